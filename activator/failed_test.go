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
	"time"

	"github.com/stokehq/stoke/internal/config"
)

// failedResolver knows model "m", whose revision failed to load.
type failedResolver struct {
	spec  config.Spec
	pokes atomic.Int32
}

func (r *failedResolver) Lookup(name string) (string, config.Spec, bool) {
	return "sha256:x", r.spec, name == "m"
}
func (r *failedResolver) Poke(string) { r.pokes.Add(1) }
func (r *failedResolver) Failed(name string) (string, bool) {
	return "revision sha256:x failed to load 3 times in a row: tensor lm_head.weight is missing", name == "m"
}

// TestFailedRevisionAnsweredAtOnce: a request for a deployment whose
// revision failed to load gets a 503 revision_failed with the reason at
// once, rather than waiting out its (one-hour) buffer for a replica.
func TestFailedRevisionAnsweredAtOnce(t *testing.T) {
	spec := config.Default()
	spec.Buffer.Timeout = config.Duration(time.Hour)
	res := &failedResolver{spec: spec}
	ts := httptest.NewServer(New(Options{Resolver: res}))
	defer ts.Close()

	// Were it buffered, the request would wait the hour: this context
	// ends it first and the test fails.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi"}`))
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
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d (%s), want 503", resp.StatusCode, body)
	}
	var e struct {
		Error struct {
			Message, Type, Code string
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
	if e.Error.Code != "revision_failed" || e.Error.Type != "service_unavailable_error" ||
		!strings.Contains(e.Error.Message, "lm_head.weight is missing") {
		t.Errorf("error %+v, want revision_failed carrying the reason", e.Error)
	}
	if n := res.pokes.Load(); n != 0 {
		t.Errorf("%d pokes: a failed revision must not ask for replicas", n)
	}
}
