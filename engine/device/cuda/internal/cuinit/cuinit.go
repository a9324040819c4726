//go:build cuda

// Package cuinit initialises the CUDA driver before gorgonia.org/cu does.
// gorgonia.org/cu calls cuInit in its package init and exits the process
// with status 1 when that fails (no driver, no device), before any test
// can skip. Go initialises packages in import-path order among those
// whose imports are ready, and this package's path sorts before
// gorgonia.org/cu while importing nothing it does not, so its init runs
// first: on failure it ends a test binary with a skip notice and status
// 0, and any other binary with one line naming the cause and status 1.
package cuinit

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>

static int stoke_cuda_probe(int *count) {
	CUresult r = cuInit(0);
	if (r != CUDA_SUCCESS) return (int)r;
	return (int)cuDeviceGetCount(count);
}
*/
import "C"

import (
	"os"
	"strconv"
	"strings"
)

// Devices is the number of CUDA devices cuInit found (set by init).
var Devices int

func init() {
	var count C.int
	if r := C.stoke_cuda_probe(&count); r != 0 || count < 1 {
		why := "cuInit returned CUresult " + strconv.Itoa(int(r))
		if r == 0 {
			why = "the driver reports no device"
		}
		if strings.HasSuffix(os.Args[0], ".test") || os.Getenv("STOKE_CUDA_SKIP_EXIT") == "1" {
			os.Stdout.WriteString("--- SKIP: no usable CUDA device (" + why + "): every test of this cuda-tagged binary skips\nPASS\n")
			os.Exit(0)
		}
		os.Stderr.WriteString("stoke: built with -tags cuda, but no usable CUDA device: " + why + "\n")
		os.Exit(1)
	}
	Devices = int(count)
}
