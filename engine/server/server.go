// Package server is the engine's HTTP server: the OpenAI-compatible
// /v1/completions, /v1/chat/completions and /v1/models, vLLM's /tokenize,
// /detokenize and /metrics, /health, and the /admin endpoints that move a
// model through blank → loading → ready ⇄ sleeping → blank. It owns the
// engine loop of the loaded model and never lets a request touch an
// engine that is not ready.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/tokenizer"
	"github.com/stokehq/stoke/internal/openai"
)

// Loaded is a model ready to serve: weights resident, an engine startable
// on a fresh KV pool.
type Loaded struct {
	// Name is the served model name (the /v1/models id).
	Name string
	// Tokenizer encodes text prompts and decodes output; nil means the
	// model takes token-id prompts only.
	Tokenizer   *tokenizer.Tokenizer
	MaxModelLen int
	// VocabSize bounds the token ids a request may carry; 0 means the
	// tokenizer's vocabulary (and no upper bound without a tokenizer).
	VocabSize int
	// Start builds an engine with a fresh KV pool; the server runs
	// engine.Run in a goroutine it owns.
	Start func(metrics *core.Metrics) (*core.Engine, error)
	// Close releases the weights.
	Close func() error
	// Adapters are the LoRA adapters served over the model; nil when
	// LoRA is off. Close closes it.
	Adapters *core.AdapterPool
}

// Loader turns a LoadRequest into a Loaded model, reporting progress
// through progress (which may be called from any goroutine).
type Loader func(ctx context.Context, req engineapi.LoadRequest, progress func(engineapi.LoadProgress)) (*Loaded, error)

// Options configure a Server.
type Options struct {
	// Loader loads the model /admin/load and Load name.
	Loader Loader
	// Registry receives the engine's vllm:* series and is served at
	// /metrics; nil makes a new one. A model's series live from its load
	// to its unload, across sleep and wake.
	Registry *prometheus.Registry
	// MaxBodyBytes limits request bodies (413 past it); 0 means 8 MiB.
	MaxBodyBytes int64
	// DrainTimeout bounds how long sleep and unload wait for requests in
	// flight before aborting them; 0 waits as long as the caller's context.
	DrainTimeout time.Duration
	// KernelSet names the CPU kernel set the engine computes with
	// ("avx512", "avx2", "generic"); when set, Registry gets
	// stoke_engine_kernels{set="…"} 1 for as long as the server lives.
	KernelSet string
}

const defaultMaxBodyBytes = 8 << 20

// Server serves one model at a time over HTTP.
type Server struct {
	opts    Options
	reg     *prometheus.Registry
	metrics *core.Metrics // series of the loaded model, kept across sleep and wake
	log     *slog.Logger
	handler http.Handler
	// op admits one lifecycle operation at a time (Load, sleep, wake,
	// unload, Shutdown); it is a channel so Shutdown can wait with a context.
	op chan struct{}

	mu       sync.Mutex
	state    engineapi.State
	model    *Loaded
	eng      *engineRun
	active   int // requests holding the engine (acquire without release)
	shutdown bool
	progress *engineapi.LoadProgress // the current or last load
}

// engineRun is an engine and the loop goroutine the server runs for it.
type engineRun struct {
	engine *core.Engine
	cancel context.CancelFunc
	done   chan struct{}
}

// New returns a blank server.
func New(opts Options) (*Server, error) {
	if opts.Loader == nil {
		return nil, errors.New("new engine server: Options.Loader is required")
	}
	if opts.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("new engine server: Options.MaxBodyBytes must not be negative, got %d", opts.MaxBodyBytes)
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = defaultMaxBodyBytes
	}
	s := &Server{opts: opts, reg: opts.Registry, log: slog.Default().With("component", "engine-server"),
		op: make(chan struct{}, 1), state: engineapi.StateBlank}
	if s.reg == nil {
		s.reg = prometheus.NewRegistry()
	}
	if opts.KernelSet != "" {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "stoke_engine_kernels",
			Help: "The CPU kernel set the engine computes with (1 on the set's series).", ConstLabels: prometheus.Labels{"set": opts.KernelSet}})
		g.Set(1)
		if err := s.reg.Register(g); err != nil {
			return nil, fmt.Errorf("new engine server: register stoke_engine_kernels: %w", err)
		}
	}
	s.handler = s.routes()
	return s, nil
}

// Handler serves the HTTP API.
func (s *Server) Handler() http.Handler { return s.handler }

// Load loads the model req names and starts its engine: blank → loading →
// ready. A server that already holds a model refuses with a 409
// *openai.Error.
func (s *Server) Load(ctx context.Context, req engineapi.LoadRequest) error {
	if err := s.begin(engineapi.StateLoading, engineapi.StateBlank); err != nil {
		return err
	}
	defer s.end()
	s.setProgress(engineapi.LoadProgress{Request: req})
	l, err := s.opts.Loader(ctx, req, func(p engineapi.LoadProgress) {
		p.Request = req
		s.setProgress(p)
	})
	if err == nil && l == nil {
		err = errors.New("loader returned no model")
	}
	if err == nil {
		err = checkLoaded(l)
		if err == nil {
			err = preloadAdapters(ctx, l)
		}
		if err != nil {
			s.closeModel(l)
		}
	}
	if err != nil {
		s.failProgress(err)
		s.settle(engineapi.StateBlank)
		return fmt.Errorf("load model from %s: %w", req, err)
	}
	s.mu.Lock()
	s.model = l
	s.mu.Unlock()
	if err := s.startEngine(l); err != nil {
		s.mu.Lock()
		s.model = nil
		s.mu.Unlock()
		s.closeModel(l)
		s.failProgress(err)
		s.settle(engineapi.StateBlank)
		return fmt.Errorf("load model from %s: %w", req, err)
	}
	s.mu.Lock()
	s.progress.Done = true
	s.mu.Unlock()
	s.settle(engineapi.StateReady)
	s.log.Info("model loaded", "model", l.Name, "from", req.String())
	return nil
}

func (s *Server) setProgress(p engineapi.LoadProgress) {
	s.mu.Lock()
	p.Done = false
	s.progress = &p
	s.mu.Unlock()
}

func (s *Server) failProgress(err error) {
	s.mu.Lock()
	if s.progress != nil {
		s.progress.Done, s.progress.Error = true, err.Error()
	}
	s.mu.Unlock()
}

func checkLoaded(l *Loaded) error {
	switch {
	case l.Name == "":
		return errors.New("loaded model has no name")
	case l.MaxModelLen < 1:
		return fmt.Errorf("loaded model %s has max model length %d", l.Name, l.MaxModelLen)
	case l.Start == nil:
		return fmt.Errorf("loaded model %s has no Start function", l.Name)
	}
	return nil
}

// Sleep drains the engine and stops its loop so the KV pool is freed;
// the weights stay loaded: ready → draining → sleeping.
func (s *Server) Sleep(ctx context.Context) error {
	if err := s.begin(engineapi.StateDraining, engineapi.StateReady); err != nil {
		return err
	}
	defer s.end()
	s.stopEngine(ctx)
	s.settle(engineapi.StateSleeping)
	s.log.Info("model asleep", "model", s.modelName())
	return nil
}

// Wake starts a fresh engine for the sleeping model: sleeping → loading →
// ready.
func (s *Server) Wake(ctx context.Context) error {
	if err := s.begin(engineapi.StateLoading, engineapi.StateSleeping); err != nil {
		return err
	}
	defer s.end()
	s.mu.Lock()
	l := s.model
	s.mu.Unlock()
	if err := s.startEngine(l); err != nil {
		s.settle(engineapi.StateSleeping)
		return fmt.Errorf("wake model %s: %w", l.Name, err)
	}
	s.settle(engineapi.StateReady)
	s.log.Info("model awake", "model", l.Name)
	return nil
}

// Unload stops the engine (as Sleep does) and releases the weights:
// ready or sleeping → draining → blank.
func (s *Server) Unload(ctx context.Context) error {
	if err := s.begin(engineapi.StateDraining, engineapi.StateReady, engineapi.StateSleeping); err != nil {
		return err
	}
	defer s.end()
	s.stopEngine(ctx)
	s.mu.Lock()
	l := s.model
	s.model = nil
	s.mu.Unlock()
	err := s.closeModel(l)
	s.settle(engineapi.StateBlank)
	s.log.Info("model unloaded", "model", l.Name)
	return err
}

// Shutdown is the SIGTERM path: new requests get 503 from now on, requests
// in flight may finish until ctx ends, then the engine loop stops (ending
// what is left) and the weights are released. It returns ctx's error when
// requests were cut short.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.shutdown = true
	s.state = engineapi.StateDraining
	s.mu.Unlock()
	waitErr := s.waitIdle(ctx)
	select {
	case s.op <- struct{}{}:
	case <-ctx.Done():
		// An operation (a load) is still running; it sees the shutdown
		// flag and leaves the state alone. Stop what is there.
		s.stopEngineNow()
		return fmt.Errorf("shut down engine server: %w", ctx.Err())
	}
	defer s.end()
	s.stopEngineNow()
	s.mu.Lock()
	l := s.model
	s.model = nil
	s.mu.Unlock()
	closeErr := s.closeModel(l)
	if waitErr != nil {
		return fmt.Errorf("shut down engine server: %w", waitErr)
	}
	return closeErr
}

// waitIdle waits until no request holds the engine.
func (s *Server) waitIdle(ctx context.Context) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		s.mu.Lock()
		n := s.active
		s.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// begin starts a lifecycle operation: the server must be in one of from;
// it moves to the transitional state to.
func (s *Server) begin(to engineapi.State, from ...engineapi.State) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown {
		return openai.Unavailable("the engine server is shutting down")
	}
	ok := false
	for _, f := range from {
		ok = ok || s.state == f
	}
	if !ok {
		if to == engineapi.StateLoading && s.model != nil && (s.state == engineapi.StateReady || s.state == engineapi.StateSleeping) && from[0] == engineapi.StateBlank {
			return openai.Conflict("a model (%s) is already loaded; unload it first", s.model.Name)
		}
		return openai.Conflict("the engine server is %s, not %s", s.state, joinStates(from))
	}
	select {
	case s.op <- struct{}{}:
	default:
		return openai.Conflict("another operation is in progress")
	}
	s.state = to
	return nil
}

func joinStates(states []engineapi.State) string {
	parts := make([]string, len(states))
	for i, st := range states {
		parts[i] = string(st)
	}
	return strings.Join(parts, " or ")
}

// settle sets the state an operation ends in, unless Shutdown took over.
func (s *Server) settle(st engineapi.State) {
	s.mu.Lock()
	if !s.shutdown {
		s.state = st
	}
	s.mu.Unlock()
}

func (s *Server) end() { <-s.op }

func (s *Server) modelName() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.model == nil {
		return ""
	}
	return s.model.Name
}

func (s *Server) closeModel(l *Loaded) error {
	if s.metrics != nil {
		s.metrics.Unregister(s.reg)
		s.metrics = nil
	}
	if l == nil || l.Close == nil {
		return nil
	}
	if err := l.Close(); err != nil {
		return fmt.Errorf("release weights of %s: %w", l.Name, err)
	}
	return nil
}

// startEngine builds l's engine and starts its loop.
func (s *Server) startEngine(l *Loaded) error {
	if s.metrics == nil {
		s.metrics = core.NewMetrics(s.reg, l.Name)
	}
	e, err := l.Start(s.metrics)
	if err != nil {
		return fmt.Errorf("start engine: %w", err)
	}
	if e == nil {
		return errors.New("start engine: Start returned no engine")
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &engineRun{engine: e, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		if err := e.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			s.log.Error("engine loop stopped", "model", l.Name, "err", err)
		}
	}()
	s.mu.Lock()
	if s.shutdown {
		s.mu.Unlock()
		cancel()
		<-r.done
		return errors.New("start engine: the server is shutting down")
	}
	s.eng = r
	s.mu.Unlock()
	return nil
}

// stopEngine lets requests in flight finish (up to DrainTimeout and ctx)
// and then stops the loop, which ends whatever is left.
func (s *Server) stopEngine(ctx context.Context) {
	s.mu.Lock()
	r := s.eng
	s.mu.Unlock()
	if r == nil {
		return
	}
	dctx := ctx
	if s.opts.DrainTimeout > 0 {
		var cancel context.CancelFunc
		dctx, cancel = context.WithTimeout(ctx, s.opts.DrainTimeout)
		defer cancel()
	}
	if err := r.engine.Drain(dctx); err != nil {
		s.log.Warn("engine drain cut short; aborting requests in flight", "err", err)
	}
	s.stopEngineNow()
}

// stopEngineNow stops the loop at once and forgets the engine.
func (s *Server) stopEngineNow() {
	s.mu.Lock()
	r := s.eng
	s.eng = nil
	s.mu.Unlock()
	if r == nil {
		return
	}
	r.cancel()
	<-r.done
}

// acquire hands a request the ready model and its engine; release must
// follow. Anything but ready is a 503.
func (s *Server) acquire() (*Loaded, *core.Engine, *openai.Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != engineapi.StateReady || s.eng == nil {
		switch s.state {
		case engineapi.StateBlank:
			return nil, nil, openai.Unavailable("no model is loaded")
		case engineapi.StateDraining:
			return nil, nil, openai.Unavailable("the engine is draining and admits no new requests")
		}
		return nil, nil, openai.Unavailable("the engine is %s, not ready", s.state)
	}
	s.active++
	return s.model, s.eng.engine, nil
}

// admit lets an API request in: the engine must be ready, the body must
// decode into req, and *model (a field of req) must name the loaded model.
// When ok is false the error response is written; otherwise the caller
// must call s.release when done.
func (s *Server) admit(c *gin.Context, req any, model *string) (l *Loaded, eng *core.Engine, ok bool) {
	l, eng, e := s.acquire()
	if e != nil {
		writeError(c, e)
		return nil, nil, false
	}
	if e = s.decodeRequest(c, req); e == nil {
		e = checkModel(l, *model)
	}
	if e == nil {
		e = checkPromptSize(l, req)
	}
	if e != nil {
		s.release()
		writeError(c, e)
		return nil, nil, false
	}
	return l, eng, true
}

func (s *Server) release() {
	s.mu.Lock()
	s.active--
	s.mu.Unlock()
}

// Info reports the server's state.
func (s *Server) Info() engineapi.StateInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	info := engineapi.StateInfo{State: s.state}
	if s.progress != nil {
		p := *s.progress
		info.Load = &p
	}
	if s.model != nil {
		info.Model = s.model.Name
	}
	if s.eng != nil {
		st := s.eng.engine.Stats()
		info.KV = engineapi.KVInfo{Blocks: st.KVBlocks, Usage: st.KVUsage}
		info.Running, info.Waiting = st.Running, st.Waiting
	}
	return info
}

// Listen opens addr: "host:port" (or "tcp://host:port") or
// "unix:///path/to.sock". A stale socket file no server answers on is
// removed first.
func Listen(addr string) (net.Listener, error) {
	if path, ok := strings.CutPrefix(addr, "unix://"); ok {
		if path == "" {
			return nil, fmt.Errorf("listen on %s: empty socket path", addr)
		}
		if fi, err := os.Lstat(path); err == nil {
			if fi.Mode()&os.ModeSocket == 0 {
				return nil, fmt.Errorf("listen on %s: %s exists and is not a socket", addr, path)
			}
			if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
				c.Close()
				return nil, fmt.Errorf("listen on %s: another server is listening there", addr)
			}
			if err := os.Remove(path); err != nil {
				return nil, fmt.Errorf("listen on %s: remove stale socket: %w", addr, err)
			}
		}
		ln, err := net.Listen("unix", path)
		if err != nil {
			return nil, fmt.Errorf("listen on %s: %w", addr, err)
		}
		return ln, nil
	}
	ln, err := net.Listen("tcp", strings.TrimPrefix(addr, "tcp://"))
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return ln, nil
}
