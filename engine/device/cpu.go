package device

import (
	"context"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// CPU is the host as a device: buffers are anonymous memory mappings,
// page-aligned (so every tensor offset a safetensors file aligns keeps its
// vector alignment) and pre-faulted so that loading pays no page faults.
// With an arena (NewCPUArena) buffers are carved from memory faulted in
// once, up front, as a warm runtime's weight arena is; without one, each
// allocation maps and faults its own. Streams copy on their own goroutine.
type CPU struct {
	mu    sync.Mutex
	arena []byte // nil: no arena
	used  int64  // bytes of the arena handed out
	live  int    // arena buffers not yet freed
}

// NewCPU returns the CPU device without an arena.
func NewCPU() *CPU { return &CPU{} }

// NewCPUArena returns the CPU device with a pre-faulted arena of size
// bytes. Allocations are carved from it, page-aligned, and it is reused
// from the start once every buffer carved from it is freed; what does not
// fit is mapped on its own.
func NewCPUArena(size int64) (*CPU, error) {
	mem, err := mapAnon(size)
	if err != nil {
		return nil, fmt.Errorf("map a %d-byte weight arena: %w", size, err)
	}
	return &CPU{arena: mem}, nil
}

// ArenaSize is the arena's size in bytes (0 without one).
func (c *CPU) ArenaSize() int64 { return int64(len(c.arena)) }

// Close unmaps the arena; buffers carved from it must be freed first.
func (c *CPU) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.live > 0 {
		return fmt.Errorf("close cpu device: %d arena buffers still in use", c.live)
	}
	arena := c.arena
	c.arena = nil
	if arena == nil {
		return nil
	}
	return unix.Munmap(arena)
}

// Name implements Device.
func (*CPU) Name() string { return "cpu" }

// Alloc implements Device: from the arena when it has room, else with a
// populated anonymous mapping.
func (c *CPU) Alloc(ctx context.Context, size int64) (Buffer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if b := c.carve(size); b != nil {
		return b, nil
	}
	mem, err := mapAnon(size)
	if err != nil {
		return nil, fmt.Errorf("alloc %d bytes on cpu: %w", size, err)
	}
	return &hostBuffer{mem: mem}, nil
}

const pageSize = 4096

// carve takes size bytes from the arena, or returns nil when it has no room.
func (c *CPU) carve(size int64) *hostBuffer {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.arena == nil || size < 0 || c.used+size > int64(len(c.arena)) {
		return nil
	}
	mem := c.arena[c.used : c.used+size : c.used+size]
	c.used = min(int64(len(c.arena)), (c.used+size+pageSize-1)/pageSize*pageSize)
	c.live++
	return &hostBuffer{mem: mem, release: c.giveBack}
}

// giveBack returns an arena buffer; the last one returned rewinds the arena.
func (c *CPU) giveBack() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.live--
	if c.live == 0 {
		c.used = 0
	}
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

// hostBuffer is both a CPU device buffer and a staging buffer: its own
// mapping, or (release set) a piece of an arena.
type hostBuffer struct {
	mu      sync.Mutex
	mem     []byte
	release func()
}

func (b *hostBuffer) Size() int64   { return int64(len(b.mem)) }
func (b *hostBuffer) Bytes() []byte { return b.mem }

func (b *hostBuffer) Free() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	mem := b.mem
	b.mem = nil
	if b.release != nil {
		if mem != nil {
			b.release()
		}
		return nil
	}
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
