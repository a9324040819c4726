package kernels

import (
	"runtime"
	"sync"
)

// Pool runs kernels on a fixed number of threads: the calling goroutine plus
// Threads()-1 worker goroutines started by NewPool (none when Threads() is 1).
// A Pool is safe for concurrent use; each call splits its own work and waits
// for it. Callers own their pools, so two engines in one process never share
// hidden state. A nil or zero Pool runs everything on the caller's goroutine.
type Pool struct {
	threads int
	ks      *kernelSet

	mu     sync.RWMutex // guards closed against sends on a closed tasks
	closed bool
	tasks  chan task
	done   sync.WaitGroup // the workers

	scratch sync.Pool // *[]float32 buffers for dequantised tiles and scaled inputs
}

// task is one chunk [lo, hi) of a Parallel call.
type task struct {
	fn     func(lo, hi int)
	lo, hi int
	wg     *sync.WaitGroup
}

// NewPool returns a pool of threads threads; threads <= 0 means
// runtime.GOMAXPROCS(0). Call Close to stop its workers.
func NewPool(threads int) *Pool { return newPool(threads, best) }

func newPool(threads int, ks *kernelSet) *Pool {
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	p := &Pool{threads: threads, ks: ks}
	if threads > 1 {
		p.tasks = make(chan task, 4*threads)
		p.done.Add(threads - 1)
		for range threads - 1 {
			go work(p.tasks, &p.done)
		}
	}
	return p
}

func work(tasks <-chan task, done *sync.WaitGroup) {
	defer done.Done()
	for t := range tasks {
		t.fn(t.lo, t.hi)
		t.wg.Done()
	}
}

// Threads is the number of threads the pool's calls are split across.
func (p *Pool) Threads() int {
	if p == nil || p.threads < 1 {
		return 1
	}
	return p.threads
}

// Close stops the pool's workers after the work already handed to them.
// Calls made after Close still work, on the calling goroutine alone.
// Close is idempotent.
func (p *Pool) Close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		if p.tasks != nil {
			close(p.tasks)
		}
	}
	p.mu.Unlock()
	p.done.Wait()
}

// Parallel calls fn(lo, hi) on disjoint ranges that together cover
// [0, count), one range per thread at most, and returns when all calls have
// returned. Every range starts at a multiple of grain (grain < 1 counts as
// 1) and all but the last have a length that is a multiple of grain. fn may
// itself call Parallel on the same pool.
func (p *Pool) Parallel(count, grain int, fn func(lo, hi int)) {
	p.parallel(count, grain, p.Threads(), fn)
}

// parallel is Parallel limited to at most threads ranges.
func (p *Pool) parallel(count, grain, threads int, fn func(lo, hi int)) {
	if count <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	grains := ceilDiv(count, grain)
	chunks := min(threads, grains, p.Threads())
	if chunks <= 1 {
		fn(0, count)
		return
	}
	bound := func(c int) int { return min(count, c*grains/chunks*grain) }

	var wg sync.WaitGroup
	var mine []task // chunks that could not be queued
	wg.Add(chunks - 1)
	p.mu.RLock()
	for c := 1; c < chunks; c++ {
		t := task{fn: fn, lo: bound(c), hi: bound(c + 1), wg: &wg}
		if p.closed {
			mine = append(mine, t)
			continue
		}
		select {
		case p.tasks <- t:
		default: // queue full
			mine = append(mine, t)
		}
	}
	p.mu.RUnlock()

	fn(0, bound(1))
	for _, t := range mine {
		t.run()
	}
	// Help with queued work (ours or another caller's) instead of sleeping,
	// so that nested calls cannot deadlock waiting for busy workers.
	for {
		select {
		case t, ok := <-p.tasks:
			if ok {
				t.run()
				continue
			}
		default:
		}
		break
	}
	wg.Wait()
}

func (t task) run() {
	t.fn(t.lo, t.hi)
	t.wg.Done()
}

// getScratch returns a buffer of at least n floats; putScratch recycles it.
func (p *Pool) getScratch(n int) *[]float32 {
	if p != nil {
		if b, ok := p.scratch.Get().(*[]float32); ok && cap(*b) >= n {
			*b = (*b)[:n]
			return b
		}
	}
	b := make([]float32, n)
	return &b
}

func (p *Pool) putScratch(b *[]float32) {
	if p != nil {
		p.scratch.Put(b)
	}
}

func (p *Pool) kernels() *kernelSet {
	if p == nil || p.ks == nil {
		return best
	}
	return p.ks
}
