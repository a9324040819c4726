package reconcile

// Prefetch on deploy: a newly deployed revision goes into the node cache in
// the background, one prefetch per revision at a time.

import (
	"context"
	"errors"
	"time"
)

// prefetch puts a deployed revision into the node cache in the background
// (Options.Prefetch); one prefetch per revision at a time.
func (c *Controller) prefetch(model, revision string) {
	if c.opts.Prefetch == nil || revision == "" {
		return
	}
	c.mu.Lock()
	if c.stopped || c.prefetching[revision] != nil {
		c.mu.Unlock()
		return
	}
	done := make(chan struct{})
	c.prefetching[revision] = done
	c.bg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.bg.Done()
		start := time.Now()
		err := c.opts.Prefetch(c.bgCtx, model, revision)
		c.mu.Lock()
		delete(c.prefetching, revision)
		c.mu.Unlock()
		close(done)
		switch {
		case err == nil:
			c.log.Info("revision prefetched into the node cache", "deployment", model, "revision", revision, "seconds", time.Since(start).Seconds())
		case !errors.Is(err, context.Canceled):
			c.log.Warn("prefetch into the node cache failed; the first cold start reads the bucket", "deployment", model, "revision", revision, "err", err)
		}
	}()
}

// waitPrefetch waits for a prefetch of revision in progress, if any.
func (c *Controller) waitPrefetch(ctx context.Context, revision string) error {
	c.mu.Lock()
	done := c.prefetching[revision]
	c.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
