package activator

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stokehq/stoke/internal/config"
)

// lateResolver is a failedResolver (its "m" is answered at once) that
// trails its source: it learns of "m" only when refreshed, as a fleet
// follower learns of a deployment the leader has just created.
type lateResolver struct {
	failedResolver
	known     atomic.Bool
	refreshes atomic.Int32
}

func (r *lateResolver) Lookup(name string) (string, config.Spec, bool) {
	rev, spec, ok := r.failedResolver.Lookup(name)
	return rev, spec, ok && r.known.Load()
}
func (r *lateResolver) Refresh(context.Context) {
	r.refreshes.Add(1)
	r.known.Store(true)
}

// TestUnknownModelRefreshesResolver: a request for a model the resolver
// does not know refreshes a RefreshingResolver once before it is called
// unknown, so a deployment created elsewhere a moment ago is served, not
// answered 404; a known model refreshes nothing, and a model still
// unknown after the refresh is a 404 model_not_found.
func TestUnknownModelRefreshesResolver(t *testing.T) {
	res := &lateResolver{failedResolver: failedResolver{spec: config.Default()}}
	ts := httptest.NewServer(New(Options{Resolver: res}))
	defer ts.Close()
	complete := func(model string) (int, string) {
		t.Helper()
		resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"`+model+`","prompt":"hi"}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		if err := json.Unmarshal(body, &e); err != nil {
			t.Fatalf("body %s: %v", body, err)
		}
		return resp.StatusCode, e.Error.Code
	}
	steps := []struct {
		model     string
		status    int
		code      string
		refreshes int32
	}{
		{"m", http.StatusServiceUnavailable, "revision_failed", 1}, // learnt on the refresh
		{"m", http.StatusServiceUnavailable, "revision_failed", 1}, // known: no refresh
		{"nope", http.StatusNotFound, "model_not_found", 2},
	}
	for _, s := range steps {
		status, code := complete(s.model)
		if status != s.status || code != s.code {
			t.Errorf("model %s: %d %s, want %d %s", s.model, status, code, s.status, s.code)
		}
		if n := res.refreshes.Load(); n != s.refreshes {
			t.Errorf("after model %s: %d refreshes, want %d", s.model, n, s.refreshes)
		}
	}
}
