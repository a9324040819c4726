package activator

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// awaitRouting polls cond until it holds; the 10s bound only keeps a bug
// from hanging the test, it is not a timing assertion.
func awaitRouting(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// settlingOf reads the buffer's count of woken Acquire waiters.
func settlingOf(b *Buffer) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.settling
}

func TestBufferGrantOrder(t *testing.T) {
	cases := []struct {
		name  string
		prios []int
		want  []int // indexes of prios in grant order
	}{
		{"fifo", []int{0, 0, 0, 0}, []int{0, 1, 2, 3}},
		{"priority", []int{0, 5, 1}, []int{1, 2, 0}},
		{"priority then fifo", []int{1, 0, 1, 2, 0, -3, 2}, []int{3, 6, 0, 2, 1, 4, 5}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBufferWithOptions(BufferOptions{Capacity: len(tc.prios), RetryInterval: -1})
			got := make(chan int, len(tc.prios))
			errs := make(chan error, len(tc.prios))
			for i, prio := range tc.prios {
				go func() {
					if err := b.Wait(context.Background(), prio, time.Time{}); err != nil {
						errs <- err
						return
					}
					got <- i
				}()
				awaitRouting(t, fmt.Sprintf("waiter %d queued", i), func() bool { return b.Len() == i+1 })
			}
			var order []int
			for range tc.prios {
				if n := b.Notify(1); n != 1 {
					t.Fatalf("Notify(1) woke %d waiters, want 1", n)
				}
				select {
				case i := <-got:
					order = append(order, i)
				case err := <-errs:
					t.Fatalf("Wait: %v", err)
				}
			}
			if !slices.Equal(order, tc.want) {
				t.Fatalf("grant order %v, want %v", order, tc.want)
			}
			if n := b.Len(); n != 0 {
				t.Fatalf("Len after all grants = %d", n)
			}
		})
	}
}

func TestBufferFull(t *testing.T) {
	cases := []struct {
		name     string
		capacity int
		queued   int
	}{
		{"no buffering", 0, 0},
		{"negative capacity", -1, 0},
		{"one slot taken", 1, 1},
		{"three slots taken", 3, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBufferWithOptions(BufferOptions{Capacity: tc.capacity, RetryInterval: -1})
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			for i := range tc.queued {
				wg.Go(func() { b.Wait(ctx, 0, time.Time{}) })
				awaitRouting(t, "waiter queued", func() bool { return b.Len() == i+1 })
			}
			if err := b.Wait(ctx, 0, time.Time{}); !errors.Is(err, ErrBufferFull) {
				t.Errorf("Wait on a full buffer = %v, want ErrBufferFull", err)
			}
			if _, err := b.Acquire(ctx, 0, time.Time{}, func() bool { return false }); !errors.Is(err, ErrBufferFull) {
				t.Errorf("Acquire on a full buffer = %v, want ErrBufferFull", err)
			}
			if n := b.Len(); n != tc.queued {
				t.Errorf("Len = %d after refusals, want %d", n, tc.queued)
			}
			b.SetCap(tc.queued + 1) // a raised capacity takes one more
			wg.Go(func() { b.Wait(ctx, 0, time.Time{}) })
			awaitRouting(t, "a waiter queued under the raised capacity", func() bool { return b.Len() == tc.queued+1 })
			if err := b.Wait(ctx, 0, time.Time{}); !errors.Is(err, ErrBufferFull) {
				t.Errorf("Wait beyond the raised capacity = %v, want ErrBufferFull", err)
			}
			cancel()
			wg.Wait()
			if n := b.Len(); n != 0 {
				t.Errorf("Len = %d after cancelling everyone", n)
			}
		})
	}
}

func TestBufferDeadline(t *testing.T) {
	never := func() bool { return false }
	cases := []struct {
		name  string
		retry time.Duration // Wait returns nil on a retry: keep it off there
		run   func(b *Buffer, deadline time.Time) error
	}{
		{"Wait", -1, func(b *Buffer, d time.Time) error { return b.Wait(context.Background(), 0, d) }},
		{"Acquire", 2 * time.Millisecond, func(b *Buffer, d time.Time) error {
			_, err := b.Acquire(context.Background(), 0, d, never)
			return err
		}},
	}
	for _, tc := range cases {
		for _, offset := range []time.Duration{-time.Second, 0, 20 * time.Millisecond} {
			t.Run(fmt.Sprintf("%s/%v", tc.name, offset), func(t *testing.T) {
				b := NewBufferWithOptions(BufferOptions{Capacity: 4, RetryInterval: tc.retry})
				if err := tc.run(b, time.Now().Add(offset)); !errors.Is(err, ErrDeadline) {
					t.Fatalf("err = %v, want ErrDeadline", err)
				}
				if n := b.Len(); n != 0 {
					t.Fatalf("Len = %d after the deadline, want 0", n)
				}
				if n := b.Notify(1); n != 0 {
					t.Fatalf("Notify woke %d waiters after the deadline", n)
				}
				if n := settlingOf(b); n != 0 {
					t.Fatalf("settling = %d", n)
				}
			})
		}
	}
	t.Run("Acquire past its deadline still takes free room", func(t *testing.T) {
		b := NewBuffer(4)
		tk, err := b.Acquire(context.Background(), 0, time.Now().Add(-time.Second), func() bool { return true })
		if err != nil || tk.Queued {
			t.Fatalf("Acquire = %+v, %v; want an unqueued success", tk, err)
		}
	})
}

func TestBufferCancelRemovesWaiter(t *testing.T) {
	cases := []struct {
		name string
		run  func(ctx context.Context, b *Buffer) error
	}{
		{"Wait", func(ctx context.Context, b *Buffer) error { return b.Wait(ctx, 0, time.Time{}) }},
		{"Acquire", func(ctx context.Context, b *Buffer) error {
			_, err := b.Acquire(ctx, 0, time.Time{}, func() bool { return false })
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBufferWithOptions(BufferOptions{Capacity: 4, RetryInterval: -1})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- tc.run(ctx, b) }()
			awaitRouting(t, "waiter queued", func() bool { return b.Len() == 1 })
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v, want context.Canceled", err)
			}
			if n := b.Len(); n != 0 {
				t.Fatalf("Len = %d after cancel, want 0", n)
			}
			if n := b.Notify(1); n != 0 {
				t.Fatalf("Notify woke %d waiters after cancel, want 0", n)
			}
			if err := tc.run(ctx, b); !errors.Is(err, context.Canceled) {
				t.Fatalf("with an ended ctx err = %v, want context.Canceled", err)
			}
		})
	}
}

// A grant that lands on a waiter whose ctx already ended goes to the next
// waiter. Holding the buffer's lock while cancelling and granting makes
// the grant certainly land on the cancelled waiter.
func TestBufferGrantToCancelledWaiterPassesOn(t *testing.T) {
	for _, acquire := range []bool{false, true} {
		t.Run(fmt.Sprintf("acquire=%v", acquire), func(t *testing.T) {
			b := NewBufferWithOptions(BufferOptions{Capacity: 4, RetryInterval: -1})
			var room atomic.Int32 // for Acquire: one slot appears with the grant
			wait := func(ctx context.Context) error {
				if !acquire {
					return b.Wait(ctx, 0, time.Time{})
				}
				_, err := b.Acquire(ctx, 0, time.Time{}, func() bool {
					for {
						n := room.Load()
						if n == 0 {
							return false
						}
						if room.CompareAndSwap(n, n-1) {
							return true
						}
					}
				})
				return err
			}
			ctxA, cancelA := context.WithCancel(context.Background())
			doneA := make(chan error, 1)
			go func() { doneA <- wait(ctxA) }()
			awaitRouting(t, "A queued", func() bool { return b.Len() == 1 })
			doneB := make(chan error, 1)
			go func() { doneB <- wait(context.Background()) }()
			awaitRouting(t, "B queued", func() bool { return b.Len() == 2 })

			b.mu.Lock()
			cancelA()
			room.Store(1)
			b.epoch.Add(1)
			if n := b.grantLocked(1); n != 1 {
				b.mu.Unlock()
				t.Fatalf("granted %d", n)
			}
			b.mu.Unlock()

			if err := <-doneA; !errors.Is(err, context.Canceled) {
				t.Fatalf("A: err = %v, want context.Canceled", err)
			}
			if err := <-doneB; err != nil {
				t.Fatalf("B did not get A's grant: %v", err)
			}
			if n := b.Len(); n != 0 {
				t.Fatalf("Len = %d", n)
			}
			if n := settlingOf(b); n != 0 {
				t.Fatalf("settling = %d", n)
			}
		})
	}
}

// slotSet is a resource of n slots taken by CAS, standing for a Pool.
type slotSet struct {
	free    atomic.Int64
	used    atomic.Int64
	maxUsed atomic.Int64
}

func (s *slotSet) take() bool {
	for {
		n := s.free.Load()
		if n <= 0 {
			return false
		}
		if s.free.CompareAndSwap(n, n-1) {
			u := s.used.Add(1)
			for {
				m := s.maxUsed.Load()
				if u <= m || s.maxUsed.CompareAndSwap(m, u) {
					break
				}
			}
			return true
		}
	}
}

func (s *slotSet) give() {
	s.used.Add(-1)
	s.free.Add(1)
}

// A request woken whose pick then fails goes back to its old place, ahead
// of requests that came after it.
func TestBufferAcquireKeepsPlace(t *testing.T) {
	b := NewBufferWithOptions(BufferOptions{Capacity: 4, RetryInterval: -1})
	var s slotSet
	done := map[string]chan error{"A": make(chan error, 1), "B": make(chan error, 1)}
	for i, name := range []string{"A", "B"} {
		go func() {
			_, err := b.Acquire(context.Background(), 0, time.Time{}, s.take)
			done[name] <- err
		}()
		awaitRouting(t, name+" queued", func() bool { return b.Len() == i+1 })
	}
	// A wake-up with no room: A retries, fails, and returns to the head.
	if n := b.Notify(1); n != 1 {
		t.Fatalf("Notify woke %d", n)
	}
	awaitRouting(t, "A back in the queue", func() bool { return b.Len() == 2 && settlingOf(b) == 0 })
	s.free.Store(1)
	b.Notify(1)
	if err := <-done["A"]; err != nil {
		t.Fatalf("A: %v", err)
	}
	awaitRouting(t, "B still queued", func() bool { return b.Len() == 1 && settlingOf(b) == 0 })
	if len(done["B"]) != 0 {
		t.Fatal("B got through with no room")
	}
	s.give()
	b.Notify(1)
	if err := <-done["B"]; err != nil {
		t.Fatalf("B: %v", err)
	}
}

// One Notify drains as many waiters as there is room: each success wakes
// the next waiter.
func TestBufferAcquireBatonDrainsRoom(t *testing.T) {
	cases := []struct{ waiters, room int }{{5, 5}, {8, 3}, {3, 10}}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%d waiters %d room", tc.waiters, tc.room), func(t *testing.T) {
			b := NewBufferWithOptions(BufferOptions{Capacity: tc.waiters, RetryInterval: -1})
			var s slotSet
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var through atomic.Int32
			var wg sync.WaitGroup
			for i := range tc.waiters {
				wg.Go(func() {
					if _, err := b.Acquire(ctx, 0, time.Time{}, s.take); err == nil {
						through.Add(1)
					}
				})
				awaitRouting(t, "queued", func() bool { return b.Len() == i+1 })
			}
			s.free.Store(int64(tc.room))
			b.Notify(1)
			want := min(tc.waiters, tc.room)
			awaitRouting(t, "room used", func() bool { return int(through.Load()) == want && settlingOf(b) == 0 })
			if n := b.Len(); n != tc.waiters-want {
				t.Fatalf("Len = %d, want %d", n, tc.waiters-want)
			}
			cancel()
			wg.Wait()
			if got := through.Load(); int(got) != want {
				t.Fatalf("%d got through, want %d", got, want)
			}
		})
	}
}

// Room that appears without a Notify is found by the head's retry.
func TestBufferAcquireRetrySafetyNet(t *testing.T) {
	b := NewBufferWithOptions(BufferOptions{Capacity: 4, RetryInterval: time.Millisecond})
	var s slotSet
	done := make(chan error, 1)
	var tk Ticket
	go func() {
		var err error
		tk, err = b.Acquire(context.Background(), 3, time.Time{}, s.take)
		done <- err
	}()
	awaitRouting(t, "queued", func() bool { return b.Len() == 1 })
	s.free.Store(1)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s.used.Load() != 1 {
		t.Fatal("slot not taken")
	}
	if !tk.Queued || tk.Priority != 3 || tk.Waited <= 0 {
		t.Fatalf("ticket %+v, want a queued one of priority 3", tk)
	}
}

// Wait at the head of the queue returns after the retry interval with no
// Notify, so a wake-up lost before it queued costs little.
func TestBufferWaitRetrySafetyNet(t *testing.T) {
	b := NewBufferWithOptions(BufferOptions{Capacity: 4, RetryInterval: time.Millisecond})
	for range 3 {
		if err := b.Wait(context.Background(), 0, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if n := b.Len(); n != 0 {
			t.Fatalf("Len = %d after the retry", n)
		}
	}
}

func TestBufferOnQueued(t *testing.T) {
	var queued atomic.Int32
	b := NewBufferWithOptions(BufferOptions{Capacity: 4, RetryInterval: -1, OnQueued: func(int) { queued.Add(1) }})
	if _, err := b.Acquire(context.Background(), 0, time.Time{}, func() bool { return true }); err != nil {
		t.Fatal(err)
	}
	if n := queued.Load(); n != 0 {
		t.Fatalf("OnQueued called %d times for a request that did not wait", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go b.Wait(ctx, 0, time.Time{})
	awaitRouting(t, "queued", func() bool { return b.Len() == 1 })
	cancel()
	if n := queued.Load(); n != 1 {
		t.Fatalf("OnQueued called %d times, want 1", n)
	}
}

// Many requests through a few slots, with cancellations and deadlines,
// the safety-net retry off: a lost wake-up leaves a patient request
// stuck (caught by its 20s ctx); an extra grant would overfill the slots.
func TestBufferAcquireStress(t *testing.T) {
	const (
		slots    = 3
		requests = 400
	)
	b := NewBufferWithOptions(BufferOptions{Capacity: requests, RetryInterval: -1})
	var s slotSet
	s.free.Store(slots)
	var ok, cancelled, expired, stuck atomic.Int32
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var deadline time.Time
			switch i % 5 {
			case 1:
				c, cancelSoon := context.WithCancel(ctx)
				defer cancelSoon()
				time.AfterFunc(time.Duration(rng.IntN(2000))*time.Microsecond, cancelSoon)
				ctx = c
			case 2:
				deadline = time.Now().Add(time.Duration(rng.IntN(2000)) * time.Microsecond)
			}
			_, err := b.Acquire(ctx, rng.IntN(3), deadline, s.take)
			switch {
			case err == nil:
				ok.Add(1)
				time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
				s.give()
				b.Notify(1)
			case errors.Is(err, context.DeadlineExceeded):
				stuck.Add(1)
			case errors.Is(err, context.Canceled):
				cancelled.Add(1)
			case errors.Is(err, ErrDeadline):
				expired.Add(1)
			default:
				t.Errorf("Acquire: %v", err)
			}
		})
	}
	wg.Wait()
	if n := stuck.Load(); n != 0 {
		t.Fatalf("%d requests never got a slot: a wake-up was lost", n)
	}
	if got := ok.Load() + cancelled.Load() + expired.Load(); got != requests {
		t.Fatalf("outcomes add to %d, want %d", got, requests)
	}
	if ok.Load() < requests*3/5 {
		t.Fatalf("only %d of %d patient-or-lucky requests got through", ok.Load(), requests)
	}
	if m := s.maxUsed.Load(); m > slots {
		t.Fatalf("%d slots used at once, only %d exist", m, slots)
	}
	if s.used.Load() != 0 || s.free.Load() != slots {
		t.Fatalf("slots not all back: used %d free %d", s.used.Load(), s.free.Load())
	}
	if b.Len() != 0 || settlingOf(b) != 0 {
		t.Fatalf("buffer not empty: Len %d settling %d", b.Len(), settlingOf(b))
	}
}

func BenchmarkBufferAcquireNoWait(b *testing.B) {
	buf := NewBuffer(1024)
	ctx := context.Background()
	yes := func() bool { return true }
	for b.Loop() {
		if _, err := buf.Acquire(ctx, 0, time.Time{}, yes); err != nil {
			b.Fatal(err)
		}
	}
}

// TestBufferFlowsTakeTurns: with one flow's backlog of 40 waiting, a
// second flow's 4 requests, queued after it, are served in turn with it
// (start-time fair queuing), not after its backlog; each flow keeps its
// own order, and priority still comes first.
func TestBufferFlowsTakeTurns(t *testing.T) {
	b := NewBufferWithOptions(BufferOptions{Capacity: 100, RetryInterval: -1})
	var mu sync.Mutex
	var order []string
	var room atomic.Int32
	try := func() Room {
		for {
			n := room.Load()
			if n <= 0 {
				return RoomNone
			}
			if room.CompareAndSwap(n, n-1) {
				return RoomTaken
			}
		}
	}
	var wg sync.WaitGroup
	queue := func(name string, priority int, flow Flow) {
		want := b.Len() + 1
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.AcquireFlow(context.Background(), priority, flow, time.Time{}, try); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
		}()
		for b.Len() < want {
			time.Sleep(time.Millisecond)
		}
	}
	for i := range 40 {
		queue(fmt.Sprint("heavy", i), 0, Flow{ID: "heavy", Cost: 10})
	}
	for i := range 4 {
		queue(fmt.Sprint("light", i), 0, Flow{ID: "light", Cost: 10})
	}
	queue("urgent", 50, Flow{ID: "heavy", Cost: 10})
	for i := range 45 {
		room.Add(1)
		b.Notify(1)
		for { // one at a time, so the order is the buffer's
			mu.Lock()
			n := len(order)
			mu.Unlock()
			// ...and the baton the last one passed has come back (the
			// woken waiter found no room), so the next Notify wakes the head.
			if n == i+1 && b.Len() == 45-n {
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	wg.Wait()
	if order[0] != "urgent" {
		t.Fatalf("the higher priority went %v, not first", order[:3])
	}
	lastLight, heavySeen := 0, 0
	for i, name := range order {
		if strings.HasPrefix(name, "light") {
			lastLight = i
		}
		if strings.HasPrefix(name, "heavy") {
			if name != fmt.Sprint("heavy", heavySeen) {
				t.Fatalf("heavy's own order broke: %v", order)
			}
			heavySeen++
		}
	}
	if lastLight > 9 {
		t.Fatalf("the light flow's 4 requests were served by position %d of %v; fair turns would serve them within the first 9", lastLight, order)
	}
}
