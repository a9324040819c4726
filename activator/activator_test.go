package activator

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/openai"
)

// testResolver knows one model and counts pokes.
type testResolver struct {
	spec  config.Spec
	pokes atomic.Int32
}

func (r *testResolver) Lookup(name string) (string, config.Spec, bool) {
	return "sha256:x", r.spec, name == "m"
}
func (r *testResolver) Poke(string) { r.pokes.Add(1) }

func newTestActivator(t *testing.T, spec config.Spec) (*Activator, *httptest.Server, *testResolver) {
	res := &testResolver{spec: spec}
	a := New(Options{Resolver: res, Retries: 2})
	ts := httptest.NewServer(a)
	t.Cleanup(ts.Close)
	return a, ts, res
}

func post(t *testing.T, url, body string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	bufio.NewReader(resp.Body).WriteTo(&b)
	resp.Body.Close()
	return resp, b.String()
}

func TestServeErrors(t *testing.T) {
	spec := config.Default()
	spec.Buffer.Capacity, spec.Buffer.Timeout = 1, config.Duration(50*time.Millisecond)
	_, ts, res := newTestActivator(t, spec)
	for _, tc := range []struct {
		name, body string
		status     int
		code       string
	}{
		{"not JSON", `{`, 400, ""},
		{"no model", `{"prompt":"x"}`, 400, ""},
		{"unknown model", `{"model":"nope","prompt":"x"}`, 404, "model_not_found"},
		{"no replica in time", `{"model":"m","prompt":"x"}`, 503, "no_replica"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := post(t, ts.URL, tc.body)
			var e openai.ErrorBody
			if resp.StatusCode != tc.status || json.Unmarshal([]byte(body), &e) != nil || e.Error.Message == "" {
				t.Fatalf("%d %s, want %d in the OpenAI shape", resp.StatusCode, body, tc.status)
			}
			if tc.code != "" && (e.Error.Code == nil || *e.Error.Code != tc.code) {
				t.Fatalf("code %v, want %s", e.Error.Code, tc.code)
			}
			if tc.status == 503 && resp.Header.Get("Retry-After") == "" {
				t.Fatal("503 without Retry-After")
			}
		})
	}
	if res.pokes.Load() == 0 {
		t.Fatal("a request waiting for a replica did not poke the scaler")
	}
}

func TestServeRetriesAndStreams(t *testing.T) {
	a, ts, _ := newTestActivator(t, config.Default())
	var broken atomic.Int32
	var goodAddr string
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The only replica fails before its first byte; a healthy one
		// turns up meanwhile and the request must be retried on it.
		broken.Add(1)
		a.deps["m"].pool.Remove("bad")
		a.AddReplica("m", "good", goodAddr, 0)
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
	}))
	defer bad.Close()
	next := make(chan struct{})
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		select { // the second event only after the client saw the first
		case <-next:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: two\n\ndata: [DONE]\n\n")
	}))
	defer good.Close()
	goodAddr = strings.TrimPrefix(good.URL, "http://")
	a.AddReplica("m", "bad", strings.TrimPrefix(bad.URL, "http://"), 0)

	for i := range 3 {
		resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x","stream":true}`))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(resp.Body)
		if !sc.Scan() || sc.Text() != "data: one" {
			t.Fatalf("request %d: first line %q (status %d)", i, sc.Text(), resp.StatusCode)
		}
		next <- struct{}{} // reached only if "one" was flushed through
		var rest []string
		for sc.Scan() {
			if sc.Text() != "" {
				rest = append(rest, sc.Text())
			}
		}
		resp.Body.Close()
		if strings.Join(rest, "|") != "data: two|data: [DONE]" {
			t.Fatalf("request %d: rest of the stream %v", i, rest)
		}
	}
	if broken.Load() != 1 {
		t.Fatalf("the failing replica served %d requests, want exactly the first", broken.Load())
	}
	if got := a.Concurrency("m"); got != 0 {
		t.Fatalf("concurrency %v after every request ended, want 0", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	a.RemoveReplica(ctx, "m", "good")
	a.RemoveReplica(ctx, "m", "bad")
}

// TestServeBufferFull fills a deployment's buffer: the next request gets a
// 429 with Retry-After at once, never a hang.
func TestServeBufferFull(t *testing.T) {
	spec := config.Default()
	spec.Buffer.Capacity, spec.Buffer.Timeout = 1, config.Duration(time.Minute)
	a, ts, _ := newTestActivator(t, spec)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // waits for a replica that never comes, holding the one place
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"x"}`))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	for bufferLen(a, "m") < 1 {
		time.Sleep(time.Millisecond)
	}
	resp, body := post(t, ts.URL, `{"model":"m","prompt":"y"}`)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "buffer_full") {
		t.Fatalf("%d %v %s: want 429 with Retry-After and code buffer_full", resp.StatusCode, resp.Header, body)
	}
}

// bufferLen is how many requests deployment's buffer holds. A test waits
// on it, not on Concurrency, to know a request took its place: Concurrency
// counts a request as waiting just before it enters the buffer.
func bufferLen(a *Activator, deployment string) int {
	if r, ok := a.existing(deployment); ok {
		return r.buffer.Len()
	}
	return 0
}

func TestUsageOf(t *testing.T) {
	for _, tc := range []struct {
		name, tail         string
		prompt, completion int
		ok                 bool
	}{
		{"plain answer", `{"id":"x","usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`, 5, 7, true},
		{"stream with usage", "data: {\"choices\":[]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\ndata: [DONE]\n\n", 3, 2, true},
		{"stream without usage", "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", 0, 0, false},
		{"cut usage", `{"usage":{"prompt_tok`, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, ok := usageOf([]byte(tc.tail))
			if ok != tc.ok || u.PromptTokens != tc.prompt || u.CompletionTokens != tc.completion {
				t.Fatalf("usageOf = %+v, %v", u, ok)
			}
		})
	}
}
