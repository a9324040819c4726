package kernels

import "github.com/stokehq/stoke/internal/dtype"

// Tuning constants, chosen by BenchmarkMatMul on a Zen 4 core.
const (
	// rowGrain is the row alignment of each thread's share of W when
	// there are enough rows: a multiple of the usual 128-row FP8 block,
	// so that no thread splits a block.
	rowGrain = 128
	// minParallelMACs is the least work (multiply-adds) worth handing to
	// another thread; below it, waking a worker costs more than it saves.
	minParallelMACs = 1 << 16
	// directMaxN: for BF16 and FP8 with fewer x rows than this, dot
	// products decode W in registers; with more, each 4-row tile of W is
	// dequantised once into F32 scratch and reused by every x row.
	directMaxN = 4
	// kBlock is the column chunk of W and x processed at a time when Cols
	// exceeds maxUnblockedK, so the W tile (4 rows) stays in L1.
	kBlock        = 1024
	maxUnblockedK = 2048
	// xBlockBytes bounds the x rows kept hot in L2 while a thread streams
	// its share of W.
	xBlockBytes = 256 << 10
)

// MatMul computes out[t*Rows+i] = Σ_j x[t*Cols+j] * W[i][j] for t < n: x is
// n rows of Cols inputs, out receives n rows of Rows outputs (x·Wᵀ, the
// product of a Hugging Face Linear layer without bias). The rows of W are
// split across the pool's threads. It panics with the error of
// [CheckMatMul] if the arguments are inconsistent.
func (p *Pool) MatMul(out, x []float32, n int, w *Matrix) {
	if err := CheckMatMul(out, x, n, w); err != nil {
		panic("kernels: " + err.Error())
	}
	if n == 0 {
		return
	}
	c := &mmCall{p: p, ks: p.kernels(), out: out, x: x, n: n, w: w}
	threads := p.Threads()
	grain := 4
	if w.Rows >= rowGrain*threads {
		grain = rowGrain
	}
	if macs := n * w.Rows * w.Cols; macs/minParallelMACs < threads {
		threads = max(1, macs/minParallelMACs)
	}
	p.parallel(w.Rows, grain, threads, c.rows)
}

// mmCall is one MatMul in progress.
type mmCall struct {
	p   *Pool
	ks  *kernelSet
	out []float32
	x   []float32
	n   int
	w   *Matrix
}

// rows computes the outputs of W rows [lo, hi) for every x row.
func (c *mmCall) rows(lo, hi int) {
	if c.w.DType != dtype.F32 && c.n < directMaxN {
		c.direct(lo, hi)
		return
	}
	c.tiled(lo, hi)
}

// tiled runs the F32 register-blocked kernels over 4x4 tiles (x rows × W
// rows), dequantising each 4-row tile of a BF16 or FP8 W into scratch first.
func (c *mmCall) tiled(lo, hi int) {
	ks, w, x, out, n := c.ks, c.w, c.x, c.out, c.n
	rows, cols := w.Rows, w.Cols
	for t := 0; t < n; t++ {
		clear(out[t*rows+lo : t*rows+hi])
	}
	kc := cols
	if cols > maxUnblockedK {
		kc = kBlock
	}
	xb := max(4, xBlockBytes/(4*kc)&^3)
	var buf []float32
	if w.DType != dtype.F32 {
		b := c.p.getScratch(4 * kc)
		defer c.p.putScratch(b)
		buf = *b
	}
	for t0 := 0; t0 < n; t0 += xb {
		t1 := min(n, t0+xb)
		for k0 := 0; k0 < cols; k0 += kc {
			k1 := min(cols, k0+kc)
			kl := k1 - k0
			for i := lo; i < hi; i += 4 {
				m := min(4, hi-i)
				wt, ws := c.tile(i, m, k0, k1, buf)
				if m < 4 {
					for r := 0; r < m; r++ {
						wr := wt[r*ws : r*ws+kl]
						for t := t0; t < t1; t++ {
							out[t*rows+i+r] += ks.dot(x[t*cols+k0:t*cols+k1], wr)
						}
					}
					continue
				}
				t := t0
				for ; t+4 <= t1; t += 4 {
					ks.f32Dot4x4(x[t*cols+k0:], cols, wt, ws, kl, out[t*rows+i:], rows)
				}
				for ; t < t1; t++ {
					ks.f32Dot1x4(x[t*cols+k0:], wt, ws, kl, out[t*rows+i:])
				}
			}
		}
	}
}

// tile returns W rows [i, i+m), columns [k0, k1) as F32 with its row
// stride: a view of an F32 matrix, or buf filled with dequantised weights.
func (c *mmCall) tile(i, m, k0, k1 int, buf []float32) ([]float32, int) {
	w := c.w
	cols := w.Cols
	if w.DType == dtype.F32 {
		return w.F32[i*cols+k0:], cols
	}
	kl := k1 - k0
	for r := 0; r < m; r++ {
		dst := buf[r*kl : (r+1)*kl]
		row := (i + r) * cols
		if w.DType == dtype.BF16 {
			c.ks.bf16ToF32(dst, w.BF16[row+k0:row+k1])
			continue
		}
		if w.BlockRows == 0 {
			c.ks.fp8ToF32(dst, w.FP8[row+k0:row+k1], fp8Unit*w.scaleAt(i+r, 0))
			continue
		}
		for j := k0; j < k1; {
			e := min(k1, (j/w.BlockCols+1)*w.BlockCols)
			c.ks.fp8ToF32(dst[j-k0:e-k0], w.FP8[row+j:row+e], fp8Unit*w.scaleAt(i+r, j))
			j = e
		}
	}
	return buf, kl
}

// direct computes BF16 and FP8 products for a few x rows (decode), with
// kernels that decode W in registers as they stream it.
func (c *mmCall) direct(lo, hi int) {
	w := c.w
	if w.DType == dtype.BF16 {
		c.directRange(c.x, lo, hi)
		return
	}
	if w.BlockRows == 0 {
		c.directRange(c.x, lo, hi)
		for t := 0; t < c.n; t++ {
			o := c.out[t*w.Rows:]
			for i := lo; i < hi; i++ {
				o[i] *= fp8Unit * w.scaleAt(i, 0)
			}
		}
		return
	}
	// Block scales: for each row block, fold the scales of its column
	// blocks (and the factor 256) into a scaled copy of x, so the FP8 dot
	// products come out fully scaled.
	cols := w.Cols
	b := c.p.getScratch(c.n * cols)
	defer c.p.putScratch(b)
	xs := *b
	for s0 := lo; s0 < hi; {
		s1 := min(hi, (s0/w.BlockRows+1)*w.BlockRows)
		for t := 0; t < c.n; t++ {
			for j := 0; j < cols; j += w.BlockCols {
				e := min(cols, j+w.BlockCols)
				seg := xs[t*cols+j : t*cols+e]
				copy(seg, c.x[t*cols+j:t*cols+e])
				c.ks.scale(seg, fp8Unit*w.scaleAt(s0, j))
			}
		}
		c.directRange(xs, s0, s1)
		s0 = s1
	}
}

// directRange stores the unscaled dot products of the x rows in x with W
// rows [lo, hi).
func (c *mmCall) directRange(x []float32, lo, hi int) {
	ks, w, out, n := c.ks, c.w, c.out, c.n
	rows, cols := w.Rows, w.Cols
	i := lo
	for ; i+4 <= hi; i += 4 {
		for t := 0; t < n; t++ {
			if w.DType == dtype.BF16 {
				ks.bf16Dot1x4(x[t*cols:], w.BF16[i*cols:], cols, cols, out[t*rows+i:])
			} else {
				ks.fp8Dot1x4(x[t*cols:], w.FP8[i*cols:], cols, cols, out[t*rows+i:])
			}
		}
	}
	for ; i < hi; i++ {
		for t := 0; t < n; t++ {
			xt := x[t*cols : (t+1)*cols]
			if w.DType == dtype.BF16 {
				out[t*rows+i] = ks.bf16Dot(xt, w.BF16[i*cols:(i+1)*cols])
			} else {
				out[t*rows+i] = ks.fp8Dot(xt, w.FP8[i*cols:(i+1)*cols])
			}
		}
	}
}
