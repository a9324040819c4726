package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Pool runs kernels on a fixed number of threads: the calling goroutine plus
// Threads()-1 worker goroutines started by NewPool (none when Threads() is 1).
// A Pool is safe for concurrent use; each call splits its own work and waits
// for it. Callers own their pools, so two engines in one process never share
// hidden state. A nil or zero Pool runs everything on the caller's
// goroutine, with the default kernel set.
type Pool struct {
	threads int
	ks      *Set

	mu     sync.RWMutex // guards closed against sends on a closed tasks
	closed bool
	tasks  chan task
	done   sync.WaitGroup // the workers

	scratch sync.Pool // *[]float32 buffers for inputs scaled by FP8 block scales
}

// task is one chunk [lo, hi) of a Parallel call.
type task struct {
	fn     func(lo, hi int)
	lo, hi int
	b      *batch
}

// batch tracks the chunks of one Parallel call that other goroutines run.
type batch struct {
	pending atomic.Int32   // chunks not finished, for the caller to poll
	wg      sync.WaitGroup // the same count, for the caller to sleep on
}

// NewPool returns a pool of threads threads on the default kernel set
// ([Default]); threads <= 0 means runtime.GOMAXPROCS(0). Call Close to
// stop its workers. It panics when STOKE_KERNELS names no usable set.
func NewPool(threads int) *Pool { return newPool(threads, mustDefault()) }

// NewPool returns a pool of threads threads that computes with s, as
// [NewPool] does with the default set; a nil s means the default set.
func (s *Set) NewPool(threads int) *Pool {
	if s == nil {
		return NewPool(threads)
	}
	return newPool(threads, s)
}

func newPool(threads int, ks *Set) *Pool {
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

// workerSpin is how long an idle worker polls for the next task before it
// parks. Waking a parked worker (and its idle CPU) takes tens of
// microseconds, as long as a whole mid-sized decode MatMul; a forward pass
// hands out tasks far more often than that, so workers stay awake through
// it and park soon after it ends. They yield while polling, so other
// goroutines are not held up.
const workerSpin = 200 * time.Microsecond

func work(tasks <-chan task, done *sync.WaitGroup) {
	defer done.Done()
	for {
		t, ok, got := poll(tasks)
		if !got {
			t, ok = <-tasks
		}
		if !ok {
			return
		}
		t.run()
	}
}

// poll receives from tasks for up to workerSpin; got is false if nothing
// came.
func poll(tasks <-chan task) (t task, ok, got bool) {
	deadline := time.Now().Add(workerSpin)
	for {
		select {
		case t, ok = <-tasks:
			return t, ok, true
		default:
		}
		if time.Now().After(deadline) {
			return task{}, false, false
		}
		runtime.Gosched()
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

	b := new(batch)
	b.pending.Store(int32(chunks - 1))
	b.wg.Add(chunks - 1)
	var mine []task // chunks that could not be queued
	p.mu.RLock()
	for c := 1; c < chunks; c++ {
		t := task{fn: fn, lo: bound(c), hi: bound(c + 1), b: b}
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
	p.wait(b)
}

// wait returns when every chunk of b has run. It first polls, running
// queued chunks (its own or another caller's) itself, so that nested calls
// cannot deadlock and this goroutine keeps its thread: sleeping here would
// let the finishing worker hand it over to another thread and leave this
// one to park, which costs the next call a slow wake-up.
func (p *Pool) wait(b *batch) {
	deadline := time.Now().Add(workerSpin)
	for i := 0; b.pending.Load() > 0; i++ {
		select {
		case t, ok := <-p.tasks:
			if ok {
				t.run()
				continue
			}
		default:
		}
		if i%64 == 63 {
			if time.Now().After(deadline) {
				break
			}
			// Let a worker that was woken onto this thread run, should
			// no other thread be free to take it.
			runtime.Gosched()
		}
	}
	b.wg.Wait()
}

func (t task) run() {
	t.fn(t.lo, t.hi)
	t.b.pending.Add(-1)
	t.b.wg.Done()
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

// Kernels is the kernel set the pool computes with.
func (p *Pool) Kernels() *Set {
	if p == nil || p.ks == nil {
		return mustDefault()
	}
	return p.ks
}
