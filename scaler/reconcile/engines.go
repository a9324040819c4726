package reconcile

import (
	"context"
	"sync"
	"time"
)

// engineReading sums what a deployment's engines reported at one poll:
// requests waiting in their schedulers, and the fullest KV cache.
type engineReading struct {
	waiting int
	kv      float64
}

// pollEngines reads every serving replica's engine state once an
// interval until ctx ends, all replicas at once and off the reconcile
// loop, so that a poke never waits behind a slow engine. Each
// deployment's latest reading is what its next decision sees.
func (c *Controller) pollEngines(ctx context.Context) {
	t := time.NewTicker(c.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.pollOnce(ctx)
		}
	}
}

// pollOnce reads the engines once; a replica that does not answer within
// the interval counts as nothing waiting.
func (c *Controller) pollOnce(ctx context.Context) {
	c.mu.Lock()
	serving := make(map[string][]string, len(c.deps))
	for name, d := range c.deps {
		serving[name] = d.serving()
	}
	c.mu.Unlock()
	var mu sync.Mutex
	var wg sync.WaitGroup
	readings := make(map[string]engineReading, len(serving))
	for name, ids := range serving {
		for _, id := range ids {
			wg.Go(func() {
				cctx, cancel := context.WithTimeout(ctx, c.opts.Interval)
				st, err := c.opts.Runtimes.EngineState(cctx, id)
				cancel()
				if err != nil {
					return
				}
				mu.Lock()
				r := readings[name]
				r.waiting += st.Waiting
				r.kv = max(r.kv, st.KV.Usage)
				readings[name] = r
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	c.mu.Lock()
	for name, d := range c.deps {
		d.engines = readings[name]
	}
	c.mu.Unlock()
}
