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
