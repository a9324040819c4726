// Package activator is the request data path: it resolves a request's
// model to a deployment, picks a ready replica with room (prefix affinity
// bounded by load, else least in-flight by two random choices), and
// proxies the request to its engine with streaming passthrough. When no
// replica has room the request waits in the deployment's bounded,
// priority-ordered buffer and the scaler is poked at once. A replica that
// fails before the first byte is retried on another; a circuit breaker
// per replica keeps a failing one out of rotation.
package activator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/openai"
)

// Resolver maps a model name to its deployment.
type Resolver interface {
	// Lookup returns the deployment's revision and spec.
	Lookup(name string) (revision string, spec config.Spec, ok bool)
	// Poke asks the scaler to decide about a deployment now.
	Poke(name string)
}

// FailedResolver is a Resolver that also knows deployments whose revision
// failed to load for good: their requests are answered at once with a 503
// carrying the reason, instead of waiting out the buffer for a replica
// that will never come.
type FailedResolver interface {
	// Failed reports whether the deployment's revision failed, and why.
	Failed(name string) (reason string, failed bool)
}

// RefreshingResolver is a Resolver whose view can trail the deployments'
// source (a fleet follower's, by up to a sync): before a request for a
// name it does not know is answered 404, Refresh brings the view up to
// date, so a deployment just created elsewhere resolves at once.
type RefreshingResolver interface {
	// Refresh updates what Lookup knows, or returns when ctx ends.
	Refresh(ctx context.Context)
}

// Options configure an Activator.
type Options struct {
	Resolver Resolver
	// MaxBodyBytes limits request bodies (default 8 MiB).
	MaxBodyBytes int64
	// Retries is how many other replicas a request that failed before
	// its first byte tries (default 2).
	Retries int
	// LeastInFlight turns prefix affinity off: replicas are picked by
	// least in-flight alone (two random choices).
	LeastInFlight bool
	// StreamWriteTimeout bounds each write (and flush) of an answer to the
	// client: a client that stops reading for this long has its request
	// cancelled, the engine's included, and its replica slot freed. A
	// stream may run for minutes; only a stalled write fails. Default 30s;
	// negative turns it off.
	StreamWriteTimeout time.Duration
	// Authorize, when set, may refuse a request's model before anything
	// else (the key's model scope); its error is the answer.
	Authorize func(ctx context.Context, model string) *openai.Error
	// Admit, when set, admits each request of a known model before it
	// waits for a replica (the tenancy's rate limits), and hears how it
	// ended.
	Admit Admit
	// ProviderBreaker configures the circuit breakers of the routes'
	// external providers (the defaults: BreakerOptions').
	ProviderBreaker BreakerOptions
	// CallerOf, when set, says who sends a request (its tenant and key
	// class), for the routes' tenant and tier rules.
	CallerOf func(ctx context.Context) Caller
	// AdapterSlots is how many LoRA adapters each engine holds at once
	// (its --max-loras), for adapter affinity; default
	// DefaultAdapterSlots.
	AdapterSlots int
	// Registerer, when set, receives the activator's stoke_* series.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// DefaultStreamWriteTimeout is Options.StreamWriteTimeout when unset.
const DefaultStreamWriteTimeout = 30 * time.Second

// Activator routes requests to the replicas of deployments.
type Activator struct {
	opts    Options
	log     *slog.Logger
	tr      Transports
	metrics *Metrics

	mu   sync.RWMutex
	deps map[string]*route
	// routes is the routes in effect (RouteBook sets them); nil: none.
	routes atomic.Pointer[routeTable]
	// canaries is the deployments' canaries (SetCanary); nil: none.
	canaries atomic.Pointer[canaryTable]
}

// route is one deployment's routing state.
type route struct {
	pool     *Pool
	buffer   *Buffer
	mu       sync.RWMutex
	addrs    map[string]string // replica id → engine address
	inflight atomic.Int64
	waiting  atomic.Int64
	arrivals atomic.Int64 // requests ever received
	// latency sums the durations of answered requests, for their mean.
	latencySum, latencyN atomic.Int64
	// tokens counts the prompt and completion tokens of its answers.
	tokens atomic.Int64

	// queueWait holds recent buffer waits, for the scaler's queue-wait
	// signal.
	queueWait queueWaits
	// batch is the batch requests holding room on replicas.
	batch batchSet
	// adapters is which adapters each replica's engine was told of.
	adapters adapterRegistry
}

// New returns an activator.
func New(opts Options) *Activator {
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 8 << 20
	}
	if opts.Retries <= 0 {
		opts.Retries = 2
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.StreamWriteTimeout == 0 {
		opts.StreamWriteTimeout = DefaultStreamWriteTimeout
	}
	a := &Activator{opts: opts, log: opts.Logger.With("component", "activator"), deps: map[string]*route{}, metrics: NewMetrics(opts.Registerer)}
	if opts.StreamWriteTimeout > 0 {
		a.tr.WriteTimeout = opts.StreamWriteTimeout
	}
	a.metrics.registerGauges(opts.Registerer, a)
	return a
}

// Traffic reports a deployment's requests received so far (a counter) and
// the mean duration of those answered, for the scaler's forecaster.
func (a *Activator) Traffic(deployment string) (arrivals int64, meanLatency time.Duration) {
	r, ok := a.existing(deployment)
	if !ok {
		return 0, 0
	}
	if n := r.latencyN.Load(); n > 0 {
		meanLatency = time.Duration(r.latencySum.Load() / n)
	}
	return r.arrivals.Load(), meanLatency
}

// Tokens returns the prompt and completion tokens a deployment's answers
// carried so far (a counter), for the operating cost per token.
func (a *Activator) Tokens(deployment string) int64 {
	r, ok := a.existing(deployment)
	if !ok {
		return 0
	}
	return r.tokens.Load()
}

// QueueWaitP90 is the 90th percentile of how long a deployment's requests
// waited in its buffer for a replica, over the requests whose wait ended
// within its stable window (spec.Window), counting only waiting for the
// replicas routable at the time (see queueWaits); 0 when there was none.
// It is the scaler's queue-wait signal, read at the scaler's cadence.
func (a *Activator) QueueWaitP90(deployment string) time.Duration {
	r, ok := a.existing(deployment)
	if !ok {
		return 0
	}
	_, spec, _ := a.opts.Resolver.Lookup(deployment)
	p90, _ := r.queueWait.p90(time.Now(), time.Duration(spec.Window))
	return p90
}

// existing returns a deployment's routing state, if it has one yet.
func (a *Activator) existing(deployment string) (*route, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	r, ok := a.deps[deployment]
	return r, ok
}

// routeFor returns a deployment's routing state, creating it.
func (a *Activator) routeFor(name string, spec config.Spec) *route {
	r, ok := a.existing(name)
	if ok {
		if r.buffer.Cap() != spec.Buffer.Capacity {
			r.buffer.SetCap(spec.Buffer.Capacity)
		}
		return r
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if r, ok = a.deps[name]; !ok {
		r = &route{addrs: map[string]string{}}
		r.buffer = NewBufferWithOptions(BufferOptions{Capacity: spec.Buffer.Capacity, OnQueued: func(priority int) {
			// An interactive request waiting takes its room back from batch
			// work: the newest batch request goes back to its runner.
			if !IsBatch(priority) {
				r.batch.preemptNewest(PreemptInteractive)
			}
			a.opts.Resolver.Poke(name)
		}})
		r.pool = NewPool(PoolOptions{OnFree: func(n int) { r.buffer.Notify(n) }, Prefix: PrefixOptions{Disabled: a.opts.LeastInFlight},
			AdapterSlots: a.opts.AdapterSlots})
		a.deps[name] = r
	}
	return r
}

// AddReplica makes a ready replica routable and wakes buffered requests.
func (a *Activator) AddReplica(deployment, id, addr string, capacity int) {
	_, spec, _ := a.opts.Resolver.Lookup(deployment)
	r := a.routeFor(deployment, spec)
	r.mu.Lock()
	r.addrs[id] = addr
	r.mu.Unlock()
	if err := r.pool.Add(id, capacity); err != nil {
		a.log.Warn("add replica", "deployment", deployment, "replica", id, "err", err)
		return
	}
	r.queueWait.grow(time.Now())
}

// RemoveReplica stops routing to a replica and waits until its requests
// in flight are done or ctx ends.
func (a *Activator) RemoveReplica(ctx context.Context, deployment, id string) {
	r, ok := a.existing(deployment)
	if !ok {
		return
	}
	if drained, ok := r.pool.Remove(id); ok {
		select {
		case <-drained:
		case <-ctx.Done():
			return
		}
	}
	r.mu.Lock()
	addr := r.addrs[id]
	delete(r.addrs, id)
	r.mu.Unlock()
	r.adapters.forget(id)
	a.tr.Forget(addr)
}

// InFlight is the requests in flight on one replica of a deployment.
func (a *Activator) InFlight(deployment, id string) int {
	r, ok := a.existing(deployment)
	if !ok {
		return 0
	}
	return r.pool.InFlight(id)
}

// Concurrency is a deployment's requests in flight plus those buffered.
func (a *Activator) Concurrency(deployment string) float64 {
	r, ok := a.existing(deployment)
	if !ok {
		return 0
	}
	return float64(r.inflight.Load() + r.waiting.Load())
}

// inferenceRequest is what the activator reads of a request body.
type inferenceRequest struct {
	Model    string          `json:"model"`
	Prompt   json.RawMessage `json:"prompt"`
	Messages json.RawMessage `json:"messages"`
	Priority int             `json:"priority"`
	// MaxTokens and MaxCompletionTokens bound the answer, for admission.
	MaxTokens           *int `json:"max_tokens"`
	MaxCompletionTokens *int `json:"max_completion_tokens"`
}

// maxTokens is the max_tokens (or max_completion_tokens) asked for; 0 when
// none was.
func (ir *inferenceRequest) maxTokens() int {
	switch {
	case ir.MaxTokens != nil:
		return *ir.MaxTokens
	case ir.MaxCompletionTokens != nil:
		return *ir.MaxCompletionTokens
	}
	return 0
}

// ServeHTTP serves /v1/completions and /v1/chat/completions. A client's
// priority is kept in the interactive band (ClampClientPriority).
func (a *Activator) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	a.handle(w, req, nil)
}

// ServeAt answers a request the platform makes itself, in-process, at a
// priority no client may ask for (PriorityBatch for the batch runner's
// lines). It returns an error wrapping ErrPreempted (a *Preempted saying
// why) when the request was cut short to give its room back; what was
// written to w then is not an answer.
func (a *Activator) ServeAt(priority int, w http.ResponseWriter, req *http.Request) error {
	return a.handle(w, req, &priority)
}

// handle answers one request, at priority when set, and records it.
func (a *Activator) handle(w http.ResponseWriter, req *http.Request, priority *int) error {
	start := time.Now()
	rec := &recorder{ResponseWriter: w}
	model, r, err := a.serve(rec, req, priority)
	if rec.done != nil {
		u, known := rec.usage.result()
		o := Outcome{Status: rec.status, Usage: u, Known: known && rec.status == http.StatusOK, Duration: time.Since(start),
			Route: rec.route, Served: rec.served, Fallbacks: rec.fallbacks}
		if !rec.first.IsZero() {
			o.TTFT = rec.first.Sub(start)
		}
		rec.done(o)
	}
	rec.release()
	if r != nil && rec.status == http.StatusOK && !rec.queued && err == nil {
		r.latencySum.Add(int64(time.Since(start)))
		r.latencyN.Add(1)
	}
	if u, ok := rec.usage.result(); r != nil && ok {
		r.tokens.Add(int64(u.PromptTokens + u.CompletionTokens))
	}
	a.metrics.observe(model, rec, start)
	return err
}

// serve answers one request and returns its deployment's name and route
// (empty and nil when the model is unknown), and the cause when it was
// preempted.
func (a *Activator) serve(rec *recorder, req *http.Request, priority *int) (string, *route, error) {
	w := http.ResponseWriter(rec)
	if req.ContentLength > a.opts.MaxBodyBytes { // refused before any of it is read
		writeError(w, openai.BodyTooLarge(a.opts.MaxBodyBytes), 0)
		return "", nil, nil
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, a.opts.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, openai.BodyTooLarge(a.opts.MaxBodyBytes), 0)
		} else { // the client stopped sending (the server's read timeout) or went away
			writeError(w, &openai.Error{Status: http.StatusRequestTimeout, Type: openai.TypeInvalidRequest, Code: "request_timeout",
				Message: "reading the request body failed: " + err.Error()}, 0)
		}
		return "", nil, nil
	}
	var ir inferenceRequest
	if e := openai.Decode(body, &ir); e != nil {
		writeError(w, e, 0)
		return "", nil, nil
	}
	if ir.Model == "" {
		writeError(w, openai.InvalidRequest("model", "model is required"), 0)
		return "", nil, nil
	}
	// A name pinning a revision is its deployment's as far as the key's
	// scope, admission and the engine are concerned.
	pool, named, pinned := a.pinned(ir.Model)
	if !pinned {
		named = ir.Model
	}
	if a.opts.Authorize != nil {
		if e := a.opts.Authorize(req.Context(), named); e != nil {
			writeError(w, e, 0)
			return "", nil, nil
		}
	}
	var via *compiledRoute
	dep := pool
	if pinned {
		if pool == "" {
			writeError(w, openai.ModelNotFound(ir.Model), 0)
			return "", nil, nil
		}
		if body, err = withModel(body, named); err != nil {
			writeError(w, openai.InvalidRequest("", "request body must be a JSON object"), 0)
			return "", nil, nil
		}
	} else {
		// A route resolves to the deployment it picks for this request,
		// and brings its fallback chain.
		via, dep = a.routes.Load().resolve(ir.Model, &requestFacts{promptTokens: (len(ir.Prompt) + len(ir.Messages)) / promptTokenBytes,
			maxTokens: ir.maxTokens(), text: func() string { return lastUserText(&ir) }, caller: a.callerOf(req.Context()), header: req.Header}, randIntN)
	}
	var adapter *engineapi.LoadAdapterRequest
	if via == nil {
		var known bool
		if dep, adapter, known = a.resolveName(req.Context(), dep); !known {
			writeError(w, openai.ModelNotFound(ir.Model), 0)
			return "", nil, nil
		}
	}
	if priority != nil {
		ir.Priority = *priority
	} else {
		// A client stays in the interactive band (and its key's class, set
		// by admission, replaces what it asked for).
		ir.Priority = ClampClientPriority(ir.Priority)
	}
	// The admission check sets its own headers (Retry-After, the limits'),
	// and prices the request by the deployment the route chose.
	var refused *openai.Error
	var flow Flow
	if body, flow, refused = a.admit(rec, req, &ir, a.canaries.Load().deployment(dep), body); refused != nil {
		writeError(w, refused, 0)
		return "", nil, nil
	}
	// The engine schedules by the priority decided here, not the body's.
	req.Header.Set(engineapi.PriorityHeader, strconv.Itoa(ir.Priority))
	chain := []string{dep}
	if via != nil {
		chain = append(chain, via.fallbacks...)
		rec.route = via.name
	}
	for i, target := range chain {
		last := i == len(chain)-1
		hop := &hop{ir: &ir, flow: flow, body: body, last: last, adapter: adapter}
		if via != nil {
			if hop.body, err = withModel(body, target); err != nil {
				writeError(w, openai.InvalidRequest("", "request body must be a JSON object"), 0)
				return "", nil, nil
			}
		}
		var r *route
		var reason string
		if p := a.routes.Load().provider(target); p != nil {
			rec.itl = a.metrics.itlOf(target)
			reason = a.serveProvider(rec, req, hop, p)
		} else {
			deployment := target
			if via != nil { // a route may target an adapter
				if base, ad := a.adapterOf(target); ad != nil {
					deployment, hop.adapter = base, ad
				}
			}
			pool := deployment
			if !pinned { // a deployment's canary takes its share
				pool = a.canaries.Load().split(deployment, randIntN)
			}
			rec.itl = a.metrics.itlOf(pool)
			r, reason, err = a.serveDeployment(rec, req, hop, pool, via)
		}
		if reason == "" {
			rec.served, rec.fallbacks = target, i
			return target, r, err
		}
		if last {
			return target, r, nil
		}
		a.metrics.fallbacks(via.name, target, chain[i+1], reason)
		a.log.Info("falling back", "route", via.name, "from", target, "to", chain[i+1], "reason", reason)
	}
	return "", nil, nil // not reached: the last target answers
}

// adapterName is the name of the adapter the hop applies; "" for none.
func (h *hop) adapterName() string {
	if h.adapter == nil {
		return ""
	}
	return h.adapter.Name
}

// resolveName resolves a model name that no route picked: a deployment,
// or an adapter of one ("BASE:ADAPTER"), whose deployment it returns with
// the adapter. A name the resolver does not know is tried again after a
// refresh where the resolver can trail its source (RefreshingResolver),
// before it is called unknown.
func (a *Activator) resolveName(ctx context.Context, name string) (string, *engineapi.LoadAdapterRequest, bool) {
	for refreshed := false; ; refreshed = true {
		if _, _, ok := a.opts.Resolver.Lookup(name); ok {
			return name, nil, true
		}
		if dep, ad := a.adapterOf(name); ad != nil {
			return dep, ad, true
		}
		rr, ok := a.opts.Resolver.(RefreshingResolver)
		if refreshed || !ok {
			return name, nil, false
		}
		rr.Refresh(ctx)
	}
}

// adapterOf resolves "BASE:ADAPTER" to BASE's deployment and the adapter
// its engines load; ad is nil when name is no adapter of a deployment.
func (a *Activator) adapterOf(name string) (deployment string, ad *engineapi.LoadAdapterRequest) {
	ar, ok := a.opts.Resolver.(AdapterResolver)
	if !ok {
		return name, nil
	}
	base, adapter, ok := engineapi.SplitAdapterModel(name)
	if !ok {
		return name, nil
	}
	if _, _, known := a.opts.Resolver.Lookup(base); !known {
		return name, nil
	}
	req, ok := ar.Adapter(base, adapter)
	if !ok {
		return name, nil
	}
	return base, &req
}

// hop is one target's try at a request.
type hop struct {
	ir   *inferenceRequest
	flow Flow
	body []byte // with the target's model name
	// last is set on the chain's last target, which answers whatever
	// happens; the others answer only a request they serve.
	last bool
	// adapter is the LoRA adapter the request applies; nil for none.
	adapter *engineapi.LoadAdapterRequest
}

// Why a target did not serve a request, for its route's next one
// (stoke_fallbacks_total's reason).
const (
	reasonNoCapacity = "no_capacity"
	reasonFailed     = "failed"
	reasonUnknown    = "unknown"
	reasonBufferFull = "buffer_full"
	reasonBreaker    = "breaker_open"
	reasonTooLong    = "context_length"
	reasonShed       = "shed"
)

// serveDeployment serves a request on one deployment: it waits for a
// replica with room (until the deployment's buffer timeout, or, when a
// route has a target after it, the route's fallback_after), proxies, and
// retries other replicas on a failure before the first byte. It returns
// reason "" once the request was answered (or the client left), else why
// the next target should try; the last target answers that reason too.
func (a *Activator) serveDeployment(rec *recorder, req *http.Request, h *hop, name string, via *compiledRoute) (*route, string, error) {
	w := http.ResponseWriter(rec)
	ir, flow := h.ir, h.flow
	revision, spec, ok := a.opts.Resolver.Lookup(name)
	if !ok {
		if h.last {
			writeError(w, openai.ModelNotFound(name), 0)
		}
		return nil, reasonUnknown, nil
	}
	if fr, ok := a.opts.Resolver.(FailedResolver); ok {
		if reason, failed := fr.Failed(name); failed {
			if h.last {
				writeError(w, &openai.Error{Status: http.StatusServiceUnavailable, Type: openai.TypeUnavailable, Code: "revision_failed",
					Message: "model " + name + " is unavailable: its revision failed to load: " + reason}, 0)
			}
			return nil, reasonFailed, nil
		}
	}
	r := a.routeFor(name, spec)
	r.arrivals.Add(1)
	body := h.body
	if !spec.Speculative { // the deployment's default, unless the request says
		var err error
		if body, err = withDefault(body, "speculative", json.RawMessage("false")); err != nil {
			if h.last {
				writeError(w, openai.InvalidRequest("", "request body must be a JSON object"), 0)
			}
			return r, reasonUnknown, nil
		}
	}
	key := ir.Prompt
	if len(ir.Messages) > 0 {
		key = ir.Messages
	}
	ctx := req.Context()
	var batch *batchRequest
	if IsBatch(ir.Priority) {
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
		batch = &batchRequest{cancel: cancel}
	}
	wait := time.Duration(spec.Buffer.Timeout)
	if !h.last {
		wait = min(wait, via.fallbackAfter)
	}
	deadline := time.Now().Add(wait)
	var failed []string // replicas that failed this request before its first byte
	for {
		var id string
		var release ReleaseFunc
		r.waiting.Add(1)
		asked := time.Now()
		ticket, err := r.buffer.AcquireFlow(ctx, ir.Priority, flow, deadline, func() Room {
			var room Room
			id, release, room = r.pool.PickAdapter(flow.ID, h.adapterName(), key, failed...)
			return room
		})
		r.waiting.Add(-1)
		if ticket.Queued {
			rec.queued = true
		}
		if err != nil {
			switch {
			case errors.Is(err, ErrBufferFull):
				if h.last {
					writeError(w, &openai.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "buffer_full",
						Message: "model " + name + " has too many requests waiting for a replica; retry shortly"}, 1)
				}
				return r, reasonBufferFull, nil
			case errors.Is(err, ErrShed):
				if h.last {
					writeError(w, &openai.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "shed",
						Message: "model " + name + " is overloaded: this request gave its place to one of a higher priority; retry shortly"}, 1)
				}
				return r, reasonShed, nil
			case errors.Is(err, ErrDeadline):
				r.queueWait.add(time.Now(), time.Since(asked), time.Duration(spec.Window))
				if h.last {
					writeError(w, &openai.Error{Status: http.StatusServiceUnavailable, Type: openai.TypeUnavailable, Code: "no_replica",
						Message: "no replica of " + name + " became available in time; retry shortly"}, 5)
				}
				return r, reasonNoCapacity, nil
			}
			return r, "", nil // the client went away
		}
		r.queueWait.add(time.Now(), ticket.Waited, time.Duration(spec.Window))
		r.mu.RLock()
		addr := r.addrs[id]
		r.mu.RUnlock()
		r.inflight.Add(1)
		w.Header().Set("X-Stoke-Replica", id)
		w.Header().Set(DeploymentHeader, a.canaries.Load().deployment(name))
		if revision != "" {
			w.Header().Set(RevisionHeader, revision)
		}
		if batch != nil {
			batch.replica, batch.started = id, time.Now()
			r.batch.add(batch)
		}
		var used *openai.Usage
		if h.adapter != nil {
			err = a.ensureAdapter(ctx, r, id, addr, *h.adapter)
			var refused *openai.Error
			if errors.As(err, &refused) {
				if batch != nil {
					r.batch.remove(batch)
				}
				r.inflight.Add(-1)
				release(nil)
				w.Header().Del("X-Stoke-Replica")
				w.Header().Del(DeploymentHeader)
				w.Header().Del(RevisionHeader)
				writeError(w, refused, 0)
				return r, "", nil
			}
			if err != nil {
				err = fmt.Errorf("%w: %w", errNotStarted, err)
			}
		}
		if err == nil {
			used, err = a.tr.forward(ctx, &a.tr.proxy(addr).rp, req, body, w, !h.last)
		}
		if used != nil {
			rec.usage.counted = used
		}
		if batch != nil {
			r.batch.remove(batch)
		}
		r.inflight.Add(-1)
		if ctx.Err() != nil || errors.Is(err, errClient) || errors.Is(err, errTooLong) {
			release(nil) // the client's doing, not the replica's
		} else {
			release(err)
		}
		if errors.Is(err, errTooLong) && ctx.Err() == nil {
			w.Header().Del("X-Stoke-Replica")
			w.Header().Del(DeploymentHeader)
			w.Header().Del(RevisionHeader)
			return r, reasonTooLong, nil
		}
		if err == nil || !errors.Is(err, errNotStarted) || ctx.Err() != nil {
			if err != nil && ctx.Err() == nil {
				a.log.Warn("request failed mid-stream", "model", name, "replica", id, "err", err)
			}
			return r, "", preempted(ctx)
		}
		failed = append(failed, id)
		a.log.Warn("replica failed before the first byte; retrying elsewhere", "model", name, "replica", id, "err", err)
		if len(failed) > a.opts.Retries {
			if h.last {
				writeError(w, openai.Unavailable("every replica tried for %s failed: %v", name, err), 1)
			}
			w.Header().Del("X-Stoke-Replica")
			w.Header().Del(DeploymentHeader)
			w.Header().Del(RevisionHeader)
			return r, reasonFailed, nil
		}
	}
}

// serveProvider sends a request to an external provider through its
// breaker; reason is as serveDeployment's.
func (a *Activator) serveProvider(rec *recorder, req *http.Request, h *hop, p *provider) string {
	w := http.ResponseWriter(rec)
	unavailable := func(format string, args ...any) {
		if h.last {
			writeError(w, openai.Unavailable(format, args...), 5)
		}
	}
	if !p.breaker.admits(time.Now().UnixNano()) {
		unavailable("provider %s is failing; retry shortly", p.name)
		return reasonBreaker
	}
	done, err := p.breaker.allow()
	if err != nil {
		unavailable("provider %s is failing; retry shortly", p.name)
		return reasonBreaker
	}
	body, err := withModel(h.body, p.model)
	if err != nil {
		done(nil)
		unavailable("request for provider %s: %v", p.name, err)
		return reasonFailed
	}
	w.Header().Set(DeploymentHeader, p.name)
	used, err := a.tr.forward(req.Context(), &p.rp, req, body, w, false)
	if used != nil {
		rec.usage.counted = used
	}
	switch {
	case req.Context().Err() != nil || errors.Is(err, errClient):
		done(nil)
		return ""
	case err != nil && errors.Is(err, errNotStarted):
		done(err)
		w.Header().Del(DeploymentHeader)
		a.log.Warn("provider failed before the first byte", "provider", p.name, "err", err)
		unavailable("provider %s failed: %v", p.name, err)
		return reasonFailed
	}
	done(err)
	return ""
}

// DeploymentHeader names, on an answer, the deployment (or provider) that
// served it.
const DeploymentHeader = "X-Stoke-Deployment"

// preempted is the cause of ctx's end when it was a preemption, else nil.
func preempted(ctx context.Context) error {
	if cause := context.Cause(ctx); errors.Is(cause, ErrPreempted) {
		return cause
	}
	return nil
}

// writeError writes e in the OpenAI shape, with Retry-After when set.
func writeError(w http.ResponseWriter, e *openai.Error, retryAfter int) {
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	json.NewEncoder(w).Encode(e.Body())
}
