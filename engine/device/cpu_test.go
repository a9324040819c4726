package device

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"unsafe"
)

func TestCPUCopies(t *testing.T) {
	dev := NewCPU()
	ctx := context.Background()
	dst, err := dev.Alloc(ctx, 10000)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	if addr := &dst.(HostMemory).Bytes()[0]; uintptr(unsafe.Pointer(addr))%4096 != 0 {
		t.Fatal("device memory is not page-aligned")
	}
	st, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	stage, err := dev.AllocStaging(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer stage.Free()
	want := make([]byte, 10000)
	for off := 0; off < len(want); off += 4096 {
		n := min(4096, len(want)-off)
		for i := range n {
			stage.Bytes()[i] = byte(off/4096 + i)
			want[off+i] = byte(off/4096 + i)
		}
		if err := st.CopyToDevice(dst, int64(off), stage, n); err != nil {
			t.Fatal(err)
		}
		ev, err := st.Record()
		if err != nil {
			t.Fatal(err)
		}
		if err := ev.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(dst.(HostMemory).Bytes(), want) {
		t.Fatal("device memory differs from what was copied")
	}

	// A copy past the end fails its event, not the process.
	if err := st.CopyToDevice(dst, 9000, stage, 4096); err != nil {
		t.Fatal(err)
	}
	ev, err := st.Record()
	if err != nil {
		t.Fatal(err)
	}
	if err := ev.Wait(ctx); err == nil {
		t.Fatal("a copy past the end of the buffer succeeded")
	}
	if err := st.CopyToDevice(dst, 0, stage, 5000); err == nil {
		t.Fatal("a copy of more bytes than the staging buffer holds was accepted")
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.CopyToDevice(dst, 0, stage, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("copy on a closed stream: %v, want ErrClosed", err)
	}
	if err := dst.Free(); err != nil {
		t.Fatal(err)
	}
	if err := dst.Free(); err != nil {
		t.Fatalf("second free: %v", err)
	}
}

func TestCPUArena(t *testing.T) {
	ctx := context.Background()
	dev, err := NewCPUArena(5 * 4096)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := dev.Alloc(ctx, 5000) // two pages of the arena
	b, _ := dev.Alloc(ctx, 4096) // the third
	big, _ := dev.Alloc(ctx, 3*4096)
	inArena := func(buf Buffer) bool {
		p := uintptr(unsafe.Pointer(&buf.(HostMemory).Bytes()[0]))
		base := uintptr(unsafe.Pointer(&dev.arena[0]))
		return p >= base && p < base+uintptr(len(dev.arena))
	}
	if !inArena(a) || !inArena(b) || inArena(big) {
		t.Fatalf("in arena: a %v b %v big %v; want a and b only", inArena(a), inArena(b), inArena(big))
	}
	if off := uintptr(unsafe.Pointer(&b.(HostMemory).Bytes()[0])) - uintptr(unsafe.Pointer(&dev.arena[0])); off != 8192 {
		t.Fatalf("second buffer at arena offset %d, want page-aligned 8192", off)
	}
	a.(HostMemory).Bytes()[4999] = 7
	if err := dev.Close(); err == nil {
		t.Fatal("closed the arena under live buffers")
	}
	for _, buf := range []Buffer{a, b, big, a} {
		if err := buf.Free(); err != nil {
			t.Fatal(err)
		}
	}
	// Every arena buffer is back: the arena starts over.
	c, _ := dev.Alloc(ctx, 5*4096)
	if !inArena(c) || c.(HostMemory).Bytes()[4999] != 7 {
		t.Fatal("the arena was not reused from its start")
	}
	c.Free()
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
}
