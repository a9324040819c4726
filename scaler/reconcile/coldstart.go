package reconcile

// The cold-start bench's admin surface: how a replica was acquired, and
// driving a deployment into a tier.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/internal/tier"
	"github.com/stokehq/stoke/runtime"
	"github.com/stokehq/stoke/weightstore/nodecache"
)

// Acquisition is how a deployment's replica on runtime id was acquired
// ("" for the latest acquisition).
func (c *Controller) Acquisition(name, id string) (*runtime.Replica, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.deps[name]
	if !ok {
		return nil, false
	}
	if id == "" {
		return d.lastAcq, d.lastAcq != nil
	}
	rep, ok := d.replicas[id]
	return rep, ok
}

// Prepare drives a deployment into the state in which its next request is
// served by tier, for the cold-start bench: every replica released and the
// autoscaler's history forgotten, then t1 leaves a sleeping replica, t2 a
// warm blank runtime with the revision in the node cache, t3 the same
// without it in the cache, t4 no idle runtime at all and an empty warm pool
// until the next acquisition. A deployment that keeps replicas (min > 0)
// cannot be prepared.
func (c *Controller) Prepare(ctx context.Context, name string, want tier.Tier) error {
	c.mu.Lock()
	d, ok := c.deps[name]
	if !ok {
		c.mu.Unlock()
		return fmt.Errorf("prepare %s: %w", name, store.ErrNotFound)
	}
	if d.spec.Replicas.Min > 0 {
		c.mu.Unlock()
		return openai.InvalidRequest("tier", "deployment %s keeps %d replicas (replicas.min); it never goes cold", name, d.spec.Replicas.Min)
	}
	revision := d.d.Revision
	c.mu.Unlock()
	if err := c.waitPrefetch(ctx, revision); err != nil { // it would refill the cache under a t3
		return err
	}
	c.mu.Lock()
	if d, ok = c.deps[name]; !ok {
		c.mu.Unlock()
		return fmt.Errorf("prepare %s: %w", name, store.ErrNotFound)
	}
	d.decider = c.opts.NewDecider(name, d.spec)
	d.hold = true
	for d.pending > 0 { // let acquisitions under way finish first
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		c.mu.Lock()
	}
	ids := d.serving()
	for _, id := range ids {
		d.draining[id] = true
	}
	revision = d.d.Revision
	c.mu.Unlock()
	for _, id := range ids {
		c.wg.Add(1)
		c.release(ctx, name, id)
	}
	idle := func(state runtime.State) []string {
		var out []string
		for _, r := range c.opts.Runtimes.Runtimes() {
			if r.State == state && !r.InUse && (state == runtime.StateBlank || r.Model == name) {
				out = append(out, r.ID)
			}
		}
		return out
	}
	cycle := func() error { // load the revision once and put it to sleep
		rep, err := c.opts.Runtimes.Acquire(ctx, name, revision)
		if err != nil {
			return err
		}
		return c.opts.Runtimes.Release(ctx, rep.ID)
	}
	switch want {
	case tier.Wake:
		if len(idle(runtime.StateSleeping)) == 0 {
			if err := cycle(); err != nil {
				return fmt.Errorf("prepare %s for t1: %w", name, err)
			}
		}
		if len(idle(runtime.StateSleeping)) == 0 {
			return fmt.Errorf("prepare %s for t1: its replica did not go to sleep (is the sleep budget big enough?)", name)
		}
		return nil
	case tier.Cache, tier.Bucket, tier.Start:
	default:
		return openai.InvalidRequest("tier", "tier %q is not t1, t2, t3 or t4", want)
	}
	if c.opts.Cache == nil {
		return fmt.Errorf("prepare %s for %s: no node cache to prepare", name, want)
	}
	if want == tier.Cache {
		if v, err := c.opts.Cache.OpenRevision(ctx, revision); err == nil {
			v.Close()
		} else if err := cycle(); err != nil {
			return fmt.Errorf("prepare %s for t2: %w", name, err)
		}
	}
	for _, id := range idle(runtime.StateSleeping) {
		if err := c.opts.Runtimes.Unload(ctx, id); err != nil {
			return fmt.Errorf("prepare %s for %s: %w", name, want, err)
		}
	}
	switch want {
	case tier.Cache:
		// The runtime that loaded it commits the cache after serving.
		for {
			v, err := c.opts.Cache.OpenRevision(ctx, revision)
			if err == nil {
				v.Close()
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("prepare %s for t2: the node cache never got the revision: %w", name, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	case tier.Bucket:
		if err := c.opts.Cache.Remove(ctx, revision); err != nil && !errors.Is(err, nodecache.ErrNotExist) {
			return fmt.Errorf("prepare %s for t3: %w", name, err)
		}
	case tier.Start:
		c.mu.Lock()
		c.restoreWarm = true
		c.mu.Unlock()
		if err := c.opts.Runtimes.SetWarm(0); err != nil {
			return err
		}
		return c.opts.Runtimes.StopIdle(ctx)
	}
	// t2 and t3 load into a warm blank runtime.
	for len(idle(runtime.StateBlank)) == 0 {
		if c.opts.Warm == 0 {
			return fmt.Errorf("prepare %s for %s: the warm pool is empty (serve --warm 0)", name, want)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("prepare %s for %s: no warm runtime: %w", name, want, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}
