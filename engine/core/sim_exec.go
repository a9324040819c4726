package core

import (
	"context"
	"hash/fnv"
	"time"

	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/sim"
	"github.com/stokehq/stoke/engine/tokenizer"
)

// SimExecutor stands in for the model: each step takes the time the
// profile predicts for it on the profiled GPU, and requests "generate"
// readable words, deterministic for the request's seed (or its prompt).
// It has no logits, so it reports no logprobs and is no PromptScorer:
// Submit refuses prompt logprobs on it (ErrNoPromptLogprobs), while a
// prefill-only request (MaxTokens 0) takes its prefill's time and ends
// with no token.
type SimExecutor struct {
	profile sim.Profile
	tok     *tokenizer.Tokenizer
	sleep   func(context.Context, time.Duration) error
	streams map[*sched.Request]*simText
}

// simText is one request's generated text, tokenised a word at a time.
type simText struct {
	seed    uint64
	words   int
	pending []int32
}

// NewSimExecutor returns a sim executor. sleep waits out each step; nil
// means real time (tests pass a virtual clock).
func NewSimExecutor(p sim.Profile, tok *tokenizer.Tokenizer, sleep func(context.Context, time.Duration) error) *SimExecutor {
	if sleep == nil {
		sleep = sleepContext
	}
	return &SimExecutor{profile: p, tok: tok, sleep: sleep, streams: map[*sched.Request]*simText{}}
}

func sleepContext(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Execute waits for the step's predicted duration and returns the next
// word token of every request that samples.
func (x *SimExecutor) Execute(ctx context.Context, step sched.Step, samplers []*sample.Sampler) ([]Sampled, error) {
	var prefill, decodes, context int
	for _, w := range step.Work {
		if w.Count == 1 && w.Start >= len(w.Req.Prompt) {
			decodes++
			context += w.Start + 1
		} else {
			prefill += w.Count
		}
	}
	if err := x.sleep(ctx, x.profile.StepTime(prefill, decodes, context)); err != nil {
		return nil, err
	}
	out := make([]Sampled, len(step.Work))
	for i, w := range step.Work {
		if w.Sample {
			out[i] = Sampled{ID: x.next(w.Req, samplers[i])}
		}
	}
	return out, nil
}

func (x *SimExecutor) next(r *sched.Request, s *sample.Sampler) int32 {
	st := x.streams[r]
	if st == nil {
		h := fnv.New64a()
		for _, t := range r.Prompt {
			h.Write([]byte{byte(t), byte(t >> 8), byte(t >> 16)})
		}
		st = &simText{seed: h.Sum64() ^ s.Params().Seed}
		x.streams[r] = st
	}
	for len(st.pending) == 0 {
		st.pending = x.tok.Encode(sim.Word(st.seed, st.words), false)
		st.words++
	}
	id := st.pending[0]
	st.pending = st.pending[1:]
	return id
}

// Release forgets a finished request's text.
func (x *SimExecutor) Release(r *sched.Request) { delete(x.streams, r) }
