package reconcile

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/internal/store"
)

// TestAdapters: ready adapter revisions recorded under BASE:NAME are what
// the activator resolves a deployment's adapter to (the latest one, from
// the store when the controller starts, then from the watcher), never a
// deployment of their own; failed ones and those of unknown models are not.
func TestAdapters(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	record := recorder(t, st)
	record("chat", store.RevisionReady, `{}`)
	put := func(model, digest, source string, state store.RevisionState) store.Revision {
		t.Helper()
		if _, err := st.PutRevision(ctx, store.Revision{Model: model, Digest: digest, Source: source}); err != nil {
			t.Fatal(err)
		}
		reason := ""
		if state == store.RevisionFailed {
			reason = "bad shape"
		}
		if err := st.SetRevisionState(ctx, model, digest, state, reason); err != nil {
			t.Fatal(err)
		}
		r, err := st.Revision(ctx, model, digest)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	put("chat:sql", "sha256:01", "s3://b/chat/adapters/sql", store.RevisionReady)
	put("chat:broken", "sha256:02", "s3://b/chat/adapters/broken", store.RevisionFailed)
	put("gone:x", "sha256:03", "s3://b/gone/adapters/x", store.RevisionReady)

	c, err := New(ctx, Options{Store: st, NewDecider: NewAutoscaler})
	if err != nil {
		t.Fatal(err)
	}
	want := engineapi.LoadAdapterRequest{Name: "sql", Path: "s3://b/chat/adapters/sql", Revision: "sha256:01"}
	if got, ok := c.Adapter("chat", "sql"); !ok || got != want {
		t.Fatalf("Adapter(chat, sql) = %+v, %v; want %+v", got, ok, want)
	}
	for _, name := range []string{"chat:sql", "gone:x", "gone"} {
		if _, _, ok := c.Lookup(name); ok {
			t.Fatalf("%s became a deployment", name)
		}
	}
	for _, q := range [][2]string{{"chat", "broken"}, {"chat", "nope"}, {"gone", "x"}} {
		if _, ok := c.Adapter(q[0], q[1]); ok {
			t.Fatalf("Adapter(%s, %s) resolved", q[0], q[1])
		}
	}
	if got := c.Adapters("chat"); !slices.Equal(got, []string{"sql"}) {
		t.Fatalf("Adapters(chat) = %v", got)
	}

	// A new revision from the watcher replaces the old one.
	c.OnRevision(put("chat:sql", "sha256:04", "s3://b/chat/adapters/sql", store.RevisionReady))
	c.OnRevision(put("chat:law", "sha256:05", "s3://b/chat/adapters/law", store.RevisionReady))
	if got, _ := c.Adapter("chat", "sql"); got.Revision != "sha256:04" {
		t.Fatalf("after a new revision, sql is at %s", got.Revision)
	}
	if got := c.Adapters("chat"); !slices.Equal(got, []string{"law", "sql"}) {
		t.Fatalf("Adapters(chat) = %v", got)
	}
}
