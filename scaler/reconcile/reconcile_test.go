package reconcile

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/weightstore/manifest"
)

// TestNewDeploysRecordedRevisions starts a controller over a store that
// already holds revisions: the latest ready one of each model becomes its
// deployment, with the spec pushed beside it; failed ones never do.
func TestNewDeploysRecordedRevisions(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	record := recorder(t, st)
	record("chat", store.RevisionReady, `{"replicas":{"min":0,"max":2}}`)
	latest := record("chat", store.RevisionReady, `{"replicas":{"min":0,"max":3}}`)
	record("broken", store.RevisionFailed, `{}`)

	c, err := New(ctx, Options{Store: st, NewDecider: NewAutoscaler})
	if err != nil {
		t.Fatal(err)
	}
	rev, spec, ok := c.Lookup("chat")
	if !ok || rev != latest || spec.Replicas.Max != 3 {
		t.Fatalf("chat: %q %+v %v, want the latest ready revision and its spec", rev, spec, ok)
	}
	if _, _, ok := c.Lookup("broken"); ok {
		t.Fatal("a model with only a failed revision was deployed")
	}
	if d, err := st.Deployment(ctx, "chat"); err != nil || d.Revision != latest {
		t.Fatalf("stored deployment %+v, %v", d, err)
	}
}

// recorder returns a function recording a revision of model in st, in
// state, with spec pushed beside it; it returns the revision's digest.
func recorder(t *testing.T, st *store.Store) func(model string, state store.RevisionState, spec string) string {
	ctx := context.Background()
	seq := 0
	return func(model string, state store.RevisionState, spec string) string {
		t.Helper()
		seq++
		files := []manifest.File{{Name: "config.json", Size: int64(len(spec)), SHA256: fmt.Sprintf("%064x", seq)}}
		m := manifest.Manifest{Model: model, Revision: manifest.Revision(files), Files: files, TotalBytes: files[0].Size, DType: "F32",
			CreatedAt: time.Now(), Spec: json.RawMessage(spec)}
		raw, err := m.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		digest := m.Revision
		if _, err := st.PutRevision(ctx, store.Revision{Model: model, Digest: digest, Manifest: raw}); err != nil {
			t.Fatal(err)
		}
		reason := ""
		if state == store.RevisionFailed {
			reason = "missing shard"
		}
		if err := st.SetRevisionState(ctx, model, digest, state, reason); err != nil {
			t.Fatal(err)
		}
		return digest
	}
}

// TestPrefetchOnDeploy checks Options.Prefetch: the revision a deployment
// serves is prefetched when the controller starts and when a new revision
// is deployed, and Run's end cancels a prefetch in progress and waits for
// it.
func TestPrefetchOnDeploy(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	record := recorder(t, st)
	first := record("chat", store.RevisionReady, `{}`)

	type call struct{ model, revision string }
	calls := make(chan call, 4)
	prefetch := func(ctx context.Context, model, revision string) error {
		calls <- call{model, revision}
		if revision != first {
			<-ctx.Done() // a prefetch still streaming when serve stops
			return ctx.Err()
		}
		return nil
	}
	c, err := New(ctx, Options{Store: st, NewDecider: NewAutoscaler, Prefetch: prefetch})
	if err != nil {
		t.Fatal(err)
	}
	next := func(what string) call {
		t.Helper()
		select {
		case got := <-calls:
			return got
		case <-time.After(10 * time.Second):
			t.Fatalf("no prefetch of %s", what)
		}
		return call{}
	}
	if got := next("the recorded revision"); got != (call{"chat", first}) {
		t.Fatalf("prefetch at start: %+v, want chat@%s", got, first)
	}

	second := record("chat", store.RevisionReady, `{}`)
	rev, err := st.Revision(ctx, "chat", second)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { c.Run(runCtx); close(ran) }()
	c.OnRevision(rev)
	if got := next("the new revision"); got != (call{"chat", second}) {
		t.Fatalf("prefetch of the new revision: %+v, want chat@%s", got, second)
	}
	stop()
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return: the prefetch in progress was not cancelled")
	}
	c.OnRevision(rev) // after Run: nothing starts
	select {
	case got := <-calls:
		t.Fatalf("prefetch %+v after Run ended", got)
	default:
	}
}

func TestLeastBusyReleasesIdleReplicasFirst(t *testing.T) {
	cases := []struct {
		name     string
		inFlight map[string]int
		n        int
		want     []string
	}{
		{"idle first", map[string]int{"a": 3, "b": 0, "c": 1}, 1, []string{"b"}},
		{"two least busy", map[string]int{"a": 3, "b": 0, "c": 1}, 2, []string{"b", "c"}},
		{"ties by id", map[string]int{"c": 0, "a": 0, "b": 2}, 2, []string{"a", "c"}},
		{"all", map[string]int{"a": 5, "b": 4}, 2, []string{"b", "a"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ids := make([]string, 0, len(tc.inFlight))
			for id := range tc.inFlight {
				ids = append(ids, id)
			}
			got := leastBusy(ids, tc.n, func(id string) int { return tc.inFlight[id] })
			if !slices.Equal(got, tc.want) {
				t.Fatalf("leastBusy = %v, want %v", got, tc.want)
			}
		})
	}
}
