package core

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kernels/kernelstest"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/sim"
	"github.com/stokehq/stoke/engine/tokenizer"
	"github.com/stokehq/stoke/internal/testmodel"
	"github.com/stokehq/stoke/weightstore/checkpoint"
)

// specSubject is a model the speculative tests decode with: its tokenizer,
// EOS ids, prompts, and the draft models it is paired with.
type specSubject struct {
	target *model.Model
	tok    *tokenizer.Tokenizer
	eos    []int32
	// drafts are the draft models tried, by name; all share the target's
	// vocabulary.
	drafts map[string]*model.Model
	// golden are the reference greedy completions of prompts[:len(golden)].
	prompts [][]int32
	golden  [][]int32
}

// randomModel is a random-weight Llama of vocabulary 512 on pool.
func randomModel(t testing.TB, pool *kernels.Pool, hidden, heads, kvHeads, layers int, seed uint64) *model.Model {
	t.Helper()
	mc := model.Config{ModelType: "llama", HiddenSize: hidden, IntermediateSize: 2 * hidden, NumLayers: layers, NumHeads: heads, NumKVHeads: kvHeads,
		HeadDim: hidden / heads, VocabSize: 512, MaxPositionEmbeddings: 2048, RMSNormEps: 1e-5, RopeTheta: 10000, HiddenAct: "silu", TieWordEmbeddings: true}
	m, err := model.New(mc, model.RandomSource(mc, seed, 0.3), pool)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// storiesSubject is the trained stories260K with its golden prompts and
// two drafts: the checkpoint itself (greedy drafts it always accepts) and
// a random model (drafts it mostly rejects); it skips without the shared
// folder.
func storiesSubject(t testing.TB, set *kernels.Set) *specSubject {
	t.Helper()
	dir := testmodel.Dir(t)
	cases := testmodel.Golden(t)
	pool := set.NewPool(2)
	t.Cleanup(pool.Close)
	load := func() *model.Model {
		m, ck, err := checkpoint.LoadModel(dir, pool)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ck.Close() })
		return m
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := &specSubject{target: load(), tok: tok, eos: tok.EOS(),
		drafts: map[string]*model.Model{"self": load(), "random": randomModel(t, pool, 32, 4, 2, 1, 5)}}
	for _, c := range cases {
		s.prompts = append(s.prompts, c.PromptIDs)
		s.golden = append(s.golden, c.Completion)
	}
	// Text prompts that repeat themselves, as extractive work does.
	for _, text := range []string{
		"Lily and Tom went to the park. Lily and Tom played with the ball. Lily and Tom",
		"The cat sat on the mat. The dog sat on the mat. The bird sat on the",
		"Once upon a time",
	} {
		s.prompts = append(s.prompts, tok.Encode(text, true))
	}
	return s
}

// gqaSubject is a synthetic grouped-query model (4 query heads over 2 KV
// heads) with a synthetic tokenizer and a smaller random draft.
func gqaSubject(t testing.TB, set *kernels.Set) *specSubject {
	t.Helper()
	pool := set.NewPool(2)
	t.Cleanup(pool.Close)
	tj, tc, err := tokenizer.Synthesize(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.New(tj, tc)
	if err != nil {
		t.Fatal(err)
	}
	s := &specSubject{target: randomModel(t, pool, 64, 4, 2, 2, 3), tok: tok, eos: tok.EOS(),
		drafts: map[string]*model.Model{"random": randomModel(t, pool, 32, 2, 1, 1, 9)}}
	for i := range 6 {
		s.prompts = append(s.prompts, testPrompt(i, 3+i*7))
	}
	rep := testPrompt(40, 12)
	s.prompts = append(s.prompts, slices.Concat(rep, rep, rep[:7]))
	return s
}

// startEngine runs an engine over m until the test ends.
func startEngine(t testing.TB, m *model.Model, tok *tokenizer.Tokenizer, eos []int32, spec SpecConfig, budget, blocks int, reg prometheus.Registerer) *Engine {
	t.Helper()
	storage, err := kvcache.New(m.KVShape(), blocks)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Sched: sched.Config{MaxNumBatchedTokens: budget, MaxNumSeqs: 64, MaxModelLen: m.Config().MaxPositionEmbeddings}, EOS: eos, Spec: spec}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	e, err := New(cfg, kvcache.NewManager(blocks, true), NewModelExecutor(m, storage), tok, NewMetrics(reg, "test"))
	if err != nil {
		storage.Free()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return e
}

// runOut is everything a stream delivered.
type runOut struct {
	text     string
	ids      []int32
	logprobs []sample.Logprobs
	prompt   []sample.Logprobs
	finish   string
	usage    Usage
}

// runAll submits every request at once and collects their outputs.
func runAll(t testing.TB, e *Engine, params []Params) []runOut {
	t.Helper()
	streams := make([]*Stream, len(params))
	for i, p := range params {
		s, err := e.Submit(p)
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = s
	}
	out := make([]runOut, len(params))
	var wg sync.WaitGroup
	for i, s := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			o := &out[i]
			for {
				d, ok := s.Next(ctx)
				if !ok {
					return
				}
				if d.Err != nil {
					t.Errorf("request %d: %v", i, d.Err)
				}
				o.text += d.Text
				o.ids = append(o.ids, d.IDs...)
				o.logprobs = append(o.logprobs, d.Logprobs...)
				if d.PromptLogprobs != nil {
					o.prompt = d.PromptLogprobs
				}
				if d.Finish != "" {
					o.finish, o.usage = d.Finish, d.Usage
				}
			}
		}()
	}
	wg.Wait()
	return out
}

// runEach submits the requests one after another (concurrency 1).
func runEach(t testing.TB, e *Engine, params []Params) []runOut {
	t.Helper()
	out := make([]runOut, len(params))
	for i, p := range params {
		out[i] = runAll(t, e, []Params{p})[0]
	}
	return out
}

// sameOutputs reports the first difference between want and got: ids,
// text, finish reason, prompt and completion tokens, logprob bits. Cached
// tokens are left out: they depend on what ran before and beside.
func sameOutputs(want, got []runOut) string {
	for i := range want {
		w, g := want[i], got[i]
		switch {
		case !slices.Equal(w.ids, g.ids):
			at := 0
			for at < min(len(w.ids), len(g.ids)) && w.ids[at] == g.ids[at] {
				at++
			}
			return fmt.Sprintf("request %d: ids differ at %d: plain %v, speculative %v", i, at, w.ids, g.ids)
		case w.text != g.text:
			return fmt.Sprintf("request %d: text %q plain, %q speculative", i, w.text, g.text)
		case w.finish != g.finish || w.usage.PromptTokens != g.usage.PromptTokens || w.usage.CompletionTokens != g.usage.CompletionTokens:
			return fmt.Sprintf("request %d: finish %q %+v plain, %q %+v speculative", i, w.finish, w.usage, g.finish, g.usage)
		case len(w.logprobs) != len(g.logprobs) || len(w.prompt) != len(g.prompt):
			return fmt.Sprintf("request %d: %d/%d logprobs plain, %d/%d speculative", i, len(w.logprobs), len(w.prompt), len(g.logprobs), len(g.prompt))
		}
		for j := range w.logprobs {
			if w.logprobs[j].Chosen != g.logprobs[j].Chosen || !slices.Equal(w.logprobs[j].Top, g.logprobs[j].Top) {
				return fmt.Sprintf("request %d: token %d's logprobs %+v plain, %+v speculative", i, j, w.logprobs[j], g.logprobs[j])
			}
		}
		for j := range w.prompt {
			if w.prompt[j].Chosen != g.prompt[j].Chosen {
				return fmt.Sprintf("request %d: prompt token %d's logprob %+v plain, %+v speculative", i, j+1, w.prompt[j], g.prompt[j])
			}
		}
	}
	return ""
}

// specMethods are the speculative configurations every subject runs.
func specMethods(s *specSubject) map[string]SpecConfig {
	m := map[string]SpecConfig{
		"ngram": {Method: SpecNgram, NumSpeculativeTokens: 4, PromptLookupMin: 1, PromptLookupMax: 3},
		// Disabled from 6 decoding requests on: the concurrent runs cross it.
		"ngram, disable_by_batch_size 6": {Method: SpecNgram, NumSpeculativeTokens: 5, PromptLookupMin: 2, PromptLookupMax: 4, DisableByBatchSize: 6},
	}
	for name, d := range s.drafts {
		m["draft_model "+name] = SpecConfig{Method: SpecDraftModel, NumSpeculativeTokens: 3, Draft: d}
	}
	return m
}

// greedyMix are the concurrent requests: every prompt several times with
// greedy settings that exercise the sampler's per-row context (penalties),
// stop strings and ids taken from the free-running output, max_tokens at
// and around the draft length, logprobs, prompt logprobs, and every other
// request opting out of speculation.
func greedyMix(prompts [][]int32, free []runOut) []Params {
	var ps []Params
	for i, prompt := range prompts {
		base := Params{Prompt: prompt, Sampling: sample.Params{TopP: 1, Logprobs: -1}, IgnoreEOS: true, MaxTokens: 40}
		text := free[i].text
		for v := range 4 {
			p := base
			switch v {
			case 0:
				p.Sampling = sample.Params{TopP: 1, Logprobs: 2, RepetitionPenalty: 1.3, FrequencyPenalty: 0.4, PresencePenalty: 0.2}
				p.MaxTokens = []int{1, 2, 4, 5, 6, 9}[i%6]
			case 1:
				if len(text) >= 12 {
					p.Stop = []string{text[len(text)/2 : len(text)/2+3]}
				}
				p.Sampling.Logprobs = 0
			case 2:
				if ids := free[i].ids; len(ids) > 8 {
					p.StopIDs = []int32{ids[7]}
				}
				p.IgnoreEOS = false
				p.Sampling.TopK = 1
				p.Sampling.Temperature = 0.8 // top-k 1 is greedy too
			case 3:
				p.PromptLogprobs = i%2 == 0
				p.Sampling.Logprobs = 1
				p.MaxTokens = 17
			}
			p.DisableSpeculation = (4*i+v)%3 == 2
			ps = append(ps, p)
		}
	}
	return ps
}

// TestSpeculativeGreedyMatchesPlain checks, on every kernel set, that
// greedy speculative decoding gives exactly what plain decoding gives
// (ids, text, finish reasons, usage and logprob bits), with prompt lookup
// and draft models, at concurrency 1 and with the prompts' 16 and more
// mixed requests at once: on stories260K (also against its golden
// completions) and on a synthetic GQA model.
func TestSpeculativeGreedyMatchesPlain(t *testing.T) {
	kernelstest.ForEachSet(t, func(t *testing.T, set *kernels.Set) {
		for _, subj := range []struct {
			name string
			load func(testing.TB, *kernels.Set) *specSubject
		}{{"stories260K", storiesSubject}, {"gqa", gqaSubject}} {
			t.Run(subj.name, func(t *testing.T) {
				s := subj.load(t, set)
				checkSpeculativeGreedy(t, s)
			})
		}
	})
}

func checkSpeculativeGreedy(t *testing.T, s *specSubject) {
	plainEngine := startEngine(t, s.target, s.tok, s.eos, SpecConfig{}, 48, 512, nil)
	free := make([]Params, len(s.prompts))
	for i, prompt := range s.prompts {
		n := 40
		if i < len(s.golden) {
			n = len(s.golden[i])
		}
		free[i] = Params{Prompt: prompt, MaxTokens: n, Sampling: sample.Params{TopP: 1, Logprobs: 0}, IgnoreEOS: true}
	}
	plainAlone := runEach(t, plainEngine, free)
	for i, g := range s.golden {
		if !slices.Equal(plainAlone[i].ids, g) {
			t.Fatalf("plain decoding of golden prompt %d: %v, golden %v", i, plainAlone[i].ids, g)
		}
	}
	mix := greedyMix(s.prompts, plainAlone)
	if len(mix) < 16 {
		t.Fatalf("only %d concurrent requests", len(mix))
	}
	plainMix := runAll(t, plainEngine, mix)
	for name, spec := range specMethods(s) {
		t.Run(name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			e := startEngine(t, s.target, s.tok, s.eos, spec, 48, 512, reg)
			if diff := sameOutputs(plainAlone, runEach(t, e, free)); diff != "" {
				t.Fatalf("concurrency 1: %s", diff)
			}
			alone := e.SpecStats()
			if diff := sameOutputs(plainMix, runAll(t, e, mix)); diff != "" {
				t.Fatalf("%d concurrent: %s", len(mix), diff)
			}
			st := e.SpecStats()
			if alone.Drafts == 0 || alone.Disabled > 0 || st.Emitted < st.Drafts || st.Accepted > st.DraftTokens {
				t.Fatalf("speculation stats alone %+v, after the concurrent run %+v", alone, st)
			}
			if disabled := spec.DisableByBatchSize > 0; disabled != (st.Disabled > 0) || !disabled && st.Drafts == alone.Drafts {
				t.Fatalf("disable_by_batch_size %d with %d concurrent requests: stats %+v", spec.DisableByBatchSize, len(mix), st)
			}
			checkSpecMetrics(t, reg, st)
			t.Logf("%+v: acceptance %.2f, %.2f tokens per draft", st, st.AcceptanceRate(), st.TokensPerDraft())
		})
	}
}

// checkSpecMetrics checks the vllm:spec_decode_* series against the
// engine's own counters.
func checkSpecMetrics(t *testing.T, reg *prometheus.Registry, st SpecStats) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]float64{}
	perPos := map[string]float64{}
	var hist struct{ count, sum float64 }
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch {
			case f.GetName() == "vllm:spec_decode_num_accepted_tokens_per_pos":
				for _, l := range m.GetLabel() {
					if l.GetName() == "position" {
						perPos[l.GetValue()] = m.GetCounter().GetValue()
					}
				}
			case f.GetName() == "stoke_engine_spec_decode_tokens_per_step":
				hist.count, hist.sum = float64(m.GetHistogram().GetSampleCount()), m.GetHistogram().GetSampleSum()
			case m.GetCounter() != nil:
				values[f.GetName()] = m.GetCounter().GetValue()
			}
		}
	}
	want := map[string]uint64{
		"vllm:spec_decode_num_drafts_total":          st.Drafts,
		"vllm:spec_decode_num_draft_tokens_total":    st.DraftTokens,
		"vllm:spec_decode_num_accepted_tokens_total": st.Accepted,
	}
	for name, v := range want {
		if values[name] != float64(v) {
			t.Errorf("%s = %v, want %d", name, values[name], v)
		}
	}
	total, prev := 0.0, -1.0
	for pos := 0; pos < len(perPos); pos++ {
		v, ok := perPos[fmt.Sprint(pos)]
		if !ok || (prev >= 0 && v > prev) {
			t.Errorf("accepted per position %v: a later position accepted more than an earlier one", perPos)
		}
		total, prev = total+v, v
	}
	if total != float64(st.Accepted) {
		t.Errorf("accepted per position sum to %v, want %d", total, st.Accepted)
	}
	if hist.count != float64(st.Drafts) || hist.sum != float64(st.Accepted+st.Drafts) {
		t.Errorf("tokens per step: %v observations summing to %v, want %d and %d", hist.count, hist.sum, st.Drafts, st.Accepted+st.Drafts)
	}
}

// TestSpeculativeUnderKVPressure checks that preemption with drafts in
// flight keeps every output: speculative requests through a pool too
// small for them all give what they give unpressured without
// speculation, and the pool is empty at the end.
func TestSpeculativeUnderKVPressure(t *testing.T) {
	kernelstest.ForEachSet(t, func(t *testing.T, set *kernels.Set) {
		s := gqaSubject(t, set)
		var ps []Params
		for i := range 10 {
			rep := testPrompt(i, 10)
			ps = append(ps, Params{Prompt: slices.Concat(rep, rep, rep[:3]), MaxTokens: 30, Sampling: greedy(), IgnoreEOS: true})
		}
		want := runAll(t, startEngine(t, s.target, s.tok, s.eos, SpecConfig{}, 256, 512, nil), ps)
		for name, spec := range specMethods(s) {
			t.Run(name, func(t *testing.T) {
				e := startEngine(t, s.target, s.tok, s.eos, spec, 256, 14, nil)
				if diff := sameOutputs(want, runAll(t, e, ps)); diff != "" {
					t.Fatal(diff)
				}
				waitFor(t, func() bool { st := e.Stats(); return st.KVUsage == 0 && st.Running+st.Waiting == 0 })
				if st := e.Stats(); st.Preemptions == 0 {
					t.Fatalf("a pool of 14 blocks preempted nothing: %+v", st)
				}
				if e.SpecStats().Drafts == 0 {
					t.Fatal("nothing speculated")
				}
			})
		}
	})
}

// TestSpeculativeSamplingRuns checks sampled requests (temperature,
// top-k, top-p) through a speculating engine: outputs of the asked length
// from the model's vocabulary, reproducible for a seed, with logprobs for
// each token and drafts accepted.
func TestSpeculativeSamplingRuns(t *testing.T) {
	s := gqaSubject(t, nil)
	spec := SpecConfig{Method: SpecNgram, NumSpeculativeTokens: 4, PromptLookupMin: 1, PromptLookupMax: 3}
	var ps []Params
	for i, prompt := range s.prompts {
		ps = append(ps, Params{Prompt: prompt, MaxTokens: 30, IgnoreEOS: true,
			Sampling: sample.Params{Temperature: 0.7, TopK: 40, TopP: 0.9, Seed: uint64(i), Logprobs: 1}})
	}
	e := startEngine(t, s.target, s.tok, s.eos, spec, 64, 512, nil)
	first, again := runEach(t, e, ps), runEach(t, e, ps)
	for i := range ps {
		if len(first[i].ids) != 30 || len(first[i].logprobs) != 30 || first[i].finish != FinishLength {
			t.Fatalf("request %d: %d ids, %d logprobs, finish %q", i, len(first[i].ids), len(first[i].logprobs), first[i].finish)
		}
		for j, lp := range first[i].logprobs {
			if lp.Chosen.ID != first[i].ids[j] || lp.Chosen.Logprob > 0 {
				t.Fatalf("request %d token %d: logprob %+v", i, j, lp)
			}
		}
	}
	if diff := sameOutputs(first, again); diff != "" {
		t.Fatalf("same seeds, different tokens: %s", diff)
	}
	if st := e.SpecStats(); st.Accepted == 0 {
		t.Fatalf("no draft accepted: %+v", st)
	}
}

// TestSpecConfigRefused checks the settings an engine refuses.
func TestSpecConfigRefused(t *testing.T) {
	pool := kernels.NewPool(1)
	t.Cleanup(pool.Close)
	target := randomModel(t, pool, 32, 2, 1, 1, 1)
	otherVocab := func() *model.Model {
		mc := target.Config()
		mc.VocabSize = 300
		m, err := model.New(mc, model.RandomSource(mc, 2, 0.3), pool)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}()
	for _, tc := range []struct {
		name string
		spec SpecConfig
		sim  bool
		want string
	}{
		{"no tokens", SpecConfig{Method: SpecNgram, PromptLookupMin: 1, PromptLookupMax: 2}, false, "num_speculative_tokens must be in [1, 64], got 0"},
		{"lookup range", SpecConfig{Method: SpecNgram, NumSpeculativeTokens: 2, PromptLookupMin: 3, PromptLookupMax: 2}, false, "prompt_lookup_min <= prompt_lookup_max"},
		{"unknown method", SpecConfig{Method: "medusa", NumSpeculativeTokens: 2}, false, `unknown method "medusa"`},
		{"no draft", SpecConfig{Method: SpecDraftModel, NumSpeculativeTokens: 2}, false, "needs a draft model"},
		{"vocabulary", SpecConfig{Method: SpecDraftModel, NumSpeculativeTokens: 2, Draft: otherVocab}, false, "the draft model's vocabulary has 300 tokens, the model's 512"},
		{"negative disable", SpecConfig{Method: SpecNgram, NumSpeculativeTokens: 2, PromptLookupMin: 1, PromptLookupMax: 1, DisableByBatchSize: -1}, false, "disable_by_batch_size"},
		{"sim", SpecConfig{Method: SpecNgram, NumSpeculativeTokens: 2, PromptLookupMin: 1, PromptLookupMax: 1}, true, "does not verify drafts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var exec Executor
			if tc.sim {
				p, err := sim.LoadProfile("llama-3.1-8b-fp8-h100")
				if err != nil {
					t.Fatal(err)
				}
				exec = NewSimExecutor(p, nil, nil)
			} else {
				storage, err := kvcache.New(target.KVShape(), 4)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { storage.Free() })
				exec = NewModelExecutor(target, storage)
			}
			_, err := New(Config{Sched: sched.Config{MaxNumBatchedTokens: 16, MaxNumSeqs: 2, MaxModelLen: 64}, Spec: tc.spec}, kvcache.NewManager(4, true), exec, nil, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// TestPromptLookup checks the n-gram proposer on hand-made sequences.
func TestPromptLookup(t *testing.T) {
	for _, tc := range []struct {
		name       string
		tokens     []int32
		minN, maxN int
		k          int
		want       []int32
	}{
		{"longest n first", []int32{1, 2, 3, 9, 9, 2, 3, 7, 8, 1, 2, 3}, 1, 3, 3, []int32{9, 9, 2}},
		{"falls back to a shorter n", []int32{5, 2, 3, 7, 8, 1, 2, 3}, 2, 3, 2, []int32{7, 8}},
		{"most recent occurrence", []int32{4, 1, 4, 2, 4}, 1, 1, 1, []int32{2}},
		{"fewer than k follow", []int32{1, 2, 6, 1, 2}, 2, 2, 5, []int32{6, 1, 2}},
		{"none", []int32{1, 2, 3, 4}, 1, 2, 3, nil},
		{"below min", []int32{1, 2, 3, 1, 9, 3}, 2, 3, 3, nil},
		{"too short", []int32{1}, 1, 3, 3, nil},
		{"k 0", []int32{1, 1, 1}, 1, 1, 0, nil},
		{"overlapping: the most recent is one before the end", []int32{7, 7, 7, 7}, 2, 2, 3, []int32{7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := promptLookup(tc.tokens, tc.minN, tc.maxN, tc.k); !slices.Equal(got, tc.want) {
				t.Fatalf("promptLookup = %v, want %v", got, tc.want)
			}
		})
	}
}

// lookupByScan is prompt lookup as its definition reads: for n from maxN
// down to minN, the most recent earlier occurrence of the last n tokens.
func lookupByScan(tokens []int32, minN, maxN, k int) []int32 {
	L := len(tokens)
	if k < 1 {
		return nil
	}
	for n := min(maxN, L-1); n >= max(minN, 1); n-- {
		for i := L - n - 1; i >= 0; i-- {
			if slices.Equal(tokens[i:i+n], tokens[L-n:]) {
				return slices.Clone(tokens[i+n : min(i+n+k, L)])
			}
		}
	}
	return nil
}

// TestPromptLookupMatchesScan checks the one-pass lookup against the
// definition on random sequences over small alphabets (many matches).
func TestPromptLookupMatchesScan(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		tokens := make([]int32, 1+r.IntN(40))
		alphabet := 1 + r.IntN(5)
		for j := range tokens {
			tokens[j] = int32(r.IntN(alphabet))
		}
		minN := 1 + r.IntN(4)
		maxN := minN + r.IntN(4)
		k := r.IntN(6)
		if got, want := promptLookup(tokens, minN, maxN, k), lookupByScan(tokens, minN, maxN, k); !slices.Equal(got, want) {
			t.Fatalf("case %d: promptLookup(%v, %d, %d, %d) = %v, want %v", i, tokens, minN, maxN, k, got, want)
		}
	}
}

// TestSpeculativePrefixCacheHoldsNoDraft checks end to end that the
// blocks a speculating request fills enter the prefix cache with the keys
// and values of its own tokens, never of a rejected draft's: after
// requests speculate with a draft model they mostly reject, prompts that
// continue their outputs take those blocks from the cache and still decode
// exactly what a fresh engine without speculation decodes.
func TestSpeculativePrefixCacheHoldsNoDraft(t *testing.T) {
	kernelstest.ForEachSet(t, func(t *testing.T, set *kernels.Set) {
		s := gqaSubject(t, set)
		spec := SpecConfig{Method: SpecDraftModel, NumSpeculativeTokens: 3, Draft: s.drafts["random"]}
		e := startEngine(t, s.target, s.tok, s.eos, spec, 64, 512, nil)
		var first []Params
		for _, p := range s.prompts {
			first = append(first, Params{Prompt: p, MaxTokens: 60, Sampling: greedy(), IgnoreEOS: true})
		}
		outs := runAll(t, e, first)
		if st := e.SpecStats(); st.DraftTokens == st.Accepted {
			t.Fatalf("no draft rejected: %+v", st)
		}
		var next []Params
		for i, p := range s.prompts {
			next = append(next, Params{Prompt: slices.Concat(p, outs[i].ids[:50]), MaxTokens: 10, Sampling: greedy(), IgnoreEOS: true, DisableSpeculation: true})
		}
		got := runAll(t, e, next)
		want := runAll(t, startEngine(t, s.target, s.tok, s.eos, SpecConfig{}, 64, 512, nil), next)
		if diff := sameOutputs(want, got); diff != "" {
			t.Fatal(diff)
		}
		for i, o := range got {
			if o.usage.CachedTokens <= len(s.prompts[i])+kvcache.BlockSize && len(s.prompts[i])+50 >= 3*kvcache.BlockSize {
				t.Fatalf("request %d took %d tokens from the cache: the blocks of its continuation were not reused", i, o.usage.CachedTokens)
			}
		}
	})
}
