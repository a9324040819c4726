package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/internal/openai"
)

func TestLifecycle(t *testing.T) {
	ml := newModelLoader(t, true)
	f := newFixture(t, ml.load, "", Options{})
	type step struct {
		name   string
		path   string // admin POST; "" just checks
		body   string
		status int
		state  engineapi.State
		blocks int // KV blocks the state reports
		health int
		serves bool // a completion succeeds
		closed int32
	}
	steps := []step{
		{name: "blank", state: engineapi.StateBlank, health: 503},
		{name: "load a missing path", path: "/admin/load", body: `{"path":"missing"}`, status: 404, state: engineapi.StateBlank, health: 503},
		{name: "load without path", path: "/admin/load", body: `{}`, status: 400, state: engineapi.StateBlank, health: 503},
		{name: "sleep while blank", path: "/admin/sleep", status: 409, state: engineapi.StateBlank, health: 503},
		{name: "load", path: "/admin/load", body: `{"path":"model"}`, status: 200, state: engineapi.StateReady, blocks: testBlocks, health: 200, serves: true},
		{name: "sleep", path: "/admin/sleep", status: 200, state: engineapi.StateSleeping, health: 503},
		{name: "sleep again", path: "/admin/sleep", status: 409, state: engineapi.StateSleeping, health: 503},
		{name: "wake", path: "/admin/wake", status: 200, state: engineapi.StateReady, blocks: testBlocks, health: 200, serves: true},
		{name: "unload", path: "/admin/unload", status: 200, state: engineapi.StateBlank, health: 503, closed: 1},
		{name: "load again", path: "/admin/load", body: `{"path":"model"}`, status: 200, state: engineapi.StateReady, blocks: testBlocks, health: 200, serves: true, closed: 1},
		{name: "sleep before unload", path: "/admin/sleep", status: 200, state: engineapi.StateSleeping, health: 503, closed: 1},
		{name: "unload", path: "/admin/unload", status: 200, state: engineapi.StateBlank, health: 503, closed: 2},
	}
	for _, s := range steps {
		if s.path != "" {
			if status, b := f.do(t, http.MethodPost, s.path, s.body); status != s.status {
				t.Fatalf("%s: POST %s: %d %s", s.name, s.path, status, b)
			}
		}
		st := f.state(t)
		if st.State != s.state || st.KV.Blocks != s.blocks {
			t.Fatalf("%s: state %+v", s.name, st)
		}
		if (s.state == engineapi.StateBlank) != (st.Model == "") {
			t.Fatalf("%s: state names model %q", s.name, st.Model)
		}
		if st.KV.Usage != 0 || st.Running != 0 || st.Waiting != 0 {
			t.Fatalf("%s: idle server reports load: %+v", s.name, st)
		}
		if status, _ := f.do(t, http.MethodGet, "/health", ""); status != s.health {
			t.Fatalf("%s: /health %d, want %d", s.name, status, s.health)
		}
		status, b := f.do(t, http.MethodPost, "/v1/completions", `{"prompt":"hi","max_tokens":3}`)
		if s.serves != (status == http.StatusOK) {
			t.Fatalf("%s: completion %d %s", s.name, status, b)
		}
		if !s.serves {
			var body openai.ErrorBody
			if status != http.StatusServiceUnavailable || json.Unmarshal(b, &body) != nil || body.Error.Message == "" {
				t.Fatalf("%s: completion while not ready: %d %s", s.name, status, b)
			}
			if status, _ := f.do(t, http.MethodGet, "/v1/models", ""); status != http.StatusServiceUnavailable {
				t.Fatalf("%s: /v1/models %d while not ready", s.name, status)
			}
		}
		if got := ml.closed.Load(); got != s.closed {
			t.Fatalf("%s: weights closed %d times, want %d", s.name, got, s.closed)
		}
	}
}

func TestModelsAndTokenize(t *testing.T) {
	f := newModelFixture(t, true, Options{})
	var models openai.ModelList
	status, b := f.do(t, http.MethodGet, "/v1/models", "")
	if status != 200 || json.Unmarshal(b, &models) != nil || len(models.Data) != 1 || models.Data[0].ID != testModel ||
		models.Data[0].MaxModelLen != testCtx || models.Object != "list" {
		t.Fatalf("/v1/models: %d %s", status, b)
	}
	for _, tc := range []struct {
		body string
		want []int32
	}{
		{`{"prompt":"Once upon a time"}`, f.loader.tok.Encode("Once upon a time", true)},
		{`{"prompt":"Once upon a time","add_special_tokens":false}`, f.loader.tok.Encode("Once upon a time", false)},
	} {
		var tk openai.TokenizeResponse
		f.postJSON(t, "/tokenize", tc.body, &tk)
		if fmt.Sprint(tk.Tokens) != fmt.Sprint(tc.want) || tk.Count != len(tc.want) || tk.MaxModelLen != testCtx {
			t.Fatalf("tokenize %s: %+v, want %v", tc.body, tk, tc.want)
		}
		var dt openai.DetokenizeResponse
		f.postJSON(t, "/detokenize", jsonBody(map[string]any{"tokens": tk.Tokens}), &dt)
		if !strings.HasSuffix(dt.Prompt, "Once upon a time") {
			t.Fatalf("detokenize: %q", dt.Prompt)
		}
	}
}

func TestLogprobs(t *testing.T) {
	f := newModelFixture(t, true, Options{})
	var cmpl openai.CompletionResponse
	f.postJSON(t, "/v1/completions", `{"prompt":"Once","max_tokens":5,"temperature":0,"ignore_eos":true,"logprobs":2}`, &cmpl)
	lp := cmpl.Choices[0].Logprobs
	if lp == nil || len(lp.Tokens) != 5 || len(lp.TokenLogprobs) != 5 || len(lp.TopLogprobs) != 5 || len(lp.TextOffset) != 5 {
		t.Fatalf("completion logprobs: %+v", lp)
	}
	for i, top := range lp.TopLogprobs {
		if lp.TokenLogprobs[i] == nil {
			t.Fatalf("token %d: null logprob without echo", i)
		}
		// Greedy: the chosen token is the most likely one.
		chosen := *lp.TokenLogprobs[i]
		best := chosen
		for _, v := range top {
			best = max(best, v)
		}
		if len(top) < 1 || len(top) > 3 || best != chosen || chosen > 0 {
			t.Fatalf("token %d: logprob %v, top %v", i, chosen, top)
		}
	}
	var chat openai.ChatCompletionResponse
	f.postJSON(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0,"ignore_eos":true,"logprobs":true,"top_logprobs":3}`, &chat)
	clp := chat.Choices[0].Logprobs
	if clp == nil || len(clp.Content) != 4 {
		t.Fatalf("chat logprobs: %+v", clp)
	}
	for _, c := range clp.Content {
		if len(c.TopLogprobs) != 3 || c.TopLogprobs[0].Logprob != c.Logprob || !tokenMatchesBytes(c.Token, c.Bytes) {
			t.Fatalf("chat token logprob %+v", c)
		}
		for _, alt := range c.TopLogprobs {
			if !tokenMatchesBytes(alt.Token, alt.Bytes) {
				t.Fatalf("chat top logprob %+v", alt)
			}
		}
	}
	var plain openai.ChatCompletionResponse
	f.postJSON(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, &plain)
	if plain.Choices[0].Logprobs != nil {
		t.Fatal("logprobs returned without being asked for")
	}
}

var vllmMetricNames = []string{
	"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
	"vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:time_to_first_token_seconds",
	"vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
	"vllm:prompt_tokens_total", "vllm:generation_tokens_total",
}

func TestMetrics(t *testing.T) {
	f := newModelFixture(t, true, Options{})
	f.do(t, http.MethodPost, "/v1/completions", `{"prompt":"Once upon a time","max_tokens":4,"ignore_eos":true}`)
	status, b := f.do(t, http.MethodGet, "/metrics", "")
	if status != 200 {
		t.Fatalf("/metrics: %d", status)
	}
	for _, name := range vllmMetricNames {
		if !strings.Contains(string(b), "\n"+name+"{") && !strings.Contains(string(b), "\n"+name+"_bucket{") {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if got := f.metric(t, `vllm:generation_tokens_total{model_name="tiny"}`); got != 4 {
		t.Fatalf("generation tokens %v, want 4", got)
	}
	// The series outlive a sleep/wake cycle: counters keep counting.
	for _, p := range []string{"/admin/sleep", "/admin/wake"} {
		if status, b := f.do(t, http.MethodPost, p, ""); status != 200 {
			t.Fatalf("%s: %d %s", p, status, b)
		}
	}
	f.do(t, http.MethodPost, "/v1/completions", `{"prompt":"Once upon a time","max_tokens":3,"ignore_eos":true}`)
	if got := f.metric(t, `vllm:generation_tokens_total{model_name="tiny"}`); got != 7 {
		t.Fatalf("generation tokens after wake %v, want 4+3", got)
	}
}

// streamBody asks for a long greedy stream.
const streamBody = `{"prompt":"Once upon a time","max_tokens":200,"temperature":0,"ignore_eos":true,"stream":true}`

func TestCancelledStreamsFreeKV(t *testing.T) {
	f := newModelFixture(t, true, Options{})
	usage := `vllm:kv_cache_usage_perc{model_name="tiny"}`
	aborted := `vllm:request_success_total{finished_reason="abort",model_name="tiny"}`
	base, abortsBefore := f.metric(t, usage), f.metric(t, aborted)
	g := f.loader.gate()
	g.set(0) // hold the engine: the streams are queued, nothing finishes by itself
	var streams []*sseStream
	for range 4 {
		streams = append(streams, f.openStream(t, "/v1/completions", streamBody))
	}
	g.set(2) // prefill and a first decode step, then hold again
	waitFor(t, "4 running streams holding KV blocks", func() bool {
		st := f.state(t)
		return st.Running == 4 && st.KV.Usage > base
	})
	for _, s := range streams {
		s.close() // the client goes away mid-stream
	}
	waitFor(t, "handlers noticing the disconnects", func() bool {
		f.srv.mu.Lock()
		defer f.srv.mu.Unlock()
		return f.srv.active == 0
	})
	g.set(-1)
	waitFor(t, "KV usage back to baseline", func() bool {
		return f.metric(t, usage) == base && f.state(t).Running == 0
	})
	if got := f.metric(t, aborted) - abortsBefore; got != 4 {
		t.Fatalf("%v requests aborted, want 4", got)
	}
}

func TestShutdownFinishesInFlight(t *testing.T) {
	f := newModelFixture(t, true, Options{})
	g := f.loader.gate()
	g.set(0) // the stream stays in flight until the shutdown has begun
	s := f.openStream(t, "/v1/chat/completions",
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":60,"temperature":0,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}`)
	if data, ok := s.next(t); !ok || !strings.Contains(data, `"role":"assistant"`) {
		t.Fatalf("first chunk %q", data)
	}
	done := make(chan error, 1)
	go func() {
		// No drain deadline of its own: on a loaded machine (the race pass
		// over every package) a fixed one ran out before the gate opened,
		// and a drain that never ends still fails at the test's timeout.
		done <- f.srv.Shutdown(t.Context())
	}()
	waitFor(t, "new requests refused", func() bool {
		status, _ := f.do(t, http.MethodPost, "/v1/completions", `{"prompt":"hi","max_tokens":2}`)
		return status == http.StatusServiceUnavailable
	})
	if status, _ := f.do(t, http.MethodGet, "/health", ""); status != http.StatusServiceUnavailable {
		t.Fatalf("/health %d while draining", status)
	}
	g.set(-1)
	var finish string
	var usage *openai.Usage
	var last string
	for {
		data, ok := s.next(t)
		if !ok {
			break
		}
		last = data
		if data == "[DONE]" {
			continue
		}
		var ch openai.ChatCompletionChunk
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("chunk %s: %v", data, err)
		}
		if ch.Usage != nil {
			usage = ch.Usage
		}
		if len(ch.Choices) > 0 && ch.Choices[0].FinishReason != nil {
			finish = *ch.Choices[0].FinishReason
		}
	}
	if finish != "length" || usage == nil || usage.CompletionTokens != 60 || last != "[DONE]" {
		t.Fatalf("in-flight stream during shutdown: finish %q, usage %+v, last event %q", finish, usage, last)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := f.state(t); st.State != engineapi.StateDraining || st.Model != "" {
		t.Fatalf("state after shutdown %+v", st)
	}
	if f.loader.closed.Load() != 1 {
		t.Fatal("shutdown did not release the weights")
	}
}

func TestSleepCutsStreamsWithError(t *testing.T) {
	f := newModelFixture(t, true, Options{DrainTimeout: time.Millisecond})
	f.loader.gate().set(0) // the stream cannot finish before the drain times out
	s := f.openStream(t, "/v1/completions", streamBody)
	if status, b := f.do(t, http.MethodPost, "/admin/sleep", ""); status != 200 {
		t.Fatalf("sleep: %d %s", status, b)
	}
	var events []string
	for {
		data, ok := s.next(t)
		if !ok {
			break
		}
		events = append(events, data)
	}
	n := len(events)
	if n < 2 || events[n-1] != "[DONE]" || !strings.HasPrefix(events[n-2], `{"error":`) {
		t.Fatalf("stream cut by sleep ended with %q", events[max(0, n-3):])
	}
	for _, e := range events[:n-2] {
		if strings.Contains(e, `"finish_reason":"`) {
			t.Fatalf("cut stream reported a finish reason: %s", e)
		}
	}
	if st := f.state(t); st.State != engineapi.StateSleeping || st.KV.Blocks != 0 {
		t.Fatalf("state %+v", st)
	}
}

func TestUnixSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "stoke")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "engine.sock")
	// A stale socket file, as a crashed server leaves it.
	stale, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	ln, err := Listen("unix://" + path)
	if err != nil {
		t.Fatal(err)
	}
	ml := newModelLoader(t, true)
	srv, err := New(Options{Loader: ml.load})
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Handler()}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close(); srv.Shutdown(context.Background()) })
	if _, err := Listen("unix://" + path); err == nil {
		t.Fatal("a second listener on a live socket was allowed")
	}
	regular := filepath.Join(dir, "file")
	os.WriteFile(regular, nil, 0o600)
	if _, err := Listen("unix://" + regular); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("listen on a regular file: %v", err)
	}
	if err := srv.Load(context.Background(), engineapi.LoadRequest{Path: "model"}); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}}
	resp, err := client.Post("http://engine/v1/completions", "application/json",
		strings.NewReader(`{"prompt":"Once","max_tokens":3,"ignore_eos":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var cmpl openai.CompletionResponse
	if err := json.NewDecoder(resp.Body).Decode(&cmpl); err != nil || resp.StatusCode != 200 || cmpl.Usage.CompletionTokens != 3 {
		t.Fatalf("completion over unix socket: %d %+v %v", resp.StatusCode, cmpl, err)
	}
}

func TestListenTCP(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0", "tcp://127.0.0.1:0"} {
		ln, err := Listen(addr)
		if err != nil {
			t.Fatal(err)
		}
		ln.Close()
	}
	if _, err := Listen("unix://"); err == nil {
		t.Fatal("empty socket path accepted")
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Fatal("no loader accepted")
	}
	if _, err := New(Options{Loader: func(context.Context, engineapi.LoadRequest, func(engineapi.LoadProgress)) (*Loaded, error) {
		return nil, errors.New("x")
	}, MaxBodyBytes: -1}); err == nil {
		t.Fatal("negative body limit accepted")
	}
}

func TestDefaultMaxTokensFitsKVPool(t *testing.T) {
	ml := newModelLoader(t, true)
	ml.blocks = 8 // 128 tokens, half the context
	f := newFixture(t, ml.load, "model", Options{})
	var chat openai.ChatCompletionResponse
	f.postJSON(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"temperature":0,"ignore_eos":true}`, &chat)
	if u := chat.Usage; u.PromptTokens+u.CompletionTokens != 8*16 || chat.Choices[0].FinishReason != "length" {
		t.Fatalf("chat without max_tokens on a 128-token pool: %+v", chat)
	}
	checkErrorCases(t, f, []errorCase{{name: "explicit max_tokens past the pool", path: "/v1/completions",
		body: `{"prompt":"hi","max_tokens":200}`, status: 400, param: "max_tokens", message: "KV cache"}})
}

// TestStreamUsageTrailer: every stream ends with its usage in the
// Stoke-Usage trailer, asked for or not, and only a stream that asked has
// the usage chunk among its events.
func TestStreamUsageTrailer(t *testing.T) {
	f := newModelFixture(t, true, Options{})
	for _, tc := range []struct {
		name, options string
		chunk         bool
	}{
		{"not asked", ``, false},
		{"include_usage", `,"stream_options":{"include_usage":true}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := f.openStream(t, "/v1/completions", `{"prompt":"Once upon a time","max_tokens":7,"temperature":0,"ignore_eos":true,"stream":true`+tc.options+`}`)
			chunk := false
			for {
				data, ok := s.next(t)
				if !ok {
					break
				}
				chunk = chunk || strings.Contains(data, `"usage":{`)
			}
			if chunk != tc.chunk {
				t.Fatalf("usage chunk in the events: %v, want %v", chunk, tc.chunk)
			}
			var u openai.Usage
			if err := json.Unmarshal([]byte(s.resp.Trailer.Get(engineapi.UsageTrailer)), &u); err != nil {
				t.Fatalf("trailer %q: %v", s.resp.Trailer.Get(engineapi.UsageTrailer), err)
			}
			if u.CompletionTokens != 7 || u.PromptTokens == 0 || u.TotalTokens != u.PromptTokens+7 {
				t.Fatalf("trailer usage %+v, want 7 completion tokens and the prompt's", u)
			}
		})
	}
}
