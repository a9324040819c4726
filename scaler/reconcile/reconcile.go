// Package reconcile carries out the scaler's decisions, one job per file:
// deployments.go keeps the deployments from the state store and resolves
// a model name to the revision and spec it serves (the activator's
// resolver); engines.go polls the replicas' engines for the scaler's
// signals, off the decision loop; reconcile.go asks each deployment's
// autoscaler how many replicas it wants and acts on it, acquiring and
// releasing replicas through the runtime manager and publishing the ready
// ones to the activator; adopt.go takes over the ready replicas an earlier
// serve left; prefetch.go puts newly deployed revisions into the node
// cache; coldstart.go drives a deployment into a cold-start tier for the
// bench; drain.go takes the replicas off a slot class whose capacity is
// reclaimed (a spot interruption notice).
package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/stokehq/stoke/engine/engineapi"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/internal/tier"
	"github.com/stokehq/stoke/runtime"
	"github.com/stokehq/stoke/scaler"
	"github.com/stokehq/stoke/weightstore/nodecache"
)

// Runtimes acquires and releases replicas (the runtime manager).
type Runtimes interface {
	Acquire(ctx context.Context, model, revision string) (*runtime.Replica, error)
	Release(ctx context.Context, id string) error
	// SetSleepLimit caps the replicas of model Release keeps asleep.
	SetSleepLimit(model string, n int)
	// EngineState reads the engine state of runtime id (its queue and KV
	// usage), through the manager's client of that engine.
	EngineState(ctx context.Context, id string) (engineapi.StateInfo, error)
	// The operations Prepare drives tiers with.
	Runtimes() []runtime.Info
	Unload(ctx context.Context, id string) error
	StopIdle(ctx context.Context) error
	SetWarm(n int) error
	// Cordon takes a slot class out of service (DrainClass): nothing
	// new starts there, and a replica released there stops.
	Cordon(class runtime.Class)
}

// RevisionRemover drops a revision from the node cache (nodecache.Dir,
// ctrdcache.Cache).
type RevisionRemover interface {
	Remove(ctx context.Context, revision string) error
	OpenRevision(ctx context.Context, revision string) (nodecache.Revision, error)
}

// Router is where ready replicas serve requests (the activator).
type Router interface {
	// AddReplica makes a ready replica of deployment routable.
	AddReplica(deployment, id, addr string, capacity int)
	// RemoveReplica stops routing to a replica and returns when its
	// requests in flight are done (or ctx ends).
	RemoveReplica(ctx context.Context, deployment, id string)
	// InFlight is the requests in flight on one of its replicas.
	InFlight(deployment, id string) int
	// Concurrency is a deployment's requests in flight plus buffered.
	Concurrency(deployment string) float64
	// QueueWaitP90 is the p90 time its recent requests waited in the
	// buffer for a replica, over its stable window (0 when none waited).
	QueueWaitP90(deployment string) time.Duration
	// Traffic is its requests received so far and their mean duration.
	Traffic(deployment string) (arrivals int64, meanLatency time.Duration)
	// Tokens is the prompt and completion tokens its answers carried so
	// far, for the operating cost per token.
	Tokens(deployment string) int64
	// PreemptBatch cancels the batch requests on one of its replicas
	// with reason and returns how many; their runners requeue them.
	PreemptBatch(deployment, replicaID, reason string) int
	// SetCanary gives pool (whose replicas serve deployment's candidate
	// revision) percent of deployment's requests; "" ends the canary.
	SetCanary(deployment, pool string, percent int)
}

// Decider decides one deployment's replica count (scaler.Autoscaler).
type Decider interface {
	// Record samples the deployment's concurrency.
	Record(now time.Time, concurrency float64)
	// Poke makes the next decision see demand at once.
	Poke(now time.Time)
	// RecordArrivals counts request arrivals for the forecaster.
	RecordArrivals(now time.Time, n int)
	// SetColdStart sets how far ahead the predictive floor looks.
	SetColdStart(d time.Duration)
	// Decide returns the wanted replicas given the signals.
	Decide(now time.Time, s scaler.Signals) scaler.Decision
}

// DefaultInterval is Options.Interval when unset: the time between two
// reconciliations, which the predictive floor looks ahead by beside a cold
// start.
const DefaultInterval = time.Second

// NewAutoscaler is the Decider of a deployment: the scaler's autoscaler
// configured from its spec.
func NewAutoscaler(name string, spec config.Spec) Decider {
	window := time.Duration(spec.Window)
	delay := time.Duration(spec.IdleDelay)
	if delay == 0 {
		delay = -1 // the scaler's "no delay"
	}
	a, err := scaler.NewAutoscaler(scaler.Config{TargetConcurrency: spec.TargetConcurrency, MinReplicas: spec.Replicas.Min,
		MaxReplicas: spec.Replicas.Max, TTFTSLO: time.Duration(spec.TTFTSLO), ScaleDownDelay: delay,
		StableWindow: window, PanicWindow: max(window/10, time.Second), Granularity: min(time.Second, window/10),
		NoPrediction: !spec.Forecast.Predictive, Lead: DefaultInterval,
		Seasonality: scaler.Seasonality{Period: time.Duration(spec.Forecast.Period), Bucket: time.Duration(spec.Forecast.Bucket)}})
	if err != nil {
		// The spec was validated; fall back to the defaults all the same.
		slog.Warn("autoscaler config refused; using the defaults", "deployment", name, "err", err)
		a, _ = scaler.NewAutoscaler(scaler.DefaultConfig())
	}
	return a
}

// Options configure a Controller.
type Options struct {
	Store    *store.Store
	Runtimes Runtimes
	Router   Router
	// NewDecider makes the autoscaler of a deployment with spec.
	NewDecider func(name string, spec config.Spec) Decider
	// ReplicaCapacity is how many requests one replica takes at once
	// (the engine's max-num-seqs).
	ReplicaCapacity int
	// Slots is how many runtimes the node holds (0: unknown). A spec whose
	// minimum exceeds it is refused, and no deployment asks for more
	// replicas than it at once.
	Slots int
	// Interval is the time between two reconciliations (default 1 s);
	// Poke reconciles a deployment at once.
	Interval time.Duration
	// OnAcquired, when set, sees every acquisition (cold-start reports).
	OnAcquired func(deployment string, r *runtime.Replica)
	// Metrics, when set, records every decision.
	Metrics *scaler.Metrics
	// Registerer, when set, receives the cold-start series
	// (stoke_cold_starts_total, stoke_cold_start_seconds) and the
	// operating cost's (cost.go).
	Registerer prometheus.Registerer
	// Cache is the node cache the runtimes load through, for Prepare.
	Cache RevisionRemover
	// Warm is the runtime manager's warm pool size, restored after a
	// Prepare for t4 emptied it.
	Warm int
	// Prefetch, when set, puts a deployment's revision into the node
	// cache in the background when it is deployed, so that its first
	// cold start reads the node cache (T2) instead of the bucket (T3).
	Prefetch func(ctx context.Context, model, revision string) error
	// ReadFile reads one file of a model's revision (a rollout's eval
	// set), checked against the revision's manifest.
	ReadFile func(ctx context.Context, model, revision, name string) ([]byte, error)
	// Evaluate answers a completions request body on one revision of a
	// deployment, its stable or its canary one (the activator, with the
	// model pinned to that revision), for the rollouts' eval gates. With
	// no Evaluate or ReadFile a gated canary waits to be promoted or
	// rolled back by hand.
	Evaluate func(ctx context.Context, deployment, revision string, body []byte) (status int, answer []byte, err error)
	Logger   *slog.Logger
}

// Controller reconciles every deployment.
type Controller struct {
	opts  Options
	log   *slog.Logger
	pokes chan string

	coldStarts       *prometheus.CounterVec
	coldStartSeconds *prometheus.HistogramVec
	drains           *drainMetrics // drain.go

	mu   sync.Mutex
	deps map[string]*deployment
	// adapters holds, per model, the LoRA adapters pushed under it at
	// their latest ready revision (adapters.go).
	adapters map[string]map[string]engineapi.LoadAdapterRequest
	// rollouts is the rollouts in canary, by deployment (rollout.go).
	rollouts map[string]*rolloutRun
	// loads counts each deployment's consecutive load failures
	// (deployments.go); it has its own lock.
	loads       loadBook
	restoreWarm bool
	wg          sync.WaitGroup

	// Background prefetches: bgCtx ends with Run, and prefetching holds
	// each one's done channel by revision.
	bgCtx       context.Context
	bgCancel    context.CancelFunc
	bg          sync.WaitGroup
	stopped     bool
	prefetching map[string]chan struct{}
}

// deployment is the controller's state of one deployment, or of one
// deployment's canary (rollout.go): a pool of replicas of one revision,
// scaled by its own autoscaler.
type deployment struct {
	d store.Deployment
	// model is the model its replicas load and their engines serve: the
	// deployment's name (d.Name is the canary pool's for a canary).
	model    string
	spec     config.Spec
	decider  Decider
	replicas map[string]*runtime.Replica
	// engines is what its replicas' engines reported at the last poll.
	engines  engineReading
	pending  int             // acquisitions in progress
	draining map[string]bool // replicas being released
	last     scaler.Decision
	lastAcq  *runtime.Replica
	// hold pauses scaling from a Prepare until the next request pokes.
	hold bool
	// cost meters its replica-seconds (cost.go).
	cost replicaMeter
	// arrivals is the router's arrival count at the last reconciliation.
	arrivals int64
}

// serving returns the ids of its replicas not being released.
func (d *deployment) serving() []string {
	ids := make([]string, 0, len(d.replicas))
	for id := range d.replicas {
		if !d.draining[id] {
			ids = append(ids, id)
		}
	}
	return ids
}

// byRevision splits the replicas serving into those of the revision it
// serves now and the stale ones, of a revision it served before: a new
// revision replaces them as its own replicas get ready.
func (d *deployment) byRevision() (current, stale []string) {
	for _, id := range d.serving() {
		if d.replicas[id].Revision == d.d.Revision {
			current = append(current, id)
		} else {
			stale = append(stale, id)
		}
	}
	return current, stale
}

// forget drops replica id from its books at now, reporting whether it
// was there.
func (d *deployment) forget(now time.Time, id string) bool {
	_, ok := d.replicas[id]
	if ok {
		d.meter(now)
	}
	delete(d.replicas, id)
	delete(d.draining, id)
	return ok
}

// New returns a controller over the deployments in opts.Store.
func New(ctx context.Context, opts Options) (*Controller, error) {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.ReplicaCapacity <= 0 {
		opts.ReplicaCapacity = 256
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	c := &Controller{opts: opts, log: opts.Logger.With("component", "reconcile"), pokes: make(chan string, 1024), deps: map[string]*deployment{},
		rollouts:    map[string]*rolloutRun{},
		prefetching: map[string]chan struct{}{},
		coldStarts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stoke_cold_starts_total",
			Help: "Replicas acquired, by deployment, tier (t1 wake, t2 node cache, t3 bucket, t4 runtime start) and cause " +
				"(demand: requests seen asked for it; predicted: the predictive floor started it ahead of demand)."}, []string{"deployment", "tier", "cause"}),
		coldStartSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "stoke_cold_start_seconds",
			Help:    "Time to acquire a ready replica, by tier.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60}}, []string{"tier"}),
	}
	if opts.Registerer != nil {
		if err := errors.Join(opts.Registerer.Register(c.coldStarts), opts.Registerer.Register(c.coldStartSeconds),
			opts.Registerer.Register(newCostCollector(c))); err != nil {
			return nil, fmt.Errorf("register cold-start and cost metrics: %w", err)
		}
	}
	var err error
	if c.drains, err = newDrainMetrics(opts.Registerer); err != nil {
		return nil, err
	}
	c.bgCtx, c.bgCancel = context.WithCancel(context.WithoutCancel(ctx))
	ds, err := opts.Store.Deployments(ctx)
	if err != nil {
		return nil, fmt.Errorf("load deployments: %w", err)
	}
	for _, d := range ds {
		if err := c.set(d); err != nil {
			c.log.Warn("skipping a deployment with a bad spec", "deployment", d.Name, "err", err)
			continue
		}
		c.prefetch(d.Name, d.Revision)
	}
	// Models whose revisions were recorded before any deployment existed
	// (by `stoke watch`, say) are deployed at their latest ready revision.
	models, err := opts.Store.Models(ctx)
	if err != nil {
		return nil, fmt.Errorf("load models: %w", err)
	}
	for _, m := range models {
		if _, ok := c.deps[m]; ok {
			continue
		}
		if _, _, adapter := engineapi.SplitAdapterModel(m); adapter {
			continue // ReadyAdapters below
		}
		if r, err := opts.Store.LatestReady(ctx, m); err == nil {
			c.OnRevision(r)
		}
	}
	adapters, err := opts.Store.ReadyAdapters(ctx)
	if err != nil {
		return nil, fmt.Errorf("load adapters: %w", err)
	}
	for _, r := range adapters {
		c.OnRevision(r) // adapters.go
	}
	if err := c.recoverRollouts(ctx); err != nil { // rollout.go
		return nil, fmt.Errorf("resume canaries: %w", err)
	}
	return c, nil
}

// Poke makes the controller reconcile a deployment now, as when a request
// waits for a replica.
func (c *Controller) Poke(name string) {
	c.mu.Lock()
	if d, ok := c.deps[name]; ok {
		d.hold = false
		d.decider.Poke(time.Now())
	}
	c.mu.Unlock()
	select {
	case c.pokes <- name:
	default:
	}
}

// Status is a deployment's live state as the controller sees it.
type Status struct {
	// Ready replicas serve requests; Pending ones are being acquired and
	// Draining ones released.
	Ready    int `json:"ready"`
	Pending  int `json:"pending"`
	Draining int `json:"draining"`
	// Desired is the scaler's latest decision, Reason why, and Panic
	// whether it was in panic mode.
	Desired int    `json:"desired"`
	Panic   bool   `json:"panic"`
	Reason  string `json:"reason,omitempty"`
	// LastColdStart is the tier of the latest acquisition ("" before
	// the first).
	LastColdStart tier.Tier `json:"last_cold_start,omitempty"`
}

// Status returns a deployment's live state.
func (c *Controller) Status(name string) (Status, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.deps[name]
	if !ok {
		return Status{}, false
	}
	st := Status{Ready: len(d.replicas) - len(d.draining), Pending: d.pending, Draining: len(d.draining),
		Desired: d.last.Desired, Panic: d.last.Panic, Reason: d.last.Reason}
	if d.lastAcq != nil {
		st.LastColdStart = d.lastAcq.Tier
	}
	return st, true
}

// OnRuntimeEvent drops a replica whose runtime is gone; the next
// reconciliation replaces it.
func (c *Controller) OnRuntimeEvent(e runtime.Event) {
	if e.State != runtime.StateGone {
		return
	}
	c.mu.Lock()
	var dep string
	for name, d := range c.deps {
		if d.forget(time.Now(), e.Runtime) {
			dep = name
		}
	}
	c.mu.Unlock()
	if dep != "" {
		c.log.Warn("replica gone", "deployment", dep, "runtime", e.Runtime, "reason", e.Reason)
		c.opts.Router.RemoveReplica(context.Background(), dep, e.Runtime)
		c.Poke(dep)
	}
}

// Run reconciles until ctx ends, then waits for acquisitions and releases
// in progress.
func (c *Controller) Run(ctx context.Context) {
	c.adoptReplicas(ctx) // adopt.go: the replicas a restarted manager re-adopted
	t := time.NewTicker(c.opts.Interval)
	defer t.Stop()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.pollEngines(ctx)
	}()
	for {
		select {
		case <-ctx.Done():
			c.mu.Lock()
			c.stopped = true
			c.mu.Unlock()
			c.bgCancel()
			c.bg.Wait()
			c.wg.Wait()
			return
		case name := <-c.pokes:
			c.reconcile(ctx, name)
		case <-t.C:
			c.mu.Lock()
			names := make([]string, 0, len(c.deps))
			for name := range c.deps {
				names = append(names, name)
			}
			c.mu.Unlock()
			for _, name := range names {
				c.reconcile(ctx, name)
			}
		}
	}
}

// reconcile moves one deployment toward its autoscaler's decision.
func (c *Controller) reconcile(ctx context.Context, name string) {
	c.mu.Lock()
	d, ok := c.deps[name]
	if !ok || d.hold {
		c.mu.Unlock()
		return
	}
	engines := d.engines
	c.mu.Unlock()
	arrivals, latency := c.opts.Router.Traffic(name)
	signals := scaler.Signals{Waiting: engines.waiting, KVUsage: engines.kv, QueueWaitP90: c.opts.Router.QueueWaitP90(name), AvgLatency: latency}

	now := time.Now()
	c.mu.Lock()
	if d, ok = c.deps[name]; !ok {
		c.mu.Unlock()
		return
	}
	d.decider.Record(now, c.opts.Router.Concurrency(name))
	d.decider.RecordArrivals(now, int(max(arrivals-d.arrivals, 0)))
	d.arrivals = arrivals
	ready := len(d.replicas) - len(d.draining)
	signals.Ready = ready
	dec := d.decider.Decide(now, signals)
	if c.opts.Metrics != nil {
		c.opts.Metrics.Observe(name, dec)
	}
	if dec.Desired != d.last.Desired {
		c.log.Info("scaling", "deployment", name, "from", d.last.Desired, "to", dec.Desired, "ready", ready, "reason", dec.Reason)
	}
	d.last = dec
	var start int
	var release []string
	current, stale := d.byRevision()
	busy := func(id string) int { return c.opts.Router.InFlight(name, id) }
	switch {
	case dec.Desired > len(current)+d.pending:
		want := dec.Desired
		if c.opts.Slots > 0 {
			want = min(want, c.opts.Slots) // more could never get a slot
		}
		start = max(0, want-len(current)-d.pending)
		d.meter(now)
		d.pending += start
	case dec.Desired < len(current):
		release = leastBusy(current, len(current)-dec.Desired, busy)
	}
	// Replicas of the revision served before keep serving until enough of
	// the new one are ready.
	if len(stale) > 0 && len(current) >= dec.Desired {
		release = append(release, stale...)
	}
	for _, id := range release {
		d.draining[id] = true
	}
	revision := d.d.Revision
	c.mu.Unlock()
	cause := CauseDemand
	if dec.Signal == scaler.SignalPredictive {
		cause = CausePredicted
	}
	for range start {
		c.wg.Add(1)
		go c.acquire(ctx, name, revision, cause)
	}
	for _, id := range release {
		c.wg.Add(1)
		go c.release(ctx, name, id)
	}
}

// ownerLocked is the pool a replica of model at revision, acquired for
// pool name, belongs to: name while it serves that revision, else the
// pool that does (a canary's replica lands in its deployment once
// promoted), else name all the same (a stale replica, which reconcile
// replaces); nil when there is none. Callers hold c.mu.
func (c *Controller) ownerLocked(name, model, revision string) *deployment {
	d := c.deps[name]
	if d != nil && d.d.Revision == revision {
		return d
	}
	for _, o := range c.deps {
		if o.model == model && o.d.Revision == revision {
			return o
		}
	}
	return d
}

// leastBusy picks the n replicas a scale-down releases: those with the
// fewest requests in flight, so draining ends soonest and the busy
// replicas keep their prefix caches.
func leastBusy(ids []string, n int, inFlight func(id string) int) []string {
	load := make(map[string]int, len(ids))
	for _, id := range ids {
		load[id] = inFlight(id)
	}
	slices.SortFunc(ids, func(a, b string) int {
		return cmp.Or(cmp.Compare(load[a], load[b]), cmp.Compare(a, b))
	})
	return ids[:n]
}

// Why a replica was acquired (stoke_cold_starts_total's cause).
const (
	// CauseDemand: requests seen (in flight, buffered, arriving) asked
	// for it.
	CauseDemand = "demand"
	// CausePredicted: the predictive floor asked for it ahead of demand.
	CausePredicted = "predicted"
)

func (c *Controller) acquire(ctx context.Context, name, revision, cause string) {
	defer c.wg.Done()
	if c.skipFailed(name, revision) { // deployments.go: a revision that does not load is not retried
		return
	}
	c.mu.Lock()
	model := name
	if d := c.deps[name]; d != nil {
		model = d.model
	}
	c.mu.Unlock()
	rep, err := c.opts.Runtimes.Acquire(ctx, model, revision)
	c.noteLoad(ctx, name, model, revision, err) // deployments.go: counts consecutive load failures
	c.mu.Lock()
	if d := c.deps[name]; d != nil {
		d.meter(time.Now())
		d.pending--
	}
	// The pool may have ended meanwhile (a canary promoted or rolled
	// back): the replica goes to whichever pool serves its revision now,
	// or back to the manager.
	owner := c.ownerLocked(name, model, revision)
	if owner == nil {
		c.mu.Unlock()
		if err == nil {
			c.log.Info("replica no longer wanted; released", "deployment", name, "runtime", rep.ID)
			if err := c.opts.Runtimes.Release(ctx, rep.ID); err != nil {
				c.log.Warn("release a replica", "deployment", name, "runtime", rep.ID, "err", err)
			}
		}
		return
	}
	d := owner
	name = d.d.Name
	if errors.Is(err, runtime.ErrNoCapacity) {
		// Replicas of the revision served before hold slots the new one
		// needs: one goes now.
		if _, stale := d.byRevision(); len(stale) > 0 {
			id := leastBusy(stale, 1, func(id string) int { return c.opts.Router.InFlight(name, id) })[0]
			d.draining[id] = true
			c.wg.Add(1)
			go c.release(ctx, name, id)
		}
	}
	// A re-adopted ready replica (t0) is no cold start: neither the
	// autoscaler's cold-start time nor the cold-start series hear of it.
	cold := err == nil && rep.Tier != tier.Hot
	if err == nil {
		d.replicas[rep.ID] = rep
		d.lastAcq = rep
	}
	if cold {
		d.decider.SetColdStart(rep.Breakdown.Total)
	}
	restore := err == nil && c.restoreWarm
	c.restoreWarm = c.restoreWarm && !restore
	c.mu.Unlock()
	if restore {
		c.opts.Runtimes.SetWarm(c.opts.Warm)
	}
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			c.log.Warn("acquire a replica", "deployment", name, "err", err)
		}
		return
	}
	if cold {
		c.coldStarts.WithLabelValues(name, string(rep.Tier), cause).Inc()
		c.coldStartSeconds.WithLabelValues(string(rep.Tier)).Observe(rep.Breakdown.Total.Seconds())
	}
	c.log.Info("replica ready", "deployment", name, "runtime", rep.ID, "tier", rep.Tier, "seconds", rep.Breakdown.Total.Seconds())
	c.opts.Router.AddReplica(name, rep.ID, rep.Addr, c.opts.ReplicaCapacity)
	if c.opts.OnAcquired != nil {
		c.opts.OnAcquired(name, rep)
	}
}

func (c *Controller) release(ctx context.Context, name, id string) {
	defer c.wg.Done()
	c.opts.Router.RemoveReplica(ctx, name, id)
	c.mu.Lock()
	if d := c.deps[name]; d != nil {
		d.forget(time.Now(), id)
	}
	c.mu.Unlock()
	if err := c.opts.Runtimes.Release(ctx, id); err != nil {
		c.log.Warn("release a replica", "deployment", name, "runtime", id, "err", err)
	}
}
