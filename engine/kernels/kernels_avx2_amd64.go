//go:build amd64 && !purego

package kernels

import "golang.org/x/sys/cpu"

// avx2Kernels is the AVX2+FMA+F16C kernel set for CPUs without AVX-512,
// or nil when the CPU lacks those too. The assembly handles whole vectors
// of 8 columns; the wrappers add the last k%8 columns with the portable
// kernels. Single-row dots and conversions, used only at the edges of
// tiles and for embedding lookups, stay portable.
var avx2Kernels = func() *Set {
	x := cpu.X86
	if !(x.HasAVX2 && x.HasFMA && x.HasF16C) {
		return nil
	}
	ks := genericKernels
	ks.name = "avx2"
	ks.f32Dot4x4 = f32Dot4x4AVX2w
	ks.f32Dot1x4 = f32Dot1x4AVX2w
	ks.dot = dotAVX2w
	ks.bf16Dot4x4 = bf16Dot4x4AVX2w
	ks.bf16Dot1x4 = bf16Dot1x4AVX2w
	ks.fp8Dot4x4 = fp8Dot4x4AVX2w
	ks.fp8Dot1x4 = fp8Dot1x4AVX2w
	ks.axpy = axpyAVX2w
	ks.scale = scaleAVX2w
	ks.addWeighted = func(out []float32, os int, p []float32, ps, nr int, v []float32, vs, n, d int) {
		addWeightedAXPY(axpyAVX2w, out, os, p, ps, nr, v, vs, n, d)
	}
	return &ks
}()

func f32Dot4x4AVX2w(x []float32, xs int, w []float32, ws, k int, out []float32, os int) {
	kv := k &^ 7
	if kv > 0 {
		_, _, _ = x[3*xs+k-1], w[3*ws+k-1], out[3*os+3]
		f32Dot2x4AVX2(&x[0], xs, &w[0], ws, kv, &out[0], os)
		f32Dot2x4AVX2(&x[2*xs], xs, &w[0], ws, kv, &out[2*os], os)
	}
	if kv < k {
		f32Dot4x4Go(x[kv:], xs, w[kv:], ws, k-kv, out, os)
	}
}

func f32Dot1x4AVX2w(x, w []float32, ws, k int, out []float32) {
	kv := k &^ 7
	if kv > 0 {
		_, _, _ = x[k-1], w[3*ws+k-1], out[3]
		f32Dot1x4AVX2(&x[0], &w[0], ws, kv, &out[0])
	}
	if kv < k {
		f32Dot1x4Go(x[kv:], w[kv:], ws, k-kv, out)
	}
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

// addTail4x4 adds the products over columns [kv, k) to the 4x4 outputs
// that a storing kernel has written for columns [0, kv).
func addTail4x4(out []float32, os int, tail func(out []float32, os int)) {
	var t [16]float32
	tail(t[:], 4)
	for r := 0; r < 4; r++ {
		o := out[r*os : r*os+4]
		for c := range o {
			o[c] += t[4*r+c]
		}
	}
}

func bf16Dot4x4AVX2w(x []float32, xs int, w []uint16, ws, k int, out []float32, os int) {
	kv := k &^ 7
	if kv == 0 {
		bf16Dot4x4Go(x, xs, w, ws, k, out, os)
		return
	}
	_, _, _ = x[3*xs+k-1], w[3*ws+k-1], out[3*os+3]
	bf16Dot2x4AVX2(&x[0], xs, &w[0], ws, kv, &out[0], os)
	bf16Dot2x4AVX2(&x[2*xs], xs, &w[0], ws, kv, &out[2*os], os)
	if kv < k {
		addTail4x4(out, os, func(t []float32, ts int) { bf16Dot4x4Go(x[kv:], xs, w[kv:], ws, k-kv, t, ts) })
	}
}

func fp8Dot4x4AVX2w(x []float32, xs int, w []uint8, ws, k int, out []float32, os int) {
	kv := k &^ 7
	if kv == 0 {
		fp8Dot4x4Go(x, xs, w, ws, k, out, os)
		return
	}
	_, _, _ = x[3*xs+k-1], w[3*ws+k-1], out[3*os+3]
	fp8Dot2x4AVX2(&x[0], xs, &w[0], ws, kv, &out[0], os)
	fp8Dot2x4AVX2(&x[2*xs], xs, &w[0], ws, kv, &out[2*os], os)
	if kv < k {
		addTail4x4(out, os, func(t []float32, ts int) { fp8Dot4x4Go(x[kv:], xs, w[kv:], ws, k-kv, t, ts) })
	}
}

func bf16Dot1x4AVX2w(x []float32, w []uint16, ws, k int, out []float32) {
	kv := k &^ 7
	if kv == 0 {
		bf16Dot1x4Go(x, w, ws, k, out)
		return
	}
	_, _, _ = x[k-1], w[3*ws+k-1], out[3]
	bf16Dot1x4AVX2(&x[0], &w[0], ws, kv, &out[0])
	if kv < k {
		var t [4]float32
		bf16Dot1x4Go(x[kv:], w[kv:], ws, k-kv, t[:])
		for r, v := range t {
			out[r] += v
		}
	}
}

func fp8Dot1x4AVX2w(x []float32, w []uint8, ws, k int, out []float32) {
	kv := k &^ 7
	if kv == 0 {
		fp8Dot1x4Go(x, w, ws, k, out)
		return
	}
	_, _, _ = x[k-1], w[3*ws+k-1], out[3]
	fp8Dot1x4AVX2(&x[0], &w[0], ws, kv, &out[0])
	if kv < k {
		var t [4]float32
		fp8Dot1x4Go(x[kv:], w[kv:], ws, k-kv, t[:])
		for r, v := range t {
			out[r] += v
		}
	}
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
func f32Dot2x4AVX2(x *float32, xs int, w *float32, ws int, k int, out *float32, os int)

//go:noescape
func bf16Dot2x4AVX2(x *float32, xs int, w *uint16, ws int, k int, out *float32, os int)

//go:noescape
func fp8Dot2x4AVX2(x *float32, xs int, w *uint8, ws int, k int, out *float32, os int)

//go:noescape
func f32Dot1x4AVX2(x *float32, w *float32, ws int, k int, out *float32)

//go:noescape
func bf16Dot1x4AVX2(x *float32, w *uint16, ws int, k int, out *float32)

//go:noescape
func fp8Dot1x4AVX2(x *float32, w *uint8, ws int, k int, out *float32)

//go:noescape
func dotAVX2(a *float32, b *float32, n int) float32

//go:noescape
func axpyAVX2(y *float32, alpha float32, x *float32, n int)

//go:noescape
func scaleAVX2(y *float32, alpha float32, n int)
