package reconcile

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/runtime"
)

// countingRuntimes fails every Acquire, counting them.
type countingRuntimes struct {
	otherRuntimes
	acquires atomic.Int32
}

func (c *countingRuntimes) Acquire(ctx context.Context, model, revision string) (*runtime.Replica, error) {
	c.acquires.Add(1)
	return nil, context.Canceled
}

func (c *countingRuntimes) SetSleepLimit(string, int) {}

// TestNodeBoundsTheReplicas: a deployment never asks the node for more
// replicas than it has slots, however many its decider wants, and a spec
// whose minimum the node cannot hold is refused naming the field.
func TestNodeBoundsTheReplicas(t *testing.T) {
	rt := &countingRuntimes{}
	dec := &fixedDecider{desired: 1000}
	c := &Controller{log: slog.New(slog.DiscardHandler), opts: Options{Runtimes: rt, Router: idleRouter{}, Slots: 2}, deps: map[string]*deployment{
		"m": {replicas: map[string]*runtime.Replica{}, draining: map[string]bool{}, decider: dec},
	}}
	for range 3 {
		c.reconcile(context.Background(), "m")
		c.wg.Wait()
	}
	if n := rt.acquires.Load(); n != 6 {
		t.Errorf("%d acquisitions over 3 reconciliations of a 2-slot node, want 2 each", n)
	}

	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.PutDeployment(ctx, store.Deployment{Name: "m", Revision: "r", Spec: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	c.opts.Store = st
	c.opts.NewDecider = NewAutoscaler
	if _, err := c.UpdateSpec(ctx, "m", json.RawMessage(`{"replicas":{"min":3,"max":8}}`)); err == nil || !strings.Contains(err.Error(), "replicas.min") {
		t.Errorf("a minimum of 3 on a 2-slot node: %v, want an error naming replicas.min", err)
	}
	if _, err := c.UpdateSpec(ctx, "m", json.RawMessage(`{"replicas":{"min":1,"max":8}}`)); err != nil {
		t.Errorf("a maximum past the node is capped, not refused: %v", err)
	}
}
