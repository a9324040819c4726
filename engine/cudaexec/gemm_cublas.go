//go:build cuda && !nocublas

package cudaexec

import (
	"fmt"
	"unsafe"

	"gonum.org/v1/gonum/blas"
	cublas "gorgonia.org/cu/blas"
)

// cublasSGEMM multiplies through cuBLAS (gorgonia.org/cu/blas) on the
// default stream, where the kernels run too.
type cublasSGEMM struct{ impl *cublas.Standard }

// newSGEMM returns cuBLAS's SGEMM (binaries built without -tags nocublas
// link libcublas).
func newSGEMM(m *Model) (sgemmer, error) {
	var impl *cublas.Standard
	err := m.dev.Do(func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("create a cuBLAS handle: %v", r)
			}
		}()
		impl = cublas.New()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &cublasSGEMM{impl: impl}, nil
}

// devFloats is a one-element slice whose data pointer is a device
// address, the form gorgonia's cuBLAS wrappers take; Go never reads it.
func devFloats(addr uint64) []float32 {
	var p unsafe.Pointer
	*(*uintptr)(unsafe.Pointer(&p)) = uintptr(addr)
	return unsafe.Slice((*float32)(p), 1)
}

// sgemm computes, in cuBLAS's column-major terms, C (rows×n, ldc ldy) =
// Wᵀ-as-stored (A: cols×rows, lda cols, transposed) × X (cols×n).
func (c *cublasSGEMM) sgemm(y, x, w uint64, n, rows, cols, ldy int) error {
	c.impl.Sgemm(blas.Trans, blas.NoTrans, rows, n, cols, 1, devFloats(w), cols, devFloats(x), cols, 0, devFloats(y), ldy)
	if err := c.impl.Err(); err != nil {
		return fmt.Errorf("cublasSgemm %dx%dx%d: %w", rows, n, cols, err)
	}
	return nil
}

func (*cublasSGEMM) name() string { return "cublas" }

func (c *cublasSGEMM) close() error { return c.impl.Close() }
