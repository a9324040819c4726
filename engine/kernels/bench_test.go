package kernels

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// benchShapes are decode (n=1, memory bound) and prefill (n=64 and 256,
// compute bound) products of Llama-sized layers, plus the tiny stories260K layer
// that measures per-call overhead.
var benchShapes = []struct {
	name          string
	n, rows, cols int
	naive         bool // also time MatMulNaive (skipped where it takes seconds)
}{
	{name: "gemv_n1_64x172", n: 1, rows: 64, cols: 172, naive: true},
	{name: "gemv_n1_768x2048", n: 1, rows: 768, cols: 2048, naive: true},
	{name: "gemv_n1_4096x4096", n: 1, rows: 4096, cols: 4096, naive: true},
	{name: "gemv_n1_14336x4096", n: 1, rows: 14336, cols: 4096},
	{name: "gemm_n64_1024x1024", n: 64, rows: 1024, cols: 1024, naive: true},
	{name: "gemm_n64_4096x4096", n: 64, rows: 4096, cols: 4096},
	{name: "gemm_n256_768x2048", n: 256, rows: 768, cols: 2048},
}

var benchKinds = []weightKind{
	{name: "f32", dt: weightKinds[0].dt},
	{name: "bf16", dt: weightKinds[1].dt},
	{name: "fp8", dt: weightKinds[4].dt, scales: "block", blockRow: 128, blockCol: 128},
}

// reportMatMul sets the metrics every MatMul benchmark reports: GFLOP/s
// (2 flops per multiply-add) and GB/s of weight bytes streamed.
func reportMatMul(b *testing.B, n int, w *Matrix) {
	ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(2*float64(n)*float64(w.Rows)*float64(w.Cols)/ns, "GFLOP/s")
	b.ReportMetric(float64(w.WeightBytes())/ns, "GB/s")
}

// BenchmarkMatMul times Pool.MatMul for each weight dtype and shape at 1
// and 2 threads, and MatMulNaive on the same inputs as the baseline.
// SetBytes is the weight bytes, so MB/s is the weight streaming rate.
func BenchmarkMatMul(b *testing.B) {
	for _, k := range benchKinds {
		for _, s := range benchShapes {
			// Built on first use, so that filtered-out shapes cost nothing.
			var w *Matrix
			var x, out []float32
			setup := func() {
				if w == nil {
					rng := rand.New(rand.NewPCG(1, 2))
					w = newMatrix(rng, k, s.rows, s.cols)
					x = randomVector(rng, s.n*s.cols)
					out = make([]float32, s.n*s.rows)
				}
			}
			for _, threads := range []int{1, 2} {
				b.Run(fmt.Sprintf("%s/%s/threads=%d", k.name, s.name, threads), func(b *testing.B) {
					setup()
					p := NewPool(threads)
					defer p.Close()
					b.SetBytes(w.WeightBytes())
					for b.Loop() {
						p.MatMul(out, x, s.n, w)
					}
					reportMatMul(b, s.n, w)
				})
			}
			if s.naive {
				b.Run(fmt.Sprintf("%s/%s/naive", k.name, s.name), func(b *testing.B) {
					setup()
					b.SetBytes(w.WeightBytes())
					for b.Loop() {
						MatMulNaive(out, x, s.n, w)
					}
					reportMatMul(b, s.n, w)
				})
			}
		}
	}
}

// BenchmarkMemoryBandwidth measures streaming read bandwidth: each thread
// reads its share of a 256 MiB buffer (far beyond the caches) once through
// the vector Dot kernel, its first half against its second half. Decode's
// GB/s in BenchmarkMatMul is bounded by this.
func BenchmarkMemoryBandwidth(b *testing.B) {
	buf := make([]float32, 64<<20) // 256 MiB
	for i := range buf {
		buf[i] = float32(i & 7)
	}
	for _, threads := range []int{1, 2} {
		b.Run(fmt.Sprintf("threads=%d", threads), func(b *testing.B) {
			p := NewPool(threads)
			defer p.Close()
			sums := make([]float32, threads)
			b.SetBytes(int64(len(buf)) * 4)
			for b.Loop() {
				p.Parallel(len(buf), 1<<16, func(lo, hi int) {
					mid := (lo + hi) / 2
					sums[lo*threads/len(buf)] = p.Dot(buf[lo:mid], buf[mid:mid+(mid-lo)])
				})
			}
			ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(float64(len(buf))*4/ns, "GB/s")
		})
	}
}

// BenchmarkFMAPeak measures each assembly set's FMA throughput on the
// calling thread (GFLOP/s, one FMA counting two): the ceiling for the
// GFLOP/s that BenchmarkMatMul and BenchmarkKernelSets report.
func BenchmarkFMAPeak(b *testing.B) {
	for _, ks := range kernelSets() {
		if ks.fmaPeak == nil {
			continue
		}
		b.Run(ks.name, func(b *testing.B) {
			const iters = 1 << 20
			for b.Loop() {
				ks.fmaPeak(iters)
			}
			ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(float64(iters)*float64(ks.flopsPerIter)/ns, "GFLOP/s")
		})
	}
}

// BenchmarkVector times the vector helpers on a 4096-element row.
func BenchmarkVector(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 3))
	x, y := randomVector(rng, 4096), randomVector(rng, 4096)
	var sink float32
	p := NewPool(1)
	b.Run("Dot", func(b *testing.B) {
		b.SetBytes(2 * 4 * 4096)
		for b.Loop() {
			sink += p.Dot(x, y)
		}
	})
	b.Run("AXPY", func(b *testing.B) {
		b.SetBytes(3 * 4 * 4096)
		for b.Loop() {
			p.AXPY(y, 1e-9, x)
		}
	})
	b.Run("Scale", func(b *testing.B) {
		b.SetBytes(2 * 4 * 4096)
		for b.Loop() {
			p.Scale(y, 1)
		}
	})
	_ = sink
}

// BenchmarkKernelSets compares the implementations this build and CPU can
// run (portable Go, AVX2, AVX-512) on one thread.
func BenchmarkKernelSets(b *testing.B) {
	shapes := []struct {
		name          string
		n, rows, cols int
	}{
		{"gemv_n1_4096x4096", 1, 4096, 4096},
		{"gemm_n64_1024x1024", 64, 1024, 1024},
	}
	for _, k := range benchKinds {
		for _, s := range shapes {
			rng := rand.New(rand.NewPCG(1, 2))
			w := newMatrix(rng, k, s.rows, s.cols)
			x := randomVector(rng, s.n*s.cols)
			out := make([]float32, s.n*s.rows)
			for _, ks := range kernelSets() {
				b.Run(fmt.Sprintf("%s/%s/%s", k.name, s.name, ks.name), func(b *testing.B) {
					p := newPool(1, ks)
					b.SetBytes(w.WeightBytes())
					for b.Loop() {
						p.MatMul(out, x, s.n, w)
					}
					reportMatMul(b, s.n, w)
				})
			}
		}
	}
}

// decodeShapes are the decode (n=1) products of a 100M-parameter Llama:
// the attention projections, the MLP and the LM head.
var decodeShapes = []struct {
	name       string
	rows, cols int
}{
	{"768x768", 768, 768},
	{"256x768", 256, 768},
	{"2048x768", 2048, 768},
	{"768x2048", 768, 2048},
	{"32000x768", 32000, 768},
}

// streamBytes is the least total size of the copies of W that
// BenchmarkDecodeStream cycles through, far beyond the caches, so that
// every product streams its weights from memory as in a real decode step.
const streamBytes = 256 << 20

// streamCopies returns enough distinct copies of an rows x cols matrix of
// kind k to total streamBytes, so that cycling through them streams W from
// memory as in a real decode step.
func streamCopies(k weightKind, rows, cols int) []*Matrix {
	rng := rand.New(rand.NewPCG(1, 2))
	w := newMatrix(rng, k, rows, cols)
	copies := int(max(2, streamBytes/w.WeightBytes()+1))
	ws := make([]*Matrix, 0, copies)
	for range copies {
		c := *w
		c.F32 = append([]float32(nil), w.F32...)
		c.BF16 = append([]uint16(nil), w.BF16...)
		c.FP8 = append([]uint8(nil), w.FP8...)
		ws = append(ws, &c)
	}
	return ws
}

// benchStream times p.MatMul with n x rows, cycling through ws.
func benchStream(b *testing.B, threads, n int, ws []*Matrix) {
	rng := rand.New(rand.NewPCG(3, 4))
	x := randomVector(rng, n*ws[0].Cols)
	out := make([]float32, n*ws[0].Rows)
	p := NewPool(threads)
	defer p.Close()
	b.SetBytes(ws[0].WeightBytes())
	i := 0
	for b.Loop() {
		p.MatMul(out, x, n, ws[i])
		if i++; i == len(ws) {
			i = 0
		}
	}
	reportMatMul(b, n, ws[0])
}

// BenchmarkDecodeStream times single-token products (n=1) at the decode
// shapes of a 100M-parameter Llama with weights that are not in cache:
// each iteration multiplies by the next of enough distinct copies of W to
// total streamBytes. GB/s is the weight streaming rate.
func BenchmarkDecodeStream(b *testing.B) {
	for _, k := range benchKinds {
		for _, s := range decodeShapes {
			var ws []*Matrix
			for _, threads := range []int{1, 2} {
				b.Run(fmt.Sprintf("%s/%s/threads=%d", k.name, s.name, threads), func(b *testing.B) {
					if ws == nil {
						ws = streamCopies(k, s.rows, s.cols)
					}
					benchStream(b, threads, 1, ws)
				})
			}
		}
	}
}

// BenchmarkBatchStream is BenchmarkDecodeStream for the small batches of
// continuous batching: n sequences decoded in one step (n x rows of x) at
// the shapes of a 100M-parameter Llama, weights streamed from memory. The
// 32000x768 LM head is BF16 only, as in the engine's FP8 models.
func BenchmarkBatchStream(b *testing.B) {
	shapes := []struct {
		name       string
		rows, cols int
		kinds      []string
	}{
		{"768x768", 768, 768, []string{"f32", "bf16", "fp8"}},
		{"2048x768", 2048, 768, []string{"f32", "bf16", "fp8"}},
		{"768x2048", 768, 2048, []string{"f32", "bf16", "fp8"}},
		{"32000x768", 32000, 768, []string{"bf16"}},
	}
	for _, k := range benchKinds {
		for _, s := range shapes {
			if !slices.Contains(s.kinds, k.name) {
				continue
			}
			var ws []*Matrix
			for _, n := range []int{2, 4, 8, 16, 64} {
				for _, threads := range []int{1, 2} {
					b.Run(fmt.Sprintf("%s/%s/n=%d/threads=%d", k.name, s.name, n, threads), func(b *testing.B) {
						if ws == nil {
							ws = streamCopies(k, s.rows, s.cols)
						}
						benchStream(b, threads, n, ws)
					})
				}
			}
		}
	}
}

// BenchmarkWiden times each set's widening of a 4096-weight FP8 and BF16
// row into F32, as large products do for every W row they tile (GB/s of
// the weights read).
func BenchmarkWiden(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 4))
	w8 := newMatrix(rng, weightKinds[2], 1, 4096).FP8
	w16 := newMatrix(rng, weightKinds[1], 1, 4096).BF16
	dst := make([]float32, 4096)
	for _, ks := range kernelSets() {
		b.Run("fp8/"+ks.name, func(b *testing.B) {
			b.SetBytes(int64(len(w8)))
			for b.Loop() {
				ks.fp8ToF32(dst, w8, 1)
			}
		})
		b.Run("bf16/"+ks.name, func(b *testing.B) {
			b.SetBytes(2 * int64(len(w16)))
			for b.Loop() {
				ks.bf16ToF32(dst, w16)
			}
		})
	}
}
