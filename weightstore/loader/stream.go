// Package loader streams a revision's files into a device: parallel ranged
// reads of a few MiB each into a bounded set of staging buffers, copies to
// device memory on streams overlapped with the reads, sha256 verified on
// the fly for bytes that come from the bucket, retries with backoff, and
// progress events. LoadRevision chooses where the bytes come from: the node
// cache when it holds the revision (tier T2), otherwise the bucket (T3),
// teeing into the cache so the next load on this node is T2.
package loader

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stokehq/stoke/engine/device"
)

// Source reads byte ranges of one file.
type Source interface {
	// ReadAt fills p with the bytes at off. An error that a retry cannot
	// cure wraps ErrPermanent.
	ReadAt(ctx context.Context, p []byte, off int64) error
}

// ErrPermanent marks source errors that retrying cannot cure (a missing
// object, refused credentials).
var ErrPermanent = errors.New("permanent")

// File is one file to stream.
type File struct {
	// Name names the file in errors and logs.
	Name string
	// Size is the number of bytes to move.
	Size int64
	// SHA256 is the content's lowercase hex sha256, checked when Verify.
	SHA256 string
	Verify bool
	// Src is where the bytes come from.
	Src Source
	// Dst receives the bytes in device memory; when nil, Host does.
	Dst  device.Buffer
	Host []byte
	// Tee, when set, receives the content in order (a node cache writer).
	// A Tee with a Sum method (the hex sha256 of what it received, as
	// nodecache.Writer has) verifies the content instead of a second hash.
	Tee io.Writer
}

// summer is a Tee that hashes what it receives.
type summer interface{ Sum() string }

// Options tune a Stream.
type Options struct {
	// Parallel is the number of concurrent range reads (default 8).
	Parallel int
	// ChunkSize is the length of one range read (default 4 MiB).
	ChunkSize int
	// Staging is the number of staging buffers of ChunkSize (default
	// 2×Parallel); it bounds the bytes in flight.
	Staging int
	// Retries is how many times a failed range is read again (default 5),
	// waiting Backoff (default 100 ms) doubled each time, with jitter.
	Retries int
	Backoff time.Duration
	// Progress, when set, is called about every ProgressEvery (default
	// 250 ms) while bytes move, and once at the end.
	Progress      func(Progress)
	ProgressEvery time.Duration
	// Logger receives retries; nil means slog.Default().
	Logger *slog.Logger
	// HostFiles, when set, makes LoadRevision stream the small files
	// (those not OnDevice) first and hand them over, by name, before the
	// weights stream: the caller can parse the tokenizer meanwhile.
	HostFiles func(map[string][]byte)
}

func (o Options) withDefaults() Options {
	if o.Parallel <= 0 {
		o.Parallel = 8
	}
	if o.ChunkSize <= 0 {
		o.ChunkSize = 4 << 20
	}
	if o.Staging <= 0 {
		o.Staging = 2 * o.Parallel
	}
	if o.Retries < 0 {
		o.Retries = 0
	} else if o.Retries == 0 {
		o.Retries = 5
	}
	if o.Backoff <= 0 {
		o.Backoff = 100 * time.Millisecond
	}
	if o.ProgressEvery <= 0 {
		o.ProgressEvery = 250 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Progress reports a stream's advance.
type Progress struct {
	// Bytes moved so far, of Total.
	Bytes, Total int64
	// Elapsed since the stream started.
	Elapsed time.Duration
	// Done is set on the last event.
	Done bool
}

// GBps is the average rate so far in 10⁹ bytes per second.
func (p Progress) GBps() float64 {
	if p.Elapsed <= 0 {
		return 0
	}
	return float64(p.Bytes) / p.Elapsed.Seconds() / 1e9
}

// chunk is one range of one file, in dispatch order.
type chunk struct {
	file  int
	index int // within the file
	off   int64
	n     int
}

// Stream moves files into their destinations. Chunks of all files are
// read interleaved (chunk 0 of every file, then chunk 1, …) so files that
// are hashed or teed, which must be consumed in order, progress side by
// side on different cores.
func Stream(ctx context.Context, dev device.Device, files []File, opts Options) (err error) {
	opts = opts.withDefaults()
	for i, f := range files {
		if err := checkFile(f); err != nil {
			return fmt.Errorf("stream %s: %w", files[i].Name, err)
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	s := &streamer{ctx: ctx, cancel: cancel, dev: dev, files: files, opts: opts, start: time.Now()}
	for _, f := range files {
		s.total += f.Size
	}
	stopProgress := s.reportProgress()
	defer func() { stopProgress(err == nil) }()

	staging, err := s.allocStaging()
	if err != nil {
		return err
	}
	defer func() {
		for _, b := range staging {
			b.Free()
		}
	}()
	s.pool = make(chan device.Staging, len(staging))
	for _, b := range staging {
		s.pool <- b
	}

	s.seqs = make([]*sequencer, len(files))
	for i, f := range files {
		if f.Verify || f.Tee != nil {
			s.seqs[i] = newSequencer(s, i)
		}
	}

	work := make(chan job)
	var wg sync.WaitGroup
	for range opts.Parallel {
		st, err := dev.NewStream()
		if err != nil {
			cancel(err)
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer st.Close()
			s.worker(st, work)
		}()
	}
	s.dispatch(work)
	close(work)
	wg.Wait()
	for _, q := range s.seqs {
		if q != nil {
			q.close()
		}
	}
	s.waitSequencers()
	if cause := context.Cause(ctx); cause != nil {
		return cause
	}
	for i, f := range files {
		if f.Verify {
			if got := s.seqs[i].sum(); got != f.SHA256 {
				return fmt.Errorf("verify %s: sha256 is %s, the manifest says %s: the object is corrupt", f.Name, got, f.SHA256)
			}
		}
	}
	return nil
}

func checkFile(f File) error {
	switch {
	case f.Size < 0:
		return fmt.Errorf("negative size %d", f.Size)
	case f.Src == nil && f.Size > 0:
		return errors.New("no source")
	case f.Dst != nil && f.Dst.Size() < f.Size:
		return fmt.Errorf("device buffer of %d bytes for %d", f.Dst.Size(), f.Size)
	case f.Dst == nil && int64(len(f.Host)) < f.Size:
		return fmt.Errorf("host buffer of %d bytes for %d", len(f.Host), f.Size)
	case f.Verify && len(f.SHA256) != 64:
		return fmt.Errorf("sha256 %q is not 64 hex digits", f.SHA256)
	}
	return nil
}

type streamer struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	dev    device.Device
	files  []File
	opts   Options
	start  time.Time
	total  int64
	moved  atomic.Int64
	pool   chan device.Staging
	seqs   []*sequencer
	seqWG  sync.WaitGroup
}

// job is a chunk with the staging buffer reserved for it (nil when the
// chunk goes straight into host-addressable memory).
type job struct {
	chunk
	buf device.Staging
}

func (s *streamer) allocStaging() ([]device.Staging, error) {
	var out []device.Staging
	if !s.needsStaging() {
		return nil, nil
	}
	var size int64
	for _, f := range s.files {
		size = max(size, min(f.Size, int64(s.opts.ChunkSize)))
	}
	n := s.opts.Staging
	for range n {
		b, err := s.dev.AllocStaging(int(size))
		if err != nil {
			for _, b := range out {
				b.Free()
			}
			return nil, fmt.Errorf("allocate staging buffers: %w", err)
		}
		out = append(out, b)
	}
	return out, nil
}

func (s *streamer) needsStaging() bool {
	for _, f := range s.files {
		if f.Size > 0 && s.direct(f) == nil {
			return true
		}
	}
	return false
}

// direct returns the memory a file's chunks are read into without staging
// (host destinations and device memory the host addresses, where the
// sequencer hashes and tees them in place), or nil for staging.
func (s *streamer) direct(f File) []byte {
	if f.Dst == nil {
		return f.Host
	}
	if hm, ok := f.Dst.(device.HostMemory); ok {
		return hm.Bytes()
	}
	return nil
}

// dispatch hands out chunks in order, reserving a staging buffer before
// taking each chunk: the earliest unfinished chunk always has a buffer, so
// sequencers holding later chunks cannot starve it.
func (s *streamer) dispatch(work chan<- job) {
	cs := s.opts.ChunkSize
	for idx := 0; ; idx++ {
		any := false
		for i, f := range s.files {
			off := int64(idx) * int64(cs)
			if off >= f.Size {
				continue
			}
			any = true
			j := job{chunk: chunk{file: i, index: idx, off: off, n: int(min(int64(cs), f.Size-off))}}
			if s.direct(f) == nil {
				select {
				case j.buf = <-s.pool:
				case <-s.ctx.Done():
					return
				}
			}
			select {
			case work <- j:
			case <-s.ctx.Done():
				if j.buf != nil {
					s.pool <- j.buf
				}
				return
			}
		}
		if !any {
			return
		}
	}
}

func (s *streamer) worker(st device.Stream, work <-chan job) {
	for j := range work {
		if s.ctx.Err() != nil {
			if j.buf != nil {
				s.pool <- j.buf
			}
			continue
		}
		if err := s.move(st, j); err != nil {
			s.cancel(err)
		}
	}
}

func (s *streamer) move(st device.Stream, j job) error {
	f := s.files[j.file]
	if mem := s.direct(f); mem != nil {
		data := mem[j.off : j.off+int64(j.n)]
		if err := s.read(f, data, j.off); err != nil {
			return err
		}
		if q := s.seqs[j.file]; q != nil {
			q.deliver(ready{data: data, j: j})
			return nil
		}
		s.moved.Add(int64(j.n))
		return nil
	}
	data := j.buf.Bytes()[:j.n]
	if err := s.read(f, data, j.off); err != nil {
		s.pool <- j.buf
		return err
	}
	if err := st.CopyToDevice(f.Dst, j.off, j.buf, j.n); err != nil {
		s.pool <- j.buf
		return fmt.Errorf("copy %s [%d, +%d) to %s: %w", f.Name, j.off, j.n, s.dev.Name(), err)
	}
	ev, err := st.Record()
	if err != nil {
		s.pool <- j.buf
		return fmt.Errorf("copy %s to %s: %w", f.Name, s.dev.Name(), err)
	}
	done := ready{ev: ev, data: data, j: j}
	if q := s.seqs[j.file]; q != nil {
		q.deliver(done)
		return nil
	}
	return s.finish(done)
}

// ready is a chunk that was read: into staging, with its copy to the
// device enqueued (ev), or straight into its destination.
type ready struct {
	ev   device.Event
	data []byte
	j    job
}

// release returns a chunk's staging buffer, if it has one.
func (s *streamer) release(r ready) {
	if r.j.buf != nil {
		s.pool <- r.j.buf
	}
}

// finish waits for a chunk's copy, if any, and returns its staging buffer.
func (s *streamer) finish(r ready) error {
	var err error
	if r.ev != nil {
		err = r.ev.Wait(s.ctx)
	}
	s.release(r)
	if err != nil {
		return fmt.Errorf("copy %s [%d, +%d) to %s: %w", s.files[r.j.file].Name, r.j.off, r.j.n, s.dev.Name(), err)
	}
	s.moved.Add(int64(r.j.n))
	return nil
}

// read fills p from f's source, retrying transient failures with backoff.
func (s *streamer) read(f File, p []byte, off int64) error {
	delay := s.opts.Backoff
	for attempt := 0; ; attempt++ {
		err := f.Src.ReadAt(s.ctx, p, off)
		if err == nil {
			return nil
		}
		if s.ctx.Err() != nil {
			return context.Cause(s.ctx)
		}
		if errors.Is(err, ErrPermanent) || attempt >= s.opts.Retries {
			return fmt.Errorf("read %s [%d, +%d) after %d attempts: %w", f.Name, off, len(p), attempt+1, err)
		}
		s.opts.Logger.Warn("retrying a failed range read", "file", f.Name, "offset", off, "bytes", len(p), "attempt", attempt+1, "err", err)
		wait := delay/2 + rand.N(delay)
		select {
		case <-time.After(wait):
		case <-s.ctx.Done():
			return context.Cause(s.ctx)
		}
		delay = min(2*delay, 5*time.Second)
	}
}

func (s *streamer) reportProgress() (stop func(ok bool)) {
	if s.opts.Progress == nil {
		return func(bool) {}
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(s.opts.ProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				s.opts.Progress(Progress{Bytes: s.moved.Load(), Total: s.total, Elapsed: time.Since(s.start)})
			case <-quit:
				return
			}
		}
	}()
	return func(ok bool) {
		close(quit)
		wg.Wait()
		s.opts.Progress(Progress{Bytes: s.moved.Load(), Total: s.total, Elapsed: time.Since(s.start), Done: true})
	}
}

// sequencer consumes one file's chunks in order: it hashes them, tees
// them, then lets their staging buffers go.
type sequencer struct {
	s    *streamer
	file int
	hash hash.Hash
	in   chan ready
}

func newSequencer(s *streamer, file int) *sequencer {
	q := &sequencer{s: s, file: file, in: make(chan ready, s.opts.Staging)}
	f := s.files[file]
	if _, ok := f.Tee.(summer); !ok && f.Verify {
		q.hash = sha256.New()
	}
	s.seqWG.Add(1)
	go q.run()
	return q
}

func (q *sequencer) deliver(r ready) { q.in <- r }

// sum is the hex sha256 of the file's content, from the tee when it hashes.
func (q *sequencer) sum() string {
	if t, ok := q.s.files[q.file].Tee.(summer); ok {
		return t.Sum()
	}
	return hex.EncodeToString(q.hash.Sum(nil))
}
func (q *sequencer) close() { close(q.in) }

func (s *streamer) waitSequencers() { s.seqWG.Wait() }

func (q *sequencer) run() {
	defer q.s.seqWG.Done()
	f := q.s.files[q.file]
	pending := map[int]ready{}
	next := 0
	for r := range q.in {
		pending[r.j.index] = r
		for {
			r, ok := pending[next]
			if !ok {
				break
			}
			delete(pending, next)
			next++
			if err := q.consume(f, r); err != nil {
				q.s.cancel(err)
			}
		}
	}
	for _, r := range pending {
		q.s.release(r)
	}
}

func (q *sequencer) consume(f File, r ready) error {
	if q.s.ctx.Err() != nil {
		q.s.release(r)
		return nil
	}
	data := r.data
	if q.hash != nil {
		q.hash.Write(data)
	}
	if f.Tee != nil {
		if _, err := f.Tee.Write(data); err != nil {
			q.s.release(r)
			return fmt.Errorf("write %s to the node cache: %w", f.Name, err)
		}
	}
	return q.s.finish(r)
}
