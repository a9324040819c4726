package synth

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/checkpoint"
)

// setModels writes each dtype's synthetic checkpoint once, under the
// parent benchmark's temporary directory, for all the kernel sets and
// thread counts its sub-benchmarks load it with.
type setModels struct {
	parent testing.TB
	mu     sync.Mutex
	dirs   map[dtype.DType]string
}

func (s *setModels) load(b *testing.B, preset string, d dtype.DType, set *kernels.Set, threads int) *model.Model {
	b.Helper()
	s.mu.Lock()
	dir, ok := s.dirs[d]
	if !ok {
		dir = write(s.parent, preset, d, 0, 1)
		s.dirs[d] = dir
	}
	s.mu.Unlock()
	pool := set.NewPool(threads)
	b.Cleanup(pool.Close)
	m, ck, err := checkpoint.LoadModel(dir, pool)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ck.Close() })
	return m
}

// weightBytes is what one forward pass streams of m's matrices.
func weightBytes(m *model.Model) int64 {
	var n int64
	w := m.Weights()
	for _, l := range w.Layers {
		for _, mat := range []*kernels.Matrix{l.Q, l.K, l.V, l.O, l.Gate, l.Up, l.Down} {
			n += mat.WeightBytes()
		}
	}
	return n + w.LMHead.WeightBytes()
}

// BenchmarkKernelSetsModel measures the synthetic model
// (STOKE_BENCH_PRESET, default 100m) on every kernel set this CPU runs:
// one-sequence decode (tokens/s, weight GB/s) for F32, BF16 and FP8 at 1
// and 2 threads; prefill of a 512-token prompt (tokens/s) for each dtype;
// and generated tokens/s of the continuous-batching engine on FP8 at 1, 4,
// 16 and 64 streams. Compare weight GB/s with the kernels package's
// BenchmarkMemoryBandwidth.
func BenchmarkKernelSetsModel(b *testing.B) {
	preset := benchPreset()
	models := &setModels{parent: b, dirs: map[dtype.DType]string{}}
	dtypes := []dtype.DType{dtype.F32, dtype.BF16, dtype.F8E4M3}
	for _, set := range kernels.Supported() {
		for _, d := range dtypes {
			for _, threads := range []int{1, 2} {
				b.Run(fmt.Sprintf("decode/%s/%s/%s/threads=%d", set.Name(), preset, d, threads), func(b *testing.B) {
					benchDecode(b, models.load(b, preset, d, set, threads))
				})
			}
		}
		for _, d := range dtypes {
			b.Run(fmt.Sprintf("prefill512/%s/%s/%s/threads=2", set.Name(), preset, d), func(b *testing.B) {
				benchPrefill(b, models.load(b, preset, d, set, 2), 512)
			})
		}
		for _, c := range []int{1, 4, 16, 64} {
			b.Run(fmt.Sprintf("streams/%s/%s/%s/concurrency=%d", set.Name(), preset, dtype.F8E4M3, c), func(b *testing.B) {
				benchStreams(b, models.load(b, preset, dtype.F8E4M3, set, 2), c)
			})
		}
	}
}

// benchDecode runs one sequence's decode steps over a 256-position context.
func benchDecode(b *testing.B, m *model.Model) {
	const ctx = 256
	kv, err := kvcache.New(m.KVShape(), ctx/kvcache.BlockSize)
	if err != nil {
		b.Fatal(err)
	}
	mgr := kvcache.NewManager(kv.NumBlocks(), false)
	if !mgr.Allocate(0, nil, ctx, nil, "") {
		b.Fatalf("no kv blocks for %d tokens", ctx)
	}
	logits := make([]float32, m.Config().VocabSize)
	batch := &model.Batch{Tokens: []int32{1}, Positions: []int32{0}, Seqs: []int32{0},
		BlockTables: [][]int32{mgr.Table(0)}, LogitRows: []int{0}}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		batch.Positions[0] = int32(i % ctx)
		batch.Tokens[0] = int32(i % 100)
		if err := m.Forward(batch, kv, logits); err != nil {
			b.Fatal(err)
		}
	}
	perToken := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(1/perToken, "tokens/s")
	b.ReportMetric(float64(weightBytes(m))/perToken/1e9, "weight-GB/s")
}

// benchPrefill runs an n-token prompt through one forward pass, as the
// engine does for a prompt within its token budget, and reports prompt
// tokens/s.
func benchPrefill(b *testing.B, m *model.Model, n int) {
	blocks := (n + kvcache.BlockSize - 1) / kvcache.BlockSize
	kv, err := kvcache.New(m.KVShape(), blocks)
	if err != nil {
		b.Fatal(err)
	}
	mgr := kvcache.NewManager(blocks, false)
	if !mgr.Allocate(0, nil, n, nil, "") {
		b.Fatalf("no kv blocks for %d tokens", n)
	}
	batch := &model.Batch{BlockTables: [][]int32{mgr.Table(0)}, LogitRows: []int{n - 1}}
	for i := range n {
		batch.Tokens = append(batch.Tokens, int32((i*31+7)%m.Config().VocabSize))
		batch.Positions = append(batch.Positions, int32(i))
		batch.Seqs = append(batch.Seqs, 0)
	}
	logits := make([]float32, m.Config().VocabSize)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := m.Forward(batch, kv, logits); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// benchStreams runs concurrency streams of 64 generated tokens after a
// 32-token prompt through the engine and reports generated tokens/s.
func benchStreams(b *testing.B, m *model.Model, concurrency int) {
	const maxTokens = 64
	blocks := concurrency * 8
	storage, err := kvcache.New(m.KVShape(), blocks)
	if err != nil {
		b.Fatal(err)
	}
	e, err := core.New(core.Config{Sched: sched.Config{MaxNumBatchedTokens: 2048, MaxNumSeqs: concurrency, MaxModelLen: 128}},
		kvcache.NewManager(blocks, false), core.NewModelExecutor(m, storage), nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.Run(ctx)
	var wg sync.WaitGroup
	sem := make(chan struct{}, concurrency)
	b.ResetTimer()
	for i := 0; i < b.N*concurrency; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			prompt := make([]int32, 32)
			for j := range prompt {
				prompt[j] = int32((i*37 + j*11) % m.Config().VocabSize)
			}
			s, err := e.Submit(core.Params{Prompt: prompt, MaxTokens: maxTokens, Sampling: sample.Params{TopP: 1, Logprobs: -1}, IgnoreEOS: true})
			if err != nil {
				b.Error(err)
				return
			}
			drain(b, ctx, s, maxTokens)
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N*concurrency*maxTokens)/b.Elapsed().Seconds(), "tokens/s")
}
