package fleet_test

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stokehq/stoke/activator/fleet"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/scaler/reconcile"
)

// routes records what is routed where: a gateway's activator as the
// fleet sees it.
type routes struct {
	reconcile.Router // not called: a call panics

	mu       sync.Mutex
	replicas map[string]string // deployment/id → addr
	canaries map[string]string // deployment → pool
	load     map[string]float64
}

func newRoutes() *routes {
	return &routes{replicas: map[string]string{}, canaries: map[string]string{}, load: map[string]float64{}}
}

func (r *routes) AddReplica(deployment, id, addr string, _ int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.replicas[deployment+"/"+id] = addr
}

func (r *routes) RemoveReplica(_ context.Context, deployment, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.replicas, deployment+"/"+id)
}

func (r *routes) SetCanary(deployment, pool string, _ int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if pool == "" {
		delete(r.canaries, deployment)
		return
	}
	r.canaries[deployment] = pool
}

func (r *routes) Concurrency(deployment string) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.load[deployment]
}

func (r *routes) snapshot() (map[string]string, map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	reps, cans := map[string]string{}, map[string]string{}
	for k, v := range r.replicas {
		reps[k] = v
	}
	for k, v := range r.canaries {
		cans[k] = v
	}
	return reps, cans
}

// TestLeaderAndFollower routes through a Publisher on the leader and a
// Follower on another gateway, sharing one state store: the follower
// resolves the stored deployments, routes to exactly the replicas and
// canary shares the leader published (and stops routing to those it
// removed), and its load adds to the leader's in what reconcile sees.
func TestLeaderAndFollower(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.PutDeployment(ctx, store.Deployment{Name: "chat", Revision: "sha256:aa", Spec: []byte(`{"replicas":{"min":0,"max":3}}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.StartRollout(ctx, store.Rollout{Deployment: "chat", Stable: "sha256:aa", Candidate: "sha256:bb", CanaryPercent: 10,
		Spec: []byte(`{"replicas":{"min":0,"max":1}}`)}); err != nil {
		t.Fatal(err)
	}
	leaderRoutes, followerRoutes := newRoutes(), newRoutes()
	pub := fleet.NewPublisher(leaderRoutes, st, "gw-1", nil)
	if err := st.PutEndpoint(ctx, store.Endpoint{Deployment: "chat", Replica: "stale", Addr: "unix:///old.sock", Capacity: 1}); err != nil {
		t.Fatal(err)
	}
	if err := pub.Clear(ctx); err != nil { // a previous leader's replica
		t.Fatal(err)
	}
	follower := fleet.NewFollower(followerRoutes, st, st, "gw-2", nil)
	if _, err := st.PutRevision(ctx, store.Revision{Model: "chat:sql", Digest: "sha256:cc", Source: "s3://b/chat/adapters/sql"}); err != nil {
		t.Fatal(err)
	}
	if err := st.SetRevisionState(ctx, "chat:sql", "sha256:cc", store.RevisionReady, ""); err != nil {
		t.Fatal(err)
	}

	pub.AddReplica("chat", "rt-1", "10.0.0.1:8000", 8)
	pub.AddReplica("chat", "rt-2", "10.0.0.2:8000", 8)
	pub.SetCanary("chat", "chat@canary", 10)
	pub.AddReplica("chat@canary", "rt-3", "10.0.0.3:8000", 8)
	followerRoutes.load["chat"] = 5
	if err := follower.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	rev, spec, ok := follower.Lookup("chat")
	if !ok || rev != "sha256:aa" || spec.Replicas.Max != 3 {
		t.Errorf("the follower resolves chat to %q %+v %v, want the stored revision and spec", rev, spec.Replicas, ok)
	}
	if rev, spec, ok := follower.Lookup(reconcile.CanaryPool("chat")); !ok || rev != "sha256:bb" || spec.Replicas.Max != 1 {
		t.Errorf("the follower resolves the canary pool to %q %+v %v, want the candidate and its spec", rev, spec.Replicas, ok)
	}
	if _, _, ok := follower.Lookup("nope"); ok {
		t.Error("the follower resolves a deployment that is not stored")
	}
	if ad, ok := follower.Adapter("chat", "sql"); !ok || ad.Path != "s3://b/chat/adapters/sql" || ad.Revision != "sha256:cc" {
		t.Errorf("the follower resolves chat's adapter sql to %+v %v, want the stored ready revision", ad, ok)
	}
	if names := follower.Adapters("chat"); len(names) != 1 || names[0] != "sql" {
		t.Errorf("the follower lists chat's adapters as %v", names)
	}
	reps, cans := followerRoutes.snapshot()
	want := map[string]string{"chat/rt-1": "10.0.0.1:8000", "chat/rt-2": "10.0.0.2:8000", "chat@canary/rt-3": "10.0.0.3:8000"}
	if len(reps) != len(want) || cans["chat"] != "chat@canary" {
		t.Fatalf("the follower routes to %v with canaries %v, want %v and chat@canary", reps, cans, want)
	}
	for k, v := range want {
		if reps[k] != v {
			t.Errorf("the follower routes %s to %q, want %q", k, reps[k], v)
		}
	}

	// The follower's load reaches reconcile through the leader.
	leaderRoutes.load["chat"] = 2
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); pub.Run(runCtx) }()
	deadline := time.Now().Add(10 * time.Second)
	for pub.Concurrency("chat") != 7 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	<-done
	if c := pub.Concurrency("chat"); c != 7 {
		t.Errorf("reconcile sees concurrency %v for chat, want 7: the leader's 2 and the follower's 5", c)
	}

	pub.RemoveReplica(ctx, "chat", "rt-1")
	pub.SetCanary("chat", "", 0)
	if err := follower.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		reps, cans = followerRoutes.snapshot()
		if _, ok := reps["chat/rt-1"]; !ok || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, ok := reps["chat/rt-1"]; ok || reps["chat/rt-2"] == "" || len(cans) != 0 {
		t.Errorf("after the leader removed rt-1 and the canary: %v %v", reps, cans)
	}
	follower.Release(ctx)
	deadline = time.Now().Add(10 * time.Second)
	for {
		reps, _ = followerRoutes.snapshot()
		if len(reps) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(reps) != 0 {
		t.Errorf("after Release the follower still routes to %v", reps)
	}
}

// countingDeployments counts the reads of a follower's deployments.
type countingDeployments struct {
	*store.Store
	reads atomic.Int32
}

func (c *countingDeployments) Deployments(ctx context.Context) ([]store.Deployment, error) {
	c.reads.Add(1)
	return c.Store.Deployments(ctx)
}

// TestFollowerRefresh: a deployment the leader stores after the
// follower's last sync resolves on the follower after a Refresh, without
// waiting for the next sync; and many requests refreshing at once share
// one read of the store.
func TestFollowerRefresh(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	deps := &countingDeployments{Store: st}
	follower := fleet.NewFollower(newRoutes(), st, deps, "gw-2", nil)
	if err := follower.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.PutDeployment(ctx, store.Deployment{Name: "late", Revision: "sha256:aa", Spec: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := follower.Lookup("late"); ok {
		t.Fatal("the follower knows a deployment stored after its last sync before any refresh")
	}
	before := deps.reads.Load()
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 50 {
		wg.Add(1)
		go func() { defer wg.Done(); <-start; follower.Refresh(ctx) }()
	}
	close(start)
	wg.Wait()
	if rev, _, ok := follower.Lookup("late"); !ok || rev != "sha256:aa" {
		t.Errorf("after a refresh the follower resolves late to %q %v, want sha256:aa", rev, ok)
	}
	// Calls that arrive while a read is in flight share it; one arriving
	// just after it ends starts the next.
	if n := deps.reads.Load() - before; n < 1 || n > 2 {
		t.Errorf("50 concurrent refreshes read the deployments %d times, want 1 or 2", n)
	}
}
