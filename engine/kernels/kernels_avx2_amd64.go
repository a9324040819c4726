//go:build amd64 && !purego

package kernels

import "golang.org/x/sys/cpu"

// avx2Kernels is the AVX2+FMA+F16C kernel set for CPUs without AVX-512,
// or nil when the CPU lacks those too. The assembly handles whole vectors
// of 8 columns; the wrappers add the last k%8 columns in order after them,
// the same way on every path, and sum rows past the last quad as a quad
// of one row, so every output is summed in one order.
var avx2Kernels = func() *Set {
	x := cpu.X86
	if !(x.HasAVX2 && x.HasFMA && x.HasF16C) {
		return nil
	}
	ks := genericKernels
	ks.name = "avx2"
	ks.f32Dot4x4 = nil // f32TileRun tiles every F32 product
	ks.f32Dot1x4 = avx2F32.dot1x4
	ks.bf16Dot4x4 = avx2BF16.tile4x4
	ks.bf16Dot1x4 = avx2BF16.dot1x4
	ks.fp8Dot4x4 = avx2FP8.tile4x4
	ks.fp8Dot1x4 = avx2FP8.dot1x4
	ks.f32Gemv = avx2F32.gemv
	ks.bf16Gemv = avx2BF16.gemv
	ks.fp8Gemv = avx2FP8.gemv
	ks.f32Gemm = avx2F32.gemm
	ks.bf16Gemm = avx2BF16.gemm
	ks.fp8Gemm = avx2FP8.gemm
	// Measured with weights streamed from memory (BenchmarkBatchStream):
	// past these batch sizes, decoding W once into F32 and running the F32
	// tiles beats decoding it in registers for every four x rows (FP8 at 16
	// tokens on Zen 5: 2.9-3.1 GB/s of weights in registers, 2.4-2.5
	// widened; at 64, 0.75 against 0.83).
	ks.gemmMax = batchLimits{f32: 16, bf16: 16, fp8: 16}
	ks.f32TileRun = f32TilesAVX2w
	ks.widenTiles = true
	ks.xStationary = true
	ks.fmaPeak, ks.flopsPerIter = fmaPeakAVX2, 12*8*2
	ks.bf16ToF32 = bf16ToF32AVX2w
	ks.fp8ToF32 = fp8ToF32AVX2w
	ks.dot = dotAVX2w
	ks.axpy = axpyAVX2w
	ks.scale = scaleAVX2w
	ks.scaleTo = scaleToAVX2w
	ks.expSum = expSumAVX2w
	ks.siluMul = siluMulAVX2w
	ks.max = maxAVX2w
	ks.addWeighted = addWeightedAVX2w
	return &ks
}()

// weight is an element type of W.
type weight interface{ float32 | uint16 | uint8 }

// avx2Ops are one weight type's AVX2 kernels, for k a multiple of 8, and
// the decoding of its tail columns (raw for FP8, as in the assembly). F32
// has no 2x4 tile (tileK): its tiles are f32TilesAVX2w.
type avx2Ops[T weight] struct {
	size  int
	gemvK gemvKernel[T]
	gemmK func(x0, x1 *float32, w *T, ws, k, quads int, out *float32, os, pf int, far bool)
	tileK func(x *float32, xs int, w *T, ws, k int, out *float32, os int)
	// gemm4K multiplies four x rows by pairs of W rows, loading (and for
	// BF16 and FP8 decoding) each W vector once for the four.
	gemm4K func(x *float32, xs int, w *T, ws, k, pairs int, out *float32, os, pf int, far bool)
	dec    func(T) float32
}

var (
	avx2F32  = &avx2Ops[float32]{size: 4, gemvK: f32GemvAVX2, gemmK: f32Gemm2AVX2, gemm4K: f32Gemm4AVX2, dec: func(v float32) float32 { return v }}
	avx2BF16 = &avx2Ops[uint16]{size: 2, gemvK: bf16GemvAVX2, gemmK: bf16Gemm2AVX2, tileK: bf16Dot2x4AVX2, gemm4K: bf16Gemm4AVX2, dec: bf16}
	avx2FP8  = &avx2Ops[uint8]{size: 1, gemvK: fp8GemvAVX2, gemmK: fp8Gemm2AVX2, tileK: fp8Dot2x4AVX2, gemm4K: fp8Gemm4AVX2,
		dec: func(b uint8) float32 { return fp8Raw[b] }}
)

// tail returns Σ x[j]*w[j] over the columns the assembly leaves out.
func (o *avx2Ops[T]) tail(x []float32, w []T) float32 {
	w = w[:len(x)]
	var s float32
	for j, v := range x {
		s += v * o.dec(w[j])
	}
	return s
}

// addTails adds the products over columns [kv, k) to out[t*os+r] for
// t < nx, r < rows.
func (o *avx2Ops[T]) addTails(x []float32, xs, nx int, w []T, ws, kv, k, rows int, out []float32, os int) {
	if kv == k {
		return
	}
	for t := range nx {
		for r := range rows {
			out[t*os+r] += o.tail(x[t*xs+kv:t*xs+k], w[r*ws+kv:r*ws+k])
		}
	}
}

// gemv stores Σ_j x[j]*W[r][j] into out[r] for r < rows.
func (o *avx2Ops[T]) gemv(x []float32, w []T, ws, k, rows int, out []float32) {
	_, _, _ = x[k-1], w[(rows-1)*ws+k-1], out[rows-1]
	kv := k &^ 7
	if kv == 0 {
		clear(out[:rows])
	} else {
		gemvRows(o.gemvK, x, w, ws, kv, rows, out, o.size)
	}
	o.addTails(x, 0, 1, w, ws, kv, k, rows, out, 0)
}

// gemm stores Σ_j x[t*xs+j]*W[r][j] into out[t*os+r] for t < nx (1 to 4)
// and r < rows: four x rows through gemm4, else two x rows per GEMM2 call.
func (o *avx2Ops[T]) gemm(x []float32, xs, nx int, w []T, ws, k, rows int, out []float32, os int) {
	if nx == 4 {
		o.gemm4(x, xs, w, ws, k, rows, out, os)
		return
	}
	for t := 0; t < nx; t += 2 {
		if t+1 == nx {
			o.gemv(x[t*xs:], w, ws, k, rows, out[t*os:])
			continue
		}
		o.gemm2(x[t*xs:], xs, w, ws, k, rows, out[t*os:], os)
	}
}

// gemm2 is gemm for two x rows.
func (o *avx2Ops[T]) gemm2(x []float32, xs int, w []T, ws, k, rows int, out []float32, os int) {
	_, _, _ = x[xs+k-1], w[(rows-1)*ws+k-1], out[os+rows-1]
	kv, q := k&^7, rows/4
	if kv == 0 {
		clear(out[:rows])
		clear(out[os : os+rows])
	} else {
		pf, far := gemvPrefetch(ws, o.size)
		far = far || pf+2*k*4 > gemmNear
		if strided(o.size, kv, q) {
			spreadQuads(q, 2, os, out, func(i int, sums *[8]float32) {
				o.gemmK(&x[0], &x[xs], &w[i*ws], q*ws, kv, 1, &sums[0], 4, 0, false)
			})
		} else if q > 0 {
			o.gemmK(&x[0], &x[xs], &w[0], ws, kv, q, &out[0], os, pf, far)
		}
		for r := 4 * q; r < rows; r++ {
			var one [8]float32
			o.gemmK(&x[0], &x[xs], &w[r*ws], 0, kv, 1, &one[0], 4, 0, false)
			out[r], out[os+r] = one[0], one[4]
		}
	}
	o.addTails(x, xs, 2, w, ws, kv, k, rows, out, os)
}

// gemm4 is gemm for four x rows, W rows two at a time; a last odd row
// runs as a pair of that row repeated, which sums it as pairs are summed.
func (o *avx2Ops[T]) gemm4(x []float32, xs int, w []T, ws, k, rows int, out []float32, os int) {
	_, _, _ = x[3*xs+k-1], w[(rows-1)*ws+k-1], out[3*os+rows-1]
	kv, pairs := k&^7, rows/2
	if kv == 0 {
		for t := range 4 {
			clear(out[t*os : t*os+rows])
		}
	} else {
		pf, far := gemvPrefetch(ws, o.size)
		far = far || pf+4*k*4 > gemmNear
		if pairs > 0 {
			o.gemm4K(&x[0], xs, &w[0], ws, kv, pairs, &out[0], os, pf, far)
		}
		if r := rows - 1; rows%2 == 1 {
			var one [8]float32
			o.gemm4K(&x[0], xs, &w[r*ws], 0, kv, 1, &one[0], 2, 0, false)
			for t := range 4 {
				out[t*os+r] = one[2*t]
			}
		}
	}
	o.addTails(x, xs, 4, w, ws, kv, k, rows, out, os)
}

// tile4x4 stores the products of four x rows with four W rows.
func (o *avx2Ops[T]) tile4x4(x []float32, xs int, w []T, ws, k int, out []float32, os int) {
	_, _, _ = x[3*xs+k-1], w[3*ws+k-1], out[3*os+3]
	kv := k &^ 7
	if kv == 0 {
		for t := range 4 {
			clear(out[t*os : t*os+4])
		}
	} else {
		o.tileK(&x[0], xs, &w[0], ws, kv, &out[0], os)
		o.tileK(&x[2*xs], xs, &w[0], ws, kv, &out[2*os], os)
	}
	o.addTails(x, xs, 4, w, ws, kv, k, 4, out, os)
}

// f32TileRunAVX2w stores the products of nx x rows with four W rows, two
// x rows at a time in one assembly call, an odd last row as a GEMV (F32
// only: the set widens BF16 and FP8 before it tiles them).
func f32TileRunAVX2w(x []float32, xs, nx int, w []float32, ws, k int, out []float32, os int) {
	_, _, _ = x[(nx-1)*xs+k-1], w[3*ws+k-1], out[(nx-1)*os+3]
	kv, pairs := k&^7, nx/2
	if kv > 0 && pairs > 0 {
		f32TileRunAVX2(&x[0], xs, pairs, &w[0], ws, kv, &out[0], os)
	} else {
		for t := range 2 * pairs {
			clear(out[t*os : t*os+4])
		}
	}
	avx2F32.addTails(x, xs, 2*pairs, w, ws, kv, k, 4, out, os)
	if nx%2 == 1 {
		avx2F32.gemv(x[(nx-1)*xs:], w, ws, k, 4, out[(nx-1)*os:])
	}
}

// f32TilesAVX2w stores the products of nx x rows with nw W rows. W rows
// few enough to stay in L2 (a widened group) stream past each quad of x
// rows in turn as 4x3 tiles, a last partial triple taken as the triple
// ending at row nw, which computes one or two rows a second time to the
// same bits. Otherwise each W group stays in L1 while every x row
// streams past it: W rows three at a time (4x3 tiles, whose twelve
// accumulators leave the FMA units slack), after one or two quads (2x4
// tiles) so that the rest divides by three; rows left past those (nw of
// 1, 2 or 5) run as quads of one row.
func f32TilesAVX2w(x []float32, xs, nx int, w []float32, ws, k, nw int, out []float32, os int) {
	if nx >= 8 && nw >= 3 && 4*nw*k <= wGroupBytes {
		f32Tile4x3ColsAVX2w(x, xs, nx, w, ws, k, nw/3, out, os)
		if r := nw - 3; nw%3 != 0 {
			f32Tile4x3ColsAVX2w(x, xs, nx, w[r*ws:], ws, k, 1, out[r:], os)
		}
		return
	}
	q := [3]int{0, 1, 2}[nw%3]
	if 4*q > nw {
		q = nw / 4
	}
	r := 0
	for ; r < 4*q; r += 4 {
		f32TileRunAVX2w(x, xs, nx, w[r*ws:], ws, k, out[r:], os)
	}
	for ; r+3 <= nw; r += 3 {
		f32Tile4x3AVX2w(x, xs, nx, w[r*ws:], ws, k, out[r:], os)
	}
	for ; r < nw; r++ {
		for t := range nx {
			avx2F32.gemv(x[t*xs:], w[r*ws:], ws, k, 1, out[t*os+r:])
		}
	}
}

// f32Tile4x3AVX2w stores the products of nx x rows with three W rows:
// x rows four at a time in one assembly call, the rest as GEMVs.
func f32Tile4x3AVX2w(x []float32, xs, nx int, w []float32, ws, k int, out []float32, os int) {
	_, _, _ = x[(nx-1)*xs+k-1], w[2*ws+k-1], out[(nx-1)*os+2]
	kv, quads := k&^7, nx/4
	if kv > 0 && quads > 0 {
		f32Tile4x3RunAVX2(&x[0], xs, quads, &w[0], ws, kv, &out[0], os)
	} else {
		for t := range 4 * quads {
			clear(out[t*os : t*os+3])
		}
	}
	avx2F32.addTails(x, xs, 4*quads, w, ws, kv, k, 3, out, os)
	for t := 4 * quads; t < nx; t++ {
		avx2F32.gemv(x[t*xs:], w, ws, k, 3, out[t*os:])
	}
}

// f32Tile4x3ColsAVX2w stores the products of nx x rows with 3*triples W
// rows: each quad of x rows in turn stays in L1 while the triples stream
// past it (f32Tile4x3AVX2w's tiles with the loops the other way round),
// the x rows past the last quad as GEMVs.
func f32Tile4x3ColsAVX2w(x []float32, xs, nx int, w []float32, ws, k, triples int, out []float32, os int) {
	nw := 3 * triples
	_, _, _ = x[(nx-1)*xs+k-1], w[(nw-1)*ws+k-1], out[(nx-1)*os+nw-1]
	kv, quads := k&^7, nx/4
	for q := range quads {
		t := 4 * q
		if kv > 0 {
			f32Tile4x3ColsAVX2(&x[t*xs], xs, &w[0], ws, kv, triples, &out[t*os], os)
		} else {
			for i := range 4 {
				clear(out[(t+i)*os : (t+i)*os+nw])
			}
		}
	}
	avx2F32.addTails(x, xs, 4*quads, w, ws, kv, k, nw, out, os)
	for t := 4 * quads; t < nx; t++ {
		avx2F32.gemv(x[t*xs:], w, ws, k, nw, out[t*os:])
	}
}

// dot1x4 stores the products of one x row with four W rows.
func (o *avx2Ops[T]) dot1x4(x []float32, w []T, ws, k int, out []float32) {
	o.gemv(x, w, ws, k, 4, out)
}

func dotAVX2w(a, b []float32) float32 {
	b = b[:len(a)]
	nv := len(a) &^ 7
	var s float32
	if nv > 0 {
		s = dotAVX2(&a[0], &b[0], nv)
	}
	if nv < len(a) {
		s += dotGo(a[nv:], b[nv:])
	}
	return s
}

func bf16ToF32AVX2w(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	nv := len(src) &^ 7
	if nv > 0 {
		bf16ToF32AVX2(&dst[0], &src[0], nv)
	}
	bf16ToF32Go(dst[nv:], src[nv:])
}

func fp8ToF32AVX2w(dst []float32, src []uint8, mul float32) {
	dst = dst[:len(src)]
	nv := len(src) &^ 7
	if nv > 0 {
		fp8ToF32AVX2(&dst[0], &src[0], nv, mul)
	}
	fp8ToF32Go(dst[nv:], src[nv:], mul)
}

func expSumAVX2w(x []float32, shift float32) float32 {
	return expSumAVX2(&x[0], len(x), shift)
}

func maxAVX2w(x []float32) float32 { return maxVectors(x, 8, maxAVX2) }

func siluMulAVX2w(gate, up []float32) {
	_ = up[len(gate)-1]
	siluMulAVX2(&gate[0], &up[0], len(gate))
}

// addWeightedAVX2w runs the weighted-sum kernel on four rows of weights
// and 16 columns at a time; rows past nr repeat row 0's weights into a
// discarded buffer, and the last d%16 columns take one axpy per weight,
// which sums each output the same way.
func addWeightedAVX2w(out []float32, os int, p []float32, ps, nr int, v []float32, vs, n, d int) {
	_, _, _ = out[(nr-1)*os+d-1], p[(nr-1)*ps+n-1], v[(n-1)*vs+d-1]
	var discard [16]float32
	d16 := d &^ 15
	for r0 := 0; r0 < nr && d16 > 0; r0 += 4 {
		var pr [4]*float32
		var or [4]int
		for i := range 4 {
			pr[i], or[i] = &p[r0*ps], -1
			if r0+i < nr {
				pr[i], or[i] = &p[(r0+i)*ps], (r0+i)*os
			}
		}
		for j := 0; j < d16; j += 16 {
			var o [4]*float32
			for i := range 4 {
				o[i] = &discard[0]
				if or[i] >= 0 {
					o[i] = &out[or[i]+j]
				}
			}
			wsum4x16AVX2(pr[0], pr[1], pr[2], pr[3], &v[j], vs, n, o[0], o[1], o[2], o[3])
		}
	}
	if d16 < d {
		addWeightedAXPY(axpyAVX2w, out[d16:], os, p, ps, nr, v[d16:], vs, n, d-d16)
	}
}

func scaleToAVX2w(dst, src []float32, alpha float32) {
	dst = dst[:len(src)]
	nv := len(src) &^ 7
	if nv > 0 {
		scaleToAVX2(&dst[0], &src[0], alpha, nv)
	}
	scaleToGo(dst[nv:], src[nv:], alpha)
}

func axpyAVX2w(y []float32, alpha float32, x []float32) {
	x = x[:len(y)]
	nv := len(y) &^ 7
	if nv > 0 {
		axpyAVX2(&y[0], alpha, &x[0], nv)
	}
	axpyGo(y[nv:], alpha, x[nv:])
}

func scaleAVX2w(y []float32, alpha float32) {
	nv := len(y) &^ 7
	if nv > 0 {
		scaleAVX2(&y[0], alpha, nv)
	}
	scaleGo(y[nv:], alpha)
}

// Implemented in kernels_avx2_amd64.s; k and n are multiples of 8.

//go:noescape
func bf16Dot2x4AVX2(x *float32, xs int, w *uint16, ws int, k int, out *float32, os int)

//go:noescape
func fp8Dot2x4AVX2(x *float32, xs int, w *uint8, ws int, k int, out *float32, os int)

//go:noescape
func f32GemvAVX2(x *float32, w *float32, ws int, k int, quads int, out *float32, pf int, far bool)

//go:noescape
func bf16GemvAVX2(x *float32, w *uint16, ws int, k int, quads int, out *float32, pf int, far bool)

//go:noescape
func fp8GemvAVX2(x *float32, w *uint8, ws int, k int, quads int, out *float32, pf int, far bool)

//go:noescape
func f32Gemm2AVX2(x0, x1 *float32, w *float32, ws, k, quads int, out *float32, os, pf int, far bool)

//go:noescape
func bf16Gemm2AVX2(x0, x1 *float32, w *uint16, ws, k, quads int, out *float32, os, pf int, far bool)

//go:noescape
func f32Gemm4AVX2(x *float32, xs int, w *float32, ws, k, pairs int, out *float32, os, pf int, far bool)

//go:noescape
func bf16Gemm4AVX2(x *float32, xs int, w *uint16, ws, k, pairs int, out *float32, os, pf int, far bool)

//go:noescape
func fp8Gemm4AVX2(x *float32, xs int, w *uint8, ws, k, pairs int, out *float32, os, pf int, far bool)

//go:noescape
func fp8Gemm2AVX2(x0, x1 *float32, w *uint8, ws, k, quads int, out *float32, os, pf int, far bool)

//go:noescape
func bf16ToF32AVX2(dst *float32, src *uint16, n int)

//go:noescape
func fp8ToF32AVX2(dst *float32, src *uint8, n int, mul float32)

//go:noescape
func f32TileRunAVX2(x *float32, xs, pairs int, w *float32, ws, k int, out *float32, os int)

//go:noescape
func expSumAVX2(x *float32, n int, shift float32) float32

//go:noescape
func maxAVX2(x *float32, n int) float32

//go:noescape
func siluMulAVX2(gate *float32, up *float32, n int)

//go:noescape
func wsum4x16AVX2(p0, p1, p2, p3 *float32, v *float32, vs, n int, o0, o1, o2, o3 *float32)

//go:noescape
func scaleToAVX2(dst *float32, src *float32, alpha float32, n int)

//go:noescape
func f32Tile4x3RunAVX2(x *float32, xs, quads int, w *float32, ws, k int, out *float32, os int)

//go:noescape
func fmaPeakAVX2(iters int)

//go:noescape
func f32Tile4x3ColsAVX2(x *float32, xs int, w *float32, ws, k, triples int, out *float32, os int)

//go:noescape
func dotAVX2(a *float32, b *float32, n int) float32

//go:noescape
func axpyAVX2(y *float32, alpha float32, x *float32, n int)

//go:noescape
func scaleAVX2(y *float32, alpha float32, n int)
