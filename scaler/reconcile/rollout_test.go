package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/runtime"
)

// loadingRuntimes hands out a replica per acquisition (failing those of
// the revisions in fail) and keeps what was acquired and released.
type loadingRuntimes struct {
	otherRuntimes // unused: nil
	mu            sync.Mutex
	n             int
	acquired      []string // model@revision
	released      []string // ids
	fail          map[string]bool
}

func (r *loadingRuntimes) Acquire(_ context.Context, model, revision string) (*runtime.Replica, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.acquired = append(r.acquired, model+"@"+revision)
	if r.fail[revision] {
		return nil, errors.New("load model: tensor missing")
	}
	r.n++
	return &runtime.Replica{ID: fmt.Sprintf("rt-%d", r.n), Addr: fmt.Sprintf("unix:///tmp/rt-%d.sock", r.n), Model: model, Revision: revision}, nil
}

func (r *loadingRuntimes) Release(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.released = append(r.released, id)
	return nil
}

func (r *loadingRuntimes) SetSleepLimit(string, int) {}

func (r *loadingRuntimes) snapshot() (acquired, released []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.acquired...), append([]string(nil), r.released...)
}

// canaryRouter records the canaries it was given and the replicas added.
type canaryRouter struct {
	idleRouter
	mu       sync.Mutex
	canaries map[string]string // deployment → "pool percent"
	added    map[string][]string
}

func (r *canaryRouter) SetCanary(deployment, pool string, percent int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if pool == "" {
		delete(r.canaries, deployment)
		return
	}
	r.canaries[deployment] = fmt.Sprintf("%s %d", pool, percent)
}

func (r *canaryRouter) AddReplica(deployment, id, _ string, _ int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.added[deployment] = append(r.added[deployment], id)
}

func (r *canaryRouter) canary(deployment string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.canaries[deployment]
}

// TestCanaryLifecycle: a gated push starts a canary pool that loads the
// candidate under the deployment's model name and gets its share from the
// router; a restarted controller resumes it; promotion moves the canary's
// replica into the deployment (nothing loaded again) and the stable
// replica is released; a candidate that fails to load ends its rollout
// rejected and the revision with it.
func TestCanaryLifecycle(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	record := recorder(t, st)
	stable := record("chat", store.RevisionReady, `{"replicas":{"min":1,"max":1}}`)
	rt := &loadingRuntimes{fail: map[string]bool{}}
	router := &canaryRouter{canaries: map[string]string{}, added: map[string][]string{}}
	dec := &fixedDecider{desired: 1}
	open := func() *Controller {
		c, err := New(ctx, Options{Store: st, Runtimes: rt, Router: router, NewDecider: func(string, config.Spec) Decider { return dec },
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := open()
	step := func(c *Controller, names ...string) {
		for _, n := range names {
			c.reconcile(ctx, n)
			c.wg.Wait()
		}
	}
	step(c, "chat")

	gated := `{"replicas":{"min":1,"max":1},"rollout":{"canary_percent":20}}`
	candidate := record("chat", store.RevisionReady, gated)
	rev, err := st.Revision(ctx, "chat", candidate)
	if err != nil {
		t.Fatal(err)
	}
	c.OnRevision(rev)
	if got, want := router.canary("chat"), "chat@canary 20"; got != want {
		t.Fatalf("router canary %q, want %q", got, want)
	}
	if r, _, _ := c.Lookup("chat"); r != stable {
		t.Fatalf("during the canary chat serves %s, want the stable %s", r, stable)
	}
	if r, _, ok := c.Lookup(CanaryPool("chat")); !ok || r != candidate {
		t.Fatalf("the canary pool serves %s (%v), want %s", r, ok, candidate)
	}
	step(c, CanaryPool("chat"))
	acquired, _ := rt.snapshot()
	if want := []string{"chat@" + stable, "chat@" + candidate}; fmt.Sprint(acquired) != fmt.Sprint(want) {
		t.Fatalf("acquired %v, want %v: the canary loads the candidate under the model's name", acquired, want)
	}

	// A restarted controller resumes the canary.
	router.SetCanary("chat", "", 0)
	c2 := open()
	if got := router.canary("chat"); got != "chat@canary 20" {
		t.Fatalf("after a restart the router's canary is %q", got)
	}
	if r, _, ok := c2.Lookup(CanaryPool("chat")); !ok || r != candidate {
		t.Fatalf("after a restart the canary pool serves %s (%v)", r, ok)
	}

	// Promotion by hand (on the first controller, which holds the replicas).
	ro, err := c.Promote(ctx, "chat")
	if err != nil || ro.State != store.RolloutPromoted {
		t.Fatalf("promote: %+v, %v", ro, err)
	}
	if router.canary("chat") != "" {
		t.Fatal("the router still splits to the canary")
	}
	d, _ := st.Deployment(ctx, "chat")
	if spec, err := config.Parse(d.Spec); d.Revision != candidate || err != nil || spec.Rollout.CanaryPercent != 20 {
		t.Fatalf("stored deployment %s with spec %s (%v), want the candidate and its spec", d.Revision, d.Spec, err)
	}
	step(c, "chat")
	c.wg.Wait()
	acquired, released := rt.snapshot()
	if len(acquired) != 2 || fmt.Sprint(released) != "[rt-1]" {
		t.Fatalf("after promotion acquired %v, released %v: want nothing loaded again and the stable rt-1 released", acquired, released)
	}
	if st, _ := c.Status("chat"); st.Ready != 1 {
		t.Fatalf("chat has %d ready replicas, want the promoted one", st.Ready)
	}
	if _, err := c.Promote(ctx, "chat"); !errors.Is(err, ErrNoCanary) {
		t.Fatalf("promote with no canary: %v, want ErrNoCanary", err)
	}

	// A candidate that never loads is rejected.
	broken := record("chat", store.RevisionReady, gated)
	rt.fail[broken] = true
	rev, _ = st.Revision(ctx, "chat", broken)
	c.OnRevision(rev)
	for range MaxLoadFailures {
		step(c, CanaryPool("chat"))
	}
	rs, err := st.Rollouts(ctx, "chat")
	if err != nil || len(rs) != 2 || rs[0].Candidate != broken || rs[0].State != store.RolloutRejected {
		t.Fatalf("rollouts %+v, %v; want the broken one rejected", rs, err)
	}
	if r, _ := st.Revision(ctx, "chat", broken); r.State != store.RevisionFailed && r.State != store.RevisionRejected {
		t.Fatalf("the broken revision is %s", r.State)
	}
	if r, _, _ := c.Lookup("chat"); r != candidate || router.canary("chat") != "" {
		t.Fatalf("after the rejection chat serves %s (canary %q), want %s alone", r, router.canary("chat"), candidate)
	}
}
