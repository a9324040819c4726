package reconcile

// The revision lister: deployments from the state store, the revision and
// spec each one serves, and what the activator resolves a model name to.

import (
	"context"
	"encoding/json"
	"time"

	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/runtime"
	"github.com/stokehq/stoke/weightstore/manifest"
)

// set installs or updates the in-memory deployment d.
func (c *Controller) set(d store.Deployment) error {
	spec, err := config.Parse(d.Spec)
	if err != nil {
		return err
	}
	if c.opts.Runtimes != nil {
		c.opts.Runtimes.SetSleepLimit(d.Name, spec.Replicas.Sleeping)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	dep, ok := c.deps[d.Name]
	if !ok || dep.spec != spec {
		nd := &deployment{d: d, spec: spec, decider: c.opts.NewDecider(d.Name, spec), replicas: map[string]*runtime.Replica{},
			draining: map[string]bool{}}
		if ok {
			nd.replicas, nd.engines, nd.pending, nd.draining, nd.last, nd.lastAcq, nd.hold, nd.arrivals = dep.replicas, dep.engines, dep.pending, dep.draining, dep.last, dep.lastAcq, dep.hold, dep.arrivals
		}
		c.deps[d.Name] = nd
		return nil
	}
	dep.d = d
	return nil
}

// OnRevision records a revision the watcher validated: a ready one
// becomes what its model's deployment serves, with the spec pushed beside
// it (or the deployment's current one, or the defaults).
func (c *Controller) OnRevision(r store.Revision) {
	if r.State != store.RevisionReady {
		return
	}
	ctx := context.Background()
	spec := json.RawMessage("{}")
	if cur, err := c.opts.Store.Deployment(ctx, r.Model); err == nil {
		spec = cur.Spec
	}
	if m, err := manifest.Parse(r.Manifest); err == nil && len(m.Spec) > 0 {
		spec = m.Spec
	}
	if _, err := config.Parse(spec); err != nil {
		c.log.Warn("the pushed stoke.yaml is invalid; keeping the defaults", "model", r.Model, "err", err)
		spec = json.RawMessage("{}")
	}
	d := store.Deployment{Name: r.Model, Revision: r.Digest, Spec: spec}
	if err := c.opts.Store.PutDeployment(ctx, d); err != nil {
		c.log.Error("record deployment", "deployment", d.Name, "err", err)
		return
	}
	d.UpdatedAt = time.Now()
	if err := c.set(d); err != nil {
		c.log.Error("deploy", "deployment", d.Name, "err", err)
		return
	}
	c.log.Info("deployment serves a new revision", "deployment", d.Name, "revision", d.Revision)
	c.prefetch(d.Name, d.Revision)
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
	if _, err := config.Parse(raw); err != nil {
		return store.Deployment{}, openai.InvalidRequest("spec", "%v", err)
	}
	d.Spec = raw
	if err := c.opts.Store.PutDeployment(ctx, d); err != nil {
		return store.Deployment{}, err
	}
	d.UpdatedAt = time.Now()
	return d, c.set(d)
}
