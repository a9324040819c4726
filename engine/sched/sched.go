// Package sched decides, step by step, which tokens of which requests the
// engine computes next: vLLM V1-style continuous batching with one token
// budget per step, running requests first, chunked prefill, prefix-cache
// reuse and preemption by recompute when KV blocks run out.
//
// Schedule is a deterministic function of the queue state and the KV
// manager, with no model in sight, so the real engine and the sim engine
// share it and it is tested on its own.
package sched

import (
	"container/heap"
	"errors"
	"fmt"

	"github.com/stokehq/stoke/engine/kvcache"
)

// State is where a request is in its life.
type State int

// Request states.
const (
	Waiting State = iota
	Running
	Finished
)

func (s State) String() string {
	switch s {
	case Waiting:
		return "waiting"
	case Running:
		return "running"
	case Finished:
		return "finished"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Request is one generation the scheduler tracks. The caller fills the
// exported fields before Add and reads the rest; the scheduler owns the
// request until it finishes.
type Request struct {
	ID     string
	Prompt []int32
	// MaxTokens bounds the generated tokens; 0 makes a prefill-only
	// request, which computes its prompt (scoring it, with ScorePrompt)
	// and generates nothing.
	MaxTokens int
	// Priority orders waiting requests (higher first) and picks preemption
	// victims (lowest first).
	Priority int
	// CacheSalt separates prefix-cache entries, e.g. per LoRA adapter.
	CacheSalt string
	// ScorePrompt asks the executor for the logprob of every prompt token
	// after the first, from the logits of the position before it
	// (teacher-forced), with PromptTopLogprobs alternatives each. Such a
	// request computes every prompt position itself: the prefix cache
	// supplies none of its tokens, since cached positions have no logits
	// (its own full blocks are still registered for later requests).
	ScorePrompt bool
	// PromptTopLogprobs is how many most likely alternatives the executor
	// reports with each prompt token's logprob when ScorePrompt is set.
	PromptTopLogprobs int
	// Drafts are tokens a speculative proposer guesses follow the request's
	// tokens, set by the engine before Schedule. A decoding request's next
	// work item carries as many of them as the step's token budget,
	// MaxTokens and the context leave room for (Work.Drafts), to be
	// verified in one forward pass; Schedule clears the field. They are
	// guesses only: nothing of them reaches Output unless Accept records it.
	Drafts []int32

	// Output holds the generated tokens.
	Output []int32
	// NumComputed counts tokens whose keys and values are in the KV cache.
	NumComputed int
	// NumCachedTokens counts prompt tokens the prefix cache supplied at the
	// request's last admission.
	NumCachedTokens int
	// Preemptions counts how often the request lost its KV blocks.
	Preemptions int

	state   State
	seq     uint64
	arrival uint64
	tokens  []int32 // prompt, then output
	index   int     // position in the waiting heap
}

// State reports where the request is.
func (r *Request) State() State { return r.state }

// Tokens are the prompt followed by the generated tokens.
func (r *Request) Tokens() []int32 { return r.tokens }

// Config bounds each step.
type Config struct {
	// MaxNumBatchedTokens is the token budget of one step.
	MaxNumBatchedTokens int
	// MaxNumSeqs caps the number of running requests.
	MaxNumSeqs int
	// MaxModelLen is the model's context length.
	MaxModelLen int
	// LowerPriorityPrefill, when positive, caps the prompt tokens a step
	// computes for requests of lower priority than the highest one in the
	// engine (running or waiting): batch work then prefills in small chunks
	// beside interactive requests, so their steps (the first token's above
	// all) are not stretched by it. Decodes are never capped. 0 turns the
	// cap off.
	LowerPriorityPrefill int
}

// Work is one request's share of a step: positions [Start, Start+Count)
// of its tokens.
type Work struct {
	Req          *Request
	Start, Count int
	// Table is the request's KV block table, covering Start+Count positions.
	Table []int32
	// Sample is set when the step reaches the request's last known token
	// and the request has tokens left to generate, so the engine samples
	// the next one from its logits.
	Sample bool
	// Drafts, when not empty, are speculative tokens after the request's
	// last known token, which is then the work's only known one: Start is
	// len(Tokens())-1 and Count is 1+len(Drafts), and the positions after
	// Start hold the drafts (Token). The engine verifies them from the
	// logits of all Count positions and records the tokens it keeps with
	// Accept, not Commit. Their KV blocks are allocated, but no block is
	// registered in the prefix cache under a draft: a rejected draft's keys
	// and values are overwritten when the position is computed again.
	Drafts []int32
}

// Token is the token at position p of the work: the request's own, or a
// draft past its last known token.
func (w Work) Token(p int) int32 {
	tokens := w.Req.tokens
	if p < len(tokens) {
		return tokens[p]
	}
	return w.Drafts[p-len(tokens)]
}

// CompletesPrompt reports whether the work computes its request's last
// prompt position: for a request that generates nothing (MaxTokens 0),
// its end. Unlike Sample it reads only the prompt, so it holds after
// Commit too.
func (w Work) CompletesPrompt() bool {
	n := len(w.Req.Prompt)
	return w.Start < n && w.Start+w.Count >= n
}

// Step is what the engine computes next.
type Step struct {
	Work []Work
	// Preempted lists requests that lost their KV blocks in this step and
	// wait to be recomputed.
	Preempted []*Request
	NumTokens int
}

// Errors Add returns for requests that can never run.
var (
	ErrDuplicate = errors.New("duplicate request id")
	ErrTooLong   = errors.New("request does not fit")
)

// Scheduler holds the waiting and running requests of one engine. It is
// not safe for concurrent use: the engine loop owns it.
type Scheduler struct {
	cfg     Config
	kv      *kvcache.Manager
	waiting waitQueue
	running []*Request
	byID    map[string]*Request
	nextSeq uint64
}

// New returns a scheduler that allocates KV blocks from kv.
func New(cfg Config, kv *kvcache.Manager) (*Scheduler, error) {
	if cfg.MaxNumBatchedTokens < 1 || cfg.MaxNumSeqs < 1 || cfg.MaxModelLen < 1 {
		return nil, fmt.Errorf("scheduler: budgets must be positive: %+v", cfg)
	}
	return &Scheduler{cfg: cfg, kv: kv, byID: map[string]*Request{}}, nil
}

// Validate refuses a request that could never run under cfg with a KV
// pool of numBlocks: an empty prompt, a negative MaxTokens, more tokens
// than the context, or more than the whole pool. It reads nothing else,
// so a server may call it from any goroutine before handing the request to
// the engine loop.
func Validate(cfg Config, numBlocks int, r *Request) error {
	total := len(r.Prompt) + r.MaxTokens
	switch {
	case len(r.Prompt) == 0:
		return fmt.Errorf("%w: the prompt is empty", ErrTooLong)
	case r.MaxTokens < 0:
		return fmt.Errorf("%w: max_tokens must not be negative, got %d", ErrTooLong, r.MaxTokens)
	case total > cfg.MaxModelLen:
		return fmt.Errorf("%w: %d prompt tokens plus %d max_tokens exceed the context of %d", ErrTooLong, len(r.Prompt), r.MaxTokens, cfg.MaxModelLen)
	case total > numBlocks*kvcache.BlockSize:
		return fmt.Errorf("%w: %d tokens exceed the KV cache of %d tokens", ErrTooLong, total, numBlocks*kvcache.BlockSize)
	}
	return nil
}

// Add queues a request after Validate.
func (s *Scheduler) Add(r *Request) error {
	if s.byID[r.ID] != nil {
		return fmt.Errorf("%w: %q", ErrDuplicate, r.ID)
	}
	if err := Validate(s.cfg, s.kv.NumBlocks(), r); err != nil {
		return err
	}
	total := len(r.Prompt) + r.MaxTokens
	s.nextSeq++
	r.seq, r.arrival = s.nextSeq, s.nextSeq
	r.tokens = append(make([]int32, 0, total), r.Prompt...)
	r.Output = r.tokens[len(r.Prompt):len(r.Prompt)]
	r.NumComputed = 0
	r.state = Waiting
	s.byID[r.ID] = r
	heap.Push(&s.waiting, r)
	return nil
}

// NumRunning is the number of requests holding KV blocks.
func (s *Scheduler) NumRunning() int { return len(s.running) }

// NumWaiting is the number of queued requests, preempted ones included.
func (s *Scheduler) NumWaiting() int { return s.waiting.Len() }

// Running returns the requests holding KV blocks, for the engine to pick
// the decoding ones it proposes drafts for. The slice belongs to the
// scheduler: read it before the next Schedule, Commit, Accept or Finish.
func (s *Scheduler) Running() []*Request { return s.running }

// Decoding reports whether r's next work is a decode: every token but its
// last is computed, so a step computes one position (plus any drafts).
func (r *Request) Decoding() bool {
	return r.state == Running && len(r.tokens)-r.NumComputed == 1
}

// Lookup returns a tracked request.
func (s *Scheduler) Lookup(id string) (*Request, bool) {
	r, ok := s.byID[id]
	return r, ok
}

// Schedule picks the next step's work. Decoding requests go first (with
// their Drafts, as far as the budget, MaxTokens and the context allow),
// then running requests still in (chunked) prefill, then waiting requests
// by priority and arrival, each taking what is left of the token budget.
// When a running request needs a block and none is free, the
// lowest-priority, newest running request is preempted (drafts never cause
// a preemption: without room for them a request decodes one token); no new
// request is admitted in a step that preempted.
//
// A running request's blocks are registered in the prefix cache once
// Commit or Accept has recorded their positions computed, never at
// allocation: a request preempted later in the same step could otherwise
// leave a registered block whose keys and values were never computed (or,
// after a rejected draft, computed for another token).
func (s *Scheduler) Schedule() Step {
	var step Step
	budget := s.cfg.MaxNumBatchedTokens
	lower := s.lowerPrefill()
	scheduled := map[*Request]int{} // request -> index in step.Work
	// Decodes first, so a long prefill never delays a running stream.
	order := make([]*Request, 0, len(s.running))
	for _, r := range s.running {
		if len(r.tokens)-r.NumComputed <= 1 {
			order = append(order, r)
		}
	}
	for _, r := range s.running {
		if len(r.tokens)-r.NumComputed > 1 {
			order = append(order, r)
		}
	}
	for _, r := range order {
		if budget == 0 {
			break
		}
		if r.state != Running {
			continue // preempted earlier in this step
		}
		var drafts []int32
		var n int
		if r.Decoding() {
			drafts = r.draftsWithin(budget-1, s.cfg.MaxModelLen)
			n = 1 + len(drafts) // a decode is never capped
		} else {
			n = lower.cap(r, min(len(r.tokens)-r.NumComputed, budget))
		}
		r.Drafts = nil
		if n == 0 {
			continue // a lower-priority prefill waits for a step with room for it
		}
		computed := r.tokens[:r.NumComputed] // what may be registered now
		ok := s.kv.Allocate(r.seq, computed, r.NumComputed+n, nil, r.CacheSalt)
		if !ok && len(drafts) > 0 {
			drafts, n = nil, 1
			ok = s.kv.Allocate(r.seq, computed, r.NumComputed+n, nil, r.CacheSalt)
		}
		for !ok {
			victim := s.victim()
			if i, was := scheduled[victim]; was {
				budget += step.Work[i].Count
				step.NumTokens -= step.Work[i].Count
				step.Work[i].Count, step.Work[i].Drafts = 0, nil
			}
			s.preempt(victim)
			step.Preempted = append(step.Preempted, victim)
			if victim == r {
				break
			}
			ok = s.kv.Allocate(r.seq, computed, r.NumComputed+n, nil, r.CacheSalt)
		}
		if r.state != Running {
			continue
		}
		scheduled[r] = len(step.Work)
		step.Work = append(step.Work, Work{Req: r, Start: r.NumComputed, Count: n, Table: s.kv.Table(r.seq),
			Sample: r.samples(r.NumComputed + n - len(drafts)), Drafts: drafts})
		step.NumTokens += n
		budget -= n
		lower.take(r, n-len(drafts))
	}
	if len(step.Preempted) > 0 {
		step.Work = dropEmpty(step.Work)
		return step
	}
	for budget > 0 && len(s.running) < s.cfg.MaxNumSeqs && s.waiting.Len() > 0 {
		r := s.waiting[0]
		var cached []int32
		hit := 0
		if !r.ScorePrompt { // a scored prompt needs the logits of every position
			cached, hit = s.kv.LookupPrefix(r.tokens, r.CacheSalt)
		}
		n := lower.cap(r, min(len(r.tokens)-hit, budget))
		if n == 0 {
			break // the rest wait behind r, at its priority or below
		}
		if !s.kv.Allocate(r.seq, r.tokens, hit+n, cached, r.CacheSalt) {
			break
		}
		heap.Pop(&s.waiting)
		r.state, r.NumComputed, r.NumCachedTokens = Running, hit, min(hit, len(r.Prompt))
		s.running = append(s.running, r)
		step.Work = append(step.Work, Work{Req: r, Start: hit, Count: n, Table: s.kv.Table(r.seq), Sample: r.samples(hit + n)})
		step.NumTokens += n
		budget -= n
		lower.take(r, n)
	}
	return step
}

// draftsWithin is how many of r's Drafts a decode step may verify: at most
// budget, and never so many that the step could pass MaxTokens (it emits up
// to one token more than it accepts) or the context of maxModelLen.
func (r *Request) draftsWithin(budget, maxModelLen int) []int32 {
	k := min(len(r.Drafts), budget, r.MaxTokens-len(r.Output)-1, maxModelLen-len(r.tokens))
	if k <= 0 {
		return nil
	}
	return r.Drafts[:k]
}

// samples reports whether computing r's tokens up to computed reaches its
// last known token with a token still to generate.
func (r *Request) samples(computed int) bool {
	return computed == len(r.tokens) && len(r.Output) < r.MaxTokens
}

// lowerBudget is what is left of a step's prefill tokens for requests below
// the engine's highest priority (Config.LowerPriorityPrefill).
type lowerBudget struct {
	on   bool
	top  int // the highest priority in the engine
	left int
}

// lowerPrefill starts a step's budget for lower-priority prefill.
func (s *Scheduler) lowerPrefill() lowerBudget {
	if s.cfg.LowerPriorityPrefill <= 0 {
		return lowerBudget{}
	}
	b := lowerBudget{on: true, left: s.cfg.LowerPriorityPrefill}
	found := false
	for _, r := range s.running {
		if !found || r.Priority > b.top {
			b.top, found = r.Priority, true
		}
	}
	if s.waiting.Len() > 0 && (!found || s.waiting[0].Priority > b.top) {
		b.top = s.waiting[0].Priority
	}
	return b
}

// cap is how many of n tokens r may compute this step: all of a decode
// (one token) and of a top-priority request's, what is left of the budget
// for a lower-priority prefill.
func (b *lowerBudget) cap(r *Request, n int) int {
	if !b.on || n <= 1 || r.Priority >= b.top {
		return n
	}
	return min(n, b.left)
}

// take counts r's n scheduled tokens against the budget.
func (b *lowerBudget) take(r *Request, n int) {
	if b.on && n > 1 && r.Priority < b.top {
		b.left -= n
	}
}

func dropEmpty(work []Work) []Work {
	out := work[:0]
	for _, w := range work {
		if w.Count > 0 {
			out = append(out, w)
		}
	}
	return out
}

// victim is the running request to preempt: lowest priority, then newest.
func (s *Scheduler) victim() *Request {
	v := s.running[0]
	for _, r := range s.running[1:] {
		if r.Priority < v.Priority || (r.Priority == v.Priority && r.arrival > v.arrival) {
			v = r
		}
	}
	return v
}

// preempt frees a running request's blocks and queues it for recompute of
// its prompt and the tokens it has generated so far.
func (s *Scheduler) preempt(r *Request) {
	s.kv.Free(r.seq)
	s.removeRunning(r)
	r.state, r.NumComputed, r.Drafts = Waiting, 0, nil
	r.Preemptions++
	heap.Push(&s.waiting, r)
}

func (s *Scheduler) removeRunning(r *Request) {
	for i, x := range s.running {
		if x == r {
			s.running = append(s.running[:i], s.running[i+1:]...)
			return
		}
	}
}

// Commit records a computed step: sampled holds, in step.Work order, the
// token sampled for each work item with Sample set (other entries are
// ignored). Requests finished since Schedule are skipped, and so are work
// items with drafts, whose tokens Accept records one at a time. The blocks
// the step filled are registered in the prefix cache.
func (s *Scheduler) Commit(step Step, sampled []int32) {
	for i, w := range step.Work {
		r := w.Req
		if r.state != Running || len(w.Drafts) > 0 {
			continue
		}
		r.NumComputed = w.Start + w.Count
		if w.Sample {
			r.tokens = append(r.tokens, sampled[i])
			r.Output = r.tokens[len(r.Prompt):]
		}
		s.register(r)
	}
}

// Accept records the next token of a computed work item with drafts, after
// Commit: the engine calls it for each token it emits, in order, the
// accepted drafts first and then the token the model chose after them (a
// replacement for the first rejected draft, or one after them all), and
// stops early when the request ends (a stop token or string), so that
// nothing after the stop is ever recorded. Each call makes every token of
// the request but the last computed: the positions verified with accepted
// drafts hold their keys and values, and a rejected draft's position is
// computed again, for its replacement, by the next step. It refuses a
// token that does not fit: more than len(w.Drafts)+1 of them, one after a
// token that differs from its draft, past MaxTokens, or for a request that
// is not running.
func (s *Scheduler) Accept(w Work, id int32) error {
	r := w.Req
	n := len(r.tokens) - (w.Start + 1) // tokens already recorded for w
	switch {
	case r.state != Running:
		return fmt.Errorf("accept token %d for %s: the request is %s", id, r.ID, r.state)
	case len(w.Drafts) == 0:
		return fmt.Errorf("accept token %d for %s: the work item has no drafts (Commit records its token)", id, r.ID)
	case n < 0 || n > len(w.Drafts):
		return fmt.Errorf("accept token %d for %s: a work item with %d drafts yields at most %d tokens", id, r.ID, len(w.Drafts), len(w.Drafts)+1)
	case n > 0 && r.tokens[w.Start+n] != w.Drafts[n-1]:
		return fmt.Errorf("accept token %d for %s: token %d replaced draft %d, so nothing follows it", id, r.ID, r.tokens[w.Start+n], w.Drafts[n-1])
	case len(r.Output) >= r.MaxTokens:
		return fmt.Errorf("accept token %d for %s: max_tokens (%d) reached", id, r.ID, r.MaxTokens)
	}
	r.tokens = append(r.tokens, id)
	r.Output = r.tokens[len(r.Prompt):]
	r.NumComputed = len(r.tokens) - 1
	r.Drafts = nil
	s.register(r)
	return nil
}

// register records r's blocks that its computed tokens fill in the prefix
// cache; its table already covers them.
func (s *Scheduler) register(r *Request) {
	s.kv.Allocate(r.seq, r.tokens, r.NumComputed, nil, r.CacheSalt)
}

// Finish ends a request, finished or cancelled, and frees its KV blocks at
// once. It reports whether the request was tracked.
func (s *Scheduler) Finish(id string) bool {
	r, ok := s.byID[id]
	if !ok {
		return false
	}
	delete(s.byID, id)
	switch r.state {
	case Running:
		s.kv.Free(r.seq)
		s.removeRunning(r)
	case Waiting:
		heap.Remove(&s.waiting, r.index)
	}
	r.state = Finished
	return true
}

// waitQueue orders waiting requests by priority (higher first), then
// arrival.
type waitQueue []*Request

func (q waitQueue) Len() int { return len(q) }
func (q waitQueue) Less(i, j int) bool {
	if q[i].Priority != q[j].Priority {
		return q[i].Priority > q[j].Priority
	}
	return q[i].arrival < q[j].arrival
}
func (q waitQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *waitQueue) Push(x any) {
	r := x.(*Request)
	r.index = len(*q)
	*q = append(*q, r)
}
func (q *waitQueue) Pop() any {
	old := *q
	r := old[len(old)-1]
	*q = old[:len(old)-1]
	return r
}
