package device

import (
	"context"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// CPU is the host as a device: buffers are anonymous memory mappings,
// page-aligned (so every tensor offset a safetensors file aligns keeps its
// vector alignment) and pre-faulted at allocation so that loading pays no
// page faults. Streams copy on their own goroutine.
type CPU struct{}

// NewCPU returns the CPU device.
func NewCPU() *CPU { return &CPU{} }

// Name implements Device.
func (*CPU) Name() string { return "cpu" }

// Alloc implements Device with a populated anonymous mapping.
func (*CPU) Alloc(ctx context.Context, size int64) (Buffer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	mem, err := mapAnon(size)
	if err != nil {
		return nil, fmt.Errorf("alloc %d bytes on cpu: %w", size, err)
	}
	return &hostBuffer{mem: mem}, nil
}

// AllocStaging implements Device; host memory needs no pinning here.
func (*CPU) AllocStaging(size int) (Staging, error) {
	mem, err := mapAnon(int64(size))
	if err != nil {
		return nil, fmt.Errorf("alloc %d staging bytes: %w", size, err)
	}
	return &hostBuffer{mem: mem}, nil
}

// NewStream implements Device.
func (*CPU) NewStream() (Stream, error) {
	s := &cpuStream{ops: make(chan cpuOp, 64)}
	s.wg.Add(1)
	go s.run()
	return s, nil
}

func mapAnon(size int64) ([]byte, error) {
	if size < 0 || int64(int(size)) != size {
		return nil, fmt.Errorf("size %d out of range", size)
	}
	if size == 0 {
		return []byte{}, nil
	}
	return unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
}

// hostBuffer is both a CPU device buffer and a staging buffer.
type hostBuffer struct {
	mu  sync.Mutex
	mem []byte
}

func (b *hostBuffer) Size() int64   { return int64(len(b.mem)) }
func (b *hostBuffer) Bytes() []byte { return b.mem }

func (b *hostBuffer) Free() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	mem := b.mem
	b.mem = nil
	if len(mem) == 0 {
		return nil
	}
	if err := unix.Munmap(mem); err != nil {
		return fmt.Errorf("free cpu buffer: %w", err)
	}
	return nil
}

// cpuOp is a copy, or (done != nil) an event marker.
type cpuOp struct {
	dst  *hostBuffer
	off  int64
	src  []byte
	done *cpuEvent
}

type cpuStream struct {
	ops    chan cpuOp
	wg     sync.WaitGroup
	mu     sync.Mutex
	closed bool
}

func (s *cpuStream) run() {
	defer s.wg.Done()
	var err error
	for op := range s.ops {
		if op.done != nil {
			op.done.err = err
			close(op.done.ch)
			continue
		}
		if err == nil {
			if op.off < 0 || op.off+int64(len(op.src)) > int64(len(op.dst.mem)) {
				err = fmt.Errorf("copy %d bytes at %d: past the end of a %d-byte buffer", len(op.src), op.off, len(op.dst.mem))
				continue
			}
			copy(op.dst.mem[op.off:], op.src)
		}
	}
}

func (s *cpuStream) enqueue(op cpuOp) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.ops <- op
	return nil
}

func (s *cpuStream) CopyToDevice(dst Buffer, off int64, src Staging, n int) error {
	d, ok := dst.(*hostBuffer)
	if !ok {
		return fmt.Errorf("copy to device: %T is not a cpu buffer", dst)
	}
	b := src.Bytes()
	if n < 0 || n > len(b) {
		return fmt.Errorf("copy to device: %d bytes from a %d-byte staging buffer", n, len(b))
	}
	if d.mem == nil && n > 0 {
		return ErrClosed
	}
	return s.enqueue(cpuOp{dst: d, off: off, src: b[:n]})
}

func (s *cpuStream) Record() (Event, error) {
	ev := &cpuEvent{ch: make(chan struct{})}
	if err := s.enqueue(cpuOp{done: ev}); err != nil {
		return nil, err
	}
	return ev, nil
}

func (s *cpuStream) Close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.ops)
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

type cpuEvent struct {
	ch  chan struct{}
	err error
}

func (e *cpuEvent) Wait(ctx context.Context) error {
	select {
	case <-e.ch:
		return e.err
	case <-ctx.Done():
		return ctx.Err()
	}
}
