package core

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kernels/kernelstest"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/sim"
	"github.com/stokehq/stoke/engine/tokenizer"
)

// scoredRun is what a stream delivered, prompt logprobs included.
type scoredRun struct {
	ids    []int32
	lps    []sample.Logprobs
	prompt []sample.Logprobs
	// promptDeltas counts the deltas that carried prompt logprobs.
	promptDeltas int
	last         Delta
}

// collectScored reads a stream to its end, keeping its prompt logprobs.
func collectScored(t *testing.T, s *Stream) scoredRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var r scoredRun
	for {
		d, ok := s.Next(ctx)
		if !ok {
			if r.last.Finish == "" {
				t.Fatal("stream ended without a finish reason")
			}
			return r
		}
		if d.PromptLogprobs != nil {
			r.prompt = d.PromptLogprobs
			r.promptDeltas++
		}
		r.ids = append(r.ids, d.IDs...)
		r.lps = append(r.lps, d.Logprobs...)
		r.last = d
	}
}

// refLogprobs is the float64 log-softmax of one row of logits.
func refLogprobs(row []float32) []float64 {
	m := math.Inf(-1)
	for _, l := range row {
		m = max(m, float64(l))
	}
	var z float64
	for _, l := range row {
		z += math.Exp(float64(l) - m)
	}
	out := make([]float64, len(row))
	for i, l := range row {
		out[i] = float64(l) - m - math.Log(z)
	}
	return out
}

// TestPromptLogprobsMatchScore checks, on every kernel set, that a prompt
// prefilled in chunks of 8 tokens is scored as model.Score's logits say:
// each token after the first gets the log-softmax of the row before it,
// with the most likely alternatives, in one delta; max_tokens 0 ends the
// request there with no token.
func TestPromptLogprobsMatchScore(t *testing.T) {
	kernelstest.ForEachSet(t, checkPromptLogprobsMatchScore)
}

func checkPromptLogprobsMatchScore(t *testing.T, set *kernels.Set) {
	f := newFixtureOn(t, set, 64, sched.Config{MaxNumBatchedTokens: 8, MaxNumSeqs: 4})
	prompt := testPrompt(3, 45)
	logits, err := f.model.Score(prompt) // before the engine has work: the model is not shared
	if err != nil {
		t.Fatal(err)
	}
	vocab := f.model.Config().VocabSize
	for _, tc := range []struct {
		name      string
		maxTokens int
	}{{"prompt only", 0}, {"generating", 3}} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := f.engine.Submit(Params{Prompt: prompt, MaxTokens: tc.maxTokens, Sampling: sample.Params{TopP: 1, Logprobs: 2},
				IgnoreEOS: true, PromptLogprobs: true})
			if err != nil {
				t.Fatal(err)
			}
			r := collectScored(t, s)
			if r.last.Finish != FinishLength || len(r.ids) != tc.maxTokens || r.last.Usage.CompletionTokens != tc.maxTokens || r.last.Usage.CachedTokens != 0 {
				t.Fatalf("finish %q, %d ids, usage %+v: want length after %d tokens, none cached", r.last.Finish, len(r.ids), r.last.Usage, tc.maxTokens)
			}
			if r.promptDeltas != 1 || len(r.prompt) != len(prompt)-1 {
				t.Fatalf("%d deltas with %d prompt logprobs, want one with %d", r.promptDeltas, len(r.prompt), len(prompt)-1)
			}
			for i, lp := range r.prompt {
				want := refLogprobs(logits[i*vocab : (i+1)*vocab])
				id := prompt[i+1]
				if lp.Chosen.ID != id || math.Abs(float64(lp.Chosen.Logprob)-want[id]) > 1e-5 {
					t.Fatalf("prompt token %d: %+v, want id %d logprob %v", i+1, lp.Chosen, id, want[id])
				}
				best := sample.Argmax(logits[i*vocab : (i+1)*vocab])
				if len(lp.Top) != 2 || lp.Top[0].ID != best || math.Abs(float64(lp.Top[0].Logprob)-want[best]) > 1e-5 || lp.Top[1].Logprob > lp.Top[0].Logprob {
					t.Fatalf("prompt token %d: top %+v, want 2, the most likely (%d) first", i+1, lp.Top, best)
				}
			}
		})
	}
}

// TestScoredTokensMatchSampled checks that a token scored in a prompt gets
// the logprob it had when it was sampled: the prompt plus the greedy
// continuation, scored, repeats the continuation's logprobs.
func TestScoredTokensMatchSampled(t *testing.T) {
	f := newFixture(t, 64, sched.Config{MaxNumBatchedTokens: 16, MaxNumSeqs: 4})
	prompt := testPrompt(5, 20)
	s, err := f.engine.Submit(Params{Prompt: prompt, MaxTokens: 6, Sampling: sample.Params{TopP: 1, Logprobs: 3}, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	gen := collectScored(t, s)
	if len(gen.ids) != 6 || len(gen.lps) != 6 || gen.prompt != nil {
		t.Fatalf("plain request: %d ids, %d logprobs, prompt logprobs %v", len(gen.ids), len(gen.lps), gen.prompt)
	}
	s, err = f.engine.Submit(Params{Prompt: append(slices.Clone(prompt), gen.ids...), Sampling: sample.Params{TopP: 1, Logprobs: 3}, PromptLogprobs: true})
	if err != nil {
		t.Fatal(err)
	}
	scored := collectScored(t, s)
	for j, want := range gen.lps {
		got := scored.prompt[len(prompt)-1+j]
		if got.Chosen.ID != want.Chosen.ID || math.Abs(float64(got.Chosen.Logprob-want.Chosen.Logprob)) > 1e-5 || len(got.Top) != len(want.Top) {
			t.Fatalf("token %d: scored %+v, sampled %+v", j, got, want)
		}
		for k := range want.Top {
			if got.Top[k].ID != want.Top[k].ID || math.Abs(float64(got.Top[k].Logprob-want.Top[k].Logprob)) > 1e-5 {
				t.Fatalf("token %d: scored top %+v, sampled top %+v", j, got.Top, want.Top)
			}
		}
	}
}

// TestPromptLogprobsSurvivePreemption checks that requests preempted (and
// recomputed) under KV pressure score their prompts once, as they do
// unpressured: preempted once their prompt is scored, or (with a step
// budget of 8 tokens, so prompts are prefilled in chunks) part way through
// it.
func TestPromptLogprobsSurvivePreemption(t *testing.T) {
	for _, budget := range []int{256, 8} {
		t.Run(fmt.Sprint("budget ", budget), func(t *testing.T) { checkPromptLogprobsSurvivePreemption(t, budget) })
	}
}

func checkPromptLogprobsSurvivePreemption(t *testing.T, budget int) {
	roomy := newFixture(t, 512, sched.Config{MaxNumBatchedTokens: budget, MaxNumSeqs: 16})
	tight := newFixture(t, 12, sched.Config{MaxNumBatchedTokens: budget, MaxNumSeqs: 16})
	run := func(f *fixture) []scoredRun {
		streams := make([]*Stream, 10)
		for i := range streams {
			s, err := f.engine.Submit(Params{Prompt: testPrompt(i, 20+i), MaxTokens: 30, Sampling: sample.Params{TopP: 1, Logprobs: 1},
				IgnoreEOS: true, PromptLogprobs: true})
			if err != nil {
				t.Fatal(err)
			}
			streams[i] = s
		}
		out := make([]scoredRun, len(streams))
		var wg sync.WaitGroup
		for i, s := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out[i] = collectScored(t, s)
			}()
		}
		wg.Wait()
		return out
	}
	want, got := run(roomy), run(tight)
	for i := range want {
		w, g := want[i], got[i]
		if g.promptDeltas != 1 || len(g.prompt) != 19+i || !slices.Equal(g.ids, w.ids) {
			t.Fatalf("request %d under KV pressure: %d prompt deltas, %d prompt logprobs, ids %v; unpressured %d, ids %v",
				i, g.promptDeltas, len(g.prompt), g.ids, len(w.prompt), w.ids)
		}
		for j := range w.prompt {
			if g.prompt[j].Chosen != w.prompt[j].Chosen {
				t.Fatalf("request %d prompt token %d: %+v under KV pressure, %+v unpressured", i, j+1, g.prompt[j].Chosen, w.prompt[j].Chosen)
			}
		}
	}
	waitFor(t, func() bool { s := tight.engine.Stats(); return s.Running+s.Waiting == 0 })
	if s := tight.engine.Stats(); s.Preemptions == 0 {
		t.Fatalf("no preemptions under KV pressure: %+v", s)
	}
}

// TestSimRefusesPromptLogprobs checks that the sim, which has no logits,
// refuses prompt logprobs at Submit and still serves prefill-only
// requests.
func TestSimRefusesPromptLogprobs(t *testing.T) {
	p, err := sim.LoadProfile("llama-3.1-8b-fp8-h100")
	if err != nil {
		t.Fatal(err)
	}
	tj, tc, err := tokenizer.Synthesize(p.VocabSize, 1)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.New(tj, tc)
	if err != nil {
		t.Fatal(err)
	}
	exec := NewSimExecutor(p, tok, func(context.Context, time.Duration) error { return nil })
	e, err := New(Config{Sched: sched.Config{MaxNumBatchedTokens: 512, MaxNumSeqs: 8, MaxModelLen: p.MaxModelLen}},
		kvcache.NewManager(1024, true), exec, tok, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	prompt := tok.Encode("Hello there", true)
	if _, err := e.Submit(Params{Prompt: prompt, Sampling: greedy(), PromptLogprobs: true}); !errors.Is(err, ErrNoPromptLogprobs) {
		t.Fatalf("sim Submit with prompt logprobs: %v, want ErrNoPromptLogprobs", err)
	}
	s, err := e.Submit(Params{Prompt: prompt, Sampling: greedy()})
	if err != nil {
		t.Fatal(err)
	}
	if r := collectScored(t, s); r.last.Finish != FinishLength || len(r.ids) != 0 || r.prompt != nil {
		t.Fatalf("sim prefill-only request: finish %q, ids %v, prompt logprobs %v", r.last.Finish, r.ids, r.prompt)
	}
}
