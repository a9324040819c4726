// Package core is the engine loop: it admits requests, asks the scheduler
// for each step, has an Executor (the model or the sim) compute it, and
// turns sampled tokens into streamed text, stopping on EOS, stop strings
// or max_tokens. One goroutine runs the loop; any goroutine may submit and
// abort.
package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/tokenizer"
)

// Executor computes scheduler steps.
type Executor interface {
	// Execute computes step and returns, aligned with step.Work, the token
	// sampled for every work item with Sample set, using samplers (also
	// aligned with step.Work; nil where Sample is unset), and for a
	// PromptScorer the logprobs of the prompt tokens each work item scores.
	Execute(ctx context.Context, step sched.Step, samplers []*sample.Sampler) ([]Sampled, error)
}

// PromptScorer is an Executor that can score prompts: for work items of a
// request with sched.Request.ScorePrompt set, its Execute fills
// Sampled.PromptLogprobs. Submit refuses requests with Params.PromptLogprobs
// unless the engine's executor is one and ScoresPrompts is true (a wrapper
// reports what the executor it wraps does).
type PromptScorer interface {
	Executor
	ScoresPrompts() bool
}

// ErrNoPromptLogprobs is returned by Submit for a request that asks for
// prompt logprobs on an engine whose executor computes no logits (the sim).
var ErrNoPromptLogprobs = errors.New("this engine computes no prompt logprobs: its executor has no model logits")

// releaser is implemented by executors that keep per-request state.
type releaser interface {
	Release(r *sched.Request)
}

// Sampled is what one work item of a step produced: the token sampled
// for it, and the logprobs of the prompt tokens it scored.
type Sampled struct {
	ID       int32
	Logprobs *sample.Logprobs
	// PromptLogprobs score, for a request with sched.Request.ScorePrompt,
	// the prompt tokens PromptFirst, PromptFirst+1, … from the logits of
	// the positions before them that the work item computed.
	PromptLogprobs []sample.Logprobs
	// PromptFirst is the index in the prompt of the token
	// PromptLogprobs[0] scores (at least 1: the first token has no
	// position before it).
	PromptFirst int
	// Spec is the outcome of a work item with drafts (a DraftVerifier
	// fills it; ID and Logprobs are then its first token's): nil for others.
	Spec *Verified
}

// Params describe one generation request.
type Params struct {
	Prompt []int32
	// MaxTokens bounds the generated tokens; 0 only computes the prompt
	// (scoring it, with PromptLogprobs), ending with FinishLength and no
	// token.
	MaxTokens int
	Sampling  sample.Params
	// StopIDs end the request (the model's EOS tokens are added unless
	// IgnoreEOS); Stop strings end it when the text contains them.
	StopIDs   []int32
	Stop      []string
	IgnoreEOS bool
	// SkipSpecial leaves special tokens out of the text.
	SkipSpecial bool
	Priority    int
	CacheSalt   string
	// PromptLogprobs asks for the logprob of every prompt token after the
	// first (Delta.PromptLogprobs), with Sampling.Logprobs alternatives
	// each (none when it is negative), computed from the model's logits
	// as a sampled token's are. The whole prompt is then computed: the
	// prefix cache supplies none of it. It needs a PromptScorer executor.
	PromptLogprobs bool
	// DisableSpeculation keeps the request out of speculative decoding
	// on an engine that speculates (Config.Spec): it then decodes one
	// token per step.
	DisableSpeculation bool
	// Adapter names the LoRA adapter (registered in Config.Adapters) the
	// request runs with; "" runs the base model.
	Adapter string
}

// Config sets up an engine.
type Config struct {
	Sched sched.Config
	// EOS are the model's end-of-sequence ids.
	EOS []int32
	// Spec turns on speculative decoding; it needs a DraftVerifier.
	Spec SpecConfig
	// Adapters serves LoRA adapters (Params.Adapter) from its slots; nil
	// turns LoRA off. It needs an AdapterBinder executor.
	Adapters *AdapterPool
}

// ErrDraining is returned by Submit once Drain has begun.
var ErrDraining = errors.New("engine is draining")

// Engine runs requests on one model.
type Engine struct {
	cfg     Config
	kv      *kvcache.Manager
	sched   *sched.Scheduler
	exec    Executor
	tok     *tokenizer.Tokenizer
	metrics *Metrics
	spec    *speculator // nil without speculative decoding

	mu       sync.Mutex
	inbox    []*request
	aborts   []string
	draining bool
	wake     chan struct{}
	nextID   atomic.Uint64
	inflight atomic.Int64 // submitted and not yet ended

	live        map[string]*request // loop-owned
	adapterWait []*request          // loop-owned: requests waiting for an adapter slot, in order
	ran         atomic.Bool         // Run was called; it closes the executor when it returns
	stats       atomic.Pointer[Stats]
	steps       atomic.Uint64
	preemptions atomic.Uint64
}

// request is the loop's state for one submitted request.
type request struct {
	sreq    *sched.Request
	params  Params
	sampler *sample.Sampler
	detok   *tokenizer.StreamDecoder
	stops   *sample.StopMatcher
	stream  *Stream
	arrived time.Time
	lastTok time.Time
	// prompt collects the logprobs of the prompt tokens scored so far
	// (Params.PromptLogprobs): prompt[i] scores token i+1. It goes to the
	// stream whole, once every token is scored, and promptSent is set.
	prompt     []sample.Logprobs
	promptSent bool
	// lora is the request's hold on its adapter (nil: the base model).
	lora *adapterUse
}

// Stats is a snapshot of the engine's load, updated after every step.
type Stats struct {
	Running, Waiting int
	KVUsage          float64
	KVBlocks         int
	PrefixQueries    int64
	PrefixHits       int64
	Steps            uint64
	// Preemptions counts requests that lost their KV blocks to recompute.
	Preemptions uint64
}

// New returns an engine; tok may be nil for a model without a tokenizer
// (requests then carry token ids only), metrics may be nil.
func New(cfg Config, kv *kvcache.Manager, exec Executor, tok *tokenizer.Tokenizer, metrics *Metrics) (*Engine, error) {
	s, err := sched.New(cfg.Sched, kv)
	if err != nil {
		return nil, err
	}
	if err := checkAdapterExecutor(cfg, exec); err != nil {
		return nil, err
	}
	if cfg.Adapters != nil && metrics != nil {
		metrics.lora.pool.Store(cfg.Adapters)
	}
	e := &Engine{cfg: cfg, kv: kv, sched: s, exec: exec, tok: tok, metrics: metrics,
		wake: make(chan struct{}, 1), live: map[string]*request{}}
	if e.spec, err = newSpeculator(cfg.Spec, cfg.Sched, exec, kv.NumBlocks()); err != nil {
		return nil, err
	}
	e.publish()
	return e, nil
}

// Submit queues a request and returns its output stream. Requests that can
// never run (empty prompt, past the context or the KV pool) are refused
// here; sampling parameters must already be valid.
func (e *Engine) Submit(p Params) (*Stream, error) {
	id := "req-" + strconv.FormatUint(e.nextID.Add(1), 10)
	sreq := &sched.Request{ID: id, Prompt: p.Prompt, MaxTokens: p.MaxTokens, Priority: p.Priority, CacheSalt: p.CacheSalt,
		ScorePrompt: p.PromptLogprobs, PromptTopLogprobs: max(p.Sampling.Logprobs, 0)}
	if p.PromptLogprobs && !e.scoresPrompts() {
		return nil, ErrNoPromptLogprobs
	}
	if err := sched.Validate(e.cfg.Sched, e.kv.NumBlocks(), sreq); err != nil {
		return nil, err
	}
	if err := p.Sampling.Validate(); err != nil {
		return nil, err
	}
	lora, err := e.useAdapter(p, sreq)
	if err != nil {
		return nil, err
	}
	r := &request{sreq: sreq, params: p, sampler: sample.New(p.Sampling), stream: newStream(id), arrived: time.Now(), lora: lora}
	if !p.IgnoreEOS {
		r.params.StopIDs = append(slices.Clone(p.StopIDs), e.cfg.EOS...)
	}
	if e.tok != nil {
		r.detok = e.tok.NewStreamDecoder(p.SkipSpecial)
	}
	r.stops = sample.NewStopMatcher(p.Stop)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.draining {
		e.dropAdapter(r)
		return nil, ErrDraining
	}
	e.inbox = append(e.inbox, r)
	e.inflight.Add(1)
	e.signal()
	return r.stream, nil
}

// scoresPrompts reports whether the executor fills Sampled.PromptLogprobs.
func (e *Engine) scoresPrompts() bool {
	ps, ok := e.exec.(PromptScorer)
	return ok && ps.ScoresPrompts()
}

// Abort cancels a request; its KV blocks are freed before the next step.
func (e *Engine) Abort(id string) {
	e.mu.Lock()
	e.aborts = append(e.aborts, id)
	e.mu.Unlock()
	e.signal()
}

func (e *Engine) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Stats returns the snapshot taken after the last step.
func (e *Engine) Stats() Stats { return *e.stats.Load() }

func (e *Engine) publish() {
	q, h := e.kv.PrefixStats()
	s := &Stats{Running: e.sched.NumRunning(), Waiting: e.sched.NumWaiting() + len(e.adapterWait), KVUsage: e.kv.Usage(),
		KVBlocks: e.kv.NumBlocks(), PrefixQueries: q, PrefixHits: h, Steps: e.steps.Load(), Preemptions: e.preemptions.Load()}
	e.stats.Store(s)
	if e.metrics != nil {
		e.metrics.observeStats(s)
	}
}

// Run is the engine loop. It returns when ctx ends, after ending every
// request it still holds and closing the executor (freeing its KV pool),
// so an engine runs once.
func (e *Engine) Run(ctx context.Context) (err error) {
	if e.ran.Swap(true) {
		return errors.New("engine: Run called again; an engine runs once")
	}
	defer func() { err = errors.Join(err, e.closeExecutor(), e.spec.close()) }()
	defer e.abortAll()
	for {
		e.admit()
		if e.sched.NumRunning()+e.sched.NumWaiting() == 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-e.wake:
				continue
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		e.propose()
		step := e.sched.Schedule()
		if len(step.Work) == 0 {
			select { // nothing fits this step; wait for a change
			case <-ctx.Done():
				return ctx.Err()
			case <-e.wake:
			case <-time.After(time.Millisecond):
			}
			continue
		}
		e.runStep(ctx, step)
	}
}

// closeExecutor frees what an executor holds once the loop is done.
func (e *Engine) closeExecutor() error {
	if c, ok := e.exec.(interface{ Close() error }); ok {
		if err := c.Close(); err != nil {
			return fmt.Errorf("engine: close executor: %w", err)
		}
	}
	return nil
}

// admit moves submitted requests into the scheduler and applies aborts.
func (e *Engine) admit() {
	e.mu.Lock()
	inbox, aborts := e.inbox, e.aborts
	e.inbox, e.aborts = nil, nil
	e.mu.Unlock()
	for _, r := range e.adapterReady(inbox) {
		if err := e.sched.Add(r.sreq); err != nil {
			delete(e.live, r.sreq.ID)
			e.dropAdapter(r)
			r.stream.finish("", FinishError, Usage{}, err)
			e.inflight.Add(-1)
			continue
		}
		e.live[r.sreq.ID] = r
	}
	for _, id := range aborts {
		if r, ok := e.live[id]; ok {
			e.end(r, FinishAbort, "", nil)
		}
	}
	if len(inbox)+len(aborts) > 0 {
		e.publish()
	}
}

func (e *Engine) runStep(ctx context.Context, step sched.Step) {
	samplers := make([]*sample.Sampler, len(step.Work))
	for i, w := range step.Work {
		if w.Sample {
			samplers[i] = e.live[w.Req.ID].sampler
		}
	}
	out, err := e.exec.Execute(ctx, step, samplers)
	e.steps.Add(1)
	e.preemptions.Add(uint64(len(step.Preempted)))
	if err != nil {
		for _, w := range step.Work {
			if r, ok := e.live[w.Req.ID]; ok {
				e.end(r, FinishError, "", fmt.Errorf("engine step: %w", err))
			}
		}
		e.publish()
		return
	}
	ids := make([]int32, len(step.Work))
	for i, s := range out {
		ids[i] = s.ID
	}
	e.sched.Commit(step, ids)
	now := time.Now()
	for i, w := range step.Work {
		r := e.live[w.Req.ID]
		if r == nil {
			continue
		}
		if r.params.PromptLogprobs {
			r.scored(out[i])
		}
		switch {
		case w.Sample && out[i].Spec != nil:
			e.emitVerified(r, w, out[i].Spec, now)
		case w.Sample:
			e.emit(r, out[i], now)
		case r.sreq.MaxTokens == 0 && w.CompletesPrompt():
			if e.metrics != nil {
				e.metrics.observePromptOnly(r)
			}
			e.end(r, FinishLength, "", nil)
		}
	}
	e.publish()
}

// scored adds the prompt logprobs a work item computed and, once every
// prompt token after the first is scored, hands them to the stream. A
// request recomputed after a preemption scores its prompt again; tokens
// already scored keep their first logprobs.
func (r *request) scored(s Sampled) {
	if r.promptSent {
		return
	}
	for j, lp := range s.PromptLogprobs {
		if s.PromptFirst+j == len(r.prompt)+1 {
			r.prompt = append(r.prompt, lp)
		}
	}
	if len(r.prompt) >= len(r.sreq.Prompt)-1 {
		r.stream.pushPrompt(r.prompt)
		r.prompt, r.promptSent = nil, true
	}
}

// emit delivers a sampled token and ends the request when it should stop.
func (e *Engine) emit(r *request, s Sampled, now time.Time) {
	if e.metrics != nil {
		e.metrics.observeToken(r, now)
	}
	r.lastTok = now
	if slices.Contains(r.params.StopIDs, s.ID) {
		r.stream.push("", s.ID, s.Logprobs)
		e.end(r, FinishStop, r.flush(), nil)
		return
	}
	var text string
	if r.detok != nil {
		text = r.detok.Add(s.ID)
	}
	text, stopped := r.stops.Add(text)
	r.stream.push(text, s.ID, s.Logprobs)
	switch {
	case stopped:
		e.end(r, FinishStop, "", nil)
	case len(r.sreq.Output) >= r.sreq.MaxTokens:
		e.end(r, FinishLength, r.flush(), nil)
	}
}

// flush returns the text still held back by the detokenizer and the stop
// matcher when a request ends without a stop string.
func (r *request) flush() string {
	var rest string
	if r.detok != nil {
		rest = r.detok.Flush()
	}
	text, stopped := r.stops.Add(rest)
	if stopped {
		return text
	}
	return text + r.stops.Flush()
}

// end finishes a request: frees its blocks and closes its stream with the
// last text.
func (e *Engine) end(r *request, reason, tail string, err error) {
	e.sched.Finish(r.sreq.ID)
	delete(e.live, r.sreq.ID)
	e.dropAdapter(r)
	if rel, ok := e.exec.(releaser); ok {
		rel.Release(r.sreq)
	}
	usage := Usage{PromptTokens: len(r.sreq.Prompt), CompletionTokens: len(r.sreq.Output), CachedTokens: r.sreq.NumCachedTokens}
	r.stream.finish(tail, reason, usage, err)
	e.inflight.Add(-1)
	if e.metrics != nil {
		e.metrics.observeFinish(r, reason, time.Now())
	}
}

func (e *Engine) abortAll() {
	e.mu.Lock()
	inbox := e.inbox
	e.inbox = nil
	e.draining = true
	e.mu.Unlock()
	for _, r := range inbox {
		e.dropAdapter(r)
		r.stream.finish("", FinishAbort, Usage{}, ErrDraining)
		e.inflight.Add(-1)
	}
	for _, r := range e.live {
		e.end(r, FinishAbort, "", ErrDraining)
	}
	e.publish()
}

// Drain stops admitting new requests and waits until every request in
// flight has finished or ctx ends; Run keeps going meanwhile.
func (e *Engine) Drain(ctx context.Context) error {
	e.mu.Lock()
	e.draining = true
	e.mu.Unlock()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for e.inflight.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}
