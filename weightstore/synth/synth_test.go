package synth

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/tokenizer"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/internal/testmodel"
	"github.com/stokehq/stoke/weightstore/checkpoint"
)

func write(t testing.TB, preset string, d dtype.DType, shard int64, seed uint64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), preset)
	if err := Write(context.Background(), dir, Options{Preset: preset, DType: d, ShardSize: shard, Seed: seed}); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestPresetsLoadAndUseGQA(t *testing.T) {
	for _, name := range Presets() {
		cfg, err := PresetConfig(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if name != "tiny" && cfg.NumKVHeads >= cfg.NumHeads {
			t.Errorf("%s does not use grouped-query attention", name)
		}
	}
	cfg, _ := PresetConfig("100m")
	if p := cfg.NumParameters(); p < 90e6 || p > 110e6 {
		t.Errorf("100m preset has %d parameters", p)
	}
	cfg, _ = PresetConfig("1b")
	if p := cfg.NumParameters(); p < 1e9 || p > 1.5e9 {
		t.Errorf("1b preset has %d parameters", p)
	}
}

func TestDeterministicAndSharded(t *testing.T) {
	a := write(t, "small", dtype.BF16, 1<<20, 42)
	b := write(t, "small", dtype.BF16, 1<<20, 42)
	c := write(t, "small", dtype.BF16, 1<<20, 43)
	idx, err := checkpoint.ReadIndex(a)
	if err != nil {
		t.Fatalf("1 MiB shards did not produce an index: %v", err)
	}
	if len(idx.Shards()) < 2 {
		t.Fatalf("only %d shard", len(idx.Shards()))
	}
	for _, shard := range idx.Shards() {
		x, _ := os.ReadFile(filepath.Join(a, shard))
		y, _ := os.ReadFile(filepath.Join(b, shard))
		z, _ := os.ReadFile(filepath.Join(c, shard))
		if !bytes.Equal(x, y) {
			t.Fatalf("%s differs between two runs with one seed", shard)
		}
		if bytes.Equal(x, z) {
			t.Fatalf("%s is identical for two seeds", shard)
		}
	}
	if _, err := tokenizer.Load(a); err != nil {
		t.Fatalf("synthetic tokenizer does not load: %v", err)
	}
	pool := kernels.NewPool(1)
	defer pool.Close()
	m, ck, err := checkpoint.LoadModel(a, pool)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if m.Weights().Layers[0].Q.DType != dtype.BF16 {
		t.Fatal("bf16 checkpoint did not load as bf16")
	}
}

func TestRejectsBadOptions(t *testing.T) {
	dir := t.TempDir()
	if err := Write(context.Background(), filepath.Join(dir, "a"), Options{Preset: "tiny", DType: dtype.I8}); err == nil {
		t.Fatal("accepted an integer dtype")
	}
	if err := Write(context.Background(), filepath.Join(dir, "b"), Options{Preset: "7b", DType: dtype.F32}); err == nil {
		t.Fatal("accepted an unknown preset")
	}
}

func lastLogits(t testing.TB, m *model.Model, tokens []int32) []float32 {
	t.Helper()
	logits, err := m.Score(tokens)
	if err != nil {
		t.Fatal(err)
	}
	return logits[(len(tokens)-1)*m.Config().VocabSize:]
}

func TestFP8Synthetic100MAgreesWithF32(t *testing.T) {
	if testing.Short() {
		t.Skip("writes a 400 MB checkpoint")
	}
	f32 := write(t, "100m", dtype.F32, 0, 9)
	fp8 := write(t, "100m", dtype.F8E4M3, 0, 9)
	pool := kernels.NewPool(0)
	defer pool.Close()
	a, ca, err := checkpoint.LoadModel(f32, pool)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	b, cb, err := checkpoint.LoadModel(fp8, pool)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	tok, err := tokenizer.Load(f32)
	if err != nil {
		t.Fatal(err)
	}
	prompt := tok.Encode("The quick brown fox jumps over the lazy dog, and then it runs away.", true)
	cos := testmodel.Cosine(lastLogits(t, a, prompt), lastLogits(t, b, prompt))
	t.Logf("100m FP8 vs F32 first-step cosine %.5f", cos)
	if cos < 0.99 {
		t.Fatalf("cosine %.5f < 0.99", cos)
	}

	// The golden prompts of stories260K, teacher-forced. A random model's
	// logits are nearly flat (the median gap between its top two is ~0.08,
	// while FP8 moves logits by ~0.26), so greedy agreement is far below
	// what a trained model shows (stories260K keeps 97.6%: checkpoint's
	// TestFP8QuantizedStories). Measured here: first-step cosines
	// 0.992-0.996, 128 of 164 argmaxes kept (0.78). The floor leaves room
	// for kernel sets that round differently and still catches a broken
	// quantiser, which keeps almost none.
	t.Run("golden prompts", func(t *testing.T) {
		vocab := a.Config().VocabSize
		var agree, total int
		for _, c := range testmodel.Golden(t) {
			tokens := append(append([]int32{}, c.PromptIDs...), c.Completion...)
			x, err := a.Score(tokens)
			if err != nil {
				t.Fatal(err)
			}
			y, err := b.Score(tokens)
			if err != nil {
				t.Fatal(err)
			}
			first := len(c.PromptIDs) - 1
			row := func(l []float32, i int) []float32 { return l[i*vocab : (i+1)*vocab] }
			cos := testmodel.Cosine(row(x, first), row(y, first))
			t.Logf("golden %s: first-step cosine %.5f", c.Name, cos)
			if cos < 0.99 {
				t.Errorf("golden %s: first-step cosine %.5f < 0.99", c.Name, cos)
			}
			for i := first; i < len(tokens)-1; i++ {
				total++
				if sample.Argmax(row(x, i)) == sample.Argmax(row(y, i)) {
					agree++
				}
			}
		}
		rate := float64(agree) / float64(total)
		t.Logf("teacher-forced top-1 agreement on the golden prompts: %d/%d = %.3f", agree, total, rate)
		if rate < 0.7 {
			t.Fatalf("top-1 agreement %.3f: the FP8 model no longer follows F32", rate)
		}
	})
}

// benchPreset is the synthetic model benchmarks run on
// (STOKE_BENCH_PRESET, default 100m).
func benchPreset() string {
	if p := os.Getenv("STOKE_BENCH_PRESET"); p != "" {
		return p
	}
	return "100m"
}

// benchModel writes and loads a synthetic model for a benchmark, released
// when it ends.
func benchModel(b *testing.B, preset string, d dtype.DType) *model.Model {
	b.Helper()
	pool := kernels.NewPool(0)
	b.Cleanup(pool.Close)
	m, ck, err := checkpoint.LoadModel(write(b, preset, d, 0, 1), pool)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ck.Close() })
	return m
}

// drain reads a stream to its end and fails the benchmark unless it ended
// normally, with want tokens in all when want > 0.
func drain(b *testing.B, ctx context.Context, s *core.Stream, want int) {
	var n int
	var last core.Delta
	for {
		d, ok := s.Next(ctx)
		if !ok {
			break
		}
		n += len(d.IDs)
		last = d
	}
	if last.Err != nil || (want > 0 && n != want) {
		b.Errorf("stream ended with %d tokens (want %d): %q %v", n, want, last.Finish, last.Err)
	}
}

// BenchmarkPrefixTTFT measures time to first token of a 1,000-token prompt
// on a synthetic FP8 model, with a cold prefix cache and with the first
// 992 tokens already cached by an earlier request.
func BenchmarkPrefixTTFT(b *testing.B) {
	preset := benchPreset()
	m := benchModel(b, preset, dtype.F8E4M3)
	const blocks = 512
	storage, _ := kvcache.New(m.KVShape(), blocks)
	e, err := core.New(core.Config{Sched: sched.Config{MaxNumBatchedTokens: 2048, MaxNumSeqs: 8, MaxModelLen: 2048}},
		kvcache.NewManager(blocks, true), core.NewModelExecutor(m, storage), nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.Run(ctx)
	firstToken := func(prompt []int32) time.Duration {
		start := time.Now()
		s, err := e.Submit(core.Params{Prompt: prompt, MaxTokens: 1, Sampling: sample.Params{TopP: 1, Logprobs: -1}, IgnoreEOS: true})
		if err != nil {
			b.Fatal(err)
		}
		first, _ := s.Next(ctx)
		d := time.Since(start)
		if first.Err != nil || len(first.IDs) == 0 {
			b.Fatalf("no first token: %q %v", first.Finish, first.Err)
		}
		drain(b, ctx, s, 0)
		return d
	}
	prompt := func(prefix, suffix int) []int32 {
		p := make([]int32, 1000)
		for i := range p {
			p[i] = int32((prefix*7919 + i*13) % m.Config().VocabSize)
		}
		p[999] = int32(suffix)
		return p
	}
	fresh := 0
	for _, hit := range []bool{false, true} {
		b.Run(fmt.Sprintf("%s/prefix_hit=%v", preset, hit), func(b *testing.B) {
			firstToken(prompt(1<<20, 0)) // warm the weights
			var total time.Duration
			for i := 0; i < b.N; i++ {
				fresh++ // never seen before, so never cached
				prefix := fresh
				if hit {
					prefix = 0
					firstToken(prompt(0, 0))
				}
				total += firstToken(prompt(prefix, i+1))
			}
			b.ReportMetric(total.Seconds()/float64(b.N)*1000, "ttft-ms")
		})
	}
}
