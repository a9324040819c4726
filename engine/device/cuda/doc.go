// Package cuda is an NVIDIA GPU as an engine device (device.Device), over
// gorgonia.org/cu's driver API: device memory (cuMemAlloc), pinned host
// staging buffers (cuMemHostAlloc, through a small cgo file of its own,
// since gorgonia does not wrap it), non-blocking streams, events whose
// Wait honours its context, and asynchronous host-to-device copies. The
// streaming loader (weightstore/loader) moves checkpoints into it through
// staging exactly as it moves them into the CPU device.
//
// Everything that touches CUDA is built only with -tags cuda; without the
// tag the package holds only what the CPU build and its tests need
// (ErrNoCUDA). A binary built with the tag needs a CUDA driver: on a
// machine without a usable device it stops at start with one line saying
// so, and a test binary reports its tests skipped (see internal/cuinit).
package cuda

import "errors"

// ErrNoCUDA is returned by Open in a binary built without -tags cuda.
var ErrNoCUDA = errors.New("this stoke binary was built without CUDA support: rebuild it with `go build -tags cuda` (needs CUDA's headers: scripts/install-cuda-headers.sh)")
