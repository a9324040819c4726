package loader

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/stokehq/stoke/engine/device"
)

// flakySource serves data from memory and fails the first failures reads
// of every range, as a dropped connection would.
type flakySource struct {
	data     []byte
	failures int
	err      error
	mu       sync.Mutex
	seen     map[int64]int
}

func (s *flakySource) ReadAt(ctx context.Context, p []byte, off int64) error {
	s.mu.Lock()
	if s.seen == nil {
		s.seen = map[int64]int{}
	}
	s.seen[off]++
	n := s.seen[off]
	s.mu.Unlock()
	if n <= s.failures {
		if s.err != nil {
			return s.err
		}
		return fmt.Errorf("connection reset (attempt %d)", n)
	}
	copy(p, s.data[off:])
	return nil
}

// gpuLike is a device whose memory the host cannot address, as a GPU's:
// streams copy from staging on their own goroutine, so loads to it take
// the staging path.
type gpuLike struct{ host *device.CPU }

type gpuBuffer struct{ mem []byte }

func (b *gpuBuffer) Size() int64 { return int64(len(b.mem)) }
func (b *gpuBuffer) Free() error { return nil }

func (d gpuLike) Name() string { return "gpu-like" }
func (d gpuLike) Alloc(ctx context.Context, size int64) (device.Buffer, error) {
	return &gpuBuffer{mem: make([]byte, size)}, nil
}
func (d gpuLike) AllocStaging(size int) (device.Staging, error) { return d.host.AllocStaging(size) }
func (d gpuLike) NewStream() (device.Stream, error) {
	s := &gpuStream{ops: make(chan func(), 16)}
	go func() {
		for op := range s.ops {
			op()
		}
	}()
	return s, nil
}

type gpuStream struct{ ops chan func() }

type gpuEvent chan struct{}

func (e gpuEvent) Wait(ctx context.Context) error {
	select {
	case <-e:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *gpuStream) CopyToDevice(dst device.Buffer, off int64, src device.Staging, n int) error {
	d := dst.(*gpuBuffer)
	b := src.Bytes()[:n]
	s.ops <- func() { copy(d.mem[off:], b) }
	return nil
}

func (s *gpuStream) Record() (device.Event, error) {
	ev := make(gpuEvent)
	s.ops <- func() { close(ev) }
	return ev, nil
}

func (s *gpuStream) Close() error { close(s.ops); return nil }

// contents returns what a buffer of either device holds.
func contents(b device.Buffer) []byte {
	if g, ok := b.(*gpuBuffer); ok {
		return g.mem
	}
	return b.(device.HostMemory).Bytes()
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func sum(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

func TestStreamMovesBytes(t *testing.T) {
	cases := []struct {
		name    string
		sizes   []int
		chunk   int
		par     int
		staging int
		verify  bool
		tee     bool
		host    bool
	}{
		{name: "direct", sizes: []int{1 << 20, 3000, 0, 777}, chunk: 64 << 10, par: 4},
		{name: "verify", sizes: []int{1 << 20, 3000, 1}, chunk: 64 << 10, par: 4, verify: true},
		{name: "verify tee one buffer", sizes: []int{300000, 70000}, chunk: 4096, par: 3, staging: 1, verify: true, tee: true},
		{name: "many files few buffers", sizes: []int{50000, 50001, 49999, 8192, 100}, chunk: 1000, par: 8, staging: 2, verify: true, tee: true},
		{name: "host files", sizes: []int{12345, 6}, chunk: 1000, par: 2, verify: true, tee: true, host: true},
	}
	for _, dev := range []device.Device{device.NewCPU(), gpuLike{device.NewCPU()}} {
		for _, c := range cases {
			t.Run(dev.Name()+"/"+c.name, func(t *testing.T) {
				var files []File
				var tees []*bytes.Buffer
				var datas [][]byte
				for i, n := range c.sizes {
					data := randomBytes(n, uint64(i))
					datas = append(datas, data)
					f := File{Name: fmt.Sprintf("f%d", i), Size: int64(n), SHA256: sum(data), Verify: c.verify, Src: &flakySource{data: data}}
					if c.host {
						f.Host = make([]byte, n)
					} else {
						buf, err := dev.Alloc(context.Background(), int64(n))
						if err != nil {
							t.Fatal(err)
						}
						defer buf.Free()
						f.Dst = buf
					}
					tee := &bytes.Buffer{}
					tees = append(tees, tee)
					if c.tee {
						f.Tee = tee
					}
					files = append(files, f)
				}
				var last Progress
				var events int
				opts := Options{Parallel: c.par, ChunkSize: c.chunk, Staging: c.staging, Progress: func(p Progress) { last = p; events++ }}
				if err := Stream(context.Background(), dev, files, opts); err != nil {
					t.Fatal(err)
				}
				for i, f := range files {
					got := f.Host
					if f.Dst != nil {
						got = contents(f.Dst)
					}
					if !bytes.Equal(got[:f.Size], datas[i]) {
						t.Errorf("%s: content differs", f.Name)
					}
					if c.tee && !bytes.Equal(tees[i].Bytes(), datas[i]) {
						t.Errorf("%s: tee got %d bytes, differing from the content", f.Name, tees[i].Len())
					}
				}
				var total int64
				for _, n := range c.sizes {
					total += int64(n)
				}
				if !last.Done || last.Bytes != total || last.Total != total || events == 0 {
					t.Errorf("last progress %+v after %d events, want done with %d bytes", last, events, total)
				}
			})
		}
	}
}

func TestStreamRetriesAndFails(t *testing.T) {
	dev := gpuLike{device.NewCPU()}
	data := randomBytes(200000, 7)
	cases := []struct {
		name    string
		src     *flakySource
		retries int
		sha     string
		wantErr string
	}{
		{name: "transient failures are retried", src: &flakySource{data: data, failures: 2}, retries: 3},
		{name: "too many failures", src: &flakySource{data: data, failures: 5}, retries: 2, wantErr: "after 3 attempts"},
		{name: "permanent errors are not retried", src: &flakySource{data: data, failures: 1, err: fmt.Errorf("%w: no such key", ErrPermanent)}, retries: 5, wantErr: "after 1 attempts"},
		{name: "corrupt content", src: &flakySource{data: append(append([]byte{}, data[:1000]...), append([]byte{data[1000] ^ 4}, data[1001:]...)...)}, wantErr: "the object is corrupt"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			buf, err := dev.Alloc(context.Background(), int64(len(data)))
			if err != nil {
				t.Fatal(err)
			}
			defer buf.Free()
			f := File{Name: "shard", Size: int64(len(data)), SHA256: sum(data), Verify: true, Src: c.src, Dst: buf}
			err = Stream(context.Background(), dev, []File{f}, Options{Parallel: 4, ChunkSize: 16384, Retries: c.retries, Backoff: 1})
			if c.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(contents(buf), data) {
					t.Fatal("content differs after retries")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, c.wantErr)
			}
		})
	}
}

// blockingSource blocks every read until its context ends.
type blockingSource struct{ started chan struct{} }

func (s blockingSource) ReadAt(ctx context.Context, p []byte, off int64) error {
	select {
	case s.started <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return ctx.Err()
}

func TestStreamCancels(t *testing.T) {
	dev := device.NewCPU()
	buf, err := dev.Alloc(context.Background(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	src := blockingSource{started: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- Stream(ctx, dev, []File{{Name: "f", Size: 1 << 20, SHA256: strings.Repeat("0", 64), Verify: true, Src: src, Dst: buf}}, Options{ChunkSize: 4096})
	}()
	<-src.started
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}
