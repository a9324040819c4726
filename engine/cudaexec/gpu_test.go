//go:build cuda

package cudaexec

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/device/cuda"
	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/internal/testmodel"
	"github.com/stokehq/stoke/weightstore/checkpoint"
)

// openGPU opens device 0, or skips: a binary built with -tags cuda only
// runs where the driver found a device, but the device may still refuse.
func openGPU(t testing.TB) *cuda.Device {
	t.Helper()
	dev, err := cuda.Open(0, cuda.Options{})
	if err != nil {
		t.Skipf("no usable CUDA device: %v", err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

// TestGPUForwardMatchesCPU runs the same batches (a chunked prefill of two
// sequences, then decodes) through the CPU model and the GPU model for
// F32, BF16 and block-scaled FP8 weights, through both GEMM paths (GEMV,
// vectorised and scalar, for small batches, dequantise + SGEMM for large),
// and compares logits.
func TestGPUForwardMatchesCPU(t *testing.T) {
	dev := openGPU(t)
	ctx := context.Background()
	for _, tc := range []struct {
		dt     dtype.DType
		scalar bool
	}{{dtype.F32, false}, {dtype.BF16, false}, {dtype.F8E4M3, false}, {dtype.BF16, true}, {dtype.F8E4M3, true}} {
		dt := tc.dt
		t.Run(fmt.Sprintf("%s/scalar=%v", dt, tc.scalar), func(t *testing.T) {
			cfg := model.Config{ModelType: "llama", HiddenSize: 256, IntermediateSize: 704, NumLayers: 2, NumHeads: 8, NumKVHeads: 2,
				HeadDim: 32, VocabSize: 600, MaxPositionEmbeddings: 1024, RMSNormEps: 1e-5, RopeTheta: 10000, HiddenAct: "silu"}
			if dt == dtype.F8E4M3 {
				cfg.Quantization = &model.QuantizationConfig{QuantMethod: "fp8", WeightBlockSize: []int{128, 128}}
			}
			src := memSource(convertSource(t, cfg, dt, 128))
			ks, err := kernels.Default()
			if err != nil {
				t.Fatal(err)
			}
			pool := ks.NewPool(0)
			defer pool.Close()
			cpu, err := model.New(cfg, src, pool)
			if err != nil {
				t.Fatal(err)
			}
			tensors, free, err := UploadSource(ctx, dev, &cfg, src)
			if err != nil {
				t.Fatal(err)
			}
			defer free()
			gpu, err := New(ctx, dev, cfg, tensors, Options{GEMVMaxTokens: 4, ScalarGEMV: tc.scalar})
			if err != nil {
				t.Fatal(err)
			}
			defer gpu.Close()
			const blocks = 64
			cpuKV, err := kvcache.New(cpu.KVShape(), blocks)
			if err != nil {
				t.Fatal(err)
			}
			defer cpuKV.Free()
			x, err := gpu.NewExecutor(ctx, blocks)
			if err != nil {
				t.Fatal(err)
			}
			defer x.Close()
			tables := [][]int32{{3, 9, 1, 4, 5, 6}, {7, 2, 8, 10, 11, 12}}
			lens := []int{0, 0}
			step := func(name string, counts []int) {
				b := &model.Batch{BlockTables: tables}
				for s, c := range counts {
					for range c {
						b.Tokens = append(b.Tokens, int32((lens[s]*31+s*7)%cfg.VocabSize))
						b.Positions = append(b.Positions, int32(lens[s]))
						b.Seqs = append(b.Seqs, int32(s))
						lens[s]++
					}
					if c > 0 {
						b.LogitRows = append(b.LogitRows, len(b.Tokens)-1)
					}
				}
				want := make([]float32, len(b.LogitRows)*cfg.VocabSize)
				got := make([]float32, len(want))
				if err := cpu.Forward(b, cpuKV, want); err != nil {
					t.Fatal(err)
				}
				if err := x.Forward(ctx, b, got); err != nil {
					t.Fatal(err)
				}
				compareLogits(t, name, got, want, cfg.VocabSize)
			}
			step("prefill", []int{40, 23})
			step("prefill+decode", []int{1, 30})
			for i := range 3 {
				step(fmt.Sprintf("decode %d", i), []int{1, 1})
			}
		})
	}
}

// compareLogits fails unless every row has the same argmax and the
// values agree to float32 rounding of differently ordered sums.
func compareLogits(t *testing.T, name string, got, want []float32, vocab int) {
	t.Helper()
	var worst, scale float64
	for i := range want {
		worst = max(worst, math.Abs(float64(got[i]-want[i])))
		scale = max(scale, math.Abs(float64(want[i])))
	}
	if math.IsNaN(worst) || worst > 2e-3*scale+1e-4 {
		t.Errorf("%s: logits differ by up to %g (largest logit %g)", name, worst, scale)
	}
	for r := range len(want) / vocab {
		g, w := argmax(got[r*vocab:(r+1)*vocab]), argmax(want[r*vocab:(r+1)*vocab])
		if g != w {
			t.Errorf("%s: row %d: gpu argmax %d, cpu %d", name, r, g, w)
		}
	}
	t.Logf("%s: max |gpu-cpu| %.3g of logits up to %.3g", name, worst, scale)
}

func argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}

// TestGPUGoldenStories serves stories260K from the GPU through the
// engine's own scheduler and KV manager and checks every golden greedy
// completion (the reference's, which the CPU engine matches exactly).
func TestGPUGoldenStories(t *testing.T) {
	cases, dir := testmodel.Golden(t), testmodel.Dir(t)
	dev := openGPU(t)
	ctx := context.Background()
	ck, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	cfg := ck.Config()
	for _, gemv := range []int{64, 1} { // GEMV for every step; and SGEMM for prefills
		t.Run(fmt.Sprintf("gemv<=%d", gemv), func(t *testing.T) {
			tensors, free, err := UploadSource(ctx, dev, &cfg, ck)
			if err != nil {
				t.Fatal(err)
			}
			defer free()
			m, err := New(ctx, dev, cfg, tensors, Options{GEMVMaxTokens: gemv})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			const blocks = 256
			x, err := m.NewExecutor(ctx, blocks)
			if err != nil {
				t.Fatal(err)
			}
			e, err := core.New(core.Config{Sched: sched.Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 8, MaxModelLen: cfg.MaxPositionEmbeddings}},
				kvcache.NewManager(blocks, true), x, nil, core.NewMetrics(prometheus.NewRegistry(), "stories"))
			if err != nil {
				x.Close()
				t.Fatal(err)
			}
			runCtx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { e.Run(runCtx); close(done) }()
			defer func() { cancel(); <-done }()
			start := time.Now()
			streams := make([]*core.Stream, len(cases))
			for i, c := range cases {
				if streams[i], err = e.Submit(core.Params{Prompt: c.PromptIDs, MaxTokens: len(c.Completion), Sampling: sample.Params{TopP: 1, Logprobs: -1}, IgnoreEOS: true}); err != nil {
					t.Fatal(err)
				}
			}
			tokens := 0
			for i, c := range cases {
				var got []int32
				for {
					d, ok := streams[i].Next(runCtx)
					if !ok {
						break
					}
					got = append(got, d.IDs...)
				}
				tokens += len(got)
				if !slices.Equal(got, c.Completion) {
					t.Errorf("%s on %s: %v, want %v", c.Name, dev.Name(), got, c.Completion)
				}
			}
			t.Logf("GPUCHECK golden_stories260K gemv<=%d: %d cases, %d tokens exact=%v in %v", gemv, len(cases), tokens, !t.Failed(), time.Since(start).Round(time.Millisecond))
		})
	}
}
