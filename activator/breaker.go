package activator

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
)

// BreakerState is the state of a replica's circuit breaker.
type BreakerState int32

const (
	// BreakerClosed lets requests through.
	BreakerClosed BreakerState = iota
	// BreakerHalfOpen lets one probe request through; its outcome closes
	// or reopens the breaker.
	BreakerHalfOpen
	// BreakerOpen keeps the replica out of rotation until the cooldown ends.
	BreakerOpen
)

// String returns "closed", "half-open" or "open".
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerHalfOpen:
		return "half-open"
	case BreakerOpen:
		return "open"
	}
	return fmt.Sprintf("BreakerState(%d)", int32(s))
}

const (
	defaultBreakerFailures = 5
	defaultBreakerCooldown = 5 * time.Second
)

// BreakerOptions configure the circuit breaker every replica of a Pool has.
// Outcomes are reported through the ReleaseFunc Pool.Pick returns: a nil
// error is a success, an error wrapping context.Canceled (the client went
// away) is ignored, any other error is a failure of the replica. Callers
// pass nil for answers that prove the replica healthy even when they are
// errors to the client (a 400, a 404).
type BreakerOptions struct {
	// Disabled turns the breakers off: no replica is ever skipped.
	Disabled bool
	// Failures is how many consecutive failures open the breaker
	// (default 5).
	Failures uint32
	// Cooldown is how long an open breaker keeps its replica out before
	// letting one probe through (default 5s).
	Cooldown time.Duration
	// OnStateChange, when set, is told of every transition. It runs under
	// the pool's and the breaker's locks: it must not call into the Pool.
	OnStateChange func(replicaID string, from, to BreakerState)
}

func (o BreakerOptions) withDefaults() BreakerOptions {
	if o.Failures == 0 {
		o.Failures = defaultBreakerFailures
	}
	if o.Cooldown <= 0 {
		o.Cooldown = defaultBreakerCooldown
	}
	return o
}

// replicaBreaker wraps gobreaker's two-step breaker with lock-free state
// that Pool.Pick reads for every candidate.
type replicaBreaker struct {
	cb       *gobreaker.TwoStepCircuitBreaker[struct{}]
	cooldown time.Duration

	state     atomic.Int32 // BreakerState as last reported by gobreaker
	openUntil atomic.Int64 // unix nanoseconds when an open breaker may probe
	probing   atomic.Bool  // the half-open probe is in flight
}

// newReplicaBreaker returns the breaker of replica id. cooled, when set,
// is called (on a timer goroutine) when an open breaker's cooldown ends,
// so that waiting requests can try the probe.
func newReplicaBreaker(id string, o BreakerOptions, cooled func()) *replicaBreaker {
	o = o.withDefaults()
	b := &replicaBreaker{cooldown: o.Cooldown}
	failures := o.Failures
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        id,
		MaxRequests: 1,
		Timeout:     o.Cooldown,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= failures },
		IsExcluded:  func(err error) bool { return errors.Is(err, context.Canceled) },
		OnStateChange: func(name string, from, to gobreaker.State) {
			f, t := breakerState(from), breakerState(to)
			if t == BreakerOpen {
				b.openUntil.Store(time.Now().Add(b.cooldown).UnixNano())
				if cooled != nil {
					time.AfterFunc(b.cooldown, cooled)
				}
			}
			b.probing.Store(false)
			b.state.Store(int32(t))
			if o.OnStateChange != nil {
				o.OnStateChange(name, f, t)
			}
		},
	})
	return b
}

func breakerState(s gobreaker.State) BreakerState {
	switch s {
	case gobreaker.StateOpen:
		return BreakerOpen
	case gobreaker.StateHalfOpen:
		return BreakerHalfOpen
	}
	return BreakerClosed
}

// admits reports whether the replica may be offered to a policy now: closed,
// or due for its half-open probe with none in flight. It takes no lock.
func (b *replicaBreaker) admits(now int64) bool {
	switch BreakerState(b.state.Load()) {
	case BreakerClosed:
		return true
	case BreakerOpen:
		return now >= b.openUntil.Load() && !b.probing.Load()
	}
	return !b.probing.Load()
}

// allow asks gobreaker to let one request through; done reports its
// outcome.
func (b *replicaBreaker) allow() (done func(error), err error) {
	d, err := b.cb.Allow()
	if err != nil {
		return nil, err
	}
	if BreakerState(b.state.Load()) != BreakerHalfOpen {
		return d, nil
	}
	b.probing.Store(true)
	return func(err error) {
		d(err)
		// An ignored outcome leaves the breaker half-open: allow a new probe.
		// A decided one changed the state, which already cleared probing.
		b.probing.Store(false)
	}, nil
}

// current returns the breaker's state, moving an open breaker whose
// cooldown ended to half-open.
func (b *replicaBreaker) current() BreakerState {
	return breakerState(b.cb.State())
}
