package push

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/dustin/go-humanize"
	"github.com/vbauerster/cupwriter"
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"

	"github.com/stokehq/stoke/weightstore/manifest"
)

// progress shows how an upload advances.
type progress interface {
	// start is called when a file's upload begins.
	start(f manifest.File) tracker
	// wait is called once every upload has ended; ok says whether all
	// succeeded.
	wait(ok bool)
}

// tracker follows one file's upload.
type tracker interface {
	add(n int64)
	done(err error)
}

// newProgress picks the display for w: none for nil, bars for a terminal,
// one line per file otherwise.
func newProgress(ctx context.Context, w io.Writer, files []manifest.File, todo []int) progress {
	if w == nil {
		return nopProgress{}
	}
	var total int64
	for _, i := range todo {
		total += files[i].Size
	}
	skipped := len(files) - len(todo)
	if !cupwriter.New(w, false).IsTerminal() {
		fmt.Fprintf(w, "uploading %d files (%s), %d already present\n", len(todo), humanize.IBytes(uint64(total)), skipped)
		return &lineProgress{w: w}
	}
	return newBarProgress(ctx, w, len(todo), skipped, total)
}

// newBarProgress starts the multi-line bar display.
func newBarProgress(ctx context.Context, w io.Writer, files, skipped int, total int64, opts ...mpb.ContainerOption) *barProgress {
	p := mpb.NewWithContext(ctx, append([]mpb.ContainerOption{mpb.WithOutput(w), mpb.WithWidth(40)}, opts...)...)
	bar := p.AddBar(total,
		mpb.PrependDecorators(decor.Name(fmt.Sprintf("total (%d files, %d present)", files, skipped), decor.WCSyncSpaceR)),
		mpb.AppendDecorators(decor.Counters(decor.SizeB1024(0), "% .1f / % .1f"), decor.Name(" "), decor.AverageSpeed(decor.SizeB1024(0), "% .1f")),
	)
	return &barProgress{p: p, total: bar}
}

type nopProgress struct{}

func (nopProgress) start(manifest.File) tracker { return nopTracker{} }
func (nopProgress) wait(bool)                   {}

type nopTracker struct{}

func (nopTracker) add(int64)  {}
func (nopTracker) done(error) {}

// lineProgress prints a line as each file finishes.
type lineProgress struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineProgress) start(f manifest.File) tracker { return &lineTracker{l: l, f: f} }
func (l *lineProgress) wait(bool)                     {}

type lineTracker struct {
	l *lineProgress
	f manifest.File
}

func (t *lineTracker) add(int64) {}

func (t *lineTracker) done(err error) {
	t.l.mu.Lock()
	defer t.l.mu.Unlock()
	if err != nil {
		fmt.Fprintf(t.l.w, "failed   %s: %v\n", t.f.Name, err)
		return
	}
	fmt.Fprintf(t.l.w, "uploaded %s (%s)\n", t.f.Name, humanize.IBytes(uint64(t.f.Size)))
}

// barProgress draws a bar per file in flight under a total bar.
type barProgress struct {
	p     *mpb.Progress
	total *mpb.Bar
}

func (b *barProgress) start(f manifest.File) tracker {
	bar := b.p.AddBar(f.Size,
		mpb.BarRemoveOnComplete(),
		mpb.PrependDecorators(decor.Name(f.Name, decor.WCSyncSpaceR)),
		mpb.AppendDecorators(decor.Counters(decor.SizeB1024(0), "% .1f / % .1f"), decor.Name(" "), decor.AverageSpeed(decor.SizeB1024(0), "% .1f")),
	)
	return &barTracker{bar: bar, total: b.total, size: f.Size}
}

func (b *barProgress) wait(ok bool) {
	if ok {
		b.total.SetTotal(-1, true)
	} else {
		b.total.Abort(false)
	}
	b.p.Wait()
}

type barTracker struct {
	bar, total *mpb.Bar
	size       int64
	sent       atomic.Int64
}

// add counts bytes once: a retried part is read again but not shown twice.
func (t *barTracker) add(n int64) {
	for {
		old := t.sent.Load()
		next := min(old+n, t.size)
		if t.sent.CompareAndSwap(old, next) {
			t.bar.IncrInt64(next - old)
			t.total.IncrInt64(next - old)
			return
		}
	}
}

func (t *barTracker) done(err error) {
	if err != nil {
		t.bar.Abort(true)
		return
	}
	t.add(t.size)
	t.bar.SetTotal(-1, true)
}
