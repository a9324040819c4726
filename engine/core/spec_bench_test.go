package core

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stokehq/stoke/engine/generate"
	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sample"
)

// benchPrompts are the prompts of the speculative benchmarks on
// stories260K: "golden", the golden cases' prompts but BOS alone, and
// "extractive", the story the model tells from BOS, then BOS again and
// the story's first 0, 4, 8 or 12 tokens: stories260K tells the same story
// again, as an answer quotes its context (summaries, code edits, RAG),
// which is the work prompt lookup is for.
func benchPrompts(b *testing.B, s *specSubject) map[string][][]int32 {
	b.Helper()
	const bos = 1
	res, err := generate.Run(context.Background(), s.target, []int32{bos}, generate.Options{MaxTokens: 400, Sampling: sample.Params{TopP: 1}, IgnoreEOS: true}, nil)
	if err != nil {
		b.Fatal(err)
	}
	story := res.IDs
	if end := slices.Index(story, bos); end > 0 {
		story = story[:end]
	}
	var extractive [][]int32
	for i := range 4 {
		extractive = append(extractive, slices.Concat([]int32{bos}, story, []int32{bos}, story[:4*i]))
	}
	return map[string][][]int32{"golden": s.prompts[1:len(s.golden)], "extractive": extractive}
}

// benchSpec is the prompt-lookup configuration the benchmarks measure.
func benchSpec() SpecConfig {
	return SpecConfig{Method: SpecNgram, NumSpeculativeTokens: 4, PromptLookupMin: 2, PromptLookupMax: 4}
}

// runLoad keeps n greedy requests in flight (each generating up to
// maxTokens tokens, cycling through prompts) until total have finished, as
// a closed-loop load generator at max concurrency n does, and reports the
// tokens generated and the time taken.
func runLoad(b *testing.B, e *Engine, prompts [][]int32, n, total, maxTokens int) (tokens int, elapsed time.Duration) {
	b.Helper()
	var next, generated atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= total {
					return
				}
				p := prompts[i%len(prompts)]
				out := runAll(b, e, []Params{{Prompt: p, MaxTokens: min(maxTokens, 512-len(p)), Sampling: sample.Params{TopP: 1, Logprobs: -1}, IgnoreEOS: true}})
				generated.Add(int64(len(out[0].ids)))
			}
		}()
	}
	wg.Wait()
	return int(generated.Load()), time.Since(start)
}

// benchSpeculative measures generated tokens per second at concurrency n
// (4n requests per iteration), with and without speculation, and reports
// the acceptance rate, tokens per verified draft and generated tokens per
// engine step.
func benchSpeculative(b *testing.B, s *specSubject, prompts [][]int32, n int, spec SpecConfig) {
	e := startEngine(b, s.target, s.tok, s.eos, spec, 2048, 2048, nil)
	total := max(4*n, 8)
	runLoad(b, e, prompts, n, len(prompts), 64) // warm up: every prompt in the prefix cache
	steps0, spec0 := e.Stats().Steps, e.SpecStats()
	var tokens int
	var elapsed time.Duration
	b.ResetTimer()
	for range b.N {
		tk, el := runLoad(b, e, prompts, n, total, 64)
		tokens, elapsed = tokens+tk, elapsed+el
	}
	b.StopTimer()
	st, steps := e.SpecStats(), e.Stats().Steps-steps0
	st.Drafts, st.DraftTokens, st.Accepted, st.Emitted = st.Drafts-spec0.Drafts, st.DraftTokens-spec0.DraftTokens, st.Accepted-spec0.Accepted, st.Emitted-spec0.Emitted
	b.ReportMetric(float64(tokens)/elapsed.Seconds(), "tok/s")
	b.ReportMetric(float64(tokens)/float64(steps), "tok/step")
	if spec.Enabled() {
		b.ReportMetric(st.AcceptanceRate(), "accept")
		b.ReportMetric(st.TokensPerDraft(), "tok/draft")
	}
}

// BenchmarkSpeculativePromptLookup measures stories260K with and without
// prompt lookup at concurrency 1 and 16, on the golden and the
// extractive prompts.
func BenchmarkSpeculativePromptLookup(b *testing.B) { benchPromptLookup(b, []int{1, 16}) }

// BenchmarkSpeculativeBreakEven measures the same at growing concurrency,
// to find the batch at which prompt lookup stops paying (the default of
// disable_by_batch_size): compare tok/s of ngram with plain at each n.
func BenchmarkSpeculativeBreakEven(b *testing.B) {
	benchPromptLookup(b, []int{1, 2, 4, 8, 12, 16, 24, 32})
}

// benchPromptLookup runs the golden and extractive prompts at each
// concurrency, plain and with prompt lookup.
func benchPromptLookup(b *testing.B, concurrencies []int) {
	set, err := kernels.Default()
	if err != nil {
		b.Fatal(err)
	}
	s := storiesSubject(b, set)
	for _, name := range []string{"golden", "extractive"} {
		prompts := benchPrompts(b, s)[name]
		for _, n := range concurrencies {
			for _, mode := range []string{"plain", "ngram"} {
				spec := SpecConfig{}
				if mode == "ngram" {
					spec = benchSpec()
				}
				b.Run(fmt.Sprintf("%s/concurrency=%d/%s", name, n, mode), func(b *testing.B) {
					benchSpeculative(b, s, prompts, n, spec)
				})
			}
		}
	}
}

// BenchmarkSpeculativeDraftModel measures stories260K with itself as the
// draft model (drafts it accepts unless the target's settings differ): the
// cost of the draft's own forward passes, an upper bound on acceptance.
func BenchmarkSpeculativeDraftModel(b *testing.B) {
	set, err := kernels.Default()
	if err != nil {
		b.Fatal(err)
	}
	s := storiesSubject(b, set)
	prompts := benchPrompts(b, s)["golden"]
	for _, n := range []int{1, 16} {
		for _, mode := range []string{"plain", "draft_model"} {
			spec := SpecConfig{}
			if mode == "draft_model" {
				spec = SpecConfig{Method: SpecDraftModel, NumSpeculativeTokens: 4, Draft: s.drafts["self"]}
			}
			b.Run(fmt.Sprintf("concurrency=%d/%s", n, mode), func(b *testing.B) {
				benchSpeculative(b, s, prompts, n, spec)
			})
		}
	}
}

// BenchmarkSpeculativeVerifyCost measures what verifying drafts costs on a
// model whose decode is bound by memory bandwidth, as real checkpoints'
// is (a random-weight model of the synth "100m" shape, F32, 440 MB; the
// trained stories260K fits in L2, so its decode is bound by arithmetic
// instead): one forward pass of batch sequences at position 256 with 1
// token each (a decode step) or 1+4 (a step verifying 4 drafts). Their
// ratio at a batch is the tokens per step speculation must reach there to
// pay: about 1 for small batches, 5 once the batch is compute bound.
func BenchmarkSpeculativeVerifyCost(b *testing.B) {
	set, err := kernels.Default()
	if err != nil {
		b.Fatal(err)
	}
	pool := set.NewPool(0)
	b.Cleanup(pool.Close)
	mc := model.Config{ModelType: "llama", HiddenSize: 768, IntermediateSize: 2048, NumLayers: 12, NumHeads: 12, NumKVHeads: 4, HeadDim: 64,
		VocabSize: 32000, MaxPositionEmbeddings: 4096, RMSNormEps: 1e-5, RopeTheta: 10000, HiddenAct: "silu", TieWordEmbeddings: true}
	m, err := model.New(mc, model.RandomSource(mc, 1, 0.02), pool)
	if err != nil {
		b.Fatal(err)
	}
	const pos = 256
	for _, batch := range []int{1, 2, 4, 8, 16, 32} {
		blocks := batch * (pos/kvcache.BlockSize + 2)
		kv, err := kvcache.New(m.KVShape(), blocks)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { kv.Free() })
		mgr := kvcache.NewManager(blocks, false)
		for s := range batch {
			mgr.Allocate(uint64(s), nil, pos+8, nil, "")
		}
		for _, tokens := range []int{1, 5} {
			b.Run(fmt.Sprintf("batch=%d/tokens=%d", batch, tokens), func(b *testing.B) {
				bt := &model.Batch{}
				for s := range batch {
					bt.BlockTables = append(bt.BlockTables, mgr.Table(uint64(s)))
					for j := range tokens {
						bt.Tokens = append(bt.Tokens, int32(7*s+j))
						bt.Positions = append(bt.Positions, int32(pos+j))
						bt.Seqs = append(bt.Seqs, int32(s))
						bt.LogitRows = append(bt.LogitRows, len(bt.Tokens)-1)
					}
				}
				logits := make([]float32, len(bt.LogitRows)*mc.VocabSize)
				for b.Loop() {
					if err := m.Forward(bt, kv, logits); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/step")
			})
		}
	}
}
