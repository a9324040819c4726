//go:build cuda

package cuda

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stokehq/stoke/engine/device"
	"github.com/stokehq/stoke/weightstore/loader"
)

func open(t testing.TB, opts Options) *Device {
	t.Helper()
	d, err := Open(0, opts)
	if err != nil {
		t.Skipf("no usable CUDA device: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestDeviceCopies checks buffers, staging, streams and events: bytes
// copied in through staging come back out; a cancelled context ends Wait;
// copies past a buffer's end and use after free are refused.
func TestDeviceCopies(t *testing.T) {
	d := open(t, Options{})
	ctx := context.Background()
	buf, err := d.Alloc(ctx, 3<<20)
	if err != nil {
		t.Fatal(err)
	}
	st, err := d.AllocStaging(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Free()
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 3<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	for off := 0; off < len(want); off += 1 << 20 {
		copy(st.Bytes(), want[off:])
		if err := s.CopyToDevice(buf, int64(off), st, 1<<20); err != nil {
			t.Fatal(err)
		}
		ev, err := s.Record()
		if err != nil {
			t.Fatal(err)
		}
		if err := ev.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]byte, len(want))
	if err := buf.(*Buffer).CopyOut(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("bytes read back differ from those copied in")
	}
	if err := s.CopyToDevice(buf, 3<<20-10, st, 11); err == nil {
		t.Error("a copy past the buffer's end was accepted")
	}
	ev, err := s.Record()
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := ev.Wait(cancelled); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("wait with a cancelled context: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyToDevice(buf, 0, st, 1); !errors.Is(err, device.ErrClosed) {
		t.Errorf("copy on a closed stream: %v", err)
	}
	buf.Free()
	if err := buf.Free(); err != nil {
		t.Errorf("second free: %v", err)
	}
}

// h2d measures host-to-device copies from staging buffers of chunk bytes
// into a device buffer, over streams streams, as the loader issues them.
func h2d(t *testing.T, d *Device, total int64, chunk, streams int) float64 {
	ctx := context.Background()
	dst, err := d.AllocBuffer(ctx, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	type lane struct {
		s  device.Stream
		st [2]device.Staging
		ev [2]device.Event
	}
	lanes := make([]lane, streams)
	for i := range lanes {
		if lanes[i].s, err = d.NewStream(); err != nil {
			t.Fatal(err)
		}
		for j := range 2 {
			if lanes[i].st[j], err = d.AllocStaging(chunk); err != nil {
				t.Fatal(err)
			}
			defer lanes[i].st[j].Free()
		}
	}
	start := time.Now()
	var moved int64
	for k := 0; moved < total; k++ {
		l := &lanes[k%streams]
		j := (k / streams) % 2
		if l.ev[j] != nil {
			if err := l.ev[j].Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		off := moved % (1 << 30)
		if err := l.s.CopyToDevice(dst, off-off%int64(chunk), l.st[j], chunk); err != nil {
			t.Fatal(err)
		}
		if l.ev[j], err = l.s.Record(); err != nil {
			t.Fatal(err)
		}
		moved += int64(chunk)
	}
	for i := range lanes {
		for _, ev := range lanes[i].ev {
			if ev != nil {
				if err := ev.Wait(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		lanes[i].s.Close()
	}
	return float64(moved) / time.Since(start).Seconds() / 1e9
}

// TestH2DBandwidth reports host-to-device bandwidth from pinned staging
// (the loader's path) and from pageable memory, in 4 MiB chunks over 8
// streams (the loader's defaults) and in 64 MiB chunks over 2.
func TestH2DBandwidth(t *testing.T) {
	pinned := open(t, Options{})
	pageable, err := Open(0, Options{Pageable: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pageable.Close()
	total := int64(8 << 30)
	if testing.Short() {
		total = 1 << 30
	}
	for _, c := range []struct{ chunk, streams int }{{4 << 20, 8}, {64 << 20, 2}} {
		p := h2d(t, pinned, total, c.chunk, c.streams)
		q := h2d(t, pageable, total/4, c.chunk, c.streams)
		t.Logf("GPUCHECK h2d chunk=%dMiB streams=%d pinned_GBps=%.2f pageable_GBps=%.2f", c.chunk>>20, c.streams, p, q)
	}
}

// TestLoaderStreamsIntoDevice streams files through the weight loader
// into device memory (staging, copies on streams, events) and checks the
// device holds their bytes.
func TestLoaderStreamsIntoDevice(t *testing.T) {
	d := open(t, Options{})
	ctx := context.Background()
	dir := t.TempDir()
	var files []loader.File
	var want [][]byte
	for i, size := range []int{0, 1, 5<<20 + 3, 17 << 20} {
		b := make([]byte, size)
		rng := rand.New(rand.NewPCG(uint64(i), 9))
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		path := filepath.Join(dir, strconv.Itoa(i))
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		buf, err := d.Alloc(ctx, int64(size))
		if err != nil {
			t.Fatal(err)
		}
		defer buf.Free()
		sum := sha256.Sum256(b)
		files = append(files, loader.File{Name: path, Size: int64(size), SHA256: hex.EncodeToString(sum[:]), Verify: true, Src: loader.LocalFile(f), Dst: buf})
		want = append(want, b)
	}
	if err := loader.Stream(ctx, d, files, loader.Options{ChunkSize: 1 << 20, Parallel: 4}); err != nil {
		t.Fatal(err)
	}
	for i, f := range files {
		got := make([]byte, f.Size)
		if err := f.Dst.(*Buffer).CopyOut(got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want[i]) {
			t.Errorf("file %d: device bytes differ", i)
		}
	}
}
