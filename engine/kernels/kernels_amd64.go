//go:build amd64 && !purego

package kernels

import (
	"golang.org/x/sys/cpu"
)

// avx512Kernels is the AVX-512 kernel set, or nil when the CPU lacks any of
// the extensions it uses (F, BW, VL, DQ, and FMA).
var avx512Kernels = func() *Set {
	x := cpu.X86
	if !(x.HasAVX512F && x.HasAVX512BW && x.HasAVX512VL && x.HasAVX512DQ && x.HasFMA) {
		return nil
	}
	return &Set{
		name:        "avx512",
		f32Dot4x4:   f32Dot4x4Asm,
		f32Dot1x4:   f32Dot1x4Asm,
		dot:         dotAsm,
		bf16Dot4x4:  bf16Dot4x4Asm,
		bf16Dot1x4:  bf16Dot1x4Asm,
		fp8Dot4x4:   fp8Dot4x4Asm,
		fp8Dot1x4:   fp8Dot1x4Asm,
		f32Gemv:     f32GemvAsm,
		bf16Gemv:    bf16GemvAsm,
		fp8Gemv:     fp8GemvAsm,
		f32Gemm:     f32GemmAsm,
		bf16Gemm:    bf16GemmAsm,
		fp8Gemm:     fp8GemmAsm,
		bf16ToF32:   bf16ToF32Asm,
		fp8ToF32:    fp8ToF32Asm,
		axpy:        axpyAsm,
		scale:       scaleAsm,
		scaleTo:     scaleToAsm,
		expSum:      expSumAsm,
		max:         maxAsm,
		siluMul:     siluMulAsm,
		addWeighted: addWeightedAsm,

		gemmMax:      batchLimits{f32: 64, bf16: 64, fp8: 64},
		widenTiles:   true,
		fmaPeak:      fmaPeakAVX512,
		flopsPerIter: 12 * 16 * 2,
	}
}()

// The wrappers below check, with one bounds check each, that the last
// element the assembly touches is inside the slices, so a driver bug panics
// instead of corrupting memory. k >= 1 always.

func f32Dot4x4Asm(x []float32, xs int, w []float32, ws, k int, out []float32, os int) {
	_, _, _ = x[3*xs+k-1], w[3*ws+k-1], out[3*os+3]
	f32Dot4x4AVX512(&x[0], xs, &w[0], ws, k, &out[0], os)
}

func f32Dot1x4Asm(x, w []float32, ws, k int, out []float32) {
	_, _, _ = x[k-1], w[3*ws+k-1], out[3]
	f32Dot1x4AVX512(&x[0], &w[0], ws, k, &out[0])
}

func dotAsm(a, b []float32) float32 {
	_ = b[len(a)-1]
	return dotAVX512(&a[0], &b[0], len(a))
}

func bf16Dot4x4Asm(x []float32, xs int, w []uint16, ws, k int, out []float32, os int) {
	_, _, _ = x[3*xs+k-1], w[3*ws+k-1], out[3*os+3]
	bf16Dot4x4AVX512(&x[0], xs, &w[0], ws, k, &out[0], os)
}

func fp8Dot4x4Asm(x []float32, xs int, w []uint8, ws, k int, out []float32, os int) {
	_, _, _ = x[3*xs+k-1], w[3*ws+k-1], out[3*os+3]
	fp8Dot4x4AVX512(&x[0], xs, &w[0], ws, k, &out[0], os)
}

func bf16Dot1x4Asm(x []float32, w []uint16, ws, k int, out []float32) {
	_, _, _ = x[k-1], w[3*ws+k-1], out[3]
	bf16Dot1x4AVX512(&x[0], &w[0], ws, k, &out[0])
}

func fp8Dot1x4Asm(x []float32, w []uint8, ws, k int, out []float32) {
	_, _, _ = x[k-1], w[3*ws+k-1], out[3]
	fp8Dot1x4AVX512(&x[0], &w[0], ws, k, &out[0])
}

// gemvPrefetch returns how far ahead, in bytes, the GEMV kernels prefetch
// W, and whether into L2 only: distances beyond gemvNear would crowd x
// out of L1. They prefetch the next quad of rows (of ws elements of size
// bytes), or the one after it where a quad is under gemvNear: a quad of
// 768 FP8 or BF16 columns arrives too late one quad ahead, which cost
// BenchmarkDecodeStream a tenth of its bandwidth on Zen 5.
func gemvPrefetch(ws, size int) (pf int, far bool) {
	pf = 4 * ws * size
	if pf < gemvNear {
		pf *= 2
	}
	return pf, pf > gemvNear
}

const gemvNear = 8 << 10

// gemmNear is the most the small-batch kernels keep in L1, a quad of W
// and the x rows; beyond it they prefetch into L2 only.
const gemmNear = 20 << 10

func f32GemvAsm(x, w []float32, ws, k, rows int, out []float32) {
	gemvRows(f32GemvAVX512, x, w, ws, k, rows, out, 4)
}

func bf16GemvAsm(x []float32, w []uint16, ws, k, rows int, out []float32) {
	gemvRows(bf16GemvAVX512, x, w, ws, k, rows, out, 2)
}

func fp8GemvAsm(x []float32, w []uint8, ws, k, rows int, out []float32) {
	gemvRows(fp8GemvAVX512, x, w, ws, k, rows, out, 1)
}

// gemmKernel is the signature of the Gemm2 and Gemm4 assembly kernels.
type gemmKernel[T any] func(x0, x1, x2, x3 *float32, w *T, ws, k, quads int, out *float32, os, nx int, far bool)

// gemmAsm runs the small-batch kernels for nx (1 to 4) x rows: Gemm2 for
// two, Gemm4 for three or four, gemv for one; rows past the last quad run
// as quads of one row (stride 0), so they are summed in the same order.
// size is the byte size of T.
func gemmAsm[T any](x []float32, xs, nx int, w []T, ws, k, rows int, out []float32, os int,
	size int, gemm2, gemm4 gemmKernel[T], gemv func(x []float32, w []T, ws, k, rows int, out []float32)) {
	if nx == 1 {
		gemv(x, w, ws, k, rows, out)
		return
	}
	q := rows / 4
	if q > 0 {
		_, _, _ = x[(nx-1)*xs+k-1], w[(4*q-1)*ws+k-1], out[(nx-1)*os+4*q-1]
		pf, far := gemvPrefetch(ws, size)
		far = far || pf+nx*k*4 > gemmNear
		if nx == 2 && strided(size, k, q) {
			spreadQuads(q, 2, os, out, func(i int, sums *[8]float32) {
				gemmQuads(x, xs, 2, &w[i*ws], q*ws, k, 1, sums[:], 4, far, gemm2, gemm4)
			})
		} else {
			gemmQuads(x, xs, nx, &w[0], ws, k, q, out, os, far, gemm2, gemm4)
		}
	}
	for r := 4 * q; r < rows; r++ {
		_ = w[r*ws+k-1]
		var one [16]float32
		gemmQuads(x, xs, nx, &w[r*ws], 0, k, 1, one[:], 4, false, gemm2, gemm4)
		for t := range nx {
			out[t*os+r] = one[4*t]
		}
	}
}

// gemmQuads runs Gemm2 or Gemm4 over quads of W rows from w.
func gemmQuads[T any](x []float32, xs, nx int, w *T, ws, k, quads int, out []float32, os int, far bool, gemm2, gemm4 gemmKernel[T]) {
	_, _ = x[(nx-1)*xs+k-1], out[(nx-1)*os+4*quads-1]
	x0, x1 := &x[0], &x[xs]
	if nx == 2 {
		gemm2(x0, x1, x1, x1, w, ws, k, quads, &out[0], os, nx, far)
		return
	}
	x2 := &x[2*xs]
	x3 := x2
	if nx == 4 {
		x3 = &x[3*xs]
	}
	gemm4(x0, x1, x2, x3, w, ws, k, quads, &out[0], os, nx, far)
}

func f32GemmAsm(x []float32, xs, nx int, w []float32, ws, k, rows int, out []float32, os int) {
	gemmAsm(x, xs, nx, w, ws, k, rows, out, os, 4, f32Gemm2AVX512, f32Gemm4AVX512, f32GemvAsm)
}

func bf16GemmAsm(x []float32, xs, nx int, w []uint16, ws, k, rows int, out []float32, os int) {
	gemmAsm(x, xs, nx, w, ws, k, rows, out, os, 2, bf16Gemm2AVX512, bf16Gemm4AVX512, bf16GemvAsm)
}

func fp8GemmAsm(x []float32, xs, nx int, w []uint8, ws, k, rows int, out []float32, os int) {
	gemmAsm(x, xs, nx, w, ws, k, rows, out, os, 1, fp8Gemm2AVX512, fp8Gemm4AVX512, fp8GemvAsm)
}

func bf16ToF32Asm(dst []float32, src []uint16) {
	if len(src) == 0 {
		return
	}
	_ = dst[len(src)-1]
	bf16ToF32AVX512(&dst[0], &src[0], len(src))
}

func fp8ToF32Asm(dst []float32, src []uint8, mul float32) {
	if len(src) == 0 {
		return
	}
	_ = dst[len(src)-1]
	fp8ToF32AVX512(&dst[0], &src[0], len(src), mul)
}

func axpyAsm(y []float32, alpha float32, x []float32) {
	_ = x[len(y)-1]
	axpyAVX512(&y[0], alpha, &x[0], len(y))
}

func scaleAsm(y []float32, alpha float32) {
	scaleAVX512(&y[0], alpha, len(y))
}

func scaleToAsm(dst, src []float32, alpha float32) {
	if len(src) == 0 {
		return
	}
	_ = dst[len(src)-1]
	scaleToAVX512(&dst[0], &src[0], alpha, len(src))
}

func maxAsm(x []float32) float32 { return maxVectors(x, 16, maxAVX512) }

// maxVectors returns the largest element of x: whole vectors of width
// elements through the assembly kernel vmax, the rest in Go.
func maxVectors(x []float32, width int, vmax func(x *float32, n int) float32) float32 {
	nv := len(x) / width * width
	if nv == 0 {
		return maxGo(x)
	}
	m := vmax(&x[0], nv)
	if nv < len(x) {
		m = max(m, maxGo(x[nv:]))
	}
	return m
}

func expSumAsm(x []float32, shift float32) float32 {
	return expSumAVX512(&x[0], len(x), shift)
}

// addWeightedAsm runs the weighted-sum kernels on four rows of weights at
// a time, 64 columns at a time and then 16 (the last ones masked). Rows
// past nr repeat row 0's weights and accumulate into a discarded buffer.
func addWeightedAsm(out []float32, os int, p []float32, ps, nr int, v []float32, vs, n, d int) {
	_, _, _ = out[(nr-1)*os+d-1], p[(nr-1)*ps+n-1], v[(n-1)*vs+d-1]
	var discard [64]float32
	for r0 := 0; r0 < nr; r0 += 4 {
		var ps4 [4]*float32
		var os4 [4]int
		for i := range 4 {
			ps4[i], os4[i] = &p[r0*ps], -1
			if r0+i < nr {
				ps4[i], os4[i] = &p[(r0+i)*ps], (r0+i)*os
			}
		}
		for j := 0; j < d; {
			var o [4]*float32
			for i := range 4 {
				o[i] = &discard[0]
				if os4[i] >= 0 {
					o[i] = &out[os4[i]+j]
				}
			}
			if d-j >= 64 {
				wsum4x64AVX512(ps4[0], ps4[1], ps4[2], ps4[3], &v[j], vs, n, o[0], o[1], o[2], o[3])
				j += 64
				continue
			}
			cols := min(16, d-j)
			wsum4x16AVX512(ps4[0], ps4[1], ps4[2], ps4[3], &v[j], vs, n, cols, o[0], o[1], o[2], o[3])
			j += cols
		}
	}
}

func siluMulAsm(gate, up []float32) {
	_ = up[len(gate)-1]
	siluMulAVX512(&gate[0], &up[0], len(gate))
}

// Implemented in kernels_amd64.s. Pointers are to the first element; strides
// and lengths are in elements.

//go:noescape
func f32Dot4x4AVX512(x *float32, xs int, w *float32, ws int, k int, out *float32, os int)

//go:noescape
func f32Dot1x4AVX512(x *float32, w *float32, ws int, k int, out *float32)

//go:noescape
func dotAVX512(a *float32, b *float32, n int) float32

//go:noescape
func bf16Dot4x4AVX512(x *float32, xs int, w *uint16, ws int, k int, out *float32, os int)

//go:noescape
func fp8Dot4x4AVX512(x *float32, xs int, w *uint8, ws int, k int, out *float32, os int)

//go:noescape
func bf16Dot1x4AVX512(x *float32, w *uint16, ws int, k int, out *float32)

//go:noescape
func fp8Dot1x4AVX512(x *float32, w *uint8, ws int, k int, out *float32)

//go:noescape
func f32GemvAVX512(x *float32, w *float32, ws int, k int, quads int, out *float32, pf int, far bool)

//go:noescape
func bf16GemvAVX512(x *float32, w *uint16, ws int, k int, quads int, out *float32, pf int, far bool)

//go:noescape
func fp8GemvAVX512(x *float32, w *uint8, ws int, k int, quads int, out *float32, pf int, far bool)

//go:noescape
func f32Gemm2AVX512(x0, x1, x2, x3 *float32, w *float32, ws, k, quads int, out *float32, os, nx int, far bool)

//go:noescape
func f32Gemm4AVX512(x0, x1, x2, x3 *float32, w *float32, ws, k, quads int, out *float32, os, nx int, far bool)

//go:noescape
func bf16Gemm2AVX512(x0, x1, x2, x3 *float32, w *uint16, ws, k, quads int, out *float32, os, nx int, far bool)

//go:noescape
func bf16Gemm4AVX512(x0, x1, x2, x3 *float32, w *uint16, ws, k, quads int, out *float32, os, nx int, far bool)

//go:noescape
func fp8Gemm2AVX512(x0, x1, x2, x3 *float32, w *uint8, ws, k, quads int, out *float32, os, nx int, far bool)

//go:noescape
func fp8Gemm4AVX512(x0, x1, x2, x3 *float32, w *uint8, ws, k, quads int, out *float32, os, nx int, far bool)

//go:noescape
func bf16ToF32AVX512(dst *float32, src *uint16, n int)

//go:noescape
func fp8ToF32AVX512(dst *float32, src *uint8, n int, mul float32)

//go:noescape
func fmaPeakAVX512(iters int)

//go:noescape
func axpyAVX512(y *float32, alpha float32, x *float32, n int)

//go:noescape
func scaleAVX512(y *float32, alpha float32, n int)

//go:noescape
func scaleToAVX512(dst *float32, src *float32, alpha float32, n int)

//go:noescape
func maxAVX512(x *float32, n int) float32

//go:noescape
func expSumAVX512(x *float32, n int, shift float32) float32

//go:noescape
func siluMulAVX512(gate *float32, up *float32, n int)

//go:noescape
func wsum4x64AVX512(p0, p1, p2, p3 *float32, v *float32, vs, n int, o0, o1, o2, o3 *float32)

//go:noescape
func wsum4x16AVX512(p0, p1, p2, p3 *float32, v *float32, vs, n, cols int, o0, o1, o2, o3 *float32)
