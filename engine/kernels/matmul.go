package kernels

import (
	"fmt"

	"github.com/stokehq/stoke/internal/dtype"
)

// Tuning constants, chosen with BenchmarkMatMul on a Zen 4 core.
const (
	// rowGrain is the row alignment of each thread's share of W when
	// there are enough rows: a multiple of the usual 128-row FP8 block,
	// so that no thread splits a block.
	rowGrain = 128
	// minParallelMACs is the least work (multiply-adds) worth handing to
	// another thread; below it, waking a worker costs more than it saves.
	minParallelMACs = 1 << 16
	// xBlockBytes bounds the block of x rows kept in L2 while a thread
	// streams its share of W past it; W is read from memory once per
	// block. Columns are never split into blocks: that would make the
	// order an output is summed in depend on the batch size.
	xBlockBytes = 512 << 10
	// gemmChunkBytes bounds the W rows that the small-batch kernels
	// multiply by each group of four x rows in turn: the first group
	// streams them from memory, the others find them in cache.
	gemmChunkBytes = 32 << 10
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
	c := &mmCall{p: p, ks: p.Kernels(), out: out, x: x, n: n, w: w}
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
	ks  *Set
	out []float32
	x   []float32
	n   int
	w   *Matrix
}

// rows computes the outputs of W rows [lo, hi) for every x row.
func (c *mmCall) rows(lo, hi int) {
	if c.w.DType == dtype.F32 {
		c.f32(lo, hi)
		return
	}
	c.quantized(lo, hi)
}

// f32 runs the F32 kernels: GEMV for one x row, the small-batch kernels
// for a few, else register-blocked tiles over blocks of x rows.
func (c *mmCall) f32(lo, hi int) {
	ks, x, out, n := c.ks, c.x, c.out, c.n
	rows, cols := c.w.Rows, c.w.Cols
	w := c.w.F32
	if n == 1 && ks.f32Gemv != nil {
		ks.f32Gemv(x, w[lo*cols:], cols, cols, hi-lo, out[lo:hi])
		return
	}
	if n <= ks.gemmMax.f32 && n*cols*4 <= xBlockBytes && ks.f32Gemm != nil {
		smallBatch(ks.f32Gemm, x, n, w, 4, rows, cols, lo, hi, out)
		return
	}
	if g := wGroupRows(ks, cols); g > 0 {
		for i := lo; i < hi; i += g {
			tiles(ks.f32Dot4x4, ks.f32Dot1x4, ks.f32TileRun, x, 0, n, w, rows, cols, i, min(hi, i+g), out)
		}
		return
	}
	xb := max(4, xBlockBytes/(4*cols)&^3)
	for t0 := 0; t0 < n; t0 += xb {
		t1 := min(n, t0+xb)
		tiles(ks.f32Dot4x4, ks.f32Dot1x4, ks.f32TileRun, x, t0, t1, w, rows, cols, lo, hi, out)
	}
}

// tiles stores the products of x rows [t0, t1) with W rows [lo, hi)
// through 4x4 tiles, 1x4 tiles for the x rows past the last quad of them,
// and for the W rows past the last quad, 1x4 tiles of one row repeated
// (stride 0): every output is summed as the quads' are. A set's own
// tiling (run), where it has one, does all of it instead.
func tiles[T any](dot4x4 func(x []float32, xs int, w []T, ws, k int, out []float32, os int),
	dot1x4 func(x []float32, w []T, ws, k int, out []float32),
	run func(x []float32, xs, nx int, w []T, ws, k, nw int, out []float32, os int),
	x []float32, t0, t1 int, w []T, rows, cols, lo, hi int, out []float32) {
	if run != nil {
		run(x[t0*cols:], cols, t1-t0, w[lo*cols:], cols, cols, hi-lo, out[t0*rows+lo:], rows)
		return
	}
	i := lo
	for ; i+4 <= hi; i += 4 {
		wt := w[i*cols:]
		t := t0
		for ; t+4 <= t1; t += 4 {
			dot4x4(x[t*cols:], cols, wt, cols, cols, out[t*rows+i:], rows)
		}
		for ; t < t1; t++ {
			dot1x4(x[t*cols:], wt, cols, cols, out[t*rows+i:])
		}
	}
	for ; i < hi; i++ {
		for t := t0; t < t1; t++ {
			var one [4]float32
			dot1x4(x[t*cols:], w[i*cols:], 0, cols, one[:])
			out[t*rows+i] = one[0]
		}
	}
}

// quantized computes BF16 and FP8 products: small batches with kernels
// that decode W in registers as they stream it, large ones through tiles
// (for the sets with widenTiles, F32 tiles over W widened widenRows rows
// at a time). FP8 scales multiply the outputs, or for block scales a scaled
// copy of x. The x rows are taken xBlockBytes at a time.
func (c *mmCall) quantized(lo, hi int) {
	ks, w := c.ks, c.w
	cols := w.Cols
	xb := max(4, xBlockBytes/(4*cols)&^3)
	if wGroupRows(ks, cols) > 0 {
		xb = c.n
	}
	var scratch *[]float32
	defer func() {
		if scratch != nil {
			c.p.putScratch(scratch)
		}
	}()
	xs := func() []float32 {
		if scratch == nil {
			scratch = c.p.getScratch(min(c.n, xb) * cols)
		}
		return *scratch
	}
	for t0 := 0; t0 < c.n; t0 += xb {
		t1 := min(c.n, t0+xb)
		switch {
		case w.DType == dtype.BF16:
			c.decode(c.x[t0*cols:], t0, t1, lo, hi)
		case w.BlockRows == 0:
			c.decode(c.x[t0*cols:t1*cols], t0, t1, lo, hi)
			for t := t0; t < t1; t++ {
				o := c.out[t*w.Rows:]
				for i := lo; i < hi; i++ {
					o[i] *= fp8Unit * w.scaleAt(i, 0)
				}
			}
		default:
			// Block scales: for each row block, fold the scales of its
			// column blocks (and fp8Unit) into a scaled copy of the x
			// rows, so the FP8 dot products come out scaled.
			for s0 := lo; s0 < hi; {
				s1 := min(hi, (s0/w.BlockRows+1)*w.BlockRows)
				for t := t0; t < t1; t++ {
					xt := xs()[(t-t0)*cols : (t-t0+1)*cols]
					src := c.x[t*cols : (t+1)*cols]
					for j := 0; j < cols; j += w.BlockCols {
						e := min(cols, j+w.BlockCols)
						ks.scaleTo(xt[j:e], src[j:e], fp8Unit*w.scaleAt(s0, j))
					}
				}
				c.decode(xs(), t0, t1, s0, s1)
				s0 = s1
			}
		}
	}
}

// decode stores the unscaled dot products of x rows [t0, t1) with W rows
// [lo, hi) of a BF16 or FP8 matrix; x starts at row t0.
func (c *mmCall) decode(x []float32, t0, t1, lo, hi int) {
	ks, w, n := c.ks, c.w, t1-t0
	rows, cols := w.Rows, w.Cols
	bf := w.DType == dtype.BF16
	out := c.out[t0*rows:]
	if n == 1 && bf && ks.bf16Gemv != nil {
		ks.bf16Gemv(x, w.BF16[lo*cols:], cols, cols, hi-lo, out[lo:hi])
		return
	}
	if n == 1 && !bf && ks.fp8Gemv != nil {
		ks.fp8Gemv(x, w.FP8[lo*cols:], cols, cols, hi-lo, out[lo:hi])
		return
	}
	if n <= ks.gemmMax.bf16 && bf && ks.bf16Gemm != nil {
		smallBatch(ks.bf16Gemm, x, n, w.BF16, 2, rows, cols, lo, hi, out)
		return
	}
	if n <= ks.gemmMax.fp8 && !bf && ks.fp8Gemm != nil {
		smallBatch(ks.fp8Gemm, x, n, w.FP8, 1, rows, cols, lo, hi, out)
		return
	}
	switch {
	case ks.widenTiles:
		c.widenedTiles(x, n, lo, hi, out)
	case bf:
		tiles(ks.bf16Dot4x4, ks.bf16Dot1x4, nil, x, 0, n, w.BF16, rows, cols, lo, hi, out)
	default:
		tiles(ks.fp8Dot4x4, ks.fp8Dot1x4, nil, x, 0, n, w.FP8, rows, cols, lo, hi, out)
	}
}

// widenRows is how many W rows widenedTiles widens at a time: whole
// quads, and whole triples for tilings that take W rows three at a time.
// wGroupBytes bounds the F32 bytes of a group of W rows on the sets with
// xStationary.
const (
	widenRows   = 12
	wGroupBytes = 128 << 10
)

// widenedTiles is the tile path of decode for sets whose F32 tiles beat
// decoding in registers: every widenRows W rows are widened once into F32
// scratch (FP8 at 1/fp8Unit of its value, as the FP8 kernels decode it)
// and multiplied by every x row through the F32 tiles. Widening is exact, so
// the products are the same bits as the set's BF16 and FP8 kernels give.
func (c *mmCall) widenedTiles(x []float32, n, lo, hi int, out []float32) {
	ks, w := c.ks, c.w
	rows, cols := w.Rows, w.Cols
	group := widenRows
	if g := wGroupRows(ks, cols); g > 0 {
		group = g
	}
	b := c.p.getScratch(group * cols)
	defer c.p.putScratch(b)
	wide := *b
	for i := lo; i < hi; i += group {
		nr := min(group, hi-i)
		for r := range nr {
			row := (i + r) * cols
			if w.DType == dtype.BF16 {
				ks.bf16ToF32(wide[r*cols:(r+1)*cols], w.BF16[row:row+cols])
			} else {
				ks.fp8ToF32(wide[r*cols:(r+1)*cols], w.FP8[row:row+cols], 1)
			}
		}
		tiles(ks.f32Dot4x4, ks.f32Dot1x4, ks.f32TileRun, x, 0, n, wide, rows, cols, 0, nr, out[i:])
	}
}

// wGroupRows is how many W rows of cols columns a product on ks takes at
// a time against every x row: the most whole multiples of widenRows that
// fit in wGroupBytes as F32. It is 0 for sets without xStationary, and
// for rows too long for one multiple to fit, which are taken as on
// other sets.
func wGroupRows(ks *Set, cols int) int {
	if !ks.xStationary {
		return 0
	}
	return wGroupBytes / (4 * cols) / widenRows * widenRows
}

// smallBatch stores the products of x rows [0, n) with W rows [lo, hi)
// (size bytes a weight) through a small-batch kernel: W is taken
// gemmChunkBytes at a time, and each chunk is multiplied by every group of
// four x rows (all of W at once for one or two x rows).
func smallBatch[T any](gemm func(x []float32, xs, nx int, w []T, ws, k, rows int, out []float32, os int),
	x []float32, n int, w []T, size, rows, cols, lo, hi int, out []float32) {
	chunk := max(4, gemmChunkBytes/(cols*size)&^3)
	if n <= 2 {
		// No chunk would be read twice, and all of W at once lets the F32
		// and BF16 kernels take rows spread apart (see gemvRows); with
		// three or four x rows that measured slower.
		chunk = hi - lo
	}
	for r0 := lo; r0 < hi; r0 += chunk {
		r1 := min(hi, r0+chunk)
		for t := 0; t < n; t += 4 {
			gemm(x[t*cols:], cols, min(4, n-t), w[r0*cols:], cols, cols, r1-r0, out[t*rows+r0:], rows)
		}
	}
}

// DequantizeRow writes the dequantised row i of m (W[i][0..Cols)) into
// dst[:Cols], for embedding lookups and the like.
func (m *Matrix) DequantizeRow(dst []float32, i int) error {
	if err := m.Validate(); err != nil {
		return fmt.Errorf("dequantize row %d: %w", i, err)
	}
	if i < 0 || i >= m.Rows {
		return fmt.Errorf("dequantize row %d of %dx%d matrix: row out of range", i, m.Rows, m.Cols)
	}
	if len(dst) < m.Cols {
		return fmt.Errorf("dequantize row %d of %dx%d matrix: dst has %d elements, want %d", i, m.Rows, m.Cols, len(dst), m.Cols)
	}
	cols := m.Cols
	dst = dst[:cols]
	row := i * cols
	switch {
	case m.DType == dtype.F32:
		copy(dst, m.F32[row:row+cols])
	case m.DType == dtype.BF16:
		fastest.bf16ToF32(dst, m.BF16[row:row+cols])
	case m.BlockRows == 0:
		fastest.fp8ToF32(dst, m.FP8[row:row+cols], fp8Unit*m.scaleAt(i, 0))
	default:
		for j := 0; j < cols; j += m.BlockCols {
			e := min(cols, j+m.BlockCols)
			fastest.fp8ToF32(dst[j:e], m.FP8[row+j:row+e], fp8Unit*m.scaleAt(i, j))
		}
	}
	return nil
}
