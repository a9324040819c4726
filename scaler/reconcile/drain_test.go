package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/stokehq/stoke/activator"
	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/internal/tier"
	"github.com/stokehq/stoke/runtime"
)

// slotRuntimes is a node of classed slots as the runtime manager keeps
// them: Acquire starts a runtime in the first free slot that is not
// cordoned, and Release of a replica in a cordoned slot stops it (its
// slot empties); it records what it was asked, in order.
type slotRuntimes struct {
	otherRuntimes // unused: nil
	mu            sync.Mutex
	classes       []runtime.Class
	slots         []string // runtime id per slot, "" when free
	cordoned      map[runtime.Class]bool
	seq           int
	calls         []string
}

func (s *slotRuntimes) Acquire(_ context.Context, model, revision string) (*runtime.Replica, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for slot, id := range s.slots {
		if id == "" && !s.cordoned[s.classes[slot]] {
			s.seq++
			id = fmt.Sprintf("rt-%d-%d", slot, s.seq)
			s.slots[slot] = id
			s.calls = append(s.calls, "acquire "+id)
			return &runtime.Replica{ID: id, Addr: "unix:///nonexistent/" + id + ".sock", Model: model, Revision: revision, Tier: tier.Start}, nil
		}
	}
	return nil, runtime.ErrNoCapacity
}

func (s *slotRuntimes) Release(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	slot := slices.Index(s.slots, id)
	if slot < 0 {
		return fmt.Errorf("release %s: not an acquired runtime", id)
	}
	s.calls = append(s.calls, "release "+id)
	if s.cordoned[s.classes[slot]] {
		s.slots[slot] = ""
	}
	return nil
}

func (s *slotRuntimes) Cordon(class runtime.Class) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cordoned[class] = true
	s.calls = append(s.calls, "cordon "+string(class))
}

func (s *slotRuntimes) Runtimes() []runtime.Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []runtime.Info
	for slot, id := range s.slots {
		if id != "" {
			out = append(out, runtime.Info{ID: id, Slot: slot, Class: s.classes[slot], State: runtime.StateReady, InUse: true,
				Cordoned: s.cordoned[s.classes[slot]]})
		}
	}
	return out
}

func (s *slotRuntimes) SetSleepLimit(string, int) {}

func (s *slotRuntimes) slot(i int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slots[i]
}

func (s *slotRuntimes) history() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// drainRouter records the replicas routed to and removed, and answers
// PreemptBatch from a script of batch requests per replica, one count a
// call (none once the script ends). A replica in hold is removed only once
// the test's context ends: an interactive request on it never finishes.
type drainRouter struct {
	idleRouter
	mu       sync.Mutex
	added    []string
	removed  []string
	batch    map[string][]int
	preempts map[string]int // calls, by replica
	reasons  []string
	hold     map[string]bool
	// preempted gets a replica's id at each of its PreemptBatch calls.
	preempted chan string
}

func (r *drainRouter) AddReplica(_, id, _ string, _ int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.added = append(r.added, id)
}

func (r *drainRouter) RemoveReplica(ctx context.Context, _, id string) {
	r.mu.Lock()
	hold := r.hold[id]
	r.mu.Unlock()
	if hold {
		<-ctx.Done()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.removed = append(r.removed, id)
}

func (r *drainRouter) PreemptBatch(_, id, reason string) int {
	r.mu.Lock()
	n := 0
	if s := r.batch[id]; len(s) > 0 {
		n, r.batch[id] = s[0], s[1:]
	}
	r.preempts[id]++
	r.reasons = append(r.reasons, reason)
	r.mu.Unlock()
	select {
	case r.preempted <- id:
	default:
	}
	return n
}

// drainFixture is a controller over deployment "m" with one replica,
// rt-spot, in the spot slot of a node with an on-demand slot free.
type drainFixture struct {
	c      *Controller
	rt     *slotRuntimes
	router *drainRouter
	dec    *fixedDecider
}

func newDrainFixture(t *testing.T) *drainFixture {
	t.Helper()
	rt := &slotRuntimes{classes: []runtime.Class{runtime.OnDemand, runtime.Spot}, slots: []string{"", "rt-spot"}, cordoned: map[runtime.Class]bool{}}
	router := &drainRouter{batch: map[string][]int{}, preempts: map[string]int{}, hold: map[string]bool{}, preempted: make(chan string, 100)}
	dec := &fixedDecider{desired: 1}
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.PutDeployment(ctx, store.Deployment{Name: "m", Revision: "r", Spec: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	c, err := New(ctx, Options{Store: st, Runtimes: rt, Router: router, NewDecider: func(string, config.Spec) Decider { return dec },
		Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	c.deps["m"].replicas["rt-spot"] = &runtime.Replica{ID: "rt-spot", Model: "m", Revision: "r"}
	return &drainFixture{c: c, rt: rt, router: router, dec: dec}
}

// TestDrainClass drains the spot slot: the replica's batch requests are
// preempted for spot, it is removed from the router and released after
// the class was cordoned, its runtime is gone, and the next
// reconciliation places the deployment's replica on the on-demand slot,
// never in the cordoned one.
func TestDrainClass(t *testing.T) {
	f := newDrainFixture(t)
	f.router.batch["rt-spot"] = []int{2}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := f.c.DrainClass(ctx, runtime.Spot); err != nil {
		t.Fatalf("DrainClass: %v", err)
	}
	if f.router.preempts["rt-spot"] == 0 || slices.ContainsFunc(f.router.reasons, func(r string) bool { return r != activator.PreemptSpot }) {
		t.Errorf("PreemptBatch calls %v with reasons %v, want calls for rt-spot with reason %q", f.router.preempts, f.router.reasons, activator.PreemptSpot)
	}
	if !slices.Equal(f.router.removed, []string{"rt-spot"}) {
		t.Errorf("removed from the router: %v, want rt-spot", f.router.removed)
	}
	if want := []string{"cordon spot", "release rt-spot"}; !slices.Equal(f.rt.history(), want) {
		t.Errorf("runtime manager calls %v, want %v", f.rt.history(), want)
	}
	if id := f.rt.slot(1); id != "" {
		t.Errorf("the spot slot holds %s after the drain, want it empty", id)
	}
	if s, _ := f.c.Status("m"); s.Ready != 0 || s.Draining != 0 {
		t.Errorf("status after the drain %+v, want no replica", s)
	}
	if got := counterValue(t, f.c.drains.drains); got != 1 {
		t.Errorf("stoke_spot_drains_total = %v, want 1", got)
	}
	if got := counterValue(t, f.c.drains.preempted.WithLabelValues("m")); got != 2 {
		t.Errorf("stoke_spot_preempted_requests_total{deployment=m} = %v, want 2", got)
	}

	// The deployment still wants its replica: it goes on the on-demand slot.
	f.c.reconcile(ctx, "m")
	f.c.wg.Wait()
	if id := f.rt.slot(0); id == "" || !slices.Equal(f.router.added, []string{id}) {
		t.Fatalf("after the drain: on-demand slot %q, routed %v; want the new replica there and routed", id, f.router.added)
	}
	// With no other slot free, nothing lands in the cordoned one.
	f.dec.desired = 2
	f.c.reconcile(ctx, "m")
	f.c.wg.Wait()
	if id := f.rt.slot(1); id != "" {
		t.Errorf("a runtime %s was placed in the cordoned spot slot", id)
	}
	if s, _ := f.c.Status("m"); s.Ready != 1 || s.Pending != 0 {
		t.Errorf("status %+v, want the one on-demand replica", s)
	}
}

// TestDrainClassUntilTheDeadline: a replica whose interactive request does
// not finish is held until ctx ends; batch requests routed to it while it
// drains are preempted too; when ctx ends its runtime is stopped all the
// same and DrainClass says the drain was cut short.
func TestDrainClassUntilTheDeadline(t *testing.T) {
	f := newDrainFixture(t)
	f.router.hold["rt-spot"] = true
	f.router.batch["rt-spot"] = []int{1, 1, 1}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // the notice's deadline comes once three batch requests were preempted
		for range 3 {
			<-f.router.preempted
		}
		cancel()
	}()
	errc := make(chan error, 1)
	go func() { errc <- f.c.DrainClass(ctx, runtime.Spot) }()
	var err error
	select {
	case err = <-errc:
	case <-time.After(time.Minute):
		t.Fatal("DrainClass did not return after its context ended")
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("DrainClass = %v, want the context's end", err)
	}
	if got := counterValue(t, f.c.drains.preempted.WithLabelValues("m")); got != 3 {
		t.Errorf("stoke_spot_preempted_requests_total{deployment=m} = %v, want 3", got)
	}
	if id := f.rt.slot(1); id != "" {
		t.Errorf("the spot slot holds %s after the drain, want it empty", id)
	}
	if !slices.Equal(f.router.removed, []string{"rt-spot"}) {
		t.Errorf("removed from the router: %v, want rt-spot", f.router.removed)
	}
}

// TestDrainClassWithNothingThere cordons the class all the same.
func TestDrainClassWithNothingThere(t *testing.T) {
	f := newDrainFixture(t)
	if err := f.c.DrainClass(context.Background(), "gpu-spot"); err != nil {
		t.Fatal(err)
	}
	if want := []string{"cordon gpu-spot"}; !slices.Equal(f.rt.history(), want) {
		t.Errorf("runtime manager calls %v, want %v", f.rt.history(), want)
	}
	if len(f.router.preempts) != 0 || len(f.router.removed) != 0 {
		t.Errorf("preempted %v, removed %v: want nothing touched", f.router.preempts, f.router.removed)
	}
}

// The scaler does not import the activator: its reason must be the
// activator's.
func TestPreemptSpotIsTheActivators(t *testing.T) {
	if preemptSpot != activator.PreemptSpot {
		t.Fatalf("preemptSpot %q, activator.PreemptSpot %q", preemptSpot, activator.PreemptSpot)
	}
}

// counterValue reads a counter.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
