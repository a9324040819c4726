package activator

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var errEngineDown = errors.New("dial engine: connection refused")

// preferA is a policy that takes replica "a" whenever it is a candidate.
func preferA(_ *rand.Rand, cands []Candidate) int {
	for i, c := range cands {
		if c.ID == "a" {
			return i
		}
	}
	return 0
}

// breakerPool has replicas ids with unlimited capacity, no prefix
// affinity, and the preferA policy.
func breakerPool(t *testing.T, bo BreakerOptions, onFree func(int), ids ...string) *Pool {
	t.Helper()
	p := NewPool(PoolOptions{Policy: preferA, Prefix: PrefixOptions{Disabled: true}, Breaker: bo, OnFree: onFree, Seed: 1})
	for _, id := range ids {
		if err := p.Add(id, 0); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// pickRelease picks and at once releases with err, returning the replica.
func pickRelease(t *testing.T, p *Pool, err error) string {
	t.Helper()
	id, rel, ok := p.Pick(nil)
	if !ok {
		t.Fatal("no pick")
	}
	rel(err)
	return id
}

func TestBreakerOpensAfterConsecutiveFailures(t *testing.T) {
	cases := []struct {
		name     string
		failures uint32 // 0: default
		outcomes []error
		open     bool
	}{
		{"default opens at 5", 0, []error{errEngineDown, errEngineDown, errEngineDown, errEngineDown, errEngineDown}, true},
		{"default stays closed at 4", 0, []error{errEngineDown, errEngineDown, errEngineDown, errEngineDown}, false},
		{"one failure opens at 1", 1, []error{errEngineDown}, true},
		{"a success resets the count", 3, []error{errEngineDown, errEngineDown, nil, errEngineDown, errEngineDown}, false},
		{"three in a row", 3, []error{nil, errEngineDown, errEngineDown, errEngineDown}, true},
		{"cancellations are ignored", 2, []error{context.Canceled, fmt.Errorf("client gone: %w", context.Canceled), context.Canceled}, false},
		{"cancellation between failures", 2, []error{errEngineDown, context.Canceled, errEngineDown}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := breakerPool(t, BreakerOptions{Failures: tc.failures, Cooldown: time.Hour}, nil, "a", "b")
			for _, err := range tc.outcomes {
				if id := pickRelease(t, p, err); id != "a" {
					t.Fatalf("picked %s while a's breaker was closed", id)
				}
			}
			st, _ := p.BreakerState("a")
			if got := st == BreakerOpen; got != tc.open {
				t.Fatalf("breaker %v, want open=%v", st, tc.open)
			}
			want := "a"
			if tc.open {
				want = "b"
			}
			for range 20 {
				if id := pickRelease(t, p, nil); id != want {
					t.Fatalf("picked %s, want %s", id, want)
				}
			}
			if st, _ := p.BreakerState("b"); st != BreakerClosed {
				t.Fatalf("b's breaker %v", st)
			}
		})
	}
}

func TestBreakerHalfOpenProbe(t *testing.T) {
	cases := []struct {
		name   string
		probe  error
		after  BreakerState
		pickOK bool // whether a pick succeeds right after the probe
	}{
		{"probe succeeds", nil, BreakerClosed, true},
		{"probe fails", errEngineDown, BreakerOpen, false},
		{"probe cancelled: probe again", context.Canceled, BreakerHalfOpen, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var transitions []string
			var mu sync.Mutex
			var freed atomic.Int32
			bo := BreakerOptions{Failures: 2, Cooldown: 5 * time.Millisecond, OnStateChange: func(id string, from, to BreakerState) {
				mu.Lock()
				transitions = append(transitions, fmt.Sprintf("%s:%v>%v", id, from, to))
				mu.Unlock()
			}}
			p := breakerPool(t, bo, func(n int) { freed.Add(1) }, "a")
			pickRelease(t, p, errEngineDown)
			pickRelease(t, p, errEngineDown)
			if _, _, ok := p.Pick(nil); ok {
				t.Fatal("picked the only replica with its breaker open")
			}
			freedAtOpen := freed.Load()
			awaitRouting(t, "the end of the cooldown reported to OnFree", func() bool { return freed.Load() > freedAtOpen })
			// After the cooldown exactly one probe goes through.
			var probe ReleaseFunc
			awaitRouting(t, "the half-open probe", func() bool {
				_, rel, ok := p.Pick(nil)
				probe = rel
				return ok
			})
			if st, _ := p.BreakerState("a"); st != BreakerHalfOpen {
				t.Fatalf("breaker %v during the probe", st)
			}
			for range 5 {
				if _, _, ok := p.Pick(nil); ok {
					t.Fatal("a second request passed a half-open breaker")
				}
			}
			probe(tc.probe)
			if st, _ := p.BreakerState("a"); st != tc.after {
				t.Fatalf("after the probe: %v, want %v", st, tc.after)
			}
			_, rel, ok := p.Pick(nil)
			if ok != tc.pickOK {
				t.Fatalf("pick after the probe ok=%v, want %v", ok, tc.pickOK)
			}
			if ok {
				rel(nil)
				if st, _ := p.BreakerState("a"); st != BreakerClosed {
					t.Fatalf("after a successful request: %v", st)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			want := []string{"a:closed>open", "a:open>half-open"}
			if !slices.Equal(transitions[:min(2, len(transitions))], want) {
				t.Fatalf("transitions %v, want them to start with %v", transitions, want)
			}
		})
	}
}

func TestBreakerDisabled(t *testing.T) {
	p := breakerPool(t, BreakerOptions{Disabled: true}, nil, "a", "b")
	for range 50 {
		if id := pickRelease(t, p, errEngineDown); id != "a" {
			t.Fatalf("picked %s: a disabled breaker skipped a", id)
		}
	}
	if st, ok := p.BreakerState("a"); !ok || st != BreakerClosed {
		t.Fatalf("state %v %v", st, ok)
	}
	if r := p.Replicas(); len(r) != 2 || r[0].Breaker != BreakerClosed {
		t.Fatalf("replicas %+v", r)
	}
}

func TestBreakerStateString(t *testing.T) {
	cases := map[BreakerState]string{BreakerClosed: "closed", BreakerHalfOpen: "half-open", BreakerOpen: "open", 9: "BreakerState(9)"}
	for s, want := range cases {
		if got := s.String(); got != want {
			t.Errorf("%d: %q, want %q", s, got, want)
		}
	}
}

// Outcomes of requests that started before the breaker opened do not
// reopen or close it: gobreaker drops reports from an older generation.
func TestBreakerLateReportsIgnored(t *testing.T) {
	p := breakerPool(t, BreakerOptions{Failures: 2, Cooldown: time.Hour}, nil, "a", "b")
	_, slow, _ := p.Pick(nil) // on a, released only after it opened
	pickRelease(t, p, errEngineDown)
	pickRelease(t, p, errEngineDown)
	if st, _ := p.BreakerState("a"); st != BreakerOpen {
		t.Fatalf("state %v", st)
	}
	slow(nil)
	if st, _ := p.BreakerState("a"); st != BreakerOpen {
		t.Fatalf("a late success changed the breaker to %v", st)
	}
	if n := p.InFlight("a"); n != 0 {
		t.Fatalf("in flight %d", n)
	}
}
