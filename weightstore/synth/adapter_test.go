package synth

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kernels/kernelstest"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/server"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/internal/testmodel"
	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/load"
)

func TestWriteAdapterIsPEFT(t *testing.T) {
	base, err := PresetConfig("tiny")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		opts  AdapterOptions
		rank  int
		scale float32
	}{
		{"defaults", AdapterOptions{Seed: 1}, 8, 2},
		{"bf16 attention only", AdapterOptions{Rank: 4, Alpha: 16, TargetModules: []string{"q_proj", "k_proj", "v_proj", "o_proj"}, DType: dtype.BF16, Seed: 2}, 4, 4},
		{"rslora f16", AdapterOptions{Rank: 16, Alpha: 8, RSLoRA: true, DType: dtype.F16, Seed: 3}, 16, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "a")
			if err := WriteAdapter(dir, base, tc.opts); err != nil {
				t.Fatal(err)
			}
			a, err := checkpoint.LoadAdapter(dir, &base, 16)
			if err != nil {
				t.Fatal(err)
			}
			if a.Rank() != tc.rank || a.Scale() != tc.scale {
				t.Fatalf("rank %d scale %v, want %d and %v", a.Rank(), a.Scale(), tc.rank, tc.scale)
			}
			for _, module := range model.ProjectionModules() {
				A, _ := a.Weights(1, module)
				want := tc.opts.TargetModules == nil
				for _, m := range tc.opts.TargetModules {
					want = want || m == module
				}
				if (A != nil) != want {
					t.Fatalf("%s: weights %v, want %v", module, A != nil, want)
				}
			}
			again := filepath.Join(t.TempDir(), "b")
			if err := WriteAdapter(again, base, tc.opts); err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{checkpoint.AdapterConfigFile, checkpoint.AdapterWeightsFile} {
				x, _ := os.ReadFile(filepath.Join(dir, f))
				y, _ := os.ReadFile(filepath.Join(again, f))
				if !bytes.Equal(x, y) {
					t.Fatalf("%s differs between two writes with one seed", f)
				}
			}
		})
	}
}

// TestAdapterMatchesMergedCheckpoint checks that a LoRA adapter applied
// at run time gives, within 1e-4, the logits of the checkpoint with the
// adapter merged into its weights (W + scale·B·A, in F32), on every kernel
// set: on the trained stories260K in F32 and quantised to FP8, and on
// synthetic BF16 and FP8 models. Quantised bases are compared with the
// merge of their dequantised weights, so the comparison isolates the
// adapter; and the adapter must change the logits.
func TestAdapterMatchesMergedCheckpoint(t *testing.T) {
	type baseCase struct {
		name  string
		dir   func(t *testing.T) string
		delta float64
	}
	stories := func(t *testing.T) string { return testmodel.Dir(t) }
	cases := []baseCase{
		{"stories260K/F32", stories, 0.02},
		{"stories260K/FP8", func(t *testing.T) string {
			out := filepath.Join(t.TempDir(), "fp8")
			if err := checkpoint.Quantize(context.Background(), stories(t), out, checkpoint.QuantizeOptions{}); err != nil {
				t.Fatal(err)
			}
			return out
		}, 0.02},
		{"small/BF16", func(t *testing.T) string { return write(t, "small", dtype.BF16, 0, 5) }, 0.01},
		{"small/FP8", func(t *testing.T) string { return write(t, "small", dtype.F8E4M3, 0, 5) }, 0.01},
	}
	for _, bc := range cases {
		t.Run(bc.name, func(t *testing.T) {
			baseDir := bc.dir(t)
			ck, err := checkpoint.Open(baseDir)
			if err != nil {
				t.Fatal(err)
			}
			cfg := ck.Config()
			ck.Close()
			adapterDir := filepath.Join(t.TempDir(), "adapter")
			if err := WriteAdapter(adapterDir, cfg, AdapterOptions{Rank: 8, Seed: 9, Delta: bc.delta}); err != nil {
				t.Fatal(err)
			}
			mergedDir := filepath.Join(t.TempDir(), "merged")
			if err := MergeAdapter(context.Background(), baseDir, adapterDir, mergedDir); err != nil {
				t.Fatal(err)
			}
			a, err := checkpoint.LoadAdapter(adapterDir, &cfg, 16)
			if err != nil {
				t.Fatal(err)
			}
			tokens := make([]int32, 40)
			for i := range tokens {
				tokens[i] = int32((i*7919 + 3) % cfg.VocabSize)
			}
			tokens[0] = 1
			kernelstest.ForEachSet(t, func(t *testing.T, set *kernels.Set) {
				pool := set.NewPool(2)
				defer pool.Close()
				m, mck, err := checkpoint.LoadModel(baseDir, pool)
				if err != nil {
					t.Fatal(err)
				}
				defer mck.Close()
				ref, rck, err := checkpoint.LoadModel(mergedDir, pool)
				if err != nil {
					t.Fatal(err)
				}
				defer rck.Close()
				got, err := m.ScoreAdapter(a, tokens)
				if err != nil {
					t.Fatal(err)
				}
				want, err := ref.Score(tokens)
				if err != nil {
					t.Fatal(err)
				}
				baseLogits, err := m.Score(tokens)
				if err != nil {
					t.Fatal(err)
				}
				d, effect := maxAbsDiff(got, want), maxAbsDiff(got, baseLogits)
				t.Logf("run-time adapter vs merged: %.3g; adapter vs base: %.3g", d, effect)
				if d > 1e-4 {
					t.Fatalf("the run-time adapter differs from the merged checkpoint by %g (> 1e-4)", d)
				}
				if effect < 1e-2 {
					t.Fatalf("the adapter changes the logits by only %g", effect)
				}
			})
		})
	}
}

func maxAbsDiff(a, b []float32) float64 {
	var d float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

// BenchmarkLoRAAdapters serves 100 synthetic adapters over the synthetic
// "small" model (STOKE_BENCH_PRESET to change it) with 16 adapter slots,
// loading adapters on demand from disk and evicting the least recently
// used, and runs 16 concurrent streams whose requests spread over all 100
// adapters; then the same load on the base model alone. It reports the
// generated tokens/s of both and their ratio, for two kinds of adapter:
// rank 8 on q_proj and v_proj (PEFT's default target for Llama) and rank
// 16 on every projection (the most --max-lora-rank 16 allows).
func BenchmarkLoRAAdapters(b *testing.B) {
	const (
		adapters  = 100
		slots     = 16
		streams   = 16
		perStream = 4 // requests per stream per iteration
		promptLen = 32
		maxTokens = 64
	)
	preset := "small"
	if p := os.Getenv("STOKE_BENCH_PRESET"); p != "" {
		preset = p
	}
	dir := b.TempDir()
	baseDir := filepath.Join(dir, preset)
	if err := Write(context.Background(), baseDir, Options{Preset: preset, DType: dtype.F32, Seed: 1}); err != nil {
		b.Fatal(err)
	}
	cfg, err := PresetConfig(preset)
	if err != nil {
		b.Fatal(err)
	}
	for _, kind := range []struct {
		name string
		opts AdapterOptions
	}{
		{"q_proj,v_proj/r=8", AdapterOptions{Rank: 8, TargetModules: []string{"q_proj", "v_proj"}}},
		{"all-linear/r=16", AdapterOptions{Rank: 16}},
	} {
		adapterDir := filepath.Join(dir, "adapters", fmt.Sprintf("r%d-%d", kind.opts.Rank, len(kind.opts.TargetModules)))
		for i := range adapters {
			opts := kind.opts
			opts.Seed = uint64(i)
			if err := WriteAdapter(filepath.Join(adapterDir, fmt.Sprintf("lora%03d", i)), cfg, opts); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(fmt.Sprintf("%s/%s/adapters=%d/slots=%d/streams=%d", preset, kind.name, adapters, slots, streams), func(b *testing.B) {
			opts := load.Options{
				Engine: server.EngineOptions{Sched: sched.Config{MaxNumBatchedTokens: 2048, MaxNumSeqs: streams},
					LoRA: server.LoRAOptions{Enabled: true, MaxLoras: slots, MaxRank: 16}},
				KVCacheBytes: 256 << 20,
			}
			loaded, err := load.Checkpoint(opts)(context.Background(), engineapi.LoadRequest{Path: baseDir}, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer loaded.Close()
			for i := range adapters {
				name := fmt.Sprintf("lora%03d", i)
				if _, _, err := loaded.Adapters.Register(context.Background(), core.AdapterSpec{Name: name, Path: filepath.Join(adapterDir, name)}); err != nil {
					b.Fatal(err)
				}
			}
			e, err := loaded.Start(core.NewMetrics(prometheus.NewRegistry(), loaded.Name))
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { e.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()

			// run drives the streams, perStream requests each, and returns
			// the time it took; request k of the round uses adapter
			// k*37 mod 100 (all 100, spread) when lora is set.
			round := 0
			run := func(lora bool) time.Duration {
				start := time.Now()
				var wg sync.WaitGroup
				for s := range streams {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for j := range perStream {
							k := round*streams*perStream + s*perStream + j
							prompt := make([]int32, promptLen)
							for p := range prompt {
								prompt[p] = int32((k*131 + p*17) % cfg.VocabSize)
							}
							params := core.Params{Prompt: prompt, MaxTokens: maxTokens, Sampling: sample.Params{TopP: 1, Logprobs: -1}, IgnoreEOS: true}
							if lora {
								params.Adapter = fmt.Sprintf("lora%03d", k*37%adapters)
							}
							st, err := e.Submit(params)
							if err != nil {
								b.Error(err)
								return
							}
							drain(b, ctx, st, maxTokens)
						}
					}()
				}
				wg.Wait()
				round++
				return time.Since(start)
			}
			run(false) // warm up
			run(true)
			// Base and LoRA rounds alternate, so that what else the machine
			// does weighs on both alike.
			var baseTime, loraTime time.Duration
			b.ResetTimer()
			for range b.N {
				baseTime += run(false)
				loraTime += run(true)
			}
			tokens := float64(b.N * streams * perStream * maxTokens)
			baseRate, loraRate := tokens/baseTime.Seconds(), tokens/loraTime.Seconds()
			b.ReportMetric(baseRate, "base-tok/s")
			b.ReportMetric(loraRate, "lora-tok/s")
			b.ReportMetric(100*loraRate/baseRate, "lora/base-%")
			resident := 0
			for _, a := range loaded.Adapters.Info().Adapters {
				if a.Loaded {
					resident++
				}
			}
			if resident > slots {
				b.Fatalf("%d adapters loaded in %d slots", resident, slots)
			}
		})
	}
}
