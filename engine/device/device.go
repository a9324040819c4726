// Package device is the memory an engine computes on and the way weights
// reach it. The interface follows what a GPU needs: device buffers the host
// cannot address, pinned host staging buffers, copies enqueued on streams
// that run asynchronously, and events that tell when they are done. The CPU
// device implements it over aligned host memory; a CUDA device (gorgonia.org/cu:
// MemAlloc, MemAllocHost, MemcpyHtoDAsync, Event.Record) fits the same shape.
package device

import (
	"context"
	"errors"
)

// ErrClosed reports use of a freed buffer, a closed stream or device.
var ErrClosed = errors.New("device: use after close")

// Device allocates device memory and moves host bytes into it.
type Device interface {
	// Name identifies the device ("cpu", "cuda:0").
	Name() string
	// Alloc reserves size bytes of device memory, ready to be written.
	Alloc(ctx context.Context, size int64) (Buffer, error)
	// AllocStaging reserves size bytes of host memory that copies can read
	// from (pinned memory on a GPU).
	AllocStaging(size int) (Staging, error)
	// NewStream returns a queue of copies that run in order, concurrently
	// with the caller and with other streams.
	NewStream() (Stream, error)
}

// Buffer is device memory.
type Buffer interface {
	// Size is the buffer's length in bytes.
	Size() int64
	// Free returns the memory to the device. Freeing twice is harmless.
	Free() error
}

// Staging is host memory that copies to the device read from.
type Staging interface {
	// Bytes is the whole buffer, for the host to fill.
	Bytes() []byte
	// Free returns the memory. Freeing twice is harmless.
	Free() error
}

// Stream runs copies in the order they were enqueued.
type Stream interface {
	// CopyToDevice enqueues a copy of src.Bytes()[:n] into dst at offset
	// off and returns at once. src must not be refilled before an event
	// recorded after this call completes.
	CopyToDevice(dst Buffer, off int64, src Staging, n int) error
	// Record returns an event that completes when every copy enqueued so
	// far has completed, carrying the first copy error.
	Record() (Event, error)
	// Close waits for enqueued copies and releases the stream.
	Close() error
}

// Event marks a point in a stream.
type Event interface {
	// Wait blocks until the event completes or ctx ends, and returns the
	// first error of the copies it covers.
	Wait(ctx context.Context) error
}

// HostMemory is implemented by buffers the host addresses directly, as the
// CPU device's are: the engine computes on Bytes in place, and a loader may
// read into them without staging.
type HostMemory interface {
	// Bytes is the buffer's memory.
	Bytes() []byte
}
