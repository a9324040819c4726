package reconcile

// Draining a slot class whose capacity is reclaimed: a spot interruption
// notice drains the node's spot slots before the instance goes away.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/runtime"
)

// preemptSpot is the reason batch requests on a drained replica are
// preempted with: activator.PreemptSpot (the scaler sits below the
// activator and does not import it; a test checks that the two agree).
const preemptSpot = "spot"

// drainPreemptEvery is how often a draining replica's batch requests are
// cancelled again while its interactive ones finish: one routed to it
// just before the router stopped routing there is cancelled too, instead
// of being waited for.
const drainPreemptEvery = 50 * time.Millisecond

// drainMetrics count the drains (stoke_spot_drains_total) and the batch
// requests they preempted (stoke_spot_preempted_requests_total).
type drainMetrics struct {
	drains    prometheus.Counter
	preempted *prometheus.CounterVec
}

// newDrainMetrics returns the drain series, registered on reg when set.
func newDrainMetrics(reg prometheus.Registerer) (*drainMetrics, error) {
	m := &drainMetrics{
		drains: prometheus.NewCounter(prometheus.CounterOpts{Name: "stoke_spot_drains_total",
			Help: "Slot classes drained because their capacity was reclaimed (spot interruption notices)."}),
		preempted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stoke_spot_preempted_requests_total",
			Help: "Batch requests cancelled (and requeued by their runners) on replicas drained off reclaimed capacity, by deployment."}, []string{"deployment"}),
	}
	if reg != nil {
		if err := errors.Join(reg.Register(m.drains), reg.Register(m.preempted)); err != nil {
			return nil, fmt.Errorf("register drain metrics: %w", err)
		}
	}
	return m, nil
}

// drained counts one drain and the batch requests it preempted by
// deployment; a nil m (a controller built without New) counts nothing.
func (m *drainMetrics) drained(preempted map[string]int) {
	if m == nil {
		return
	}
	m.drains.Inc()
	for dep, n := range preempted {
		m.preempted.WithLabelValues(dep).Add(float64(n))
	}
}

// drainee is a replica on a drained slot.
type drainee struct {
	deployment, id string
	// releasing: a scale-down was releasing it already.
	releasing bool
}

// DrainClass takes the node's slots of class out of service within ctx
// (whose deadline is the notice's): it cordons them on the runtime
// manager, so that nothing new is placed there, and takes every replica
// serving there off them. Each one's batch requests are cancelled at once
// (their runners requeue them) while its interactive requests may finish
// until ctx ends; then it is released as a scale-down releases a replica,
// and the manager stops it, leaving its slot empty. Its deployment is
// poked at the start, so the replacement is acquired on a free slot of
// another class, when there is one, while the drain goes on. DrainClass
// returns when every replica there is gone; the error says when ctx ended
// first, cutting interactive requests short.
func (c *Controller) DrainClass(ctx context.Context, class runtime.Class) error {
	if c.opts.Runtimes == nil || c.opts.Router == nil {
		return fmt.Errorf("drain %s slots: the controller has no runtime manager or router", class)
	}
	start := time.Now()
	c.opts.Runtimes.Cordon(class)
	attrs := []any{"class", class}
	if deadline, ok := ctx.Deadline(); ok {
		attrs = append(attrs, "deadline", deadline)
	}
	c.log.Warn("draining slots", attrs...)
	preempted := map[string]int{}
	seen := map[string]bool{}
	replicas := 0
	// Rounds until none is left: a replica an acquisition was handing out
	// there as the class was cordoned joins its deployment in between.
	for {
		drainees := c.replicasIn(class, seen)
		if len(drainees) == 0 {
			break
		}
		replicas += len(drainees)
		for _, d := range drainees {
			c.Poke(d.deployment)
		}
		counts := make([]int, len(drainees))
		var wg sync.WaitGroup
		for i, d := range drainees {
			wg.Go(func() { counts[i] = c.drainReplica(ctx, d) })
		}
		wg.Wait()
		for i, d := range drainees {
			preempted[d.deployment] += counts[i]
		}
	}
	c.drains.drained(preempted)
	total := 0
	for _, n := range preempted {
		total += n
	}
	c.log.Info("drained slots", "class", class, "replicas", replicas, "preempted_batch_requests", total, "seconds", time.Since(start).Seconds())
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("drain %s slots: the deadline came before %d replicas were drained, cutting requests short: %w", class, replicas, err)
	}
	return nil
}

// replicasIn returns the replicas on slots of class not in seen, adding
// them to seen and marking them draining, so that reconcile counts them
// out of their deployments' serving replicas at once.
func (c *Controller) replicasIn(class runtime.Class, seen map[string]bool) []drainee {
	inClass := map[string]bool{}
	for _, r := range c.opts.Runtimes.Runtimes() {
		if r.Class == class {
			inClass[r.ID] = true
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []drainee
	for name, d := range c.deps {
		for id := range d.replicas {
			if !inClass[id] || seen[id] {
				continue
			}
			seen[id] = true
			out = append(out, drainee{deployment: name, id: id, releasing: d.draining[id]})
			d.draining[id] = true
		}
	}
	slices.SortFunc(out, func(a, b drainee) int { return cmp.Compare(a.id, b.id) })
	return out
}

// drainReplica takes one replica off a drained slot and returns how many
// of its batch requests it preempted. It releases the replica (release:
// the router stops routing to it and waits for its requests in flight
// until ctx ends, then the runtime manager stops it), cancelling its batch
// requests meanwhile; one that a scale-down releases already is left to
// it, its batch requests cancelled until it is gone or ctx ends.
func (c *Controller) drainReplica(ctx context.Context, d drainee) int {
	n := c.opts.Router.PreemptBatch(d.deployment, d.id, preemptSpot)
	released := make(chan struct{})
	if d.releasing {
		released = nil
	} else {
		c.wg.Add(1)
		go func() {
			c.release(ctx, d.deployment, d.id)
			close(released)
		}()
	}
	t := time.NewTicker(drainPreemptEvery)
	defer t.Stop()
	ctxDone := ctx.Done()
	for {
		select {
		case <-released:
			return n
		case <-t.C:
		case <-ctxDone:
			if d.releasing {
				return n
			}
			ctxDone = nil // release returns now that ctx ended
			continue
		}
		if d.releasing && !c.holds(d.deployment, d.id) {
			return n
		}
		n += c.opts.Router.PreemptBatch(d.deployment, d.id, preemptSpot)
	}
}

// holds reports whether deployment still books replica id.
func (c *Controller) holds(deployment, id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.deps[deployment]
	if !ok {
		return false
	}
	_, ok = d.replicas[id]
	return ok
}
