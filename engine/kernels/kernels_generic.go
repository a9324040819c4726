package kernels

import (
	"math"

	"github.com/stokehq/stoke/internal/dtype"
)

// Set is one implementation of the kernels' inner loops ("avx512", "avx2"
// or "generic"). The MatMul driver only calls these, so the assembly and
// the portable Go versions share all the blocking, threading and scale
// handling; see the package doc for the summation order every set keeps.
//
// Shapes: x and w rows are k elements long; xs, ws and os are the distances
// in elements between consecutive rows of x, w and out. FP8 dot products are
// "raw": every set decodes FP8 at 1/fp8Unit of its value, so the caller
// multiplies the products by fp8Unit·scale after.
type Set struct {
	name string
	// f32Dot4x4 stores Σ_j x[t*xs+j]*w[r*ws+j] into out[t*os+r] for t, r < 4
	// (nil where f32TileRun does the tiling).
	f32Dot4x4 func(x []float32, xs int, w []float32, ws, k int, out []float32, os int)
	// f32Dot1x4 stores Σ_j x[j]*w[r*ws+j] into out[r] for r < 4. With
	// ws = 0 it sums one row (four times), in the order of every quad.
	f32Dot1x4 func(x, w []float32, ws, k int, out []float32)
	// dot returns Σ a[j]*b[j]; len(a) == len(b). It serves [Pool.Dot],
	// not the products, and may sum in another order than they do.
	dot func(a, b []float32) float32
	// bf16Dot4x4 stores Σ_j x[t*xs+j]*W[r][j] into out[t*os+r] for t, r < 4.
	bf16Dot4x4 func(x []float32, xs int, w []uint16, ws, k int, out []float32, os int)
	// bf16Dot1x4 stores Σ_j x[j]*W[r][j] into out[r] for r < 4.
	bf16Dot1x4 func(x []float32, w []uint16, ws, k int, out []float32)
	// fp8Dot4x4 stores the raw FP8 dot products into out[t*os+r] for t, r < 4.
	fp8Dot4x4 func(x []float32, xs int, w []uint8, ws, k int, out []float32, os int)
	// fp8Dot1x4 stores the raw FP8 dot products into out[r] for r < 4.
	fp8Dot1x4 func(x []float32, w []uint8, ws, k int, out []float32)
	// f32Gemv, bf16Gemv and fp8Gemv, where a set has them, are the
	// single-token (decode) products over many rows at once: they store
	// Σ_j x[j]*W[r][j] (raw for FP8) into out[r] for r < rows. Sets without
	// them run decode through the 1x4 kernels.
	f32Gemv  func(x, w []float32, ws, k, rows int, out []float32)
	bf16Gemv func(x []float32, w []uint16, ws, k, rows int, out []float32)
	fp8Gemv  func(x []float32, w []uint8, ws, k, rows int, out []float32)
	// f32Gemm, bf16Gemm and fp8Gemm, where a set has them, are the
	// small-batch products: for nx (1 to 4) x rows of stride xs they store
	// Σ_j x[t*xs+j]*W[r][j] (raw for FP8) into out[t*os+r] for t < nx,
	// r < rows, decoding each W element once. Sets without them run small
	// batches through the 4x4 and 1x4 kernels.
	f32Gemm  func(x []float32, xs, nx int, w []float32, ws, k, rows int, out []float32, os int)
	bf16Gemm func(x []float32, xs, nx int, w []uint16, ws, k, rows int, out []float32, os int)
	fp8Gemm  func(x []float32, xs, nx int, w []uint8, ws, k, rows int, out []float32, os int)
	// gemmMax is the largest batch, per weight type, that runs through
	// the small-batch kernels above; larger ones run through the tiles.
	gemmMax batchLimits
	// f32TileRun, where a set has it, replaces the F32 tiles: it stores
	// the products of nx x rows (stride xs) with nw W rows (stride ws)
	// into out[t*os+r], tiling them its own way.
	f32TileRun func(x []float32, xs, nx int, w []float32, ws, k, nw int, out []float32, os int)
	// widenTiles makes large BF16 and FP8 products widen W into F32 a few
	// rows at a time and run the F32 tiles over them, instead of the
	// set's BF16 and FP8 tiles (for sets where decoding in registers costs
	// more than the FMAs it feeds).
	widenTiles bool
	// xStationary makes large products take W in groups of up to
	// wGroupBytes (as F32) against every x row at once, instead of blocks
	// of x rows against all of W: for sets whose f32TileRun keeps each
	// quad of x rows in L1 while a group that small streams past it from
	// L2. widenTiles then widens each W row once per product.
	xStationary bool
	// fmaPeak, where a set has it, runs iters iterations of flopsPerIter
	// floating-point operations of independent FMAs and nothing else: the
	// arithmetic peak its products are measured against.
	fmaPeak      func(iters int)
	flopsPerIter int
	// bf16ToF32 widens src into dst; len(dst) == len(src).
	bf16ToF32 func(dst []float32, src []uint16)
	// fp8ToF32 stores E4M3(src[j])/fp8Unit*mul into dst[j]; len(dst) == len(src).
	fp8ToF32 func(dst []float32, src []uint8, mul float32)
	// axpy adds alpha*x to y; len(y) == len(x).
	axpy func(y []float32, alpha float32, x []float32)
	// scale multiplies y by alpha.
	scale func(y []float32, alpha float32)
	// scaleTo stores src[j]*alpha into dst[j]; len(dst) == len(src).
	scaleTo func(dst, src []float32, alpha float32)
	// expSum replaces x[j] with exp(x[j]-shift) and returns their sum;
	// len(x) > 0.
	expSum func(x []float32, shift float32) float32
	// max returns the largest element of x, which holds no NaN; len(x) > 0.
	// Any order of comparisons gives the same value.
	max func(x []float32) float32
	// siluMul replaces gate[j] with silu(gate[j])*up[j]; len(up) >= len(gate) > 0.
	siluMul func(gate, up []float32)
	// addWeighted adds Σ_q p[r*ps+q]*v[q*vs+j] to out[r*os+j] for r < nr,
	// j < d, q < n; nr, n, d >= 1.
	addWeighted func(out []float32, os int, p []float32, ps, nr int, v []float32, vs, n, d int)
}

// batchLimits are the largest batches of F32, BF16 and FP8 products that
// run through a set's small-batch kernels.
type batchLimits struct{ f32, bf16, fp8 int }

// fp8Unit is what every set's FP8 kernels and fp8ToF32 divide E4M3 values
// by: they decode FP8 through half precision (or fp8Raw) at 1/256 of its
// value, where subnormals stay exact and every value is a normal float32.
const fp8Unit = 256

// genericKernels is the portable implementation, used by purego builds, on
// other architectures and on CPUs without AVX2.
var genericKernels = Set{
	name:        "generic",
	f32Dot4x4:   f32Dot4x4Go,
	f32Dot1x4:   f32Dot1x4Go,
	dot:         dotGo,
	bf16Dot4x4:  bf16Dot4x4Go,
	bf16Dot1x4:  bf16Dot1x4Go,
	fp8Dot4x4:   fp8Dot4x4Go,
	fp8Dot1x4:   fp8Dot1x4Go,
	bf16ToF32:   bf16ToF32Go,
	fp8ToF32:    fp8ToF32Go,
	axpy:        axpyGo,
	scale:       scaleGo,
	scaleTo:     scaleToGo,
	expSum:      expSumGo,
	max:         maxGo,
	siluMul:     siluMulGo,
	addWeighted: addWeightedGo,
}

// fp8Raw holds E4M3(b)/256 for every byte b (read-only).
var fp8Raw = func() (t [256]float32) {
	for i, v := range dtype.E4M3Table() {
		t[i] = v / fp8Unit
	}
	return t
}()

func f32Dot4x4Go(x []float32, xs int, w []float32, ws, k int, out []float32, os int) {
	for t := 0; t < 4; t++ {
		f32Dot1x4Go(x[t*xs:], w, ws, k, out[t*os:])
	}
}

func f32Dot1x4Go(x, w []float32, ws, k int, out []float32) {
	x = x[:k]
	w0, w1, w2, w3 := w[:k], w[ws:ws+k], w[2*ws:2*ws+k], w[3*ws:3*ws+k]
	var s0, s1, s2, s3 float32
	for j, v := range x {
		s0 += v * w0[j]
		s1 += v * w1[j]
		s2 += v * w2[j]
		s3 += v * w3[j]
	}
	out = out[:4]
	out[0], out[1], out[2], out[3] = s0, s1, s2, s3
}

func dotGo(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	j := 0
	for ; j+4 <= len(a); j += 4 {
		s0 += a[j] * b[j]
		s1 += a[j+1] * b[j+1]
		s2 += a[j+2] * b[j+2]
		s3 += a[j+3] * b[j+3]
	}
	for ; j < len(a); j++ {
		s0 += a[j] * b[j]
	}
	return (s0 + s1) + (s2 + s3)
}

func bf16(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

func bf16Dot4x4Go(x []float32, xs int, w []uint16, ws, k int, out []float32, os int) {
	for t := 0; t < 4; t++ {
		bf16Dot1x4Go(x[t*xs:], w, ws, k, out[t*os:])
	}
}

func fp8Dot4x4Go(x []float32, xs int, w []uint8, ws, k int, out []float32, os int) {
	for t := 0; t < 4; t++ {
		fp8Dot1x4Go(x[t*xs:], w, ws, k, out[t*os:])
	}
}

func bf16Dot1x4Go(x []float32, w []uint16, ws, k int, out []float32) {
	x = x[:k]
	w0, w1, w2, w3 := w[:k], w[ws:ws+k], w[2*ws:2*ws+k], w[3*ws:3*ws+k]
	var s0, s1, s2, s3 float32
	for j, v := range x {
		s0 += v * bf16(w0[j])
		s1 += v * bf16(w1[j])
		s2 += v * bf16(w2[j])
		s3 += v * bf16(w3[j])
	}
	out = out[:4]
	out[0], out[1], out[2], out[3] = s0, s1, s2, s3
}

func bf16DotGo(x []float32, w []uint16) float32 {
	w = w[:len(x)]
	var s0, s1 float32
	j := 0
	for ; j+2 <= len(x); j += 2 {
		s0 += x[j] * bf16(w[j])
		s1 += x[j+1] * bf16(w[j+1])
	}
	if j < len(x) {
		s0 += x[j] * bf16(w[j])
	}
	return s0 + s1
}

func fp8Dot1x4Go(x []float32, w []uint8, ws, k int, out []float32) {
	x = x[:k]
	w0, w1, w2, w3 := w[:k], w[ws:ws+k], w[2*ws:2*ws+k], w[3*ws:3*ws+k]
	var s0, s1, s2, s3 float32
	for j, v := range x {
		s0 += v * fp8Raw[w0[j]]
		s1 += v * fp8Raw[w1[j]]
		s2 += v * fp8Raw[w2[j]]
		s3 += v * fp8Raw[w3[j]]
	}
	out = out[:4]
	out[0], out[1], out[2], out[3] = s0, s1, s2, s3
}

func fp8DotGo(x []float32, w []uint8) float32 {
	w = w[:len(x)]
	var s0, s1 float32
	j := 0
	for ; j+2 <= len(x); j += 2 {
		s0 += x[j] * fp8Raw[w[j]]
		s1 += x[j+1] * fp8Raw[w[j+1]]
	}
	if j < len(x) {
		s0 += x[j] * fp8Raw[w[j]]
	}
	return s0 + s1
}

func bf16ToF32Go(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for j, b := range src {
		dst[j] = bf16(b)
	}
}

func fp8ToF32Go(dst []float32, src []uint8, mul float32) {
	dst = dst[:len(src)]
	for j, b := range src {
		dst[j] = fp8Raw[b] * mul
	}
}

func axpyGo(y []float32, alpha float32, x []float32) {
	x = x[:len(y)]
	for j, v := range x {
		y[j] += alpha * v
	}
}

func scaleGo(y []float32, alpha float32) {
	for j := range y {
		y[j] *= alpha
	}
}

func scaleToGo(dst, src []float32, alpha float32) {
	dst = dst[:len(src)]
	for j, v := range src {
		dst[j] = v * alpha
	}
}

func expSumGo(x []float32, shift float32) float32 {
	var sum float32
	for j, v := range x {
		e := float32(math.Exp(float64(v - shift)))
		x[j] = e
		sum += e
	}
	return sum
}

func maxGo(x []float32) float32 {
	inf := float32(math.Inf(-1))
	m0, m1, m2, m3 := inf, inf, inf, inf
	i := 0
	for ; i+4 <= len(x); i += 4 {
		m0, m1, m2, m3 = max(m0, x[i]), max(m1, x[i+1]), max(m2, x[i+2]), max(m3, x[i+3])
	}
	for ; i < len(x); i++ {
		m0 = max(m0, x[i])
	}
	return max(m0, m1, m2, m3)
}

func siluMulGo(gate, up []float32) {
	up = up[:len(gate)]
	for j, g := range gate {
		gate[j] = g / (1 + float32(math.Exp(float64(-g)))) * up[j]
	}
}

func addWeightedGo(out []float32, os int, p []float32, ps, nr int, v []float32, vs, n, d int) {
	addWeightedAXPY(axpyGo, out, os, p, ps, nr, v, vs, n, d)
}

// addWeightedAXPY computes addWeighted as one axpy per weight.
func addWeightedAXPY(axpy func(y []float32, alpha float32, x []float32),
	out []float32, os int, p []float32, ps, nr int, v []float32, vs, n, d int) {
	for r := range nr {
		o := out[r*os : r*os+d]
		for q, w := range p[r*ps : r*ps+n] {
			axpy(o, w, v[q*vs:q*vs+d])
		}
	}
}
