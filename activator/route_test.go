package activator

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestPowerOfTwoChoices(t *testing.T) {
	cases := []struct {
		name   string
		loads  []int
		always int   // index always chosen; -1 when none
		never  []int // indexes never chosen
		both   []int // indexes each chosen at least once (ties)
	}{
		{"empty", nil, -1, nil, nil},
		{"single", []int{7}, 0, nil, nil},
		{"two, second lighter", []int{3, 1}, 1, nil, nil},
		{"two, first lighter", []int{0, 9}, 0, nil, nil},
		{"tie is random", []int{2, 2}, -1, nil, []int{0, 1}},
		{"most loaded never", []int{0, 5, 9}, -1, []int{2}, []int{0, 1}},
		{"four", []int{4, 1, 8, 1}, -1, []int{2}, []int{0, 1, 3}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			cands := make([]Candidate, len(tc.loads))
			for i, l := range tc.loads {
				cands[i] = Candidate{ID: fmt.Sprint(i), InFlight: l}
			}
			seen := map[int]int{}
			for range 1000 {
				i := PowerOfTwoChoices(rng, cands)
				if len(cands) == 0 {
					if i != -1 {
						t.Fatalf("no candidates: chose %d", i)
					}
					return
				}
				if i < 0 || i >= len(cands) {
					t.Fatalf("chose %d of %d", i, len(cands))
				}
				seen[i]++
			}
			if tc.always >= 0 && seen[tc.always] != 1000 {
				t.Errorf("chose %v, want always %d", seen, tc.always)
			}
			for _, i := range tc.never {
				if seen[i] != 0 {
					t.Errorf("chose the most loaded %d %d times", i, seen[i])
				}
			}
			for _, i := range tc.both {
				if seen[i] == 0 {
					t.Errorf("never chose %d: %v", i, seen)
				}
			}
		})
	}
}

// p2cPool is a pool without prefix affinity or breakers.
func p2cPool(t testing.TB, onFree func(int), caps map[string]int) *Pool {
	t.Helper()
	p := NewPool(PoolOptions{Prefix: PrefixOptions{Disabled: true}, Breaker: BreakerOptions{Disabled: true}, OnFree: onFree, Seed: 42})
	for _, id := range slices.Sorted(mapKeys(caps)) {
		if err := p.Add(id, caps[id]); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func TestPoolPrefersLessLoaded(t *testing.T) {
	t.Run("two replicas alternate", func(t *testing.T) {
		p := p2cPool(t, nil, map[string]int{"a": 0, "b": 0})
		counts := map[string]int{}
		for range 10 {
			id, _, ok := p.Pick(nil)
			if !ok {
				t.Fatal("no pick")
			}
			counts[id]++
			if d := counts["a"] - counts["b"]; d > 1 || d < -1 {
				t.Fatalf("held picks %v: the less loaded was not chosen", counts)
			}
		}
	})
	for _, loaded := range []int{2, 3} {
		t.Run(fmt.Sprintf("an idle replica among %d loaded ones", loaded), func(t *testing.T) {
			caps := map[string]int{}
			for i := range loaded {
				caps[fmt.Sprint("busy", i)] = 0
			}
			p := p2cPool(t, nil, caps)
			for range 2 * loaded {
				if _, _, ok := p.Pick(nil); !ok {
					t.Fatal("no pick")
				}
			}
			if l := inflights(p); slices.Min(l) == 0 {
				t.Fatalf("loads %v: a replica stayed idle while others took two", l)
			}
			if err := p.Add("idle", 0); err != nil {
				t.Fatal(err)
			}
			// Idle is drawn with probability 2/(loaded+1) and then always wins.
			idle := 0
			const trials = 400
			for range trials {
				id, rel, _ := p.Pick(nil)
				if id == "idle" {
					idle++
				}
				rel(nil)
			}
			if want := trials * 2 / (loaded + 1) * 3 / 4; idle < want {
				t.Fatalf("idle replica chosen %d of %d times, want at least %d", idle, trials, want)
			}
		})
	}
}

func inflights(p *Pool) []int {
	var out []int
	for _, r := range p.Replicas() {
		out = append(out, r.InFlight)
	}
	return out
}

func spread(l []int) int { return slices.Max(l) - slices.Min(l) }

func TestPoolCapacity(t *testing.T) {
	cases := []struct {
		name  string
		caps  map[string]int
		picks int // how many succeed before the pool is full; -1: unlimited
	}{
		{"one slot each", map[string]int{"a": 1, "b": 1}, 2},
		{"mixed", map[string]int{"a": 3, "b": 1, "c": 2}, 6},
		{"unlimited", map[string]int{"a": 0}, -1},
		{"empty pool", map[string]int{}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := p2cPool(t, nil, tc.caps)
			want := tc.picks
			if want < 0 {
				want = 200
			}
			byID := map[string][]ReleaseFunc{}
			for range want {
				id, rel, ok := p.Pick([]byte("hello"))
				if !ok {
					t.Fatalf("pick failed with %v in flight", inflights(p))
				}
				byID[id] = append(byID[id], rel)
				if c := tc.caps[id]; c > 0 && p.InFlight(id) > c {
					t.Fatalf("%s has %d in flight, capacity %d", id, p.InFlight(id), c)
				}
			}
			if tc.picks < 0 {
				return
			}
			id, rel, ok := p.Pick(nil)
			if ok || id != "" {
				t.Fatalf("pick on a full pool = %q, %v", id, ok)
			}
			rel(nil) // the no-op release of a failed pick
			for id, rels := range byID {
				rels[0](nil)
				got, _, ok := p.Pick(nil)
				if !ok || got != id {
					t.Fatalf("after releasing one of %s, pick = %q, %v", id, got, ok)
				}
				break
			}
		})
	}
}

func TestPoolReleaseIsOnce(t *testing.T) {
	p := p2cPool(t, nil, map[string]int{"a": 2})
	_, r1, _ := p.Pick(nil)
	_, r2, _ := p.Pick(nil)
	for range 3 {
		r1(nil)
	}
	if n := p.InFlight("a"); n != 1 {
		t.Fatalf("in flight %d after releasing one request thrice, want 1", n)
	}
	r2(nil)
	r2(nil)
	if n := p.InFlight("a"); n != 0 {
		t.Fatalf("in flight %d, want 0", n)
	}
}

func TestPoolRemoveWithInFlight(t *testing.T) {
	var freed atomic.Int64
	p := p2cPool(t, func(n int) { freed.Add(int64(n)) }, map[string]int{"a": 0})
	var rels []ReleaseFunc
	for range 3 {
		_, rel, ok := p.Pick(nil)
		if !ok {
			t.Fatal("no pick")
		}
		rels = append(rels, rel)
	}
	drained, ok := p.Remove("a")
	if !ok {
		t.Fatal("Remove: unknown")
	}
	if _, ok := p.Remove("a"); ok {
		t.Fatal("second Remove found the replica")
	}
	if _, _, ok := p.Pick(nil); ok {
		t.Fatal("picked a removed replica")
	}
	if n := p.InFlight("a"); n != 3 {
		t.Fatalf("draining in flight = %d, want 3", n)
	}
	if err := p.Add("a", 1); err != nil { // a new incarnation under the same id
		t.Fatal(err)
	}
	freedBefore := freed.Load()
	for i, rel := range rels {
		select {
		case <-drained:
			t.Fatalf("drained with %d requests still in flight", 3-i)
		default:
		}
		rel(nil)
		rel(nil)
	}
	<-drained
	if got := freed.Load() - freedBefore; got != 0 {
		t.Fatalf("releases on a removed replica reported %d free slots", got)
	}
	if n := p.InFlight("a"); n != 0 {
		t.Fatalf("in flight %d after draining", n)
	}
	id, rel, ok := p.Pick(nil)
	if !ok || id != "a" || p.InFlight("a") != 1 {
		t.Fatalf("new incarnation: pick %q %v, in flight %d", id, ok, p.InFlight("a"))
	}
	rel(nil)
	if d, _ := p.Remove("a"); d == nil {
		t.Fatal("nil drained channel")
	} else {
		<-d // nothing in flight: closed at once
	}
}

func TestPoolOnFree(t *testing.T) {
	var events []int
	var mu sync.Mutex
	p := p2cPool(t, func(n int) { mu.Lock(); events = append(events, n); mu.Unlock() }, nil)
	steps := []struct {
		name string
		do   func() error
		want []int
	}{
		{"add capacity 4", func() error { return p.Add("a", 4) }, []int{4}},
		{"pick", func() error { p.Pick(nil); return nil }, nil},
		{"release", func() error {
			_, rel, _ := p.Pick(nil)
			rel(nil)
			rel(nil)
			return nil
		}, []int{1}},
		{"raise capacity", func() error { return p.SetCapacity("a", 6) }, []int{2}},
		{"lower capacity", func() error { return p.SetCapacity("a", 1) }, nil},
		{"unlimited capacity", func() error { return p.SetCapacity("a", 0) }, []int{math.MaxInt32}},
		{"add unlimited", func() error { return p.Add("b", 0) }, []int{math.MaxInt32}},
	}
	for _, st := range steps {
		mu.Lock()
		events = nil
		mu.Unlock()
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		mu.Lock()
		got := slices.Clone(events)
		mu.Unlock()
		if !slices.Equal(got, st.want) {
			t.Fatalf("%s: OnFree %v, want %v", st.name, got, st.want)
		}
	}
}

func TestPoolBadInput(t *testing.T) {
	p := p2cPool(t, nil, map[string]int{"a": 1})
	cases := []struct {
		name string
		err  error
	}{
		{"empty id", p.Add("", 1)},
		{"negative capacity", p.Add("b", -1)},
		{"duplicate", p.Add("a", 2)},
		{"capacity of unknown", p.SetCapacity("zz", 1)},
		{"negative set capacity", p.SetCapacity("a", -2)},
	}
	for _, tc := range cases {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	if n := p.Len(); n != 1 {
		t.Fatalf("Len = %d after bad adds, want 1", n)
	}
	if n := p.InFlight("nope"); n != 0 {
		t.Fatalf("InFlight of unknown = %d", n)
	}
	if _, ok := p.BreakerState("nope"); ok {
		t.Fatal("BreakerState of unknown found it")
	}
	if _, ok := p.Remove("nope"); ok {
		t.Fatal("Remove of unknown found it")
	}
}

// Picks and releases from many goroutines, with replicas coming and
// going: no replica ever exceeds its capacity and every count ends at zero.
func TestPoolConcurrentAccounting(t *testing.T) {
	for _, prefix := range []bool{false, true} {
		t.Run(fmt.Sprintf("prefix=%v", prefix), func(t *testing.T) {
			p := NewPool(PoolOptions{Prefix: PrefixOptions{Disabled: !prefix, MaxBlocksPerReplica: 64}, Seed: 9})
			caps := map[string]int{"a": 2, "b": 3, "c": 1, "d": 4}
			for id, c := range caps {
				if err := p.Add(id, c); err != nil {
					t.Fatal(err)
				}
			}
			mine := map[string]*atomic.Int64{}
			for id := range caps {
				mine[id] = new(atomic.Int64)
			}
			prompts := [][]byte{nil, make([]byte, 100), make([]byte, 300), make([]byte, 700)}
			for i, pr := range prompts {
				for j := range pr {
					pr[j] = byte(i*31 + j%7)
				}
			}
			var over, picked atomic.Int64
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(g), 1))
					var held []func()
					for range 2000 {
						if len(held) > 0 && (len(held) > 3 || rng.IntN(2) == 0) {
							k := rng.IntN(len(held))
							held[k]()
							held = slices.Delete(held, k, k+1)
							continue
						}
						id, rel, ok := p.Pick(prompts[rng.IntN(len(prompts))])
						if !ok {
							continue
						}
						picked.Add(1)
						if n := mine[id].Add(1); n > int64(caps[id]) {
							over.Add(1)
						}
						held = append(held, func() {
							mine[id].Add(-1)
							rel(nil)
							rel(nil)
						})
					}
					for _, h := range held {
						h()
					}
				})
			}
			// Churn: remove and re-add "d" while the others pick.
			wg.Go(func() {
				for range 50 {
					if d, ok := p.Remove("d"); ok {
						<-d
					}
					if err := p.Add("d", caps["d"]); err != nil {
						t.Error(err)
						return
					}
				}
			})
			wg.Wait()
			if n := over.Load(); n != 0 {
				t.Fatalf("%d picks went over a replica's capacity", n)
			}
			if picked.Load() == 0 {
				t.Fatal("nothing was picked")
			}
			for _, r := range p.Replicas() {
				if r.InFlight != 0 || p.InFlight(r.ID) != 0 {
					t.Fatalf("replica %s ends with %d in flight", r.ID, r.InFlight)
				}
			}
		})
	}
}

// The pool and the buffer together, as the proxy uses them: requests that
// find no room wait and get through as others release.
func TestPoolWithBuffer(t *testing.T) {
	buf := NewBufferWithOptions(BufferOptions{Capacity: 100, RetryInterval: -1})
	p := NewPool(PoolOptions{OnFree: func(n int) { buf.Notify(n) }, Seed: 3})
	caps := map[string]int{"a": 2, "b": 1}
	mine := map[string]*atomic.Int64{"a": new(atomic.Int64), "b": new(atomic.Int64)}
	var over atomic.Int64
	var wg sync.WaitGroup
	const requests = 60
	var through atomic.Int64
	for i := range requests {
		if i == requests/2 {
			for id, c := range caps {
				if err := p.Add(id, c); err != nil {
					t.Fatal(err)
				}
			}
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var id string
			var release ReleaseFunc
			_, err := buf.Acquire(ctx, i%3, time.Time{}, func() bool {
				var ok bool
				id, release, ok = p.Pick(fmt.Appendf(nil, "prompt %d", i))
				return ok
			})
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			if n := mine[id].Add(1); n > int64(caps[id]) {
				over.Add(1)
			}
			time.Sleep(100 * time.Microsecond)
			mine[id].Add(-1)
			through.Add(1)
			release(nil)
		})
	}
	wg.Wait()
	if n := through.Load(); n != requests {
		t.Fatalf("%d of %d requests got through", n, requests)
	}
	if over.Load() != 0 {
		t.Fatalf("%d picks over capacity", over.Load())
	}
	if buf.Len() != 0 || p.InFlight("a") != 0 || p.InFlight("b") != 0 {
		t.Fatalf("left: buffer %d, in flight a %d b %d", buf.Len(), p.InFlight("a"), p.InFlight("b"))
	}
}

// benchPrompts returns n prompts of about size bytes sharing 8 prefixes of
// half that size.
func benchPrompts(n, size int) [][]byte {
	rng := rand.New(rand.NewPCG(5, 6))
	prefixes := make([][]byte, 8)
	for i := range prefixes {
		prefixes[i] = randomText(rng, size/2)
	}
	out := make([][]byte, n)
	for i := range out {
		out[i] = append(slices.Clone(prefixes[rng.IntN(len(prefixes))]), randomText(rng, size-size/2)...)
	}
	return out
}

func randomText(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + rng.IntN(26))
	}
	return b
}

func BenchmarkPoolPick(b *testing.B) {
	prompts := benchPrompts(1024, 2048)
	for _, prefix := range []bool{true, false} {
		for _, n := range []int{4, 64} {
			name := fmt.Sprintf("prefix=%v/replicas=%d", prefix, n)
			b.Run(name, func(b *testing.B) {
				p := NewPool(PoolOptions{Prefix: PrefixOptions{Disabled: !prefix}, Seed: 1})
				for i := range n {
					p.Add(fmt.Sprint("r", i), 64)
				}
				i := 0
				for b.Loop() {
					_, rel, ok := p.Pick(prompts[i%len(prompts)])
					if !ok {
						b.Fatal("no pick")
					}
					rel(nil)
					i++
				}
			})
			b.Run(name+"/parallel", func(b *testing.B) {
				p := NewPool(PoolOptions{Prefix: PrefixOptions{Disabled: !prefix}, Seed: 1})
				for i := range n {
					p.Add(fmt.Sprint("r", i), 0)
				}
				var next atomic.Int64
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						_, rel, ok := p.Pick(prompts[int(next.Add(1))%len(prompts)])
						if !ok {
							b.Fatal("no pick")
						}
						rel(nil)
					}
				})
			})
		}
	}
}
