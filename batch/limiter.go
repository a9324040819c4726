package batch

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// limiter bounds the batch lines in flight to one model and adapts the
// bound to what the node can give batch work without slowing anyone else:
//
//   - it starts small and grows by one line per line answered (slow
//     start), then by one line per bound's worth of lines answered;
//   - it halves when a line was preempted or refused for want of capacity
//     (interactive demand took the room back);
//   - it shrinks while the lines' time per output token is more than
//     tolerance above the lowest seen recently: the engine's steps (or the
//     node's CPU) are slowing down under the batch's weight, and every
//     interactive request in those steps would pay for it.
//
// The last rule is the one that keeps interactive latency flat: batch work
// grows into capacity nobody uses and stops growing where it starts to
// cost others time (a delay-based window, as TCP Vegas's).
type limiter struct {
	max       int
	tolerance float64
	gauge     prometheus.Gauge // the bound, exported

	mu        sync.Mutex
	limit     float64
	slowStart bool
	inflight  int
	// recent is a moving average of the lines' time per output token;
	// baseline is the lowest recent has been (it drifts up slowly, so it
	// re-learns a node that got slower for good).
	baseline, recent float64
	samples          int
	wake             chan struct{} // closed and replaced when room may have freed
}

// Limiter tuning.
const (
	// initialLimit is a new limiter's bound.
	initialLimit = 4
	// recentWeight is the weight of one line in the recent average.
	recentWeight = 0.05
	// warmupSamples is how many lines the average takes before it is
	// compared.
	warmupSamples = 20
	// baselineDrift is how far the baseline moves toward a slower line.
	baselineDrift = 0.002
	// shrinkFactor is how much the bound shrinks per slow line.
	shrinkFactor = 0.97
)

// DefaultLatencyTolerance is Options.LatencyTolerance when unset: batch
// lines may slow the node's time per token by 10%.
const DefaultLatencyTolerance = 1.1

func newLimiter(max int, tolerance float64, gauge prometheus.Gauge) *limiter {
	l := &limiter{max: max, tolerance: tolerance, gauge: gauge, limit: float64(min(initialLimit, max)), slowStart: true, wake: make(chan struct{})}
	gauge.Set(l.limit)
	return l
}

// acquire waits for room for one more line, or for ctx to end.
func (l *limiter) acquire(ctx context.Context) error {
	for {
		l.mu.Lock()
		if l.inflight < int(l.limit) {
			l.inflight++
			l.mu.Unlock()
			return nil
		}
		wake := l.wake
		l.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// outcome is how a line went, for its limiter.
type outcome struct {
	// answered: the line got its answer.
	answered bool
	// refused: capacity refused or preempted it.
	refused bool
	// perToken is the answered line's time per output token (0: unknown).
	perToken time.Duration
}

// release gives a line's room back and adapts the bound to how it went. A
// line that was neither answered nor refused (cancelled, failed for its
// own reasons) leaves the bound alone.
func (l *limiter) release(o outcome) {
	l.mu.Lock()
	l.inflight--
	switch {
	case o.refused:
		l.limit, l.slowStart = max(1, l.limit/2), false
	case o.answered:
		if l.slower(float64(o.perToken)) {
			l.limit, l.slowStart = max(1, l.limit*shrinkFactor), false
		} else if l.slowStart {
			l.limit = min(float64(l.max), l.limit+1)
		} else {
			l.limit = min(float64(l.max), l.limit+1/l.limit)
		}
	}
	l.gauge.Set(float64(int(l.limit)))
	close(l.wake)
	l.wake = make(chan struct{})
	l.mu.Unlock()
}

// slower folds a line's time per token into the averages and reports
// whether lines are now slower than the baseline allows; l.mu is held.
//
// Both sides are smoothed: recent is a moving average of the lines' times
// per token, and the baseline is the lowest that average has been (drifting
// up slowly), not the lowest single line, which is an outlier on any real
// node and would make every ordinary line look slow.
func (l *limiter) slower(perToken float64) bool {
	if perToken <= 0 {
		return false
	}
	l.samples++
	if l.recent == 0 {
		l.recent = perToken
	} else {
		l.recent += (perToken - l.recent) * recentWeight
	}
	if l.samples < warmupSamples {
		return false
	}
	switch {
	case l.baseline == 0 || l.recent < l.baseline:
		l.baseline = l.recent
	default:
		l.baseline += (l.recent - l.baseline) * baselineDrift
	}
	return l.recent > l.baseline*l.tolerance
}

// bound is the current bound, for tests.
func (l *limiter) bound() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int(l.limit)
}

// limiterFor returns the model's limiter, shared by every batch.
func (s *Service) limiterFor(model string) *limiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.limiters[model]
	if !ok {
		l = newLimiter(s.o.MaxInFlight, s.o.LatencyTolerance, s.metrics.limit.WithLabelValues(model))
		s.limiters[model] = l
	}
	return l
}
