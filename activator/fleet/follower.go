package fleet

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"

	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/scaler/reconcile"
)

// Routes is the follower's activator: where the published replicas and
// canary shares go, and whose load the follower reports.
type Routes interface {
	AddReplica(deployment, id, addr string, capacity int)
	RemoveReplica(ctx context.Context, deployment, id string)
	SetCanary(deployment, pool string, percent int)
	Concurrency(deployment string) float64
}

// Deployments lists the deployments and the rollouts in canary
// (internal/store).
type Deployments interface {
	Deployments(ctx context.Context) ([]store.Deployment, error)
	ActiveRollouts(ctx context.Context) ([]store.Rollout, error)
	ReadyAdapters(ctx context.Context) ([]store.Revision, error)
}

// drainTimeout bounds how long an unpublished replica's requests here may
// take to finish.
const drainTimeout = 30 * time.Second

// refreshGap is the least time between two refreshes (Refresh), so that
// requests for names that do not exist cannot turn into a read of the
// state store each; refreshTimeout bounds a refresh's reads.
const (
	refreshGap     = 100 * time.Millisecond
	refreshTimeout = 5 * time.Second
)

// deployment is what a follower resolves a name to.
type deployment struct {
	revision string
	spec     config.Spec
}

// Follower keeps a gateway that is not the leader routing like the leader:
// its activator's Resolver and the applier of what the leader publishes.
type Follower struct {
	routes   Routes
	st       Store
	deps     Deployments
	gateway  string
	interval time.Duration
	log      *slog.Logger
	poke     chan struct{}

	refreshes    singleflight.Group
	refreshLimit *rate.Limiter
	// reads numbers the resolutions read from the store, in the order
	// they began; installed is the latest one in resolved.
	reads atomic.Uint64

	mu        sync.Mutex
	installed uint64
	resolved  map[string]deployment
	// adapters are the deployments' LoRA adapters, by base and name.
	adapters map[string]map[string]engineapi.LoadAdapterRequest
	applied  map[[2]string]store.Endpoint // by deployment and replica
	canaries map[string]store.CanaryShare // by deployment
}

// NewFollower applies what st holds to routes, as gateway.
func NewFollower(routes Routes, st Store, deps Deployments, gateway string, log *slog.Logger) *Follower {
	if log == nil {
		log = slog.Default()
	}
	return &Follower{routes: routes, st: st, deps: deps, gateway: gateway, interval: DefaultInterval, log: log.With("component", "fleet-follower"),
		poke: make(chan struct{}, 1), refreshLimit: rate.NewLimiter(rate.Every(refreshGap), 1), resolved: map[string]deployment{}, applied: map[[2]string]store.Endpoint{}, canaries: map[string]store.CanaryShare{}}
}

// Lookup implements activator.Resolver from what the store holds, as the
// leader's reconcile resolves it: a deployment to its revision and spec,
// the canary pool of a rollout in canary (reconcile.CanaryPool) to the
// candidate and its spec.
func (f *Follower) Lookup(name string) (string, config.Spec, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.resolved[name]
	return d.revision, d.spec, ok
}

// Adapter implements activator.AdapterResolver from what the store holds:
// an adapter of a deployment at its latest ready revision, as the leader
// serves it.
func (f *Follower) Adapter(deployment, name string) (engineapi.LoadAdapterRequest, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ad, ok := f.adapters[deployment][name]
	return ad, ok
}

// Adapters lists, sorted, the adapters of deployment.
func (f *Follower) Adapters(deployment string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := make([]string, 0, len(f.adapters[deployment]))
	for n := range f.adapters[deployment] {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Poke implements activator.Resolver: the next sync comes now, so the
// leader sees a waiting request's load at once.
func (f *Follower) Poke(string) {
	select {
	case f.poke <- struct{}{}:
	default:
	}
}

// Run syncs every interval, and when poked, until ctx ends.
func (f *Follower) Run(ctx context.Context) {
	t := time.NewTicker(f.interval)
	defer t.Stop()
	for {
		if err := f.Sync(ctx); err != nil && ctx.Err() == nil {
			f.log.Warn("sync with the leader's state", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-f.poke:
		}
	}
}

// Refresh implements activator.RefreshingResolver: it reads the
// deployments, canaries and adapters from the store now, so that a
// deployment the leader has just created resolves here before the next
// sync. Concurrent calls share one read, and reads come at most one per
// refreshGap, the calls waiting meanwhile; it returns early when ctx ends.
func (f *Follower) Refresh(ctx context.Context) {
	done := f.refreshes.DoChan("resolve", func() (any, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), refreshTimeout)
		defer cancel()
		if err := f.refreshLimit.Wait(rctx); err != nil {
			return nil, err
		}
		_, err := f.resolve(rctx)
		if err != nil {
			f.log.Warn("refresh from the leader's state", "err", err)
		}
		return nil, err
	})
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// Sync reads the deployments and the published replicas once, applies
// the changes, and reports this gateway's load.
func (f *Follower) Sync(ctx context.Context) error {
	resolved, err := f.resolve(ctx)
	if err != nil {
		return err
	}
	eps, shares, err := f.st.Fleet(ctx)
	if err != nil {
		return err
	}
	f.apply(ctx, eps, shares)

	load := map[string]float64{}
	for name := range resolved { // deployments and canary pools
		if c := f.routes.Concurrency(name); c > 0 {
			load[name] = c
		}
	}
	return f.st.ReportLoad(ctx, f.gateway, load)
}

// resolve reads what Lookup and Adapter answer from (the deployments, the
// rollouts in canary, the ready adapters) and installs it, unless a read
// that began after it is installed already. It returns what it read.
func (f *Follower) resolve(ctx context.Context) (map[string]deployment, error) {
	seq := f.reads.Add(1)
	deps, err := f.deps.Deployments(ctx)
	if err != nil {
		return nil, err
	}
	canaries, err := f.deps.ActiveRollouts(ctx)
	if err != nil {
		return nil, err
	}
	resolved := make(map[string]deployment, len(deps)+len(canaries))
	resolve := func(name, revision string, raw []byte) {
		spec, err := config.Parse(raw)
		if err != nil {
			f.log.Warn("a stored spec does not parse", "deployment", name, "err", err)
			return
		}
		resolved[name] = deployment{revision: revision, spec: spec}
	}
	for _, d := range deps {
		resolve(d.Name, d.Revision, d.Spec)
	}
	for _, ro := range canaries {
		resolve(reconcile.CanaryPool(ro.Deployment), ro.Candidate, ro.Spec)
	}
	ready, err := f.deps.ReadyAdapters(ctx)
	if err != nil {
		return nil, err
	}
	adapters := map[string]map[string]engineapi.LoadAdapterRequest{}
	for _, r := range ready {
		base, name, _ := engineapi.SplitAdapterModel(r.Model)
		if adapters[base] == nil {
			adapters[base] = map[string]engineapi.LoadAdapterRequest{}
		}
		adapters[base][name] = engineapi.LoadAdapterRequest{Name: name, Path: r.Source, Revision: r.Digest}
	}
	f.mu.Lock()
	if seq > f.installed {
		f.resolved, f.adapters, f.installed = resolved, adapters, seq
	}
	f.mu.Unlock()
	return resolved, nil
}

// apply makes the activator route to exactly the published replicas.
func (f *Follower) apply(ctx context.Context, eps []store.Endpoint, canaries []store.CanaryShare) {
	want := make(map[[2]string]store.Endpoint, len(eps))
	for _, e := range eps {
		want[[2]string{e.Deployment, e.Replica}] = e
	}
	for k, e := range f.applied {
		switch w, ok := want[k]; {
		case !ok: // routing to it stops now; its requests drain meanwhile
			go func() {
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drainTimeout)
				defer cancel()
				f.routes.RemoveReplica(dctx, e.Deployment, e.Replica)
			}()
			delete(f.applied, k)
		case w != e: // republished elsewhere: gone before it comes back
			f.routes.RemoveReplica(ctx, e.Deployment, e.Replica)
			delete(f.applied, k)
		}
	}
	for k, e := range want {
		if _, ok := f.applied[k]; !ok {
			f.routes.AddReplica(e.Deployment, e.Replica, e.Addr, e.Capacity)
			f.applied[k] = e
		}
	}
	wantC := make(map[string]store.CanaryShare, len(canaries))
	for _, c := range canaries {
		wantC[c.Deployment] = c
	}
	for d, c := range f.canaries {
		if _, ok := wantC[d]; !ok {
			f.routes.SetCanary(d, "", 0)
			delete(f.canaries, c.Deployment)
		}
	}
	for d, c := range wantC {
		if f.canaries[d] != c {
			f.routes.SetCanary(d, c.Pool, c.Percent)
			f.canaries[d] = c
		}
	}
}

// Release stops routing to everything applied: the gateway becomes the
// leader, whose own replicas replace the published ones.
func (f *Follower) Release(ctx context.Context) {
	f.apply(ctx, nil, nil)
}
