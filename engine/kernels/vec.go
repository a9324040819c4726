package kernels

import "math"

// The vector helpers below run on the calling goroutine with the pool's
// kernel set, so that everything one model computes comes from one set.

// Dot returns Σ a[i]*b[i] over the first min(len(a), len(b)) elements.
func (p *Pool) Dot(a, b []float32) float32 {
	n := min(len(a), len(b))
	if n == 0 {
		return 0
	}
	return p.Kernels().dot(a[:n], b[:n])
}

// AXPY adds alpha*x[i] to y[i] for the first min(len(y), len(x)) elements.
func (p *Pool) AXPY(y []float32, alpha float32, x []float32) {
	n := min(len(y), len(x))
	if n == 0 {
		return
	}
	p.Kernels().axpy(y[:n], alpha, x[:n])
}

// Scale multiplies every element of y by alpha.
func (p *Pool) Scale(y []float32, alpha float32) {
	if len(y) == 0 {
		return
	}
	p.Kernels().scale(y, alpha)
}

// ExpSum replaces every x[j] with exp(x[j]-shift) and returns their sum:
// the exponentials of a softmax, shifted by the row's maximum.
func (p *Pool) ExpSum(x []float32, shift float32) float32 {
	if len(x) == 0 {
		return 0
	}
	return p.Kernels().expSum(x, shift)
}

// Max returns the largest element of x, which holds no NaN (-Inf when x
// is empty): the shift of a softmax.
func (p *Pool) Max(x []float32) float32 {
	if len(x) == 0 {
		return float32(math.Inf(-1))
	}
	return p.Kernels().max(x)
}

// SiLUMul replaces every gate[j] with silu(gate[j])·up[j], where
// silu(g) = g/(1+exp(-g)): the activation of a SwiGLU feed-forward layer,
// over the first min(len(gate), len(up)) elements.
func (p *Pool) SiLUMul(gate, up []float32) {
	n := min(len(gate), len(up))
	if n == 0 {
		return
	}
	p.Kernels().siluMul(gate[:n], up[:n])
}

// MulRows stores Σ_j x[t*xs+j]·w[r*ws+j] into out[t*os+r] for t < nx and
// r < nw: the products of nx rows of x with nw rows of w, every row k long.
// It serves products too small or too irregular for [Pool.MatMul], such
// as attention's scores against cached keys, whose rows lie at the KV
// cache's stride. Each output is summed in the set's one order (see the
// package doc), so it is the same whatever nx and nw are.
func (p *Pool) MulRows(out []float32, os int, x []float32, xs, nx int, w []float32, ws, nw, k int) {
	mulRows(p.Kernels(), out, os, x, xs, nx, w, ws, nw, k)
}

func mulRows(ks *Set, out []float32, os int, x []float32, xs, nx int, w []float32, ws, nw, k int) {
	if nx <= 0 || nw <= 0 {
		return
	}
	if k <= 0 {
		for t := range nx {
			clear(out[t*os : t*os+nw])
		}
		return
	}
	if ks.f32Gemm != nil {
		for t := 0; t < nx; t += 4 {
			ks.f32Gemm(x[t*xs:], xs, min(4, nx-t), w, ws, k, nw, out[t*os:], os)
		}
		return
	}
	for t := range nx {
		xt := x[t*xs : t*xs+k]
		o := out[t*os : t*os+nw]
		r := 0
		for ; r+4 <= nw; r += 4 {
			ks.f32Dot1x4(xt, w[r*ws:], ws, k, o[r:])
		}
		for ; r < nw; r++ {
			var one [4]float32
			ks.f32Dot1x4(xt, w[r*ws:], 0, k, one[:])
			o[r] = one[0]
		}
	}
}

// AddWeightedRows adds Σ_q p[r*ps+q]·v[q*vs+j] to out[r*os+j] for r < nr
// and j < d: each of nr rows of weights (n long) weighs n rows of v (d
// long) into a row of out. It serves attention, whose cached values are
// weighed by each query's softmax in place, at the stride of the KV cache.
func (p *Pool) AddWeightedRows(out []float32, os int, pw []float32, ps, nr int, v []float32, vs, n, d int) {
	if nr <= 0 || n <= 0 || d <= 0 {
		return
	}
	p.Kernels().addWeighted(out, os, pw, ps, nr, v, vs, n, d)
}
