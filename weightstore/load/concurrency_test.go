package load

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/generate"
	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kernels/kernelstest"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/server"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/internal/testmodel"
	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/synth"
)

// concurrentRequests is how many greedy requests run at once.
const concurrentRequests = 32

// promptLengths are the lengths of the concurrent prompts: single tokens,
// block edges (16, 32, 64, 128), and prompts longer than a step's token
// budget, so that steps mix decodes with whole and chunked prefills.
var promptLengths = [concurrentRequests]int{1, 2, 3, 4, 5, 7, 9, 12, 15, 16, 17, 20, 24, 31, 32, 33,
	40, 48, 57, 64, 65, 70, 80, 96, 97, 100, 120, 128, 129, 150, 170, 200}

// wideGQAConfig is a synthetic grouped-query model (18 query heads over 6
// KV heads of 64) whose every product is wider than 1,024 inputs: hidden
// 1,152 (the input of Q/K/V, gate/up and the LM head), 18×64 = 1,152 (O)
// and intermediate 1,280 (down).
func wideGQAConfig() model.Config {
	return model.Config{HiddenSize: 1152, IntermediateSize: 1280, NumLayers: 1, NumHeads: 18, NumKVHeads: 6, HeadDim: 64,
		VocabSize: 512, MaxPositionEmbeddings: 512, RopeTheta: 10000, TieWordEmbeddings: true}
}

// TestConcurrentGreedyMatchesAlone serves a model the way `stoke engine
// --model` does (load.Checkpoint, the continuous-batching engine over the
// model executor) and checks that 32 concurrent greedy requests, with
// prompts of 1 to 200 tokens that the scheduler chunks and batches
// together, give exactly what each gives alone, on every kernel set this
// CPU runs: the same ids as on an idle engine and as generate.Run on one
// thread, and the same logprob bits as on the idle engine. It runs on the
// trained stories260K and on a synthetic GQA model with layers wider than
// 1,024.
func TestConcurrentGreedyMatchesAlone(t *testing.T) {
	t.Run("stories260K", func(t *testing.T) {
		dir := testmodel.Dir(t)
		kernelstest.ForEachSet(t, func(t *testing.T, set *kernels.Set) {
			checkConcurrentMatchesAlone(t, set, dir, concurrencyLoad{batchTokens: 64, maxTokens: 24, bos: true})
		})
	})
	t.Run("wide-gqa", func(t *testing.T) {
		cfg := wideGQAConfig()
		dir := filepath.Join(t.TempDir(), "wide-gqa")
		if err := synth.Write(context.Background(), dir, synth.Options{Config: &cfg, DType: dtype.F32, Seed: 11}); err != nil {
			t.Fatal(err)
		}
		load := concurrencyLoad{batchTokens: 128, maxTokens: 12}
		if testing.Short() {
			// Shorter prompts and outputs (the longer ones still exceed a
			// step's budget).
			load = concurrencyLoad{batchTokens: 48, maxTokens: 6, maxPrompt: 64}
		}
		kernelstest.ForEachSet(t, func(t *testing.T, set *kernels.Set) {
			if testing.Short() && set.Name() == "generic" {
				// Pure Go under the race detector takes minutes on this
				// model; the full run covers the portable set.
				t.Skip("-short: the portable set runs this model in the full run only")
			}
			checkConcurrentMatchesAlone(t, set, dir, load)
		})
	})
}

// concurrencyLoad shapes one run of checkConcurrentMatchesAlone.
type concurrencyLoad struct {
	batchTokens int  // the scheduler's MaxNumBatchedTokens
	maxTokens   int  // generated per request
	maxPrompt   int  // caps promptLengths when > 0
	bos         bool // prompts start with token 1
}

// concurrentPrompt is request i's prompt: pseudo-random ids below vocab,
// the first half shared with the other requests of its family (i mod 4),
// so that some blocks come from the prefix cache.
func concurrentPrompt(i, vocab int, l concurrencyLoad) []int32 {
	n := promptLengths[i]
	if l.maxPrompt > 0 {
		n = min(n, l.maxPrompt)
	}
	p := make([]int32, n)
	for j := range p {
		seed := i
		if j < n/2 {
			seed = i % 4
		}
		p[j] = int32(3 + (seed*7919+j*104729+j*j*31)%(vocab-3))
	}
	if l.bos {
		p[0] = 1
	}
	return p
}

// output is what one request produced: its ids and each one's logprob.
type output struct {
	ids      []int32
	logprobs []float32
}

// runRequests submits prompts to a fresh engine of loaded, all at once when
// concurrent, else one after another, and returns each one's output.
func runRequests(t *testing.T, ctx context.Context, loaded *server.Loaded, prompts [][]int32, maxTokens int, concurrent bool) []output {
	t.Helper()
	e, err := loaded.Start(core.NewMetrics(prometheus.NewRegistry(), loaded.Name))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	// Temperature 0 is greedy; logprobs 0 reports the chosen token's.
	greedy := sample.Params{Temperature: 0, TopP: 1, Logprobs: 0}
	out := make([]output, len(prompts))
	request := func(i int) {
		s, err := e.Submit(core.Params{Prompt: prompts[i], MaxTokens: maxTokens, Sampling: greedy, IgnoreEOS: true})
		if err != nil {
			t.Error(err)
			return
		}
		for {
			d, ok := s.Next(ctx)
			if !ok {
				return
			}
			if d.Err != nil {
				t.Errorf("request %d: %v", i, d.Err)
			}
			out[i].ids = append(out[i].ids, d.IDs...)
			for _, lp := range d.Logprobs {
				out[i].logprobs = append(out[i].logprobs, lp.Chosen.Logprob)
			}
		}
	}
	if !concurrent {
		for i := range prompts {
			request(i)
		}
		return out
	}
	var wg sync.WaitGroup
	for i := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			request(i)
		}()
	}
	wg.Wait()
	return out
}

// checkConcurrentMatchesAlone runs the concurrent requests of l on the
// model in dir with set, then each alone, and checks the outputs agree:
// the ids exactly, with generate.Run on one thread too, and the logprobs
// bit for bit, as every kernel set promises one result per input whatever
// the batch, chunking or split across threads.
func checkConcurrentMatchesAlone(t *testing.T, set *kernels.Set, dir string, l concurrencyLoad) {
	// The engine the concurrent requests share has a small step budget, so
	// long prompts are chunked; alone, each request runs on an engine with
	// stoke engine's default budget, which prefills it in one step.
	serve := func(budget int) *server.Loaded {
		opts := Options{Engine: server.EngineOptions{Sched: sched.Config{MaxNumBatchedTokens: budget, MaxNumSeqs: concurrentRequests}, PrefixCaching: true},
			KVCacheBytes: 64 << 20, Threads: 2, Kernels: set}
		loaded, err := Checkpoint(opts)(context.Background(), engineapi.LoadRequest{Path: dir}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { loaded.Close() })
		return loaded
	}
	shared, idle := serve(l.batchTokens), serve(2048)
	// Bounded by the test binary's own deadline, not a fixed one: under
	// emulation (scripts/test-cpus.sh) a case takes minutes.
	ctx := t.Context()
	if d, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-30*time.Second))
		defer cancel()
	}

	// The reference: each prompt alone through generate.Run, on one thread.
	pool := set.NewPool(1)
	defer pool.Close()
	m, ck, err := checkpoint.LoadModel(dir, pool)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()

	vocab := m.Config().VocabSize
	prompts := make([][]int32, concurrentRequests)
	for i := range prompts {
		prompts[i] = concurrentPrompt(i, vocab, l)
	}
	concurrent := runRequests(t, ctx, shared, prompts, l.maxTokens, true)
	if t.Failed() {
		return
	}
	alone := runRequests(t, ctx, idle, prompts, l.maxTokens, false)
	if t.Failed() {
		return
	}

	var bad []string
	for i, prompt := range prompts {
		res, err := generate.Run(ctx, m, prompt, generate.Options{MaxTokens: l.maxTokens, Sampling: sample.Params{TopP: 1}, IgnoreEOS: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		c, a := concurrent[i], alone[i]
		if len(c.logprobs) != len(c.ids) || len(a.logprobs) != len(a.ids) {
			t.Fatalf("request %d: %d and %d logprobs for %d and %d ids", i, len(c.logprobs), len(a.logprobs), len(c.ids), len(a.ids))
		}
		switch {
		case !slices.Equal(c.ids, a.ids) || !slices.Equal(c.ids, res.IDs):
			at := 0
			for at < min(len(c.ids), len(a.ids), len(res.IDs)) && c.ids[at] == a.ids[at] && c.ids[at] == res.IDs[at] {
				at++
			}
			bad = append(bad, fmt.Sprintf("request %d (prompt of %d): ids differ from token %d: concurrent %v, alone %v, generate.Run %v",
				i, len(prompt), at, c.ids, a.ids, res.IDs))
		case !slices.Equal(c.logprobs, a.logprobs):
			at := 0
			for c.logprobs[at] == a.logprobs[at] {
				at++
			}
			bad = append(bad, fmt.Sprintf("request %d (prompt of %d): same ids, but token %d's logprob is %v concurrent, %v alone",
				i, len(prompt), at, c.logprobs[at], a.logprobs[at]))
		}
	}
	if len(bad) > 0 {
		t.Errorf("%d of %d concurrent greedy requests differ from the same request alone; the first %d:", len(bad), len(prompts), min(len(bad), 4))
		for _, b := range bad[:min(len(bad), 4)] {
			t.Log(b)
		}
	}
}
