package reconcile

import (
	"context"
	"errors"

	"github.com/stokehq/stoke/internal/tier"
	"github.com/stokehq/stoke/runtime"
)

// adoptReplicas takes over, when the controller starts, the ready runtimes
// a restarted runtime manager re-adopted: one that serves a deployment's
// current revision becomes its replica (acquired through the manager, a
// t0, so the manager counts it in use), and the first request after a
// restart is served by it with nothing loaded. A ready runtime of another
// revision, or of a model no deployment serves, is acquired and released
// at once: it goes to sleep or back to blank like any released replica,
// instead of holding its slot idle for ever.
func (c *Controller) adoptReplicas(ctx context.Context) {
	if c.opts.Runtimes == nil {
		return
	}
	type ready struct{ model, revision string }
	var current, stale []ready
	runtimes := c.opts.Runtimes.Runtimes()
	c.mu.Lock()
	for _, r := range runtimes {
		if r.State != runtime.StateReady || r.InUse {
			continue
		}
		if d, ok := c.deps[r.Model]; ok && r.Revision == d.d.Revision {
			d.pending++ // reconcile counts it as on its way
			current = append(current, ready{r.Model, r.Revision})
		} else {
			stale = append(stale, ready{r.Model, r.Revision})
		}
	}
	c.mu.Unlock()
	for _, r := range current {
		c.adoptOne(ctx, r.model, r.revision)
	}
	for _, r := range stale {
		rep, err := c.opts.Runtimes.Acquire(ctx, r.model, r.revision)
		if err != nil {
			continue
		}
		if rep.Tier != tier.Hot { // not the idle one after all; nothing to put away
			c.log.Warn("put away a re-adopted replica: acquired another", "model", r.model, "runtime", rep.ID, "tier", rep.Tier)
		}
		if err := c.opts.Runtimes.Release(ctx, rep.ID); err != nil {
			c.log.Warn("put away a re-adopted replica", "model", r.model, "runtime", rep.ID, "err", err)
			continue
		}
		c.log.Info("re-adopted replica of no current revision put away", "model", r.model, "revision", r.revision, "runtime", rep.ID)
	}
}

// adoptOne acquires a re-adopted ready replica of deployment name (whose
// pending count holds it) and publishes it, as acquire does a new one; a
// t0 is no cold start, so neither the autoscaler's cold-start time nor the
// cold-start series hear of it.
func (c *Controller) adoptOne(ctx context.Context, name, revision string) {
	rep, err := c.opts.Runtimes.Acquire(ctx, name, revision)
	c.mu.Lock()
	d := c.deps[name]
	d.pending--
	if err == nil {
		d.replicas[rep.ID] = rep
		d.lastAcq = rep
	}
	c.mu.Unlock()
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			c.log.Warn("take a re-adopted replica", "deployment", name, "err", err)
		}
		return
	}
	c.log.Info("replica ready", "deployment", name, "runtime", rep.ID, "tier", rep.Tier, "re-adopted", rep.Tier == tier.Hot)
	c.opts.Router.AddReplica(name, rep.ID, "unix://"+rep.Socket, c.opts.ReplicaCapacity)
	if c.opts.OnAcquired != nil {
		c.opts.OnAcquired(name, rep)
	}
}
