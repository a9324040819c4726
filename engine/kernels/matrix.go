package kernels

import (
	"errors"
	"fmt"
	"math"

	"github.com/stokehq/stoke/internal/dtype"
)

// Matrix is a weight matrix W[Rows][Cols], row-major as in a Hugging Face
// Linear layer ([out, in]), holding F32, BF16 or FP8 E4M3FN weights. Only the
// slice that matches DType is read.
//
// FP8 weights are dequantised as W[i][j] = E4M3ToF32(FP8[i*Cols+j]) * s,
// where s comes from Scales: one scale for the whole tensor (len 1), one per
// row (len Rows), or, when BlockRows and BlockCols are set, one per block of
// BlockRows x BlockCols weights (len ceil(Rows/BlockRows)*ceil(Cols/BlockCols),
// row-major over blocks), as in Hugging Face fine-grained FP8 checkpoints
// whose blocks are typically 128x128.
//
// The E4M3FN NaN codes 0x7F and 0xFF never occur in quantised weights; the
// optimised kernels decode them as the finite value ±480 rather than NaN.
type Matrix struct {
	Rows, Cols int
	DType      dtype.DType
	F32        []float32
	BF16       []uint16
	FP8        []uint8
	Scales     []float32
	BlockRows  int
	BlockCols  int
}

// Validate reports whether m is a matrix the kernels can multiply: a
// supported dtype, positive dimensions, a weight slice long enough for
// Rows*Cols elements and, for FP8, a consistent set of scales.
func (m *Matrix) Validate() error {
	if m == nil {
		return errors.New("validate matrix: matrix is nil")
	}
	if m.Rows < 1 || m.Cols < 1 {
		return fmt.Errorf("validate %dx%d matrix: Rows and Cols must be positive", m.Rows, m.Cols)
	}
	if m.Rows > math.MaxInt32 || m.Cols > math.MaxInt32 || m.Rows > math.MaxInt/m.Cols {
		return fmt.Errorf("validate %dx%d matrix: too many elements", m.Rows, m.Cols)
	}
	size := m.Rows * m.Cols
	short := func(field string, have int) error {
		return fmt.Errorf("validate %dx%d %s matrix: %s has %d elements, want at least %d",
			m.Rows, m.Cols, m.DType, field, have, size)
	}
	switch m.DType {
	case dtype.F32:
		if len(m.F32) < size {
			return short("F32", len(m.F32))
		}
	case dtype.BF16:
		if len(m.BF16) < size {
			return short("BF16", len(m.BF16))
		}
	case dtype.F8E4M3:
		if len(m.FP8) < size {
			return short("FP8", len(m.FP8))
		}
		return m.validateScales()
	default:
		return fmt.Errorf("validate %dx%d matrix: DType %s is not supported (want F32, BF16 or F8_E4M3)",
			m.Rows, m.Cols, m.DType)
	}
	return nil
}

func (m *Matrix) validateScales() error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("validate %dx%d %s matrix: %s", m.Rows, m.Cols, m.DType, fmt.Sprintf(format, args...))
	}
	if m.BlockRows < 0 || m.BlockCols < 0 {
		return fail("BlockRows %d and BlockCols %d must not be negative", m.BlockRows, m.BlockCols)
	}
	if (m.BlockRows > 0) != (m.BlockCols > 0) {
		return fail("BlockRows %d and BlockCols %d must be set together", m.BlockRows, m.BlockCols)
	}
	if m.BlockRows > 0 {
		want := ceilDiv(m.Rows, m.BlockRows) * ceilDiv(m.Cols, m.BlockCols)
		if len(m.Scales) != want {
			return fail("Scales has %d elements, want %d for %dx%d blocks",
				len(m.Scales), want, m.BlockRows, m.BlockCols)
		}
		return nil
	}
	if len(m.Scales) != 1 && len(m.Scales) != m.Rows {
		return fail("Scales has %d elements, want 1 (per tensor) or %d (per row)", len(m.Scales), m.Rows)
	}
	return nil
}

// At returns the dequantised weight W[i][j]. It is meant for tests and
// reference code, not for hot loops.
func (m *Matrix) At(i, j int) float32 {
	k := i*m.Cols + j
	switch m.DType {
	case dtype.F32:
		return m.F32[k]
	case dtype.BF16:
		return dtype.BF16ToF32(m.BF16[k])
	case dtype.F8E4M3:
		return dtype.E4M3ToF32(m.FP8[k]) * m.scaleAt(i, j)
	}
	return 0
}

// WeightBytes is the number of bytes of weights one product with m streams
// (scales excluded), for reporting achieved memory bandwidth.
func (m *Matrix) WeightBytes() int64 {
	return int64(m.Rows) * int64(m.Cols) * int64(m.DType.Size())
}

// scaleAt returns the FP8 scale that applies to W[i][j].
func (m *Matrix) scaleAt(i, j int) float32 {
	switch {
	case m.BlockRows > 0:
		return m.Scales[(i/m.BlockRows)*ceilDiv(m.Cols, m.BlockCols)+j/m.BlockCols]
	case len(m.Scales) == 1:
		return m.Scales[0]
	default:
		return m.Scales[i]
	}
}

// CheckMatMul reports whether out = x·Wᵀ with n rows of x is well formed:
// w is valid, n is not negative, x holds n*Cols and out n*Rows elements.
// MatMul and MatMulNaive panic with this error, since running on such
// arguments would read or write out of bounds; callers that take shapes
// from untrusted input call it first.
func CheckMatMul(out, x []float32, n int, w *Matrix) error {
	if err := w.Validate(); err != nil {
		return fmt.Errorf("matmul: %w", err)
	}
	if n < 0 {
		return fmt.Errorf("matmul with %dx%d matrix: n = %d is negative", w.Rows, w.Cols, n)
	}
	if n > math.MaxInt/w.Cols || n > math.MaxInt/w.Rows {
		return fmt.Errorf("matmul with %dx%d matrix: n = %d is too large", w.Rows, w.Cols, n)
	}
	if len(x) < n*w.Cols {
		return fmt.Errorf("matmul with %dx%d matrix: x has %d elements, want %d (n=%d x Cols)",
			w.Rows, w.Cols, len(x), n*w.Cols, n)
	}
	if len(out) < n*w.Rows {
		return fmt.Errorf("matmul with %dx%d matrix: out has %d elements, want %d (n=%d x Rows)",
			w.Rows, w.Cols, len(out), n*w.Rows, n)
	}
	return nil
}

// MatMulNaive computes the same product as [Pool.MatMul] with the
// straightforward triple loop, dequantising every weight as it goes. It is
// the reference for tests and the baseline for benchmarks.
func MatMulNaive(out, x []float32, n int, w *Matrix) {
	if err := CheckMatMul(out, x, n, w); err != nil {
		panic("kernels: " + err.Error())
	}
	rows, cols := w.Rows, w.Cols
	for t := 0; t < n; t++ {
		xt := x[t*cols : (t+1)*cols]
		for i := 0; i < rows; i++ {
			var s float32
			switch w.DType {
			case dtype.F32:
				wi := w.F32[i*cols : (i+1)*cols]
				for j, v := range xt {
					s += v * wi[j]
				}
			case dtype.BF16:
				wi := w.BF16[i*cols : (i+1)*cols]
				for j, v := range xt {
					s += v * dtype.BF16ToF32(wi[j])
				}
			case dtype.F8E4M3:
				wi := w.FP8[i*cols : (i+1)*cols]
				for j, v := range xt {
					s += v * (dtype.E4M3ToF32(wi[j]) * w.scaleAt(i, j))
				}
			}
			out[t*rows+i] = s
		}
	}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
