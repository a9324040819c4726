package reconcile

// Rollouts: a new revision of a deployment whose spec gates its rollout
// first serves as a canary (a pool of its own, CanaryPool, given a share
// of the deployment's requests by the activator) while the eval gate
// scores it against the stable revision; it is then promoted (its
// replicas join the deployment's, which replace the stable ones as
// reconcile sees them stale) or rejected (its replicas released, the
// revision marked rejected). Every step is recorded in the store first,
// so a restarted controller resumes a canary where it stood.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/scaler/rollout"
)

// CanaryPool names the pool of a deployment's canary replicas: what the
// activator routes the canary's share to, and what the controller
// scales and reports (Status) as a deployment of its own.
func CanaryPool(deployment string) string { return deployment + "@canary" }

// ErrNoCanary reports a deployment with no rollout in canary.
var ErrNoCanary = fmt.Errorf("no canary in progress: %w", store.ErrNotFound)

// rolloutRun is a rollout in canary, as the controller runs it.
type rolloutRun struct {
	r store.Rollout
	// cancel ends its eval, if one runs.
	cancel context.CancelFunc
}

// startRollout starts the canary of revision candidate (with raw, its
// spec, parsed as spec) on deployment cur, in place of a canary in
// progress.
func (c *Controller) startRollout(ctx context.Context, cur store.Deployment, candidate string, raw json.RawMessage, spec config.Spec) {
	c.endCanary(ctx, cur.Name, store.RolloutSuperseded, "revision "+candidate+" was pushed during the canary")
	ro, err := c.opts.Store.StartRollout(ctx, store.Rollout{Deployment: cur.Name, Stable: cur.Revision, Candidate: candidate,
		CanaryPercent: spec.Rollout.CanaryPercent, Spec: raw})
	if err != nil {
		c.log.Error("start a canary", "deployment", cur.Name, "revision", candidate, "err", err)
		return
	}
	c.log.Info("canary started", "deployment", cur.Name, "stable", cur.Revision, "candidate", candidate,
		"percent", ro.CanaryPercent, "eval", spec.Rollout.Eval.File)
	c.runCanary(ro, spec)
}

// runCanary puts the canary of rollout ro in place: its pool, its share
// in the activator, and its eval.
func (c *Controller) runCanary(ro store.Rollout, spec config.Spec) {
	pool := CanaryPool(ro.Deployment)
	now := time.Now()
	d := c.newDeployment(store.Deployment{Name: pool, Revision: ro.Candidate, Spec: ro.Spec, UpdatedAt: now}, ro.Deployment, spec, now)
	run := &rolloutRun{r: ro}
	gate := spec.Rollout.Eval
	evaluate := gate.File != "" && c.opts.Evaluate != nil && c.opts.ReadFile != nil
	var ctx context.Context
	c.mu.Lock()
	c.deps[pool] = d
	c.rollouts[ro.Deployment] = run
	if evaluate {
		ctx, run.cancel = context.WithTimeout(c.bgCtx, time.Duration(gate.Timeout))
		c.bg.Add(1)
	}
	c.mu.Unlock()
	c.opts.Router.SetCanary(ro.Deployment, pool, ro.CanaryPercent)
	c.prefetch(ro.Deployment, ro.Candidate)
	if evaluate {
		go func() {
			defer c.bg.Done()
			defer run.cancel()
			c.evaluate(ctx, run, gate)
		}()
	} else if gate.File != "" {
		c.log.Warn("no eval runner: the canary waits to be promoted or rolled back by hand", "deployment", ro.Deployment)
	}
	c.Poke(pool)
}

// evaluate runs the eval gate of a canary on both revisions and ends it
// as the verdict says. An eval that cannot run rejects the candidate;
// one cut short because the canary ended otherwise (or the controller
// stopped) decides nothing.
func (c *Controller) evaluate(ctx context.Context, run *rolloutRun, gate config.Eval) {
	ro := run.r
	on := func(revision string) rollout.Complete {
		return func(ctx context.Context, body []byte) (int, []byte, error) {
			return c.opts.Evaluate(ctx, ro.Deployment, revision, body)
		}
	}
	var stable, candidate rollout.Score
	data, err := c.opts.ReadFile(ctx, ro.Deployment, ro.Candidate, gate.File)
	var items []rollout.Item
	if err == nil {
		items, err = rollout.ParseSet(data)
	}
	if err == nil {
		stable, err = rollout.Run(ctx, on(ro.Stable), items, gate)
	}
	if err == nil {
		candidate, err = rollout.Run(ctx, on(ro.Candidate), items, gate)
	}
	bg := context.WithoutCancel(ctx)
	if err != nil {
		c.mu.Lock()
		ended := c.rollouts[ro.Deployment] != run
		c.mu.Unlock()
		if ended || c.bgCtx.Err() != nil {
			return
		}
		c.log.Warn("eval gate could not run; the candidate is rejected", "deployment", ro.Deployment, "revision", ro.Candidate, "err", err)
		c.finish(bg, run, store.RolloutRejected, "eval failed: "+err.Error(), nil)
		return
	}
	v := rollout.Judge(gate, stable, candidate)
	figures, _ := json.Marshal(v)
	state := store.RolloutRejected
	if v.Promote {
		state = store.RolloutPromoted
	}
	c.log.Info("eval gate", "deployment", ro.Deployment, "revision", ro.Candidate, "verdict", v.String())
	c.finish(bg, run, state, v.String(), figures)
}

// endCanary ends deployment's canary, if one runs, as state.
func (c *Controller) endCanary(ctx context.Context, deployment string, state store.RolloutState, reason string) {
	c.mu.Lock()
	run := c.rollouts[deployment]
	c.mu.Unlock()
	if run != nil {
		c.finish(ctx, run, state, reason, nil)
	}
}

// finish ends rollout run as state: recorded first (with the deployment's
// move on promotion, or the candidate's rejection), then carried out.
func (c *Controller) finish(ctx context.Context, run *rolloutRun, state store.RolloutState, reason string, figures json.RawMessage) (store.Rollout, error) {
	ro, err := c.opts.Store.FinishRollout(ctx, run.r.ID, state, reason, figures)
	if err != nil {
		if !errors.Is(err, store.ErrIllegalTransition) { // ended already (by hand, say): nothing to do
			c.log.Error("end a canary", "deployment", run.r.Deployment, "state", state, "err", err)
		}
		return store.Rollout{}, err
	}
	if run.cancel != nil {
		run.cancel()
	}
	name, pool := ro.Deployment, CanaryPool(ro.Deployment)
	c.log.Info("canary ended", "deployment", name, "candidate", ro.Candidate, "state", state, "reason", reason)
	// The promoted revision and the canary's replicas move into the
	// deployment at once: reconcile never sees it without replicas of its
	// new revision.
	var promoted *store.Deployment
	var spec config.Spec
	if state == store.RolloutPromoted {
		d, err := c.opts.Store.Deployment(ctx, name)
		if err == nil {
			spec, err = c.prepare(d)
		}
		if err != nil {
			c.log.Error("serve the promoted revision", "deployment", name, "err", err)
		} else {
			promoted = &d
		}
	}
	c.mu.Lock()
	if promoted != nil {
		c.installLocked(*promoted, spec)
	}
	if c.rollouts[name] == run {
		delete(c.rollouts, name)
	}
	cd := c.deps[pool]
	delete(c.deps, pool)
	moved := map[string]string{} // replica id → engine address
	var released []string
	now := time.Now()
	if cd != nil {
		cd.meter(now)
		main := c.deps[name]
		for _, id := range cd.serving() {
			if state == store.RolloutPromoted && main != nil && main.d.Revision == cd.d.Revision {
				main.meter(now)
				main.replicas[id] = cd.replicas[id]
				moved[id] = cd.replicas[id].Addr
			} else {
				released = append(released, id)
			}
		}
	}
	c.mu.Unlock()
	for id, addr := range moved {
		c.opts.Router.AddReplica(name, id, addr, c.opts.ReplicaCapacity)
	}
	c.opts.Router.SetCanary(name, "", 0)
	bg := context.WithoutCancel(ctx)
	for id := range moved {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.opts.Router.RemoveReplica(bg, pool, id) // its requests in flight finish there
		}()
	}
	for _, id := range released {
		c.wg.Add(1)
		go c.release(bg, pool, id)
	}
	c.Poke(name)
	return ro, nil
}

// recoverRollouts resumes the canaries the store records in progress (a
// controller restarted during one); one whose deployment moved on since
// is recorded superseded.
func (c *Controller) recoverRollouts(ctx context.Context) error {
	active, err := c.opts.Store.ActiveRollouts(ctx)
	if err != nil {
		return err
	}
	for _, ro := range active {
		c.mu.Lock()
		d := c.deps[ro.Deployment]
		c.mu.Unlock()
		spec, err := c.parseSpec(ro.Spec)
		if d == nil || d.d.Revision != ro.Stable || err != nil {
			reason := "the deployment no longer serves the stable revision"
			if err != nil {
				reason = err.Error()
			}
			if _, err := c.opts.Store.FinishRollout(ctx, ro.ID, store.RolloutSuperseded, reason, nil); err != nil {
				return err
			}
			continue
		}
		c.log.Info("canary resumed", "deployment", ro.Deployment, "candidate", ro.Candidate)
		c.runCanary(ro, spec)
	}
	return nil
}

// Rollouts implements api.Deployments: a deployment's rollouts, newest
// first.
func (c *Controller) Rollouts(ctx context.Context, name string) ([]store.Rollout, error) {
	return c.opts.Store.Rollouts(ctx, name)
}

// Promote implements api.Deployments: the canary of deployment name is
// promoted now, its eval gate (if any) left unfinished.
func (c *Controller) Promote(ctx context.Context, name string) (store.Rollout, error) {
	return c.byHand(ctx, name, store.RolloutPromoted, "promoted by hand")
}

// Rollback implements api.Deployments: the canary of deployment name ends
// now, its traffic back on the stable revision. The candidate stays ready
// (an operator's call, not a verdict); pinning it serves it after all.
func (c *Controller) Rollback(ctx context.Context, name string) (store.Rollout, error) {
	return c.byHand(ctx, name, store.RolloutRolledBack, "rolled back by hand")
}

func (c *Controller) byHand(ctx context.Context, name string, state store.RolloutState, reason string) (store.Rollout, error) {
	c.mu.Lock()
	run := c.rollouts[name]
	c.mu.Unlock()
	if run == nil {
		return store.Rollout{}, fmt.Errorf("deployment %s: %w", name, ErrNoCanary)
	}
	return c.finish(ctx, run, state, reason, nil)
}

// Pin implements api.Deployments: deployment name serves revision (one of
// its model's, ready or rejected) from now on, whatever is pushed next,
// until Unpin. A canary in progress ends: promoted when it is the
// revision pinned, rolled back otherwise.
func (c *Controller) Pin(ctx context.Context, name, revision string) (store.Deployment, error) {
	d, err := c.opts.Store.Deployment(ctx, name)
	if err != nil {
		return store.Deployment{}, err
	}
	r, err := c.opts.Store.Revision(ctx, name, revision)
	if errors.Is(err, store.ErrNotFound) {
		return store.Deployment{}, openai.InvalidRequest("revision", "model %s has no revision %s", name, revision)
	}
	if err != nil {
		return store.Deployment{}, err
	}
	if r.State != store.RevisionReady && r.State != store.RevisionRejected {
		return store.Deployment{}, openai.InvalidRequest("revision", "revision %s of %s is %s; only a ready or rejected one can be pinned", revision, name, r.State)
	}
	c.mu.Lock()
	run := c.rollouts[name]
	c.mu.Unlock()
	if run != nil {
		if run.r.Candidate == revision {
			c.finish(ctx, run, store.RolloutPromoted, "pinned by hand", nil)
		} else {
			c.finish(ctx, run, store.RolloutRolledBack, "another revision was pinned by hand", nil)
		}
		if d, err = c.opts.Store.Deployment(ctx, name); err != nil {
			return store.Deployment{}, err
		}
	}
	d.Revision, d.Pinned = revision, true
	if err := c.deploy(ctx, d); err != nil {
		return store.Deployment{}, err
	}
	return c.opts.Store.Deployment(ctx, name)
}

// Unpin implements api.Deployments: deployment name follows pushes again
// (from the next one on; what it serves does not change now).
func (c *Controller) Unpin(ctx context.Context, name string) (store.Deployment, error) {
	d, err := c.opts.Store.Deployment(ctx, name)
	if err != nil {
		return store.Deployment{}, err
	}
	d.Pinned = false
	if err := c.opts.Store.PutDeployment(ctx, d); err != nil {
		return store.Deployment{}, err
	}
	return c.opts.Store.Deployment(ctx, name)
}
