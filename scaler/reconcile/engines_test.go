package reconcile

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/runtime"
	"github.com/stokehq/stoke/scaler"
)

// otherRuntimes names Runtimes for embedding (its field name would
// clash with the Runtimes method).
type otherRuntimes = Runtimes

// stateRuntimes answers EngineState from a table; a runtime missing from
// it fails, and one in block answers only once ctx ends.
type stateRuntimes struct {
	otherRuntimes // unused: nil
	states        map[string]engineapi.StateInfo
	block         map[string]bool
	mu            sync.Mutex
	calls         int
}

func (s *stateRuntimes) EngineState(ctx context.Context, id string) (engineapi.StateInfo, error) {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	if s.block[id] {
		<-ctx.Done()
		return engineapi.StateInfo{}, ctx.Err()
	}
	st, ok := s.states[id]
	if !ok {
		return engineapi.StateInfo{}, errors.New("no such runtime")
	}
	return st, nil
}

func TestPollEngines(t *testing.T) {
	rt := &stateRuntimes{
		states: map[string]engineapi.StateInfo{
			"a1": {Waiting: 3, KV: engineapi.KVInfo{Usage: 0.2}},
			"a2": {Waiting: 5, KV: engineapi.KVInfo{Usage: 0.7}},
			"a3": {Waiting: 100, KV: engineapi.KVInfo{Usage: 1}}, // being released
			"b1": {Waiting: 1, KV: engineapi.KVInfo{Usage: 0.1}},
		},
		block: map[string]bool{"b2": true},
	}
	c := &Controller{opts: Options{Runtimes: rt, Interval: 50 * time.Millisecond}, deps: map[string]*deployment{
		"a": {replicas: map[string]*runtime.Replica{"a1": {}, "a2": {}, "a3": {}, "gone": {}}, draining: map[string]bool{"a3": true}},
		"b": {replicas: map[string]*runtime.Replica{"b1": {}, "b2": {}}, draining: map[string]bool{}},
		"c": {replicas: map[string]*runtime.Replica{}, draining: map[string]bool{}, engines: engineReading{waiting: 9}},
	}}
	c.pollOnce(context.Background())
	want := map[string]engineReading{"a": {waiting: 8, kv: 0.7}, "b": {waiting: 1, kv: 0.1}, "c": {}}
	for name, w := range want {
		if got := c.deps[name].engines; got != w {
			t.Errorf("deployment %s: reading %+v, want %+v", name, got, w)
		}
	}
}

// TestReconcileReadsNoEngine checks that a decision uses the latest poll
// and never waits on an engine itself: a poke is answered at once however
// slow the replicas are.
func TestReconcileReadsNoEngine(t *testing.T) {
	rt := &stateRuntimes{block: map[string]bool{"r1": true}}
	dec := &fixedDecider{}
	c := &Controller{log: slog.New(slog.DiscardHandler), opts: Options{Runtimes: rt, Router: idleRouter{}, Interval: time.Hour}, deps: map[string]*deployment{
		"m": {replicas: map[string]*runtime.Replica{"r1": {}}, draining: map[string]bool{}, decider: dec, engines: engineReading{waiting: 7, kv: 0.5}},
	}}
	dec.desired = 1
	c.reconcile(context.Background(), "m")
	if rt.calls != 0 {
		t.Errorf("reconcile read %d engine states; it must use the poller's reading", rt.calls)
	}
	if dec.seen.Waiting != 7 || dec.seen.KVUsage != 0.5 || dec.seen.Ready != 1 {
		t.Errorf("decider saw %+v, want the polled waiting 7 and kv 0.5 with 1 ready", dec.seen)
	}
}

type fixedDecider struct {
	desired int
	signal  string // the decision's signal ("" for none)
	seen    scaler.Signals
}

func (f *fixedDecider) Record(time.Time, float64)     {}
func (f *fixedDecider) Poke(time.Time)                {}
func (f *fixedDecider) RecordArrivals(time.Time, int) {}
func (f *fixedDecider) SetColdStart(time.Duration)    {}
func (f *fixedDecider) Decide(_ time.Time, s scaler.Signals) scaler.Decision {
	f.seen = s
	return scaler.Decision{Desired: f.desired, Signal: f.signal}
}

type idleRouter struct{}

func (idleRouter) AddReplica(string, string, string, int)        {}
func (idleRouter) RemoveReplica(context.Context, string, string) {}
func (idleRouter) InFlight(string, string) int                   { return 0 }
func (idleRouter) Concurrency(string) float64                    { return 0 }
func (idleRouter) QueueWaitP90(string) time.Duration             { return 0 }
func (idleRouter) Traffic(string) (int64, time.Duration)         { return 0, 0 }
func (idleRouter) Tokens(string) int64                           { return 0 }
func (idleRouter) PreemptBatch(string, string, string) int       { return 0 }
func (idleRouter) SetCanary(string, string, int)                 {}
