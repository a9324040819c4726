package activator

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/openai"
)

// engineAddr is the address AddReplica takes for a test server.
func engineAddr(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }

// readEvents reads an SSE body's data lines.
func readEvents(t *testing.T, body io.Reader) []string {
	t.Helper()
	var data []string
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			data = append(data, d)
		}
	}
	return data
}

// TestProxyPlainAnswer: the request reaches the engine whole, with the
// client's headers but neither hop-by-hop ones nor an upgrade; the
// answer comes back whole with the engine's headers and its length.
func TestProxyPlainAnswer(t *testing.T) {
	a, ts, _ := newTestActivator(t, config.Default())
	const reqBody = `{"model":"m","prompt":"\u00e9 x","max_tokens":1}`
	answer := `{"id":"cmpl-1","choices":[{"text":"ok"}],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}}`
	var seen atomic.Value
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		seen.Store(fmt.Sprintf("%s %s body=%s len=%d x-client=%s x-hop=%q upgrade=%q host=%s",
			r.Method, r.URL.RequestURI(), body, r.ContentLength, r.Header.Get("X-Client"), r.Header.Get("X-Hop"), r.Header.Get("Upgrade"), r.Host))
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Engine", "1")
		w.Header().Set("Keep-Alive", "timeout=5")
		io.WriteString(w, answer)
	}))
	defer engine.Close()
	a.AddReplica("m", "r1", engineAddr(engine), 0)

	req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/completions?x=1", strings.NewReader(reqBody))
	req.Header.Set("X-Client", "c")
	req.Header.Set("X-Hop", "h")
	req.Header.Set("Connection", "X-Hop, Upgrade")
	req.Header.Set("Upgrade", "websocket")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(got) != answer {
		t.Fatalf("%d %s, want 200 %s", resp.StatusCode, got, answer)
	}
	if resp.ContentLength != int64(len(answer)) || resp.Header.Get("X-Engine") != "1" || resp.Header.Get("Keep-Alive") != "" || resp.Header.Get("X-Stoke-Replica") != "r1" {
		t.Fatalf("length %d, headers %v: want the answer's length, X-Engine, X-Stoke-Replica and no Keep-Alive", resp.ContentLength, resp.Header)
	}
	want := fmt.Sprintf(`POST /v1/completions?x=1 body=%s len=%d x-client=c x-hop="" upgrade="" host=%s`, reqBody, len(reqBody), engineAddr(engine))
	if s, _ := seen.Load().(string); s != want {
		t.Fatalf("the engine saw\n%s\nwant\n%s", s, want)
	}
}

// TestProxyEngineErrorsPassThrough: a 4xx is the engine's answer to give,
// not a failure to retry.
func TestProxyEngineErrorsPassThrough(t *testing.T) {
	a, ts, _ := newTestActivator(t, config.Default())
	var calls atomic.Int32
	const answer = `{"error":{"message":"max_tokens is too large","type":"invalid_request_error","param":"max_tokens","code":null}}`
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, answer)
	}))
	defer engine.Close()
	a.AddReplica("m", "r1", engineAddr(engine), 0)
	resp, body := post(t, ts.URL, `{"model":"m","prompt":"x"}`)
	if resp.StatusCode != 400 || body != answer || calls.Load() != 1 {
		t.Fatalf("%d %s after %d calls, want the engine's 400 once", resp.StatusCode, body, calls.Load())
	}
}

// TestProxyRetriesUnreachable: a replica nobody listens on fails before
// the first byte; the request goes to another.
func TestProxyRetriesUnreachable(t *testing.T) {
	// One retry is enough: it avoids the replica that failed.
	a := New(Options{Resolver: &testResolver{spec: config.Default()}, Retries: 1})
	ts := httptest.NewServer(a)
	defer ts.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`)
	}))
	defer engine.Close()
	a.AddReplica("m", "dead", dead, 0)
	a.AddReplica("m", "good", engineAddr(engine), 0)
	for i := range 20 {
		resp, body := post(t, ts.URL, `{"model":"m","prompt":"x"}`)
		if resp.StatusCode != 200 || body != `{"ok":true}` || resp.Header.Get("X-Stoke-Replica") != "good" {
			t.Fatalf("request %d: %d %s from %q, want the good replica's answer", i, resp.StatusCode, body, resp.Header.Get("X-Stoke-Replica"))
		}
	}
}

// TestProxyEveryReplicaFails: when every try fails before the first byte,
// the client gets a 503 in the OpenAI shape (the engine's 5xx text, quotes
// and all, inside valid JSON).
func TestProxyEveryReplicaFails(t *testing.T) {
	a, ts, _ := newTestActivator(t, config.Default())
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "engine \"draining\"\t\x01", http.StatusServiceUnavailable)
	}))
	defer engine.Close()
	a.AddReplica("m", "r1", engineAddr(engine), 0)
	resp, body := post(t, ts.URL, `{"model":"m","prompt":"x"}`)
	var e openai.ErrorBody
	if err := json.Unmarshal([]byte(body), &e); err != nil || resp.StatusCode != 503 || !strings.Contains(e.Error.Message, `engine "draining"`) {
		t.Fatalf("%d %s (%v): want a 503 in the OpenAI shape naming the engine's error", resp.StatusCode, body, err)
	}
}

// TestProxyStreamBrokenMidway: a replica that dies after its first event
// ends the stream with an OpenAI error event (valid JSON); the request is
// not retried elsewhere.
func TestProxyStreamBrokenMidway(t *testing.T) {
	spec := config.Default()
	a, ts, _ := newTestActivator(t, spec)
	var other atomic.Int32
	dies := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"text\":\"one\"}]}\n\n")
		w.(http.Flusher).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		conn.Close() // mid chunked body
	}))
	defer dies.Close()
	a.AddReplica("m", "dies", engineAddr(dies), 0)
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	// Only now a healthy replica: a retry would have to find it.
	healthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { other.Add(1) }))
	defer healthy.Close()
	a.AddReplica("m", "healthy", engineAddr(healthy), 0)
	events := readEvents(t, resp.Body)
	resp.Body.Close()
	if len(events) != 2 || events[0] != `{"choices":[{"text":"one"}]}` {
		t.Fatalf("events %q: want the first event, then an error", events)
	}
	var e openai.ErrorBody
	if err := json.Unmarshal([]byte(events[1]), &e); err != nil || e.Error.Type != openai.TypeServer || e.Error.Code == nil || *e.Error.Code != "replica_failed" {
		t.Fatalf("last event %s (%v): want an OpenAI server_error with code replica_failed", events[1], err)
	}
	if other.Load() != 0 {
		t.Fatal("a stream that had started was retried on another replica")
	}
}

// TestProxyClientGoneCancelsEngine: a client that goes away mid-stream
// cancels the engine's request, and the replica's slot comes back.
func TestProxyClientGoneCancelsEngine(t *testing.T) {
	a, ts, _ := newTestActivator(t, config.Default())
	cancelled := make(chan struct{})
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for {
			io.WriteString(w, "data: {\"choices\":[{\"text\":\"t\"}]}\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				close(cancelled)
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}))
	defer engine.Close()
	a.AddReplica("m", "r1", engineAddr(engine), 1)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"x","stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q, %v", line, err)
	}
	cancel()
	resp.Body.Close()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine's request was not cancelled after the client went away")
	}
	for a.InFlight("m", "r1") != 0 {
		time.Sleep(time.Millisecond)
	}
	if st, _ := a.deps["m"].pool.BreakerState("r1"); st != BreakerClosed {
		t.Fatalf("breaker %v after the client's own disconnect, want closed", st)
	}
}

func counterValue(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	if m.Histogram != nil {
		return float64(m.Histogram.GetSampleCount())
	}
	return m.GetCounter().GetValue()
}

// TestProxyMetricsFromAnswers: tokens come from the answers' usage and a
// stream's events are counted by their boundaries, whatever the tokens
// say.
func TestProxyMetricsFromAnswers(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := New(Options{Resolver: &testResolver{spec: config.Default()}, Registerer: reg})
	const tricky = `data: x\n\ndata: {\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":100}}`
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "stream") {
			w.Header().Set("Content-Type", "text/event-stream")
			for range 4 {
				fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"%s\"}]}\n\n", tricky)
				w.(http.Flusher).Flush()
				time.Sleep(5 * time.Millisecond) // one event a read: the proxy writes each on its own
			}
			io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,\"total_tokens\":7}}\n\ndata: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"choices":[{"text":"%s"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`, tricky)
	}))
	defer engine.Close()
	a.AddReplica("m", "r1", engineAddr(engine), 0)

	for _, path := range []string{"/v1/completions", "/stream/v1/completions"} {
		w := httptest.NewRecorder()
		a.ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{"model":"m","prompt":"x"}`)))
		if w.Code != 200 || !strings.Contains(w.Body.String(), tricky) {
			t.Fatalf("%s: %d %s", path, w.Code, w.Body)
		}
	}
	m := a.metrics
	for _, c := range []struct {
		name string
		got  prometheus.Metric
		want float64
	}{
		{"prompt tokens", m.tokens.WithLabelValues("m", "prompt"), 8},
		{"completion tokens", m.tokens.WithLabelValues("m", "completion"), 5},
		{"requests answered 200", m.requests.WithLabelValues("m", "200"), 2},
		{"TTFT samples", m.ttfb.WithLabelValues("m").(prometheus.Metric), 2},
		{"TPOT samples (the stream only)", m.tpot.WithLabelValues("m").(prometheus.Metric), 1},
	} {
		if got := counterValue(t, c.got); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	// The gaps between the stream's writes: at least one, fewer than its
	// six events (the network may join some); the plain answer has none.
	if got := counterValue(t, m.itl.WithLabelValues("m").(prometheus.Metric)); got < 1 || got > 5 {
		t.Errorf("ITL samples: %v, want 1 to 5 from the stream alone", got)
	}
}

// TestMidStreamErrorIsJSON: whatever the error says, the event is JSON
// (Go's %q is not: it writes \x01 and \U0001f600 escapes).
func TestMidStreamErrorIsJSON(t *testing.T) {
	msg := "read tcp: \"reset\"\t\x01 \xff \u2028 \U0001f600"
	ev := string(midStreamError(errors.New(msg)))
	data, ok := strings.CutPrefix(ev, "data: ")
	if !ok || !strings.HasSuffix(data, "\n\n") {
		t.Fatalf("%q is not one SSE event", ev)
	}
	var e openai.ErrorBody
	if err := json.Unmarshal([]byte(data), &e); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	if want := "the replica failed mid-stream: " + strings.ToValidUTF8(msg, "\ufffd"); e.Error.Message != want || e.Error.Param != nil {
		t.Fatalf("message %q param %v, want %q and null", e.Error.Message, e.Error.Param, want)
	}
}

// TestProxyStreamHeadersAtOnce: a stream's headers reach the client as
// soon as the engine sends them, before its first event (as the engine
// itself does), so the client knows its request was taken.
func TestProxyStreamHeadersAtOnce(t *testing.T) {
	a, ts, _ := newTestActivator(t, config.Default())
	gotHeaders := make(chan struct{})
	var late atomic.Bool
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select { // the first event only once the client has the headers
		case <-gotHeaders:
		case <-r.Context().Done():
			return
		case <-time.After(10 * time.Second): // no hang if they never come
			late.Store(true)
		}
		io.WriteString(w, "data: {\"choices\":[]}\n\ndata: [DONE]\n\n")
	}))
	defer engine.Close()
	a.AddReplica("m", "r1", engineAddr(engine), 0)
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if late.Load() {
		t.Fatal("the stream's headers reached the client only with its first event")
	}
	close(gotHeaders)
	if ev := readEvents(t, resp.Body); len(ev) != 2 || ev[1] != "[DONE]" || !isEventStream(resp.Header.Get("Content-Type")) {
		t.Fatalf("events %q, content type %q", ev, resp.Header.Get("Content-Type"))
	}
}

// dialSmallWindow dials addr with a tiny receive buffer, so a server
// writing to a client that never reads blocks soon.
func dialSmallWindow(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024) })
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestProxyStalledClientReleasesReplica: a streaming client that never
// reads has its request cancelled once a write to it stalls past the
// stream write deadline: the engine's request is cancelled, the replica's
// only slot is freed and serves the next request.
func TestProxyStalledClientReleasesReplica(t *testing.T) {
	a := New(Options{Resolver: &testResolver{spec: config.Default()}, StreamWriteTimeout: 200 * time.Millisecond})
	ts := httptest.NewServer(a)
	defer ts.Close()
	var cancelled atomic.Int32
	chunk := "data: " + strings.Repeat("x", 8<<10) + "\n\n"
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), `"stream":true`) {
			io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for {
			io.WriteString(w, chunk)
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				cancelled.Add(1)
				return
			case <-time.After(time.Millisecond):
			}
		}
	}))
	defer engine.Close()
	a.AddReplica("m", "r1", engineAddr(engine), 1)

	c := dialSmallWindow(t, strings.TrimPrefix(ts.URL, "http://"))
	body := `{"model":"m","prompt":"x","stream":true}`
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// It never reads. Within the deadline (plus filling the buffers) the
	// engine's request is cancelled and the slot comes back.
	limit := time.Now().Add(30 * time.Second)
	for cancelled.Load() == 0 || a.InFlight("m", "r1") != 0 {
		if time.Now().After(limit) {
			t.Fatalf("a client that stopped reading still holds its replica: engine cancelled %d, in flight %d", cancelled.Load(), a.InFlight("m", "r1"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, got := post(t, ts.URL, `{"model":"m","prompt":"x"}`)
	if resp.StatusCode != http.StatusOK || !strings.Contains(got, "ok") {
		t.Fatalf("next request: %d %s", resp.StatusCode, got)
	}
	if st, _ := a.deps["m"].pool.BreakerState("r1"); st != BreakerClosed {
		t.Fatalf("breaker %v after a client stalled, want closed", st)
	}
}

// TestServeLimits: a body announced past the limit is refused at once,
// without waiting for it; a client's priority stays in the interactive
// band.
func TestServeLimits(t *testing.T) {
	a := New(Options{Resolver: &testResolver{spec: config.Default()}, MaxBodyBytes: 1 << 10})
	ts := httptest.NewServer(a)
	defer ts.Close()

	t.Run("413 before the body", func(t *testing.T) {
		c, err := net.Dial("tcp", strings.TrimPrefix(ts.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// Announces 100 MB, sends one byte and waits: the answer must not
		// wait for the rest.
		io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n{")
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no answer to an over-limit Content-Length: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d, want 413", resp.StatusCode)
		}
	})

	for _, tc := range []struct {
		asked, got int
	}{
		{0, PriorityInteractive},
		{5, 5},
		{-5, -5},
		{math.MaxInt64, PriorityInteractiveMax},
		{math.MinInt64, PriorityInteractiveMin},
		{PrioritySystem, PriorityInteractiveMax},
		{PriorityBatch, PriorityInteractiveMin},
	} {
		if got := ClampClientPriority(tc.asked); got != tc.got {
			t.Errorf("ClampClientPriority(%d) = %d, want %d", tc.asked, got, tc.got)
		}
	}
}

// TestServeClampsPriority: with the replica busy, a request asking for
// the largest priority does not overtake one that waits at the top of the
// interactive band.
func TestServeClampsPriority(t *testing.T) {
	a := New(Options{Resolver: &testResolver{spec: config.Default()}})
	ts := httptest.NewServer(a)
	defer ts.Close()
	gate := make(chan struct{})
	var order []string
	var mu sync.Mutex
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req struct{ Prompt string }
		json.Unmarshal(body, &req)
		if req.Prompt == "busy" {
			<-gate
		}
		mu.Lock()
		order = append(order, req.Prompt)
		mu.Unlock()
		io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
	}))
	defer engine.Close()
	a.AddReplica("m", "r1", engineAddr(engine), 1)
	var wg sync.WaitGroup
	send := func(prompt string, priority int64) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Post(ts.URL+"/v1/completions", "application/json",
				strings.NewReader(fmt.Sprintf(`{"model":"m","prompt":%q,"priority":%d}`, prompt, priority)))
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	waitWaiting := func(n int64) {
		for a.deps["m"] == nil || a.deps["m"].waiting.Load() != n {
			time.Sleep(time.Millisecond)
		}
	}
	send("busy", 0)
	for a.InFlight("m", "r1") != 1 {
		time.Sleep(time.Millisecond)
	}
	send("first", PriorityInteractiveMax)
	waitWaiting(1)
	send("jumper", math.MaxInt64)
	waitWaiting(2)
	close(gate)
	wg.Wait()
	if want := []string{"busy", "first", "jumper"}; fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("served %v, want %v: a client's priority jumped the interactive band", order, want)
	}
}

// TestProxyUsageTrailer: a stream whose client did not ask for usage is
// counted from the engine's usage trailer (which wins over an event's
// usage), and the client gets neither the trailer nor its announcement.
func TestProxyUsageTrailer(t *testing.T) {
	var got Outcome
	a := New(Options{Resolver: &testResolver{spec: config.Default()}, Admit: func(context.Context, http.ResponseWriter, AdmitRequest) (Admitted, *openai.Error) {
		return Admitted{Done: func(o Outcome) { got = o }, Hold: true}, nil
	}})
	ts := httptest.NewServer(a)
	defer ts.Close()
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Trailer", engineapi.UsageTrailer)
		io.WriteString(w, "data: {\"choices\":[{\"text\":\"hi\"}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n")
		w.Header().Set(engineapi.UsageTrailer, `{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10,"prompt_tokens_details":{"cached_tokens":2}}`)
	}))
	defer engine.Close()
	a.AddReplica("m", "r1", engineAddr(engine), 0)
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	events := readEvents(t, resp.Body)
	resp.Body.Close()
	if len(events) != 2 || events[1] != "[DONE]" {
		t.Fatalf("events %q", events)
	}
	if len(resp.Trailer) != 0 || resp.Header.Get("Trailer") != "" {
		t.Fatalf("the client got trailers %v (announced %q)", resp.Trailer, resp.Header.Get("Trailer"))
	}
	u := got.Usage
	if !got.Known || u.PromptTokens != 7 || u.CompletionTokens != 3 || u.PromptTokensDetails == nil || u.PromptTokensDetails.CachedTokens != 2 {
		t.Fatalf("outcome %+v, want the trailer's usage 7/3 with 2 cached", got)
	}
}
