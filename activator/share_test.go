package activator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/openai"
)

func TestFlowSharesAdmits(t *testing.T) {
	const window = int64(time.Second)
	for _, tc := range []struct {
		name        string
		inflight    map[string]int
		seenAgo     map[string]time.Duration // default: just now
		flow        string
		free, total int
		want        bool
	}{
		{name: "alone takes the last slot", inflight: map[string]int{"a": 15}, flow: "a", free: 1, total: 16, want: true},
		{name: "the shared flow is not held", inflight: map[string]int{"a": 1}, flow: "", free: 1, total: 16, want: true},
		{name: "no limit, no shares", inflight: map[string]int{"a": 15, "b": 0}, flow: "a", free: 1, total: 0, want: true},
		{name: "over its share, the last slot stays for the other", inflight: map[string]int{"a": 15, "b": 0}, flow: "a", free: 1, total: 16, want: false},
		{name: "over its share with two free", inflight: map[string]int{"a": 14, "b": 0}, flow: "a", free: 2, total: 16, want: true},
		{name: "below its share takes the last slot", inflight: map[string]int{"a": 15, "b": 0}, flow: "b", free: 1, total: 16, want: true},
		{name: "one kept for each flow below its share", inflight: map[string]int{"a": 10, "b": 1, "c": 0}, flow: "a", free: 2, total: 16, want: false},
		{name: "flows at their share keep nothing", inflight: map[string]int{"a": 8, "b": 8}, flow: "a", free: 1, total: 17, want: true},
		{name: "an idle flow past the window is forgotten", inflight: map[string]int{"a": 15, "b": 0}, seenAgo: map[string]time.Duration{"b": 2 * time.Second},
			flow: "a", free: 1, total: 16, want: true},
		{name: "a flow in flight stays active past the window", inflight: map[string]int{"a": 14, "b": 1}, seenAgo: map[string]time.Duration{"b": time.Hour},
			flow: "a", free: 1, total: 16, want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const now = int64(1e12)
			s := newFlowShares(time.Duration(window))
			for id, n := range tc.inflight {
				s.flows[id] = &flowUse{inflight: n, seen: now - int64(tc.seenAgo[id])}
			}
			if got := s.admits(tc.flow, tc.free, tc.total, now); got != tc.want {
				t.Fatalf("admits(%q, free %d, total %d) = %v, want %v", tc.flow, tc.free, tc.total, got, tc.want)
			}
		})
	}
}

// TestPoolShares: a heavy flow fills the pool alone, gives a slot back,
// and cannot take it again while a light flow is active; the light flow
// gets it at once, and once the light flow has been idle past the window
// the heavy one may take every slot again.
func TestPoolShares(t *testing.T) {
	now := int64(1e12)
	p := NewPool(PoolOptions{Prefix: PrefixOptions{Disabled: true}, Breaker: BreakerOptions{Disabled: true}, ShareWindow: time.Second})
	p.now = func() int64 { return now }
	if err := p.Add("r", 4); err != nil {
		t.Fatal(err)
	}
	var heavy []ReleaseFunc
	for range 4 {
		_, rel, room := p.PickFor("heavy", nil)
		if room != RoomTaken {
			t.Fatal("a flow alone could not fill the pool")
		}
		heavy = append(heavy, rel)
	}
	if _, _, room := p.PickFor("light", nil); room != RoomNone {
		t.Fatalf("a full pool answered %v, want RoomNone", room)
	}
	heavy[0](nil)
	if _, _, room := p.PickFor("heavy", nil); room != RoomHeld {
		t.Fatalf("the heavy flow got %v for the last slot while the light one waited for it, want RoomHeld", room)
	}
	_, light, room := p.PickFor("light", nil)
	if room != RoomTaken {
		t.Fatal("the light flow did not get the slot kept for it")
	}
	light(nil)
	now += int64(500 * time.Millisecond)
	if _, _, room := p.PickFor("heavy", nil); room != RoomHeld {
		t.Fatalf("the heavy flow got %v for the slot of a flow active within the window, want RoomHeld", room)
	}
	now += int64(2 * time.Second)
	if _, _, room := p.PickFor("heavy", nil); room != RoomTaken {
		t.Fatal("the heavy flow is still held back by a flow idle past the window")
	}
}

// TestServeLightFlowBesideHeavy: one tenant holds every slot of a replica
// and keeps a backlog waiting; another tenant's requests, one after
// another, are each served while all of the heavy tenant's stay stuck on
// the engine, so none of them waits for a heavy request to end.
func TestServeLightFlowBesideHeavy(t *testing.T) {
	unblock := make(chan struct{})
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), "heavy") {
			select {
			case <-unblock:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"text_completion","choices":[{"text":"ok"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	defer engine.Close()
	defer close(unblock)
	spec := config.Default()
	spec.Buffer.Capacity, spec.Buffer.Timeout = 100, config.Duration(time.Minute)
	a := New(Options{Resolver: &testResolver{spec: spec}, Admit: func(_ context.Context, _ http.ResponseWriter, r AdmitRequest) (Admitted, *openai.Error) {
		return Admitted{Flow: strings.TrimSuffix(r.RequestID, "-req")}, nil
	}})
	ts := httptest.NewServer(a)
	defer ts.Close()
	a.AddReplica("m", "r", strings.TrimPrefix(engine.URL, "http://"), 4)
	send := func(ctx context.Context, tenant string) (int, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/completions",
			strings.NewReader(fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":1}`, tenant)))
		req.Header.Set("X-Request-Id", tenant+"-req")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for range 20 {
		wg.Add(1)
		go func() { defer wg.Done(); send(ctx, "heavy") }()
	}
	for a.InFlight("m", "r") < 4 || bufferLen(a, "m") < 16 {
		time.Sleep(time.Millisecond)
	}
	// The heavy tenant holds all 4 slots with 16 more waiting; the light
	// tenant first finds none free, and its request takes the first the
	// heavy tenant's share leaves it: a heavy request must end for that.
	done := make(chan int, 1)
	go func() { code, _ := send(ctx, "light"); done <- code }()
	for bufferLen(a, "m") < 17 {
		time.Sleep(time.Millisecond)
	}
	select {
	case code := <-done:
		t.Fatalf("the light request was answered (%d) with every slot held", code)
	case <-time.After(50 * time.Millisecond):
	}
	unblock <- struct{}{} // one heavy request ends: its slot is the light one's
	if code := <-done; code != http.StatusOK {
		t.Fatalf("light request: status %d", code)
	}
	for i := range 10 {
		code, err := send(ctx, "light")
		if err != nil || code != http.StatusOK {
			t.Fatalf("light request %d beside the heavy backlog: %d %v", i, code, err)
		}
	}
	if n := a.InFlight("m", "r"); n != 3 {
		t.Fatalf("%d requests in flight, want the heavy tenant's 3 (one slot kept for the light one)", n)
	}
}

// TestBufferHandsHeldRoom: room that a heavy flow's waiters are held back
// from reaches a light flow's waiter behind them (a hand-over), and, with
// no light waiter to take it, a light request arriving later tries at
// once instead of queueing behind them.
func TestBufferHandsHeldRoom(t *testing.T) {
	b := NewBufferWithOptions(BufferOptions{Capacity: 100, RetryInterval: -1})
	var mu sync.Mutex
	free, heldFor := 0, ""
	tryFor := func(flow string) func() Room {
		return func() Room {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case free == 0:
				return RoomNone
			case flow == heldFor:
				return RoomHeld
			}
			free--
			return RoomTaken
		}
	}
	setRoom := func(n int, held string) {
		mu.Lock()
		free, heldFor = n, held
		mu.Unlock()
	}
	heavy := Flow{ID: "heavy", Cost: 10}
	light := Flow{ID: "light", Cost: 1000} // so its next turn is behind the heavy waiters'
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 3 {
		go b.AcquireFlow(ctx, 0, heavy, time.Time{}, tryFor("heavy"))
	}
	for b.Len() < 3 {
		time.Sleep(time.Millisecond)
	}
	acquire := func() chan error {
		done := make(chan error, 1)
		go func() {
			_, err := b.AcquireFlow(ctx, 0, light, time.Time{}, tryFor("light"))
			done <- err
		}()
		return done
	}
	first := acquire()
	for b.Len() < 4 {
		time.Sleep(time.Millisecond)
	}
	setRoom(1, "heavy")
	b.Notify(1) // wakes the head, a heavy request: held back, it hands over
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	setRoom(1, "heavy")
	b.Notify(1) // held back again, with no light waiter to hand over to
	for b.Len() != 3 {
		time.Sleep(time.Millisecond)
	}
	select { // queued, it would wait for a Notify that never comes
	case err := <-acquire():
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the light request queued behind the held-back heavy ones")
	}
	if n := b.Len(); n != 3 {
		t.Fatalf("%d waiting, want the 3 heavy requests", n)
	}
}

// TestBufferShedsLowestPriority: a full buffer makes room for a request of
// a higher priority by shedding the newest of its lowest-priority waiters,
// and refuses one of the same priority or lower.
func TestBufferShedsLowestPriority(t *testing.T) {
	b := NewBufferWithOptions(BufferOptions{Capacity: 3, RetryInterval: -1})
	never := func() Room { return RoomNone }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	results := map[string]chan error{}
	queue := func(name string, priority int) {
		done := make(chan error, 1)
		results[name] = done
		want := b.Len() + 1
		go func() {
			_, err := b.AcquireFlow(ctx, priority, Flow{}, time.Time{}, never)
			done <- err
		}()
		for b.Len() < want {
			time.Sleep(time.Millisecond)
		}
	}
	queue("batch-old", PriorityBatch)
	queue("batch-new", PriorityBatch)
	queue("standard", PriorityInteractive)
	if _, err := b.AcquireFlow(ctx, PriorityBatch, Flow{}, time.Time{}, never); !errors.Is(err, ErrBufferFull) {
		t.Fatalf("a batch request at a full buffer: %v, want ErrBufferFull", err)
	}
	done := make(chan error, 1)
	go func() { _, err := b.AcquireFlow(ctx, PriorityInteractiveMax, Flow{}, time.Time{}, never); done <- err }()
	if err := <-results["batch-new"]; !errors.Is(err, ErrShed) {
		t.Fatalf("the newest batch request: %v, want ErrShed", err)
	}
	for b.Len() < 3 {
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-results["batch-old"]:
		t.Fatalf("the older batch request left too: %v", err)
	case err := <-done:
		t.Fatalf("the interactive request left: %v", err)
	default:
	}
}
