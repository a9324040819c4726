package activator

import (
	"container/heap"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// ErrBufferFull is returned at once by Buffer.Wait and Buffer.Acquire when
// the buffer already holds its capacity of waiting requests; the caller
// answers 429 with a Retry-After.
var ErrBufferFull = errors.New("activator buffer is full")

// ErrShed is returned by Buffer.Wait and Buffer.Acquire to a waiting
// request that lost its place to one of a higher priority arriving at a
// full buffer (the lowest priority is shed first, its newest request
// first); the caller answers 429, or falls back.
var ErrShed = errors.New("shed from the activator buffer for a request of a higher priority")

// ErrDeadline is returned by Buffer.Wait and Buffer.Acquire when the
// request's deadline passed before capacity came; the caller answers 503.
var ErrDeadline = errors.New("deadline passed while waiting for a replica")

// Priority bands of the buffer (higher waits less). Interactive requests
// default to PriorityInteractive; a client may move its own request within
// [PriorityInteractiveMin, PriorityInteractiveMax] and no further (until
// keys carry a priority of their own: see ClampClientPriority). Batch work
// waits below every interactive request; PrioritySystem is above them for
// the platform's own requests (evals, probes).
const (
	PriorityBatch          = -1000
	PriorityInteractiveMin = -100
	PriorityInteractive    = 0
	PriorityInteractiveMax = 100
	PrioritySystem         = 1000
)

// ClampClientPriority keeps a priority a client asked for in the
// interactive band, so no client can jump above every other one (or below
// batch work) by sending priority: 9223372036854775807.
func ClampClientPriority(p int) int {
	return min(max(p, PriorityInteractiveMin), PriorityInteractiveMax)
}

// defaultBufferRetryInterval is BufferOptions.RetryInterval when unset.
const defaultBufferRetryInterval = 250 * time.Millisecond

// BufferOptions configure a Buffer.
type BufferOptions struct {
	// Capacity is how many requests may wait at once; 0 or less refuses
	// every wait with ErrBufferFull (no buffering).
	Capacity int
	// RetryInterval is a safety net against capacity that appears without
	// a Notify (a breaker cooling down, a missed call): the request at the
	// head of the queue retries after waiting this long without a grant.
	// Default 250ms; negative turns the safety net off.
	RetryInterval time.Duration
	// OnQueued, when set, is called (outside the buffer's lock) with the
	// request's priority each time a request starts waiting, so the caller
	// can poke the scaler (and reclaim capacity from lower priorities).
	OnQueued func(priority int)
}

// Buffer is the wait queue of one deployment: requests wait in it while no
// replica has room. It is bounded, ordered by priority (higher first) and,
// within a priority, first come first served. Safe for concurrent use.
//
// The Buffer does not count capacity itself; it hands out wake-ups. The
// caller's contract:
//   - whenever capacity may have appeared (a request released its replica,
//     a replica became ready, a capacity was raised), call Notify with the
//     number of slots that may have freed;
//   - a granted waiter retries its pick; a grant that finds no room is not
//     an error, the request just waits again.
//
// Acquire runs that loop for the caller without losing a wake-up and
// without losing the request's place in the queue; it is the recommended
// entry point. Wait is the single step, for callers that run the loop
// themselves.
type Buffer struct {
	capacity atomic.Int64
	retry    time.Duration
	onQueued func(priority int)

	mu    sync.Mutex
	queue waiterHeap
	seq   uint64
	// settling counts Acquire waiters taken off the queue (granted or
	// retrying) whose pick has not yet succeeded or failed.
	settling int
	// epoch counts Notify calls (and hand-overs); Acquire compares it
	// across a failed pick to detect a wake-up it could have missed.
	epoch atomic.Uint64

	// Fair queuing among flows (start-time fair queuing): vclock is the
	// start tag of the last request served, finish each flow's last
	// finish tag.
	vclock float64
	finish map[string]float64
	// held lists the flows whose waiters were last held back by their
	// shares from free room that no waiter of another flow took; until a
	// try finds no room at all, a request of another flow arriving tries
	// at once.
	held []string
}

// Flow is who a request is for, in the buffer's fair order: within a
// priority, requests wait in start-time fair queuing order, each tagged
// start = max(the virtual clock, its flow's last finish) and finish =
// start + Cost, and the lowest start goes first. So a flow (a tenant)
// sending ten times more than another takes turns with it rather than
// queueing it behind its backlog; requests of one flow keep their order.
// The zero Flow is one shared flow: plain arrival order.
type Flow struct {
	// ID names the flow ("" for the shared one).
	ID string
	// Cost is the request's weight: an upper bound of its tokens (at
	// least 1).
	Cost float64
}

// tagLocked gives a request of flow its start tag and advances the
// flow's finish tag; b.mu is held.
func (b *Buffer) tagLocked(f Flow) float64 {
	if b.finish == nil {
		b.finish = map[string]float64{}
	}
	start := max(b.vclock, b.finish[f.ID])
	b.finish[f.ID] = start + max(f.Cost, 1)
	if len(b.finish) > 4096 { // forget flows with no credit or debt left
		for id, fin := range b.finish {
			if fin <= b.vclock {
				delete(b.finish, id)
			}
		}
	}
	return start
}

// Room is how one try for room went (see AcquireFlow).
type Room int

// The outcomes of a try.
const (
	// RoomNone: no room is free; wait for a Notify.
	RoomNone Room = iota
	// RoomHeld: room is free but kept for other flows (the request's flow
	// has its share); a request of another flow may take it.
	RoomHeld
	// RoomTaken: the request has its room.
	RoomTaken
)

// Ticket describes how a request got through a Buffer.
type Ticket struct {
	// Priority is the priority the request waited with.
	Priority int
	// Queued reports whether the request had to wait in the queue.
	Queued bool
	// Waited is how long it waited (zero when it did not).
	Waited time.Duration
}

// bufferWaiter is one request in the queue.
type bufferWaiter struct {
	priority int
	seq      uint64
	index    int // position in the heap; -1 while not queued
	granted  bool
	acquire  bool          // waits through Acquire (counts in settling when granted)
	ready    chan struct{} // one token per grant
	// start is the request's virtual start tag among the flows (see
	// Flow): within a priority, lower starts go first.
	start float64
	// flow is the request's flow; skip, on a grant handed over from a
	// request held back by its flow's share, the flows already held back
	// on the way (see handOverLocked).
	flow string
	skip []string
	// shed is set, before its wake-up, on a request shed for a higher
	// priority.
	shed bool
}

// waiterHeap orders waiters by priority (higher first), then by virtual
// start tag (the fair share of their flows), then arrival.
type waiterHeap []*bufferWaiter

func (h waiterHeap) Len() int { return len(h) }
func (h waiterHeap) Less(i, j int) bool {
	if h[i].priority != h[j].priority {
		return h[i].priority > h[j].priority
	}
	if h[i].start != h[j].start {
		return h[i].start < h[j].start
	}
	return h[i].seq < h[j].seq
}
func (h waiterHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *waiterHeap) Push(x any) {
	w := x.(*bufferWaiter)
	w.index = len(*h)
	*h = append(*h, w)
}
func (h *waiterHeap) Pop() any {
	old := *h
	n := len(old) - 1
	w := old[n]
	old[n] = nil
	w.index = -1
	*h = old[:n]
	return w
}

// NewBuffer returns a buffer holding at most capacity waiting requests,
// with the default retry interval.
func NewBuffer(capacity int) *Buffer {
	return NewBufferWithOptions(BufferOptions{Capacity: capacity})
}

// NewBufferWithOptions returns a buffer configured by opts.
func NewBufferWithOptions(opts BufferOptions) *Buffer {
	retry := opts.RetryInterval
	if retry == 0 {
		retry = defaultBufferRetryInterval
	}
	b := &Buffer{retry: retry, onQueued: opts.OnQueued}
	b.capacity.Store(int64(opts.Capacity))
	return b
}

// Len returns the number of requests waiting.
func (b *Buffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.queue.Len()
}

// Cap returns the most requests that may wait at once.
func (b *Buffer) Cap() int { return int(b.capacity.Load()) }

// SetCap changes how many requests may wait at once. Requests already
// waiting beyond a lowered capacity keep their place.
func (b *Buffer) SetCap(n int) { b.capacity.Store(int64(n)) }

// Notify says that up to n slots may have freed: it wakes the n first
// waiters (highest priority, oldest first) and returns how many it woke.
// Wake-ups beyond the waiters present are not stored.
func (b *Buffer) Notify(n int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.epoch.Add(1)
	return b.grantLocked(n)
}

// grantLocked wakes up to n waiters from the head of the queue.
func (b *Buffer) grantLocked(n int) int {
	granted := 0
	for ; n > 0 && b.queue.Len() > 0; n-- {
		w := heap.Pop(&b.queue).(*bufferWaiter)
		w.granted = true
		if w.acquire {
			b.settling++
		}
		w.ready <- struct{}{}
		granted++
	}
	return granted
}

// Wait queues a request and blocks until it is woken by Notify, its
// deadline passes (ErrDeadline; a zero deadline never passes), or ctx ends
// (ctx's error). It refuses at once with ErrBufferFull when the buffer is
// full. A nil return means "retry your pick now": a Notify woke it, or it
// sat at the head of the queue for the retry interval without one. A wake
// that lands on a request whose ctx has already ended, or whose deadline
// has passed, is handed to the next waiter, so no wake-up is lost; a
// request that gives up is always taken out of the queue.
//
// A caller that picks, fails and then calls Wait can miss a Notify made
// between the two (the retry interval bounds the cost); Acquire cannot.
func (b *Buffer) Wait(ctx context.Context, priority int, deadline time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !deadline.IsZero() && !time.Now().Before(deadline) {
		return ErrDeadline
	}
	w := &bufferWaiter{priority: priority, index: -1, ready: make(chan struct{}, 1)}
	b.mu.Lock()
	w.start = b.vclock
	err := b.enqueueLocked(w)
	b.mu.Unlock()
	if err != nil {
		return err
	}
	if b.onQueued != nil {
		b.onQueued(priority)
	}
	timers := newWaitTimers(deadline, b.retry)
	defer timers.stop()
	return b.block(ctx, w, timers)
}

// Acquire gets a request through to a replica: it calls try (typically a
// Pool.Pick that keeps its result) until try reports success, waiting in
// the queue between attempts. When nobody waits it calls try at once.
// Otherwise the request queues behind the others; each time it is woken it
// calls try again and, if that fails, returns to the same place in the
// queue (it never falls behind requests that arrived after it). A waiter
// whose try succeeds passes a wake-up to the next one, so a burst of
// capacity drains the queue without one Notify per slot.
//
// Errors: ErrBufferFull at once when the request would have to wait and
// the buffer is full; ErrDeadline when deadline (zero: none) passes first;
// ctx's error when ctx ends first. try runs on the caller's goroutine,
// never under the buffer's lock, and may run after ctx has ended only if
// it ended during the call.
func (b *Buffer) Acquire(ctx context.Context, priority int, deadline time.Time, try func() bool) (Ticket, error) {
	if try == nil {
		return Ticket{}, errors.New("activator buffer: Acquire needs a try function")
	}
	return b.AcquireFlow(ctx, priority, Flow{}, deadline, func() Room {
		if try() {
			return RoomTaken
		}
		return RoomNone
	})
}

// AcquireFlow is Acquire for a request of flow: one that waits takes its
// turn among the flows of its priority (see Flow); one that gets room at
// once is charged to its flow all the same. try says whether it took room,
// found none, or found room held for other flows (Pool.PickFor): a woken
// request held back hands its wake-up to the first waiter of another flow,
// so room kept for a light flow reaches it through a queue of a heavy
// one's requests.
func (b *Buffer) AcquireFlow(ctx context.Context, priority int, flow Flow, deadline time.Time, try func() Room) (Ticket, error) {
	if try == nil {
		return Ticket{}, errors.New("activator buffer: Acquire needs a try function")
	}
	if !deadline.IsZero() && !time.Now().Before(deadline) {
		// Past its deadline a request may still take free room, never wait.
		if err := ctx.Err(); err != nil {
			return Ticket{}, err
		}
		if try() == RoomTaken {
			b.charge(flow)
			return Ticket{Priority: priority}, nil
		}
		return Ticket{}, ErrDeadline
	}
	for { // leaves with b.mu held, to queue the request
		if err := ctx.Err(); err != nil {
			return Ticket{}, err
		}
		b.mu.Lock()
		if (b.queue.Len() > 0 || b.settling > 0) && !b.aheadLocked(priority, flow) {
			// Others wait or are being served: queue behind them; they
			// pass wake-ups on, so this request needs no try of its own.
			break
		}
		epoch := b.epoch.Load()
		b.mu.Unlock()
		room := try()
		if room == RoomTaken {
			b.charge(flow)
			return Ticket{Priority: priority}, nil
		}
		b.mu.Lock()
		if room == RoomNone {
			b.held = nil
		}
		if b.epoch.Load() == epoch {
			break
		}
		// A Notify came while try ran: room may have freed; try again.
		b.mu.Unlock()
	}
	w := newAcquireWaiter(priority)
	w.flow = flow.ID
	if flow.ID != "" {
		w.start = b.tagLocked(flow)
	} else {
		w.start = b.vclock
	}
	err := b.enqueueLocked(w)
	b.mu.Unlock()
	if err != nil {
		return Ticket{}, err
	}
	start := time.Now()
	if b.onQueued != nil {
		b.onQueued(priority)
	}
	timers := newWaitTimers(deadline, b.retry)
	defer timers.stop()
	for {
		if err := b.block(ctx, w, timers); err != nil {
			return Ticket{}, err
		}
		// Woken and off the queue, counted in settling.
		for {
			epoch := b.epoch.Load()
			room := try()
			b.mu.Lock()
			if room == RoomTaken {
				// The virtual clock is the start tag of the last request
				// served (not of one woken and held back by its share).
				b.vclock = max(b.vclock, w.start)
				b.settling--
				b.grantLocked(1) // pass the baton: more room may be there
				b.mu.Unlock()
				return Ticket{Priority: priority, Queued: true, Waited: time.Since(start)}, nil
			}
			if b.epoch.Load() != epoch && ctx.Err() == nil && !timers.expired() {
				b.mu.Unlock()
				continue // a wake-up arrived during try: retry before queueing
			}
			b.settling--
			var err error
			if err = ctx.Err(); err == nil && timers.expired() {
				err = ErrDeadline
			}
			if err != nil {
				// It may have been woken for room that another can use.
				b.grantLocked(1)
				b.mu.Unlock()
				return Ticket{}, err
			}
			// Back to its old place; a request already admitted may exceed
			// the capacity by the few that are settling.
			skip := w.skip
			w.granted, w.skip = false, nil
			heap.Push(&b.queue, w)
			if room == RoomNone {
				b.held = nil
			} else if skip = append(slices.Clip(skip), w.flow); !b.handOverLocked(skip) {
				b.held = skip
			}
			b.mu.Unlock()
			break
		}
		timers.resetRetry()
	}
}

// aheadLocked reports whether a request of priority and flow, arriving
// while others wait, tries for room at once: it would go before every
// waiter (a higher priority, or an earlier turn in the fair order), or
// room is free that the waiters' flows are held back from (their slot
// shares, see Pool.PickFor) and its flow is not one of those. b.mu is held.
func (b *Buffer) aheadLocked(priority int, flow Flow) bool {
	if len(b.held) > 0 && flow.ID != "" && !slices.Contains(b.held, flow.ID) {
		return true
	}
	if b.queue.Len() == 0 {
		return false
	}
	head := b.queue[0]
	if priority != head.priority {
		return priority > head.priority
	}
	if flow.ID == "" {
		return false
	}
	return max(b.vclock, b.finish[flow.ID]) < head.start
}

// handOverLocked wakes the first waiter whose flow is not in skip (the
// flows a wake-up was already held back for), passing skip on, and
// reports false when every waiter's flow is in skip. b.mu is held.
func (b *Buffer) handOverLocked(skip []string) bool {
	best := -1
	for i, w := range b.queue {
		if !slices.Contains(skip, w.flow) && (best < 0 || b.queue.Less(i, best)) {
			best = i
		}
	}
	if best < 0 {
		return false
	}
	w := heap.Remove(&b.queue, best).(*bufferWaiter)
	w.granted, w.skip = true, skip
	if w.acquire {
		b.settling++
	}
	w.ready <- struct{}{}
	return true
}

// charge counts a request of flow that got room without waiting against
// its flow's share (the shared flow is not counted: it is in arrival
// order anyway).
func (b *Buffer) charge(flow Flow) {
	if flow.ID == "" {
		return
	}
	b.mu.Lock()
	b.tagLocked(flow)
	b.mu.Unlock()
}

func newAcquireWaiter(priority int) *bufferWaiter {
	return &bufferWaiter{priority: priority, index: -1, acquire: true, ready: make(chan struct{}, 1)}
}

// enqueueLocked queues a new waiter unless the buffer is full; a full
// buffer sheds its lowest-priority waiter (the newest of them) for a
// waiter of a higher priority.
func (b *Buffer) enqueueLocked(w *bufferWaiter) error {
	if int64(b.queue.Len()) >= b.capacity.Load() {
		low := -1
		for i, q := range b.queue {
			if low < 0 || q.priority < b.queue[low].priority || q.priority == b.queue[low].priority && q.seq > b.queue[low].seq {
				low = i
			}
		}
		if low < 0 || b.queue[low].priority >= w.priority {
			return ErrBufferFull
		}
		shed := heap.Remove(&b.queue, low).(*bufferWaiter)
		shed.shed = true
		shed.ready <- struct{}{}
	}
	w.seq = b.seq
	b.seq++
	heap.Push(&b.queue, w)
	return nil
}

// block waits for w to be granted, or gives up on ctx or the deadline. On
// a nil return w is off the queue and granted (and, for Acquire waiters,
// counted in settling).
func (b *Buffer) block(ctx context.Context, w *bufferWaiter, t *waitTimers) error {
	for {
		select {
		case <-w.ready:
			if w.shed {
				return ErrShed
			}
			if err := ctx.Err(); err != nil {
				return b.abandon(w, err)
			}
			if t.expired() {
				return b.abandon(w, ErrDeadline)
			}
			return nil
		case <-ctx.Done():
			return b.abandon(w, ctx.Err())
		case <-t.deadlineC():
			return b.abandon(w, ErrDeadline)
		case <-t.retryC():
			b.mu.Lock()
			switch {
			case w.granted:
				// A grant raced the retry timer; its token is in w.ready.
				b.mu.Unlock()
				<-w.ready
				return nil
			case w.index == 0:
				heap.Remove(&b.queue, 0)
				w.granted = true
				if w.acquire {
					b.settling++
				}
				b.mu.Unlock()
				return nil
			}
			b.mu.Unlock()
			t.resetRetry()
		}
	}
}

// abandon takes w out of the buffer for good. If w was granted meanwhile,
// the grant goes to the next waiter so the wake-up is not lost.
func (b *Buffer) abandon(w *bufferWaiter, err error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w.granted {
		if w.acquire {
			b.settling--
		}
		b.epoch.Add(1)
		b.grantLocked(1)
		return err
	}
	if w.index >= 0 {
		heap.Remove(&b.queue, w.index)
	}
	return err
}

// waitTimers are a waiter's deadline and retry timers.
type waitTimers struct {
	deadline time.Time
	dl       *time.Timer
	retry    time.Duration
	rt       *time.Timer
}

func newWaitTimers(deadline time.Time, retry time.Duration) *waitTimers {
	t := &waitTimers{deadline: deadline, retry: retry}
	if !deadline.IsZero() {
		t.dl = time.NewTimer(time.Until(deadline))
	}
	if retry > 0 {
		t.rt = time.NewTimer(retry)
	}
	return t
}

func (t *waitTimers) deadlineC() <-chan time.Time {
	if t.dl == nil {
		return nil
	}
	return t.dl.C
}

func (t *waitTimers) retryC() <-chan time.Time {
	if t.rt == nil {
		return nil
	}
	return t.rt.C
}

func (t *waitTimers) expired() bool {
	return !t.deadline.IsZero() && !time.Now().Before(t.deadline)
}

func (t *waitTimers) resetRetry() {
	if t.rt != nil {
		t.rt.Reset(t.retry)
	}
}

func (t *waitTimers) stop() {
	if t.dl != nil {
		t.dl.Stop()
	}
	if t.rt != nil {
		t.rt.Stop()
	}
}
