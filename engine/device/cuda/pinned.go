//go:build cuda

package cuda

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>

static int stoke_host_alloc(void **p, size_t size) {
	return (int)cuMemHostAlloc(p, size, CU_MEMHOSTALLOC_PORTABLE);
}

static int stoke_host_free(void *p) { return (int)cuMemFreeHost(p); }
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// hostAlloc returns size bytes of page-locked host memory, portable across
// contexts, that the GPU's copy engines read at full link speed. The
// caller's thread must have the device's context current.
func hostAlloc(size int) ([]byte, error) {
	if size <= 0 {
		return []byte{}, nil
	}
	var p unsafe.Pointer
	if r := C.stoke_host_alloc(&p, C.size_t(size)); r != 0 {
		return nil, fmt.Errorf("cuMemHostAlloc %d bytes: CUresult %d", size, int(r))
	}
	return unsafe.Slice((*byte)(p), size), nil
}

// hostFree returns memory hostAlloc gave.
func hostFree(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if r := C.stoke_host_free(unsafe.Pointer(&b[0])); r != 0 {
		return fmt.Errorf("cuMemFreeHost: CUresult %d", int(r))
	}
	return nil
}
