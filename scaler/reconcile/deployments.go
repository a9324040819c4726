package reconcile

// The revision lister: deployments from the state store, the revision and
// spec each one serves, and what the activator resolves a model name to.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/runtime"
	"github.com/stokehq/stoke/weightstore/manifest"
)

// set installs or updates the in-memory deployment d.
func (c *Controller) set(d store.Deployment) error {
	spec, err := c.prepare(d)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.installLocked(d, spec)
	return nil
}

// prepare parses d's spec and readies what installLocked relies on.
func (c *Controller) prepare(d store.Deployment) (config.Spec, error) {
	spec, err := config.Parse(d.Spec)
	if err != nil {
		return config.Spec{}, err
	}
	if c.opts.Runtimes != nil {
		c.opts.Runtimes.SetSleepLimit(d.Name, spec.Replicas.Sleeping)
	}
	c.syncLoadState(d)
	return spec, nil
}

// newDeployment is the controller's fresh state of pool d (a deployment,
// or a canary's pool) whose replicas load and serve model, metered from
// now.
func (c *Controller) newDeployment(d store.Deployment, model string, spec config.Spec, now time.Time) *deployment {
	nd := &deployment{d: d, model: model, spec: spec, decider: c.opts.NewDecider(d.Name, spec), replicas: map[string]*runtime.Replica{},
		draining: map[string]bool{}}
	nd.cost.since = now
	return nd
}

// installLocked installs or updates deployment d with its parsed spec;
// callers hold c.mu.
func (c *Controller) installLocked(d store.Deployment, spec config.Spec) {
	dep, ok := c.deps[d.Name]
	if !ok || dep.spec != spec {
		now := time.Now()
		nd := c.newDeployment(d, d.Name, spec, now)
		if ok {
			dep.meter(now) // at the old spec's cost, up to now
			nd.replicas, nd.engines, nd.pending, nd.draining, nd.last, nd.lastAcq, nd.hold, nd.arrivals = dep.replicas, dep.engines, dep.pending, dep.draining, dep.last, dep.lastAcq, dep.hold, dep.arrivals
			nd.cost = dep.cost
		}
		c.deps[d.Name] = nd
		return
	}
	dep.d = d
}

// OnRevision records a revision the watcher validated: a ready one
// becomes what its model's deployment serves, with the spec pushed beside
// it (or the deployment's current one, or the defaults) — at once, or
// first as a canary when that spec's rollout is gated (rollout.go) and the
// revision served did not fail. A pinned deployment stays on its revision.
func (c *Controller) OnRevision(r store.Revision) {
	if r.State != store.RevisionReady {
		return
	}
	if base, name, ok := engineapi.SplitAdapterModel(r.Model); ok {
		c.setAdapter(base, name, r) // adapters.go
		return
	}
	ctx := context.Background()
	spec := json.RawMessage("{}")
	cur, err := c.opts.Store.Deployment(ctx, r.Model)
	exists := err == nil
	if exists {
		spec = cur.Spec
	}
	if m, err := manifest.Parse(r.Manifest); err == nil && len(m.Spec) > 0 {
		spec = m.Spec
	}
	parsed, err := c.parseSpec(spec)
	if err != nil {
		c.log.Warn("the pushed stoke.yaml is invalid; keeping the defaults", "model", r.Model, "err", err)
		spec, parsed = json.RawMessage("{}"), config.Default()
	}
	switch {
	case exists && cur.Pinned:
		c.log.Info("deployment is pinned; the new revision is recorded, not deployed", "deployment", r.Model,
			"revision", r.Digest, "pinned", cur.Revision)
		return
	case exists && cur.Revision == r.Digest:
		return
	case exists && parsed.Rollout.Gated() && !c.revisionFailed(ctx, cur):
		c.startRollout(ctx, cur, r.Digest, spec, parsed) // rollout.go
		return
	}
	c.endCanary(ctx, r.Model, store.RolloutSuperseded, "revision "+r.Digest+" was deployed at once") // rollout.go
	d := store.Deployment{Name: r.Model, Revision: r.Digest, Spec: spec}
	if err := c.deploy(ctx, d); err != nil {
		c.log.Error("deploy", "deployment", d.Name, "err", err)
	}
}

// revisionFailed reports whether the revision d serves failed to load for
// good: there is nothing to compare a new one with, nor to keep serving.
func (c *Controller) revisionFailed(ctx context.Context, d store.Deployment) bool {
	r, err := c.opts.Store.Revision(ctx, d.Name, d.Revision)
	return err == nil && r.State == store.RevisionFailed
}

// deploy records d and makes it what its deployment serves: replicas of
// its revision replace the others as they get ready.
func (c *Controller) deploy(ctx context.Context, d store.Deployment) error {
	if err := c.opts.Store.PutDeployment(ctx, d); err != nil {
		return err
	}
	d.UpdatedAt = time.Now()
	if err := c.set(d); err != nil {
		return err
	}
	c.log.Info("deployment serves a new revision", "deployment", d.Name, "revision", d.Revision)
	c.prefetch(d.Name, d.Revision)
	return nil
}

// Lookup resolves a model name to its deployment's revision and spec.
func (c *Controller) Lookup(name string) (revision string, spec config.Spec, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.deps[name]
	if !ok {
		return "", config.Spec{}, false
	}
	return d.d.Revision, d.spec, true
}

// Deployments implements api.Deployments.
func (c *Controller) Deployments(ctx context.Context) ([]store.Deployment, error) {
	return c.opts.Store.Deployments(ctx)
}

// Deployment implements api.Deployments.
func (c *Controller) Deployment(ctx context.Context, name string) (store.Deployment, error) {
	return c.opts.Store.Deployment(ctx, name)
}

// UpdateSpec implements api.Deployments.
func (c *Controller) UpdateSpec(ctx context.Context, name string, raw json.RawMessage) (store.Deployment, error) {
	d, err := c.opts.Store.Deployment(ctx, name)
	if err != nil {
		return store.Deployment{}, err
	}
	if _, err := c.parseSpec(raw); err != nil {
		return store.Deployment{}, openai.InvalidRequest("spec", "%v", err)
	}
	d.Spec = raw
	if err := c.opts.Store.PutDeployment(ctx, d); err != nil {
		return store.Deployment{}, err
	}
	d.UpdatedAt = time.Now()
	return d, c.set(d)
}

// parseSpec parses and validates a deployment spec, with the bound of
// this node (Options.Slots) on its minimum of replicas.
func (c *Controller) parseSpec(raw json.RawMessage) (config.Spec, error) {
	spec, err := config.Parse(raw)
	if err == nil {
		err = spec.CheckNode(c.opts.Slots)
	}
	return spec, err
}

// MaxLoadFailures is how many consecutive acquisitions of one revision may
// fail to load, across replicas, before the controller records the
// revision as failed and stops acquiring replicas of it: its requests are
// then answered at once with the reason (Failed) until a new revision is
// deployed.
const MaxLoadFailures = 3

// loadState counts the consecutive load failures of a deployment's
// revision.
type loadState struct {
	revision string
	failures int
	reason   string // the last failure's
	failed   bool   // MaxLoadFailures reached, or recorded failed in the store
}

// loadBook holds a controller's load states by deployment; an entry is
// dropped when its deployment moves to a new revision.
type loadBook struct {
	sync.Mutex
	m map[string]*loadState
}

// put records st for deployment name; callers hold the lock.
func (b *loadBook) put(name string, st *loadState) {
	if b.m == nil {
		b.m = map[string]*loadState{}
	}
	b.m[name] = st
}

// syncLoadState forgets the load failures of a revision d no longer
// serves, and marks d's revision failed when the store records it so (a
// controller restarted after giving up on it).
func (c *Controller) syncLoadState(d store.Deployment) {
	key := d.Name
	c.loads.Lock()
	st := c.loads.m[key]
	if st != nil && st.revision != d.Revision {
		delete(c.loads.m, key)
		st = nil
	}
	c.loads.Unlock()
	if st != nil || c.opts.Store == nil {
		return
	}
	r, err := c.opts.Store.Revision(context.Background(), d.Name, d.Revision)
	if err != nil || r.State != store.RevisionFailed {
		return
	}
	c.loads.Lock()
	if c.loads.m[key] == nil {
		c.loads.put(key, &loadState{revision: d.Revision, reason: r.Reason, failed: true})
	}
	c.loads.Unlock()
}

// noteLoad books the outcome of one acquisition of revision for
// deployment name: a success resets the count of consecutive failures; a
// failure to load counts, and the MaxLoadFailures-th records the revision
// as failed in the store. Cancellation and a node out of runtime slots are
// not the revision's fault and do not count.
func (c *Controller) noteLoad(ctx context.Context, name, model, revision string, err error) {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, runtime.ErrNoCapacity) {
		return
	}
	key := name
	c.loads.Lock()
	st := c.loads.m[key]
	if st == nil || st.revision != revision {
		if err == nil {
			c.loads.Unlock()
			return
		}
		st = &loadState{revision: revision}
		c.loads.put(key, st)
	}
	if err == nil {
		if !st.failed {
			st.failures = 0
		}
		c.loads.Unlock()
		return
	}
	if st.failed {
		c.loads.Unlock()
		return
	}
	st.failures++
	st.reason = err.Error()
	giveUp := st.failures >= MaxLoadFailures
	if giveUp {
		st.failed = true
		st.reason = fmt.Sprintf("revision %s failed to load %d times in a row: %v", revision, st.failures, err)
	}
	reason := st.reason
	c.loads.Unlock()
	if !giveUp {
		return
	}
	c.log.Error("revision failed to load too many times; no more replicas of it will be acquired until a new revision is pushed",
		"deployment", name, "revision", revision, "reason", reason)
	if c.opts.Store == nil {
		return
	}
	if err := c.opts.Store.FailLoadedRevision(context.WithoutCancel(ctx), model, revision, reason); err != nil {
		c.log.Warn("record the revision as failed", "deployment", name, "revision", revision, "err", err)
	}
	if name != model { // a canary's candidate: its rollout ends here
		c.endCanary(context.WithoutCancel(ctx), model, store.RolloutRejected, reason)
	}
}

// skipFailed reports whether revision of deployment name failed to load
// for good, in which case the acquisition reconcile counted as pending is
// given up at once.
func (c *Controller) skipFailed(name, revision string) bool {
	c.loads.Lock()
	st := c.loads.m[name]
	failed := st != nil && st.failed && st.revision == revision
	c.loads.Unlock()
	if failed {
		c.mu.Lock()
		if d := c.deps[name]; d != nil {
			d.meter(time.Now())
			d.pending--
		}
		c.mu.Unlock()
	}
	return failed
}

// Failed reports whether the revision deployment name serves failed to
// load for good (and has no replica serving all the same), with the
// reason: the activator answers its requests at once with it.
func (c *Controller) Failed(name string) (reason string, failed bool) {
	c.mu.Lock()
	d, ok := c.deps[name]
	var revision string
	serving := 0
	if ok {
		revision, serving = d.d.Revision, len(d.serving())
	}
	c.mu.Unlock()
	if !ok || serving > 0 {
		return "", false
	}
	c.loads.Lock()
	defer c.loads.Unlock()
	st := c.loads.m[name]
	if st == nil || !st.failed || st.revision != revision {
		return "", false
	}
	return st.reason, true
}
