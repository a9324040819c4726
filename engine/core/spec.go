package core

import (
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
)

// Speculative decoding: before each step a proposer guesses up to
// NumSpeculativeTokens tokens after every decoding request's last (prompt
// lookup, or a small draft model run greedily), the scheduler hands the
// guesses to the step within its token budget, the model computes the last
// token and the drafts in one forward pass (kernels give every row the
// result it would have alone, so row j's logits are those a plain decode
// after j accepted drafts would see), and the sampler keeps drafts while
// rejection sampling accepts them, then emits one token of its own. At
// temperature 0 the output is that of plain decoding, token for token;
// sampling, it is distributed as plain sampling is.

// Speculation methods, as vLLM's speculative_config names them.
const (
	// SpecNgram proposes by prompt lookup: the tokens that followed the
	// most recent earlier occurrence of the request's last n tokens.
	SpecNgram = "ngram"
	// SpecDraftModel proposes with a smaller model of the same vocabulary.
	SpecDraftModel = "draft_model"
)

// MaxSpeculativeTokens bounds SpecConfig.NumSpeculativeTokens.
const MaxSpeculativeTokens = 64

// SpecConfig turns on speculative decoding for an engine. The zero value
// (no Method) leaves it off.
type SpecConfig struct {
	// Method is SpecNgram or SpecDraftModel; "" turns speculation off.
	Method string
	// NumSpeculativeTokens is how many tokens are proposed per decoding
	// request and step, at most (1..MaxSpeculativeTokens).
	NumSpeculativeTokens int
	// PromptLookupMax and PromptLookupMin bound the n of the n-grams
	// prompt lookup matches (the longest is tried first); ngram only.
	PromptLookupMax, PromptLookupMin int
	// DisableByBatchSize, when positive, turns speculation off for a step
	// in which at least this many running requests decode: verifying
	// drafts costs compute that a large batch no longer has to spare.
	DisableByBatchSize int
	// Draft is the draft model (draft_model). It must have the verifying
	// model's vocabulary, and runs on its own KV pool.
	Draft *model.Model
	// DraftKVBlocks sizes the draft model's KV pool; 0 means as many
	// blocks as the engine's own pool.
	DraftKVBlocks int
}

// Enabled reports whether c turns speculation on.
func (c SpecConfig) Enabled() bool { return c.Method != "" }

// Validate reports the first setting out of range.
func (c SpecConfig) Validate() error {
	if !c.Enabled() {
		return nil
	}
	if c.NumSpeculativeTokens < 1 || c.NumSpeculativeTokens > MaxSpeculativeTokens {
		return fmt.Errorf("speculative decoding: num_speculative_tokens must be in [1, %d], got %d", MaxSpeculativeTokens, c.NumSpeculativeTokens)
	}
	if c.DisableByBatchSize < 0 {
		return fmt.Errorf("speculative decoding: disable_by_batch_size must not be negative, got %d", c.DisableByBatchSize)
	}
	switch c.Method {
	case SpecNgram:
		if c.PromptLookupMin < 1 || c.PromptLookupMax < c.PromptLookupMin {
			return fmt.Errorf("speculative decoding: prompt lookup needs 1 <= prompt_lookup_min <= prompt_lookup_max, got %d and %d",
				c.PromptLookupMin, c.PromptLookupMax)
		}
		if c.Draft != nil {
			return errors.New("speculative decoding: the ngram method takes no draft model")
		}
	case SpecDraftModel:
		if c.Draft == nil {
			return errors.New("speculative decoding: the draft_model method needs a draft model")
		}
		if c.DraftKVBlocks < 0 {
			return fmt.Errorf("speculative decoding: the draft model's KV pool must not be negative, got %d blocks", c.DraftKVBlocks)
		}
	default:
		return fmt.Errorf("speculative decoding: unknown method %q (want %q or %q)", c.Method, SpecNgram, SpecDraftModel)
	}
	return nil
}

// DraftVerifier is an Executor that verifies drafts: for a work item with
// sched.Work.Drafts its Execute fills Sampled.Spec from the logits of every
// position of the item. An engine speculates only over one (a wrapper
// reports what the executor it wraps does).
type DraftVerifier interface {
	Executor
	// DraftVocabSize is the vocabulary of the model that verifies drafts,
	// which a draft model must share; 0 means drafts are not verified.
	DraftVocabSize() int
}

// Verified is what a work item with drafts produced: the tokens to emit,
// in order (the accepted drafts, then the model's own token: a replacement
// for the first rejected draft, or one after them all), with their
// logprobs (nil entries when none are asked for).
type Verified struct {
	IDs      []int32
	Logprobs []*sample.Logprobs
	// Accepted counts the drafts kept: len(IDs)-1.
	Accepted int
}

// SpecStats counts an engine's speculation since it started.
type SpecStats struct {
	// Drafts counts work items that carried drafts; DraftTokens the drafts
	// they carried and Accepted those kept.
	Drafts, DraftTokens, Accepted uint64
	// Emitted counts the tokens those work items emitted (at most
	// Accepted+Drafts: a stop drops what follows it).
	Emitted uint64
	// Disabled counts steps with speculation off because
	// DisableByBatchSize was reached.
	Disabled uint64
}

// AcceptanceRate is Accepted / DraftTokens (0 without drafts).
func (s SpecStats) AcceptanceRate() float64 {
	if s.DraftTokens == 0 {
		return 0
	}
	return float64(s.Accepted) / float64(s.DraftTokens)
}

// TokensPerDraft is the mean number of tokens a work item with drafts
// emitted (1 + Accepted/Drafts, less what stops cut; 0 without drafts).
func (s SpecStats) TokensPerDraft() float64 {
	if s.Drafts == 0 {
		return 0
	}
	return float64(s.Emitted) / float64(s.Drafts)
}

// proposer guesses the tokens after decoding requests' last ones.
type proposer interface {
	// propose sets reqs[i].Drafts to at most ks[i] tokens (nil for none).
	propose(reqs []*sched.Request, ks []int)
	// close frees what the proposer holds once the engine is done.
	close() error
}

// speculator is an engine's speculative decoding: its proposer, the
// per-request opt-outs and the counters.
type speculator struct {
	cfg  SpecConfig
	prop proposer
	reqs []*sched.Request
	ks   []int

	drafts, draftTokens, accepted, emitted, disabled atomic.Uint64
}

// newSpeculator sets up speculation for an engine over exec whose KV pool
// has kvBlocks blocks; nil when cfg leaves it off.
func newSpeculator(cfg SpecConfig, sc sched.Config, exec Executor, kvBlocks int) (*speculator, error) {
	if !cfg.Enabled() {
		return nil, nil
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dv, ok := exec.(DraftVerifier)
	vocab := 0
	if ok {
		vocab = dv.DraftVocabSize()
	}
	if vocab == 0 {
		return nil, errors.New("speculative decoding: this engine's executor does not verify drafts (the sim computes no logits)")
	}
	sp := &speculator{cfg: cfg}
	switch cfg.Method {
	case SpecNgram:
		sp.prop = ngramProposer{min: cfg.PromptLookupMin, max: cfg.PromptLookupMax}
	case SpecDraftModel:
		if got := cfg.Draft.Config().VocabSize; got != vocab {
			return nil, fmt.Errorf("speculative decoding: the draft model's vocabulary has %d tokens, the model's %d: they must be the same", got, vocab)
		}
		blocks := cfg.DraftKVBlocks
		if blocks == 0 {
			blocks = kvBlocks
		}
		p, err := newDraftProposer(cfg.Draft, blocks, sc.MaxNumBatchedTokens)
		if err != nil {
			return nil, err
		}
		sp.prop = p
	}
	return sp, nil
}

// close frees the proposer's resources (the draft model's KV pool).
func (sp *speculator) close() error {
	if sp == nil {
		return nil
	}
	if err := sp.prop.close(); err != nil {
		return fmt.Errorf("speculative decoding: %w", err)
	}
	return nil
}

// SpecStats returns the engine's speculation counters (zero without
// speculation). Any goroutine may call it.
func (e *Engine) SpecStats() SpecStats {
	sp := e.spec
	if sp == nil {
		return SpecStats{}
	}
	return SpecStats{Drafts: sp.drafts.Load(), DraftTokens: sp.draftTokens.Load(), Accepted: sp.accepted.Load(),
		Emitted: sp.emitted.Load(), Disabled: sp.disabled.Load()}
}

// propose sets the drafts of the running decoding requests that speculate
// before the next Schedule: every one but those that opted out
// (Params.DisableSpeculation) and those with fewer than two tokens left to
// generate (a step emits one token more than it accepts), unless the step
// decodes at least DisableByBatchSize requests.
func (e *Engine) propose() {
	sp := e.spec
	if sp == nil {
		return
	}
	reqs, ks := sp.reqs[:0], sp.ks[:0]
	decoding := 0
	for _, r := range e.sched.Running() {
		r.Drafts = nil
		if !r.Decoding() {
			continue
		}
		decoding++
		k := min(sp.cfg.NumSpeculativeTokens, r.MaxTokens-len(r.Output)-1)
		if lr := e.live[r.ID]; k < 1 || lr == nil || lr.params.DisableSpeculation {
			continue
		}
		reqs, ks = append(reqs, r), append(ks, k)
	}
	sp.reqs, sp.ks = reqs, ks
	defer clear(sp.reqs) // hold no request past the round
	if d, ok := sp.prop.(*draftProposer); ok {
		d.sweep()
	}
	if len(reqs) == 0 {
		return
	}
	if sp.cfg.DisableByBatchSize > 0 && decoding >= sp.cfg.DisableByBatchSize {
		sp.disabled.Add(1)
		return
	}
	sp.prop.propose(reqs, ks)
}

// emitVerified records and delivers the tokens of a work item with drafts,
// one at a time, as a plain decode would have delivered them over as many
// steps: each passes the stop checks, and the first that ends the request
// drops the rest, which never reach the stream or the request's output.
func (e *Engine) emitVerified(r *request, w sched.Work, v *Verified, now time.Time) {
	sp := e.spec
	if sp != nil {
		sp.drafts.Add(1)
		sp.draftTokens.Add(uint64(len(w.Drafts)))
		sp.accepted.Add(uint64(v.Accepted))
	}
	if e.metrics != nil {
		e.metrics.observeSpec(len(w.Drafts), v.Accepted)
	}
	for j, id := range v.IDs {
		if err := e.sched.Accept(w, id); err != nil {
			e.end(r, FinishError, "", fmt.Errorf("engine step: %w", err))
			return
		}
		if sp != nil {
			sp.emitted.Add(1)
		}
		e.emit(r, Sampled{ID: id, Logprobs: v.Logprobs[j]}, now)
		if e.live[r.sreq.ID] == nil {
			return // ended: a stop token, a stop string or max_tokens
		}
	}
}

// DraftVocabSize is the model's vocabulary: the executor verifies drafts
// (DraftVerifier).
func (x *ModelExecutor) DraftVocabSize() int { return x.model.Config().VocabSize }

// verifier is a model executor's scratch for verifying drafts.
type verifier struct {
	// context is a work item's output followed by its drafts: row j's
	// penalties see the output as it would be there, context[:len+j].
	context []int32
	// rows collects a work item's logit rows when they arrive in groups
	// (a step that scores prompts).
	rows []float32
}

// sample draws work item w's tokens from its logit rows (one per position
// it computes when it has drafts, else one): a plain Sample, or the
// verification of its drafts.
func (v *verifier) sample(w sched.Work, s *sample.Sampler, logits []float32, vocab int) Sampled {
	if len(w.Drafts) == 0 {
		id, lp := s.Sample(logits[:vocab], w.Req.Prompt, w.Req.Output)
		return Sampled{ID: id, Logprobs: lp}
	}
	out := len(w.Req.Output)
	v.context = append(append(v.context[:0], w.Req.Output...), w.Drafts...)
	res := &Verified{IDs: make([]int32, 0, len(w.Drafts)+1), Logprobs: make([]*sample.Logprobs, 0, len(w.Drafts)+1)}
	for j := 0; j <= len(w.Drafts); j++ {
		row := logits[j*vocab : (j+1)*vocab]
		if j == len(w.Drafts) { // every draft accepted: one token more
			id, lp := s.Sample(row, w.Req.Prompt, v.context[:out+j])
			res.IDs, res.Logprobs = append(res.IDs, id), append(res.Logprobs, lp)
			break
		}
		id, ok, lp := s.Verify(row, w.Req.Prompt, v.context[:out+j], w.Drafts[j], nil)
		res.IDs, res.Logprobs = append(res.IDs, id), append(res.Logprobs, lp)
		if !ok {
			break
		}
		res.Accepted++
	}
	return Sampled{ID: res.IDs[0], Logprobs: res.Logprobs[0], Spec: res}
}

// sampleRow is sample for logit rows that arrive one at a time: row is row
// j of work item w's rows; the item's token fields of *out (ID, Logprobs,
// Spec) are set once its last row is in.
func (v *verifier) sampleRow(out *Sampled, w sched.Work, s *sample.Sampler, j int, row []float32) {
	rows := row
	if len(w.Drafts) > 0 {
		if j == 0 {
			v.rows = v.rows[:0]
		}
		v.rows = append(v.rows, row...)
		if j < len(w.Drafts) {
			return
		}
		rows = v.rows
	}
	got := v.sample(w, s, rows, len(row))
	out.ID, out.Logprobs, out.Spec = got.ID, got.Logprobs, got.Spec
}

// specMetrics are speculative decoding's series: vLLM's
// vllm:spec_decode_* counters, from which the acceptance rate
// (accepted/draft tokens) and the mean acceptance length
// (1 + accepted/drafts) follow, and the distribution of the tokens each
// work item with drafts yields.
type specMetrics struct {
	drafts, draftTokens, accepted prometheus.Counter
	perPos                        *prometheus.CounterVec
	tokensPerStep                 prometheus.Histogram
}

func newSpecMetrics(labels prometheus.Labels) specMetrics {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	}
	buckets := make([]float64, 0, 9)
	for n := 1; n <= 9; n++ {
		buckets = append(buckets, float64(n))
	}
	return specMetrics{
		drafts:      counter("vllm:spec_decode_num_drafts_total", "Work items that verified speculative drafts (one per request and step)."),
		draftTokens: counter("vllm:spec_decode_num_draft_tokens_total", "Draft tokens verified."),
		accepted:    counter("vllm:spec_decode_num_accepted_tokens_total", "Draft tokens accepted."),
		perPos: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:spec_decode_num_accepted_tokens_per_pos",
			Help: "Draft tokens accepted, by their position among the drafts (0 is the first).", ConstLabels: labels}, []string{"position"}),
		tokensPerStep: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "stoke_engine_spec_decode_tokens_per_step",
			Help:        "Tokens one request gained from one step that verified its drafts: the accepted drafts plus the model's own token.",
			ConstLabels: labels, Buckets: buckets}),
	}
}

func (m *specMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.drafts, m.draftTokens, m.accepted, m.perPos, m.tokensPerStep}
}

// observeSpec counts one verified work item of drafts drafts, accepted of
// them (the first ones).
func (m *Metrics) observeSpec(drafts, accepted int) {
	s := &m.spec
	s.drafts.Inc()
	s.draftTokens.Add(float64(drafts))
	s.accepted.Add(float64(accepted))
	for pos := range accepted {
		s.perPos.WithLabelValues(strconv.Itoa(pos)).Inc()
	}
	s.tokensPerStep.Observe(float64(accepted + 1))
}
