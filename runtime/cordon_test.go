package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/stokehq/stoke/runtime"
)

// TestManagerCordon cordons the spot slots of a node with one on-demand
// and two spot slots: the idle warm runtime there stops, the replica
// serving there keeps serving (listed as cordoned) until it is released
// and then stops instead of sleeping, and nothing new starts in those
// slots, neither for an acquisition nor for the warm pool.
func TestManagerCordon(t *testing.T) {
	n := newNode(t, "process", "a")
	ctx := context.Background()
	m, err := runtime.New(ctx, runtime.Options{
		Backend: n.backend, Dir: n.dir, Slots: []runtime.Class{runtime.OnDemand, runtime.Spot, runtime.Spot}, SleepBudget: 1 << 30, Source: n.source,
		EngineArgs:     []string{"--kv-cache-memory", "8MiB", "--threads", "1", "--cache-dir", filepath.Join(n.dir, "cache")},
		HealthInterval: 200 * time.Millisecond, StopGrace: 5 * time.Second,
		OnEvent: func(e runtime.Event) {
			select {
			case n.events <- e:
			default:
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(ctx)
	slotOf := func(id string) int {
		for _, r := range m.Runtimes() {
			if r.ID == id {
				return r.Slot
			}
		}
		return -1
	}
	onDemand, err := m.Acquire(ctx, "a", "")
	if err != nil {
		t.Fatal(err)
	}
	spot, err := m.Acquire(ctx, "a", "")
	if err != nil {
		t.Fatal(err)
	}
	if slotOf(onDemand.ID) != 0 || slotOf(spot.ID) != 1 {
		t.Fatalf("replicas in slots %d and %d, want 0 (on-demand) and 1 (spot)", slotOf(onDemand.ID), slotOf(spot.ID))
	}
	if err := m.SetWarm(1); err != nil { // a blank runtime in the last spot slot
		t.Fatal(err)
	}
	waitFor(t, "a warm blank runtime", func() bool { return states(m)[runtime.StateBlank] == 1 })
	var warm string
	for _, r := range m.Runtimes() {
		if r.State == runtime.StateBlank {
			warm = r.ID
		}
	}

	m.Cordon(runtime.Spot)
	waitFor(t, "the idle spot runtime stopped", func() bool { return slotOf(warm) < 0 })
	for _, r := range m.Runtimes() {
		if r.Cordoned != (r.Class == runtime.Spot) {
			t.Errorf("runtime %s in a %s slot: cordoned %v", r.ID, r.Class, r.Cordoned)
		}
	}
	rec := httptest.NewRecorder()
	m.RuntimesHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/admin/runtimes", nil))
	var listed struct {
		Data []map[string]any `json:"data"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &listed); err != nil || len(listed.Data) != 2 {
		t.Fatalf("GET /admin/runtimes: %s (%v), want the two replicas", rec.Body, err)
	}
	for _, r := range listed.Data {
		if c, _ := r["cordoned"].(bool); c != (r["id"] == spot.ID) {
			t.Errorf("GET /admin/runtimes lists %v: want cordoned only on the spot replica %s", r, spot.ID)
		}
	}
	// The replica serving there serves on.
	if err := runtime.NewEngineClient(spot.Addr).Complete(ctx, "a", []int32{1, 2}); err != nil {
		t.Fatalf("the replica in the cordoned slot stopped serving: %v", err)
	}
	// No free slot but the cordoned one: nothing starts there.
	if _, err := m.Acquire(ctx, "a", ""); !errors.Is(err, runtime.ErrNoCapacity) {
		t.Fatalf("acquire with only a cordoned slot free: %v, want ErrNoCapacity", err)
	}
	// Released, it stops rather than sleeps, and the warm pool does not
	// take the slot it leaves.
	if err := m.Release(ctx, spot.ID); err != nil {
		t.Fatal(err)
	}
	if rs := m.Runtimes(); len(rs) != 1 || rs[0].ID != onDemand.ID {
		t.Fatalf("runtimes after the spot replica's release: %+v, want only the on-demand replica", rs)
	}
	waitFor(t, "the spot replica's engine gone", func() bool { return len(n.engines(t)) == 1 })
	sawDraining := false
	for done := false; !done; {
		select {
		case e := <-n.events:
			sawDraining = sawDraining || (e.Runtime == spot.ID && e.State == runtime.StateDraining)
		default:
			done = true
		}
	}
	if !sawDraining {
		t.Error("the released spot replica went away without draining")
	}
	// An on-demand replica released sleeps as before, and wakes.
	if err := m.Release(ctx, onDemand.ID); err != nil {
		t.Fatal(err)
	}
	if s := states(m); s[runtime.StateSleeping] != 1 || len(m.Runtimes()) != 1 {
		t.Fatalf("after releasing the on-demand replica: %v, want it asleep and nothing else", s)
	}
	again, err := m.Acquire(ctx, "a", "")
	if err != nil || again.ID != onDemand.ID {
		t.Fatalf("acquire after the drain: %+v, %v; want the on-demand replica woken", again, err)
	}
	m.Cordon(runtime.Spot) // again: nothing changes
	if rs := m.Runtimes(); len(rs) != 1 || rs[0].Cordoned {
		t.Fatalf("runtimes after a second cordon: %+v", rs)
	}
}
