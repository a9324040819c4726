package activator

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/internal/config"
)

// TestEngineGetsTheDecidedPriority: the engine is told the priority the
// activator decided, whatever the body says: a client's clamped to the
// interactive band, an in-process batch line's below it.
func TestEngineGetsTheDecidedPriority(t *testing.T) {
	a, ts, _ := newTestActivator(t, config.Default())
	got := make(chan string, 1)
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get(engineapi.PriorityHeader)
		fmt.Fprint(w, `{}`)
	}))
	defer engine.Close()
	a.AddReplica("m", "r", strings.TrimPrefix(engine.URL, "http://"), 4)
	for _, tc := range []struct{ body, header, want string }{
		{`{"model":"m","prompt":"x"}`, "", "0"},
		{`{"model":"m","prompt":"x","priority":5000}`, "", "100"},
		{`{"model":"m","prompt":"x","priority":-5000}`, "", "-100"},
		{`{"model":"m","prompt":"x"}`, "9999", "0"}, // a client's own header is replaced
	} {
		req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/completions", strings.NewReader(tc.body))
		if tc.header != "" {
			req.Header.Set(engineapi.PriorityHeader, tc.header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if p := <-got; p != tc.want {
			t.Errorf("%s (header %q): engine saw priority %q, want %s", tc.body, tc.header, p, tc.want)
		}
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"model":"m","prompt":"x","priority":50}`))
	if err := a.ServeAt(PriorityBatch, httptest.NewRecorder(), req); err != nil {
		t.Fatal(err)
	}
	if p := <-got; p != fmt.Sprint(PriorityBatch) {
		t.Errorf("a batch line reached the engine at priority %q, want %d", p, PriorityBatch)
	}
}

// TestInteractiveRequestPreemptsBatch: on a replica full of batch requests,
// an interactive request that has to wait preempts the newest batch
// request (whose caller gets a *Preempted with the reason) and takes its
// room; PreemptBatch cancels the batch requests of one replica.
func TestInteractiveRequestPreemptsBatch(t *testing.T) {
	a, ts, _ := newTestActivator(t, config.Default())
	release := make(chan struct{})
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(engineapi.PriorityHeader) == fmt.Sprint(PriorityBatch) {
			select { // a batch request runs until it is cancelled or released
			case <-r.Context().Done():
				return
			case <-release:
			}
		}
		fmt.Fprint(w, `{}`)
	}))
	defer engine.Close()
	defer close(release)
	a.AddReplica("m", "r", strings.TrimPrefix(engine.URL, "http://"), 2)

	errs := make(chan error, 2)
	var started sync.WaitGroup
	for range 2 {
		started.Add(1)
		go func() {
			req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"model":"m","prompt":"batch"}`))
			started.Done()
			errs <- a.ServeAt(PriorityBatch, httptest.NewRecorder(), req)
		}()
	}
	started.Wait()
	// Both hold room once they are in the preemptible set, which they
	// join a moment after taking their slot.
	for batchRequests(a, "m") < 2 {
		time.Sleep(time.Millisecond)
	}
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"interactive"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("interactive request: %d", resp.StatusCode)
	}
	var pre *Preempted
	if err := <-errs; !errors.As(err, &pre) || pre.Reason != PreemptInteractive || !errors.Is(err, ErrPreempted) {
		t.Fatalf("the preempted batch request returned %v", err)
	}
	if n := a.PreemptBatch("m", "r", PreemptSpot); n != 1 {
		t.Fatalf("PreemptBatch cancelled %d batch requests, want the 1 left", n)
	}
	if err := <-errs; !errors.As(err, &pre) || pre.Reason != PreemptSpot {
		t.Fatalf("the batch request drained for spot returned %v", err)
	}
}

// batchRequests is how many batch requests of deployment can be preempted.
func batchRequests(a *Activator, deployment string) int {
	r, ok := a.existing(deployment)
	if !ok {
		return 0
	}
	r.batch.mu.Lock()
	defer r.batch.mu.Unlock()
	return len(r.batch.set)
}
