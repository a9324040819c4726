package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/sim"
	"github.com/stokehq/stoke/engine/tokenizer"
)

const (
	testVocab   = 512
	testCtx     = 256
	testBlocks  = 64
	testModel   = "tiny"
	testMaxBody = 16 << 10
)

// testTokenizer is the synthetic Llama-3-style tokenizer whose chat
// template refuses "tool" messages, so tests can reach a template exception.
func testTokenizer(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	tj, tc, err := tokenizer.Synthesize(testVocab, 1)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(tc, &cfg); err != nil {
		t.Fatal(err)
	}
	tmpl, ok := cfg["chat_template"].(string)
	if !ok {
		t.Fatal("synthetic tokenizer_config.json has no chat_template")
	}
	cfg["chat_template"] = `{% for message in messages %}{% if message['role'] == 'tool' %}{{ raise_exception('tool messages are not supported') }}{% endif %}{% endfor %}` + tmpl
	tc, err = json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.New(tj, tc)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// gate lets a test hold the engine between steps without timing: it runs
// the next allow steps (all when negative) and then waits.
type gate struct {
	inner core.Executor
	mu    sync.Mutex
	allow int
}

// set lets n more steps run; negative lets all run.
func (g *gate) set(n int) {
	g.mu.Lock()
	g.allow = n
	g.mu.Unlock()
}

func (g *gate) pass() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.allow == 0 {
		return false
	}
	if g.allow > 0 {
		g.allow--
	}
	return true
}

func (g *gate) Execute(ctx context.Context, step sched.Step, samplers []*sample.Sampler) ([]core.Sampled, error) {
	for !g.pass() {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return g.inner.Execute(ctx, step, samplers)
}

// ScoresPrompts reports what the gated executor does (core.PromptScorer).
func (g *gate) ScoresPrompts() bool {
	ps, ok := g.inner.(core.PromptScorer)
	return ok && ps.ScoresPrompts()
}

// modelLoader loads a random-weight model for any path but "missing"; it
// counts Close calls and exposes the executor gate of the last engine.
type modelLoader struct {
	tok      *tokenizer.Tokenizer // nil: token-id prompts only
	blocks   int                  // KV pool size of each engine
	pool     *kernels.Pool
	closed   atomic.Int32
	mu       sync.Mutex
	lastGate *gate
}

func newModelLoader(t *testing.T, withTokenizer bool) *modelLoader {
	pool := kernels.NewPool(2)
	t.Cleanup(pool.Close)
	ml := &modelLoader{pool: pool, blocks: testBlocks}
	if withTokenizer {
		ml.tok = testTokenizer(t)
	}
	return ml
}

func (ml *modelLoader) gate() *gate {
	ml.mu.Lock()
	defer ml.mu.Unlock()
	return ml.lastGate
}

func (ml *modelLoader) load(ctx context.Context, req engineapi.LoadRequest, progress func(engineapi.LoadProgress)) (*Loaded, error) {
	if req.Path == "missing" {
		return nil, fmt.Errorf("open %s/config.json: %w", req.Path, fs.ErrNotExist)
	}
	progress(engineapi.LoadProgress{Tier: "local", Bytes: 1, TotalBytes: 1})
	mc := model.Config{ModelType: "llama", HiddenSize: 64, IntermediateSize: 128, NumLayers: 2, NumHeads: 4, NumKVHeads: 2,
		HeadDim: 16, VocabSize: testVocab, MaxPositionEmbeddings: 2048, RMSNormEps: 1e-5, RopeTheta: 10000, HiddenAct: "silu", TieWordEmbeddings: true}
	m, err := model.New(mc, model.RandomSource(mc, 3, 0.3), ml.pool)
	if err != nil {
		return nil, err
	}
	var eos []int32
	if ml.tok != nil {
		eos = ml.tok.EOS()
	}
	return &Loaded{
		Name:        testModel,
		Tokenizer:   ml.tok,
		MaxModelLen: testCtx,
		VocabSize:   testVocab,
		Start: func(metrics *core.Metrics) (*core.Engine, error) {
			storage, err := kvcache.New(m.KVShape(), ml.blocks)
			if err != nil {
				return nil, err
			}
			g := &gate{inner: core.NewModelExecutor(m, storage), allow: -1}
			ml.mu.Lock()
			ml.lastGate = g
			ml.mu.Unlock()
			cfg := core.Config{Sched: sched.Config{MaxNumBatchedTokens: 128, MaxNumSeqs: 16, MaxModelLen: testCtx}, EOS: eos}
			return core.New(cfg, kvcache.NewManager(ml.blocks, true), g, ml.tok, metrics)
		},
		Close: func() error { ml.closed.Add(1); return nil },
	}, nil
}

// simLoader serves the 8B H100 sim profile with the synthetic tokenizer
// and a clock that never waits.
func simLoader(t *testing.T) Loader {
	tok := testTokenizer(t)
	return func(ctx context.Context, req engineapi.LoadRequest, _ func(engineapi.LoadProgress)) (*Loaded, error) {
		p, err := sim.LoadProfile(req.Path)
		if err != nil {
			return nil, err
		}
		noWait := func(context.Context, time.Duration) error { return nil }
		return &Loaded{
			Name:        p.Model,
			Tokenizer:   tok,
			MaxModelLen: p.MaxModelLen,
			Start: func(metrics *core.Metrics) (*core.Engine, error) {
				blocks := p.KVCapacityTokens / kvcache.BlockSize
				cfg := core.Config{Sched: sched.Config{MaxNumBatchedTokens: 2048, MaxNumSeqs: p.MaxNumSeqs, MaxModelLen: p.MaxModelLen}, EOS: tok.EOS()}
				return core.New(cfg, kvcache.NewManager(blocks, true), core.NewSimExecutor(p, tok, noWait), tok, metrics)
			},
			Close: func() error { return nil },
		}, nil
	}
}

// fixture is a server behind a real HTTP listener.
type fixture struct {
	srv    *Server
	ts     *httptest.Server
	reg    *prometheus.Registry
	loader *modelLoader
}

// newFixture starts a server; load says which path to load first ("" for
// a blank server).
func newFixture(t *testing.T, loader Loader, load string, opts Options) *fixture {
	t.Helper()
	f := &fixture{reg: prometheus.NewRegistry()}
	opts.Loader, opts.Registry = loader, f.reg
	srv, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = srv
	f.ts = httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		f.ts.CloseClientConnections()
		f.ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	if load != "" {
		if err := srv.Load(context.Background(), engineapi.LoadRequest{Path: load}); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// newModelFixture serves the random-weight model.
func newModelFixture(t *testing.T, withTokenizer bool, opts Options) *fixture {
	ml := newModelLoader(t, withTokenizer)
	f := newFixture(t, ml.load, "model", opts)
	f.loader = ml
	return f
}

// do sends a request and returns the status and body.
func (f *fixture) do(t *testing.T, method, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, f.ts.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := f.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// postJSON posts body and decodes a 200 answer into out.
func (f *fixture) postJSON(t *testing.T, path, body string, out any) {
	t.Helper()
	status, b := f.do(t, http.MethodPost, path, body)
	if status != http.StatusOK {
		t.Fatalf("POST %s: %d %s", path, status, b)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("POST %s: decode %s: %v", path, b, err)
	}
}

func (f *fixture) state(t *testing.T) engineapi.StateInfo {
	t.Helper()
	status, b := f.do(t, http.MethodGet, "/admin/state", "")
	if status != http.StatusOK {
		t.Fatalf("GET /admin/state: %d %s", status, b)
	}
	var st engineapi.StateInfo
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// metric reads one sample of /metrics: name plus its label text, e.g.
// `vllm:request_success_total{finished_reason="abort",model_name="tiny"}`.
// A series that does not exist yet reads as 0.
func (f *fixture) metric(t *testing.T, series string) float64 {
	t.Helper()
	status, b := f.do(t, http.MethodGet, "/metrics", "")
	if status != http.StatusOK {
		t.Fatalf("GET /metrics: %d", status)
	}
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`)
	m := re.FindSubmatch(b)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// sseStream is a raw streamed response read event by event.
type sseStream struct {
	resp   *http.Response
	sc     *bufio.Scanner
	cancel context.CancelFunc
}

// openStream posts a streaming request and checks the 200.
func (f *fixture) openStream(t *testing.T, path, body string) *sseStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.ts.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := f.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		t.Fatalf("POST %s: %d %s", path, resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("stream content type %q", ct)
	}
	s := &sseStream{resp: resp, sc: bufio.NewScanner(resp.Body), cancel: cancel}
	t.Cleanup(s.close)
	return s
}

// next returns the next event's data, or false at the end of the body.
func (s *sseStream) next(t *testing.T) (string, bool) {
	t.Helper()
	for s.sc.Scan() {
		line := s.sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("unexpected SSE line %q", line)
		}
		return data, true
	}
	return "", false
}

func (s *sseStream) close() {
	s.cancel()
	s.resp.Body.Close()
}

// waitFor polls cond until it holds (the engine works asynchronously).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s never happened", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func jsonBody(v any) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(err)
	}
	return buf.String()
}
