package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stokehq/stoke/activator"
	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/runtime"
)

// failingRuntimes fails every acquisition with a load error and counts
// them by revision.
type failingRuntimes struct {
	otherRuntimes // unused: nil
	mu            sync.Mutex
	calls         map[string]int
	err           error
}

func (f *failingRuntimes) Acquire(_ context.Context, _, revision string) (*runtime.Replica, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[revision]++
	return nil, f.err
}

func (f *failingRuntimes) SetSleepLimit(string, int) {}

func (f *failingRuntimes) count(revision string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[revision]
}

// TestRevisionFailsAfterRepeatedLoadFailures: a revision whose replicas
// fail to load MaxLoadFailures times in a row is recorded as failed with
// the load error, no more replicas of it are acquired, and requests for it
// get a prompt 503 with the reason instead of waiting out a one-hour
// buffer. A new revision clears it.
func TestRevisionFailsAfterRepeatedLoadFailures(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	record := recorder(t, st)
	spec := `{"replicas":{"min":1,"max":2},"buffer":{"timeout":"1h"}}`
	bad := record("chat", store.RevisionReady, spec)

	rt := &failingRuntimes{calls: map[string]int{}, err: errors.New("load model: tensor model.layers.0.mlp.up_proj.weight is missing from the checkpoint")}
	var c *Controller
	act := activator.New(activator.Options{Resolver: resolverFunc{lookup: func(name string) (string, config.Spec, bool) { return c.Lookup(name) },
		failed: func(name string) (string, bool) { return c.Failed(name) }, poke: func(name string) { c.Poke(name) }}})
	dec := &fixedDecider{desired: 1}
	c, err = New(ctx, Options{Store: st, Runtimes: rt, Router: act, NewDecider: func(string, config.Spec) Decider { return dec },
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if rev, _, ok := c.Lookup("chat"); !ok || rev != bad {
		t.Fatalf("chat serves %q, %v; want %s", rev, ok, bad)
	}

	for range MaxLoadFailures + 3 {
		c.reconcile(ctx, "chat")
		c.wg.Wait()
	}
	if n := rt.count(bad); n != MaxLoadFailures {
		t.Errorf("%d acquisitions of the failing revision, want %d and then none", n, MaxLoadFailures)
	}
	if s, _ := c.Status("chat"); s.Pending != 0 {
		t.Errorf("status %+v: acquisitions left pending", s)
	}
	r, err := st.Revision(ctx, "chat", bad)
	if err != nil {
		t.Fatal(err)
	}
	if r.State != store.RevisionFailed || !strings.Contains(r.Reason, "up_proj.weight is missing") || !strings.Contains(r.Reason, "3 times") {
		t.Errorf("stored revision is %s (%q), want failed with the load error", r.State, r.Reason)
	}
	reason, failed := c.Failed("chat")
	if !failed || !strings.Contains(reason, "up_proj.weight is missing") {
		t.Fatalf("Failed = %q, %v; want the load error", reason, failed)
	}

	// The request is answered at once: were it buffered, it would wait
	// the hour and the test's context would end it first.
	ts := httptest.NewServer(act)
	defer ts.Close()
	status, body := postCompletion(t, ts.URL)
	if status != http.StatusServiceUnavailable {
		t.Fatalf("status %d (%s), want 503", status, body)
	}
	var e struct {
		Error struct {
			Message, Type, Code string
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
	if e.Error.Code != "revision_failed" || e.Error.Type != "service_unavailable_error" || !strings.Contains(e.Error.Message, "up_proj.weight is missing") {
		t.Errorf("error %+v, want revision_failed with the reason", e.Error)
	}

	// A restarted controller over the same store knows it too.
	c2, err := New(ctx, Options{Store: st, Runtimes: rt, Router: act, NewDecider: func(string, config.Spec) Decider { return dec },
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, failed := c2.Failed("chat"); !failed {
		t.Error("a restarted controller forgot the failed revision")
	}
	c2.reconcile(ctx, "chat")
	c2.wg.Wait()
	if n := rt.count(bad); n != MaxLoadFailures {
		t.Errorf("the restarted controller acquired the failed revision again (%d acquisitions)", n)
	}

	// A new push clears it: the new revision is acquired again.
	good := record("chat", store.RevisionReady, spec)
	nr, err := st.Revision(ctx, "chat", good)
	if err != nil {
		t.Fatal(err)
	}
	c.OnRevision(nr)
	if _, failed := c.Failed("chat"); failed {
		t.Error("the new revision is still reported failed")
	}
	c.reconcile(ctx, "chat")
	c.wg.Wait()
	if n := rt.count(good); n != 1 {
		t.Errorf("%d acquisitions of the new revision, want 1", n)
	}
}

// TestLoadFailuresMustBeConsecutive: a successful load resets the count,
// and cancellations or a full node do not count.
func TestLoadFailuresMustBeConsecutive(t *testing.T) {
	c := &Controller{log: slog.New(slog.DiscardHandler), deps: map[string]*deployment{}}
	ctx := context.Background()
	loadErr := errors.New("load failed")
	for range MaxLoadFailures - 1 {
		c.noteLoad(ctx, "m", "m", "r1", loadErr)
	}
	c.noteLoad(ctx, "m", "m", "r1", nil)
	for range MaxLoadFailures - 1 {
		c.noteLoad(ctx, "m", "m", "r1", loadErr)
	}
	c.noteLoad(ctx, "m", "m", "r1", context.Canceled)
	c.noteLoad(ctx, "m", "m", "r1", runtime.ErrNoCapacity)
	if c.skipFailed("m", "r1") {
		t.Fatal("failed after non-consecutive load failures")
	}
	c.noteLoad(ctx, "m", "m", "r1", loadErr)
	if !c.skipFailed("m", "r1") {
		t.Fatal("not failed after consecutive load failures")
	}
	if c.skipFailed("m", "r2") {
		t.Fatal("another revision is failed too")
	}
}

// resolverFunc is an activator.Resolver (and FailedResolver) of functions.
type resolverFunc struct {
	lookup func(string) (string, config.Spec, bool)
	failed func(string) (string, bool)
	poke   func(string)
}

func (r resolverFunc) Lookup(name string) (string, config.Spec, bool) { return r.lookup(name) }
func (r resolverFunc) Failed(name string) (string, bool)              { return r.failed(name) }
func (r resolverFunc) Poke(name string)                               { r.poke(name) }

func postCompletion(t *testing.T, url string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(`{"model":"chat","prompt":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("request: %v (was it buffered?)", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
