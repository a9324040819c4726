package reconcile

import (
	"context"
	"time"

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
	type ready struct{ pool, model, revision string }
	var current, stale []ready
	runtimes := c.opts.Runtimes.Runtimes()
	c.mu.Lock()
	for _, r := range runtimes {
		if r.State != runtime.StateReady || r.InUse {
			continue
		}
		// The deployment's pool, or its canary's, that serves this revision.
		if d := c.ownerLocked(r.Model, r.Model, r.Revision); d != nil && d.d.Revision == r.Revision {
			d.meter(time.Now())
			d.pending++ // reconcile counts it as on its way
			current = append(current, ready{d.d.Name, r.Model, r.Revision})
		} else {
			stale = append(stale, ready{r.Model, r.Model, r.Revision})
		}
	}
	c.mu.Unlock()
	for _, r := range current {
		c.wg.Add(1)
		c.acquire(ctx, r.pool, r.revision, CauseDemand) // t0: the re-adopted replica (no cold start)
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
