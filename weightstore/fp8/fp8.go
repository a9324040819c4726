// Package fp8 quantises float32 weight matrices to float8 E4M3FN the way
// Hugging Face checkpoints store them: fine-grained blocks with a
// "<name>.weight_scale_inv" tensor (weight_block_size=[128,128]), or
// compressed-tensors style per-row and per-tensor "weight_scale".
//
// In every scheme the scale of a group is amax/448, so the largest finite
// magnitude of the group maps to the largest finite E4M3 value, and
// dequantisation multiplies the decoded byte by the scale. The amax ignores
// non-finite values: ±Inf saturate to ±448·scale and NaN stays NaN, so one
// bad weight does not wipe out the rest of its group. A group with no
// non-zero finite value gets scale 1.
package fp8

import (
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/stokehq/stoke/internal/dtype"
)

// parallelMin is the element count below which work stays on one goroutine.
const parallelMin = 1 << 16

// QuantizeBlocks quantises a [rows×cols] row-major matrix in blocks of
// block×block: for each block, scaleInv = amax/448 (1 if the block is all
// zero), q = E4M3(w/scaleInv). scaleInv has shape
// [ceil(rows/block)][ceil(cols/block)] row-major. This is HF's
// `weight_block_size=[128,128]` with tensor `<name>.weight_scale_inv`.
func QuantizeBlocks(w []float32, rows, cols, block int) (q []uint8, scaleInv []float32, err error) {
	if err := checkMatrix(len(w), rows, cols); err != nil {
		return nil, nil, fmt.Errorf("quantize blocks: %w", err)
	}
	if block <= 0 {
		return nil, nil, fmt.Errorf("quantize blocks: block size %d must be positive", block)
	}
	br, bc := ceilDiv(rows, block), ceilDiv(cols, block)
	q = make([]uint8, len(w))
	scaleInv = make([]float32, br*bc)
	parallelFor(br, len(w), func(lo, hi int) {
		for bi := lo; bi < hi; bi++ {
			r0, r1 := bi*block, min((bi+1)*block, rows)
			for bj := range bc {
				c0, c1 := bj*block, min((bj+1)*block, cols)
				var amax uint32
				for r := r0; r < r1; r++ {
					amax = maxAbsBits(w[r*cols+c0:r*cols+c1], amax)
				}
				s := scaleFor(amax)
				for r := r0; r < r1; r++ {
					encode(q[r*cols+c0:r*cols+c1], w[r*cols+c0:r*cols+c1], s)
				}
				scaleInv[bi*bc+bj] = s
			}
		}
	})
	return q, scaleInv, nil
}

// DequantizeBlocks is the reference inverse of QuantizeBlocks:
// W[i][j] = E4M3ToF32(q) * scaleInv[i/block][j/block].
func DequantizeBlocks(q []uint8, scaleInv []float32, rows, cols, block int) ([]float32, error) {
	if err := checkMatrix(len(q), rows, cols); err != nil {
		return nil, fmt.Errorf("dequantize blocks: %w", err)
	}
	if block <= 0 {
		return nil, fmt.Errorf("dequantize blocks: block size %d must be positive", block)
	}
	br, bc := ceilDiv(rows, block), ceilDiv(cols, block)
	if len(scaleInv) != br*bc {
		return nil, fmt.Errorf("dequantize blocks: scale_inv has %d values, [%d×%d] in %d-blocks needs %d×%d", len(scaleInv), rows, cols, block, br, bc)
	}
	table := dtype.E4M3Table()
	out := make([]float32, len(q))
	parallelFor(rows, len(q), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			srow := scaleInv[(r/block)*bc : (r/block+1)*bc]
			qrow, orow := q[r*cols:(r+1)*cols], out[r*cols:(r+1)*cols]
			for j, b := range qrow {
				orow[j] = table[b] * srow[j/block]
			}
		}
	})
	return out, nil
}

// QuantizePerRow quantises a [rows×cols] row-major matrix with one scale per
// row (per output channel): scale[r] = amax(row r)/448, q = E4M3(w/scale).
// This is compressed-tensors' channel strategy; scale is stored as
// `<name>.weight_scale` of shape [rows, 1].
func QuantizePerRow(w []float32, rows, cols int) (q []uint8, scale []float32, err error) {
	if err := checkMatrix(len(w), rows, cols); err != nil {
		return nil, nil, fmt.Errorf("quantize per row: %w", err)
	}
	q = make([]uint8, len(w))
	scale = make([]float32, rows)
	parallelFor(rows, len(w), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			row := w[r*cols : (r+1)*cols]
			s := scaleFor(maxAbsBits(row, 0))
			encode(q[r*cols:(r+1)*cols], row, s)
			scale[r] = s
		}
	})
	return q, scale, nil
}

// QuantizePerTensor quantises w with a single scale = amax/448,
// compressed-tensors' tensor strategy (`<name>.weight_scale`, a scalar).
func QuantizePerTensor(w []float32) (q []uint8, scale float32) {
	const chunk = 1 << 14
	n := ceilDiv(len(w), chunk)
	partial := make([]uint32, n)
	parallelFor(n, len(w), func(lo, hi int) {
		for c := lo; c < hi; c++ {
			partial[c] = maxAbsBits(w[c*chunk:min((c+1)*chunk, len(w))], 0)
		}
	})
	var amax uint32
	for _, a := range partial {
		amax = max(amax, a)
	}
	scale = scaleFor(amax)
	q = make([]uint8, len(w))
	parallelFor(n, len(w), func(lo, hi int) {
		lo, hi = lo*chunk, min(hi*chunk, len(w))
		encode(q[lo:hi], w[lo:hi], scale)
	})
	return q, scale
}

// DequantizeScaled inverts QuantizePerRow (len(scale) == rows) and
// QuantizePerTensor (len(scale) == 1): W[i][j] = E4M3ToF32(q) * scale.
func DequantizeScaled(q []uint8, scale []float32, rows, cols int) ([]float32, error) {
	if err := checkMatrix(len(q), rows, cols); err != nil {
		return nil, fmt.Errorf("dequantize: %w", err)
	}
	if len(scale) != 1 && len(scale) != rows {
		return nil, fmt.Errorf("dequantize: weight_scale has %d values, want 1 (per tensor) or %d (per row)", len(scale), rows)
	}
	table := dtype.E4M3Table()
	out := make([]float32, len(q))
	parallelFor(rows, len(q), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			s := scale[0]
			if len(scale) > 1 {
				s = scale[r]
			}
			orow := out[r*cols : (r+1)*cols]
			for j, b := range q[r*cols : (r+1)*cols] {
				orow[j] = table[b] * s
			}
		}
	})
	return out, nil
}

func checkMatrix(n, rows, cols int) error {
	if rows < 0 || cols < 0 {
		return fmt.Errorf("shape [%d×%d] has a negative dimension", rows, cols)
	}
	if cols != 0 && rows > math.MaxInt/cols {
		return fmt.Errorf("shape [%d×%d] overflows", rows, cols)
	}
	if n != rows*cols {
		return fmt.Errorf("matrix has %d elements, shape [%d×%d] needs %d", n, rows, cols, rows*cols)
	}
	return nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// maxAbsBits folds the largest finite |v| of vs into amax. Both are float32
// bit patterns of non-negative values, which order the same as the values.
func maxAbsBits(vs []float32, amax uint32) uint32 {
	for _, v := range vs {
		a := math.Float32bits(v) & 0x7fffffff
		if a < 0x7f800000 && a > amax {
			amax = a
		}
	}
	return amax
}

// scaleFor is the scale mapping amax (as bits) to 448.
func scaleFor(amaxBits uint32) float32 {
	if amaxBits == 0 {
		return 1
	}
	s := math.Float32frombits(amaxBits) / dtype.E4M3Max
	if s == 0 {
		// amax is a float32 subnormal so small that amax/448 underflows;
		// the smallest positive scale still keeps |w|/s below 448.
		s = math.SmallestNonzeroFloat32
	}
	return s
}

func encode(dst []uint8, src []float32, s float32) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = dtype.F32ToE4M3(v / s)
	}
}

// parallelFor runs fn over [0, n) split into contiguous ranges across
// GOMAXPROCS goroutines, or inline when the work (elems elements) is small.
func parallelFor(n, elems int, fn func(lo, hi int)) {
	workers := min(runtime.GOMAXPROCS(0), n)
	if workers <= 1 || elems < parallelMin {
		fn(0, n)
		return
	}
	var wg sync.WaitGroup
	for k := range workers {
		lo, hi := n*k/workers, n*(k+1)/workers
		wg.Go(func() { fn(lo, hi) })
	}
	wg.Wait()
}
