//go:build cuda

package cuda

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/stokehq/stoke/engine/device"
	// cuinit must initialise before gorgonia.org/cu: see its doc.
	_ "github.com/stokehq/stoke/engine/device/cuda/internal/cuinit"
)

// Available reports whether this binary can drive a CUDA device: with
// -tags cuda, always (a binary without a usable device does not start).
func Available() bool { return true }

// Options tune a Device.
type Options struct {
	// Pageable makes AllocStaging hand out ordinary (pageable) host
	// memory instead of pinned memory, as a baseline: copies from it are
	// staged again by the driver and run at a fraction of the link speed.
	Pageable bool
}

// Device is one CUDA device, driven through its primary context. Every
// method may be called from any goroutine: each call makes the context
// current on its (locked) OS thread.
type Device struct {
	ordinal int
	dev     cu.Device
	ctx     cu.CUContext
	name    string
	opts    Options

	mu     sync.Mutex
	closed bool
}

// Open retains device ordinal's primary context.
func Open(ordinal int, opts Options) (*Device, error) {
	n, err := cu.NumDevices()
	if err != nil {
		return nil, fmt.Errorf("count cuda devices: %w", err)
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("open cuda:%d: this machine has %d cuda devices", ordinal, n)
	}
	dev, err := cu.GetDevice(ordinal)
	if err != nil {
		return nil, fmt.Errorf("open cuda:%d: %w", ordinal, err)
	}
	ctx, err := dev.RetainPrimaryCtx()
	if err != nil {
		return nil, fmt.Errorf("open cuda:%d: retain its primary context: %w", ordinal, err)
	}
	d := &Device{ordinal: ordinal, dev: dev, ctx: ctx, name: fmt.Sprintf("cuda:%d", ordinal), opts: opts}
	return d, nil
}

// Do runs f on a locked OS thread with the device's context current, as
// every driver call needs; the GPU model runs its steps through it.
func (d *Device) Do(f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cu.SetCurrentContext(d.ctx); err != nil {
		return fmt.Errorf("make the %s context current: %w", d.name, err)
	}
	return f()
}

// Name implements device.Device.
func (d *Device) Name() string { return d.name }

// Ordinal is the device's index among the machine's CUDA devices.
func (d *Device) Ordinal() int { return d.ordinal }

// Model is the device's product name ("NVIDIA H200").
func (d *Device) Model() string {
	s, err := d.dev.Name()
	if err != nil {
		return "unknown"
	}
	return s
}

// MemInfo returns the device's free and total memory in bytes.
func (d *Device) MemInfo() (free, total int64, err error) {
	err = d.Do(func() error {
		var err error
		free, total, err = cu.MemInfo()
		return err
	})
	return free, total, err
}

// Attribute reads a device attribute (compute capability, SM count, …).
func (d *Device) Attribute(a cu.DeviceAttribute) (int, error) {
	return d.dev.Attribute(a)
}

// Close releases the primary context; buffers must be freed first.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	if err := d.dev.ReleasePrimaryCtx(); err != nil {
		return fmt.Errorf("close %s: %w", d.name, err)
	}
	return nil
}

// Buffer is device memory.
type Buffer struct {
	d    *Device
	mu   sync.Mutex
	ptr  cu.DevicePtr
	size int64
}

// Alloc implements device.Device with cuMemAlloc.
func (d *Device) Alloc(ctx context.Context, size int64) (device.Buffer, error) {
	return d.AllocBuffer(ctx, size)
}

// AllocBuffer is Alloc returning the concrete type.
func (d *Device) AllocBuffer(ctx context.Context, size int64) (*Buffer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if size < 0 {
		return nil, fmt.Errorf("alloc %d bytes on %s: negative size", size, d.name)
	}
	b := &Buffer{d: d, size: size}
	if size == 0 {
		return b, nil
	}
	err := d.Do(func() error {
		var err error
		b.ptr, err = cu.MemAlloc(size)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("alloc %d bytes on %s: %w", size, d.name, err)
	}
	return b, nil
}

// Size implements device.Buffer.
func (b *Buffer) Size() int64 { return b.size }

// Ptr is the buffer's device address (0 once freed or when empty).
func (b *Buffer) Ptr() cu.DevicePtr {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ptr
}

// DeviceAddr is Ptr as a plain address, for kernel arguments.
func (b *Buffer) DeviceAddr() uint64 { return uint64(b.Ptr()) }

// Device is the device the buffer lives on.
func (b *Buffer) Device() *Device { return b.d }

// Free implements device.Buffer.
func (b *Buffer) Free() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ptr == 0 {
		return nil
	}
	ptr := b.ptr
	b.ptr = 0
	return b.d.Do(func() error {
		if err := cu.MemFree(ptr); err != nil {
			return fmt.Errorf("free %d bytes on %s: %w", b.size, b.d.name, err)
		}
		return nil
	})
}

// CopyIn copies src into the buffer at off, synchronously.
func (b *Buffer) CopyIn(off int64, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	ptr := b.Ptr()
	if err := checkRange(ptr, off, int64(len(src)), b.size); err != nil {
		return fmt.Errorf("copy to %s: %w", b.d.name, err)
	}
	return b.d.Do(func() error {
		return cu.MemcpyHtoD(ptr+cu.DevicePtr(off), unsafe.Pointer(&src[0]), int64(len(src)))
	})
}

// CopyOut copies len(dst) bytes at off out of the buffer, synchronously.
func (b *Buffer) CopyOut(dst []byte, off int64) error {
	if len(dst) == 0 {
		return nil
	}
	ptr := b.Ptr()
	if err := checkRange(ptr, off, int64(len(dst)), b.size); err != nil {
		return fmt.Errorf("copy from %s: %w", b.d.name, err)
	}
	return b.d.Do(func() error {
		return cu.MemcpyDtoH(unsafe.Pointer(&dst[0]), ptr+cu.DevicePtr(off), int64(len(dst)))
	})
}

func checkRange(ptr cu.DevicePtr, off, n, size int64) error {
	switch {
	case ptr == 0:
		return device.ErrClosed
	case off < 0 || n < 0 || off+n > size:
		return fmt.Errorf("%d bytes at %d: past the end of a %d-byte buffer", n, off, size)
	}
	return nil
}

// Staging is pinned (or, with Options.Pageable, ordinary) host memory.
type Staging struct {
	d      *Device
	mu     sync.Mutex
	mem    []byte
	pinned bool
}

// AllocStaging implements device.Device: page-locked memory from
// cuMemHostAlloc, which the copy engines read by DMA.
func (d *Device) AllocStaging(size int) (device.Staging, error) {
	if size < 0 {
		return nil, fmt.Errorf("alloc %d staging bytes: negative size", size)
	}
	if d.opts.Pageable {
		return &Staging{d: d, mem: make([]byte, size)}, nil
	}
	var mem []byte
	err := d.Do(func() error {
		var err error
		mem, err = hostAlloc(size)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("alloc %d pinned staging bytes for %s: %w", size, d.name, err)
	}
	return &Staging{d: d, mem: mem, pinned: true}, nil
}

// Bytes implements device.Staging.
func (s *Staging) Bytes() []byte { return s.mem }

// Free implements device.Staging.
func (s *Staging) Free() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	mem := s.mem
	s.mem = nil
	if !s.pinned || mem == nil {
		return nil
	}
	return s.d.Do(func() error { return hostFree(mem) })
}

// Stream is a non-blocking CUDA stream of copies.
type Stream struct {
	d      *Device
	mu     sync.Mutex
	s      cu.Stream
	closed bool
}

// NewStream implements device.Device.
func (d *Device) NewStream() (device.Stream, error) {
	st := &Stream{d: d}
	err := d.Do(func() error {
		var err error
		st.s, err = cu.MakeStream(cu.NonBlocking)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create a stream on %s: %w", d.name, err)
	}
	return st, nil
}

// CopyToDevice implements device.Stream with cuMemcpyHtoDAsync.
func (s *Stream) CopyToDevice(dst device.Buffer, off int64, src device.Staging, n int) error {
	b, ok := dst.(*Buffer)
	if !ok {
		return fmt.Errorf("copy to %s: %T is not a cuda buffer", s.d.name, dst)
	}
	mem := src.Bytes()
	if n < 0 || n > len(mem) {
		return fmt.Errorf("copy to %s: %d bytes from a %d-byte staging buffer", s.d.name, n, len(mem))
	}
	if n == 0 {
		return nil
	}
	ptr := b.Ptr()
	if err := checkRange(ptr, off, int64(n), b.size); err != nil {
		return fmt.Errorf("copy to %s: %w", s.d.name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return device.ErrClosed
	}
	return s.d.Do(func() error {
		if err := cu.MemcpyHtoDAsync(ptr+cu.DevicePtr(off), unsafe.Pointer(&mem[0]), int64(n), s.s); err != nil {
			return fmt.Errorf("cuMemcpyHtoDAsync %d bytes: %w", n, err)
		}
		return nil
	})
}

// Record implements device.Stream.
func (s *Stream) Record() (device.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, device.ErrClosed
	}
	ev := &Event{d: s.d}
	err := s.d.Do(func() error {
		var err error
		if ev.ev, err = cu.MakeEvent(cu.DisableTiming); err != nil {
			return err
		}
		return ev.ev.Record(s.s)
	})
	if err != nil {
		return nil, fmt.Errorf("record an event on %s: %w", s.d.name, err)
	}
	return ev, nil
}

// Close implements device.Stream: it waits for the stream's copies.
func (s *Stream) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.d.Do(func() error {
		err := s.s.Synchronize()
		return errors.Join(err, s.s.Destroy())
	})
}

// Event is a point in a stream.
type Event struct {
	d    *Device
	mu   sync.Mutex
	ev   cu.Event
	done bool
	err  error
}

// pollBackoff bounds how long Wait sleeps between two queries.
const pollBackoff = 200 * time.Microsecond

// Wait implements device.Event: it polls the event (cuEventQuery), so
// that it returns as soon as ctx ends, sleeping a little longer after
// each query that finds the copies still running.
func (e *Event) Wait(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.done {
		return e.err
	}
	sleep := 2 * time.Microsecond
	for {
		var ready bool
		err := e.d.Do(func() error {
			err := e.ev.Query()
			if errors.Is(err, cu.NotReady) {
				return nil
			}
			ready = true
			if err != nil {
				return err
			}
			return nil
		})
		if ready || err != nil {
			e.done, e.err = true, err
			e.d.Do(func() error { return cu.DestroyEvent(&e.ev) })
			if err != nil {
				e.err = fmt.Errorf("copies on %s: %w", e.d.name, err)
			}
			return e.err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(sleep):
		}
		sleep = min(2*sleep, pollBackoff)
	}
}
