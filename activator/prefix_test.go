package activator

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestPrefixChain(t *testing.T) {
	seed := maphash.MakeSeed()
	rng := rand.New(rand.NewPCG(1, 1))
	base := randomText(rng, 1000)
	with := func(at int) []byte { // base with byte at changed
		b := slices.Clone(base)
		b[at] ^= 1
		return b
	}
	cases := []struct {
		name      string
		a, b      []byte
		block     int
		max       int
		lenA      int
		sameUntil int // leading hashes a and b share
	}{
		{"empty", nil, nil, 64, 512, 0, 0},
		{"shorter than a block", base[:63], base[:63], 64, 512, 0, 0},
		{"exactly a block", base[:64], base[:64], 64, 512, 1, 1},
		{"partial last block ignored", base[:130], base[:128], 64, 512, 2, 2},
		{"differ in block 2", base, with(150), 64, 512, 15, 2},
		{"differ in block 0", base, with(10), 64, 512, 15, 0},
		{"differ in the ignored tail", base[:1000], with(999), 64, 512, 15, 15},
		{"capped", base, base, 64, 4, 4, 4},
		{"small blocks", base[:100], with(50)[:100], 10, 512, 10, 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ha := prefixChain(seed, tc.a, tc.block, tc.max, nil)
			hb := prefixChain(seed, tc.b, tc.block, tc.max, nil)
			if len(ha) != tc.lenA {
				t.Fatalf("%d hashes, want %d", len(ha), tc.lenA)
			}
			same := 0
			for same < min(len(ha), len(hb)) && ha[same] == hb[same] {
				same++
			}
			if same != tc.sameUntil {
				t.Fatalf("share %d leading hashes, want %d", same, tc.sameUntil)
			}
			for i := same; i < min(len(ha), len(hb)); i++ {
				if ha[i] == hb[i] {
					t.Fatalf("hash %d equal after the chains diverged", i)
				}
			}
		})
	}
	t.Run("chained: a repeated block hashes differently", func(t *testing.T) {
		b := bytes.Repeat(base[:64], 3)
		h := prefixChain(seed, b, 64, 512, nil)
		if h[0] == h[1] || h[1] == h[2] || h[0] == h[2] {
			t.Fatalf("repeated blocks share hashes: %x", h)
		}
	})
}

// chainOf is a test chain of distinct hashes start, start+1, ...
func chainOf(start uint64, n int) []uint64 {
	c := make([]uint64, n)
	for i := range c {
		c[i] = start + uint64(i)
	}
	return c
}

// matchOwners runs match for owners (candidate i is owner ids[i]).
func matchOwners(x *prefixIndex, epoch uint64, chain []uint64, ids ...int32) []Candidate {
	cands := make([]Candidate, len(ids))
	for i, id := range ids {
		x.owners[id].slot, x.owners[id].epoch = i, epoch
	}
	x.match(chain, epoch, cands)
	return cands
}

// checkIndex verifies the index's links and counts.
func checkIndex(t *testing.T, x *prefixIndex) {
	t.Helper()
	live := 0
	for id, o := range x.owners {
		n, count := o.head, 0
		prev := int32(-1)
		for ; n >= 0; n = x.nodes[n].lruNext {
			if x.nodes[n].owner != int32(id) || x.nodes[n].lruPrev != prev {
				t.Fatalf("owner %d: broken LRU link at node %d", id, n)
			}
			prev = n
			count++
		}
		if count != o.count || prev != o.tail {
			t.Fatalf("owner %d: count %d tail %d, list has %d ending at %d", id, o.count, o.tail, count, prev)
		}
		if o.count > x.max {
			t.Fatalf("owner %d holds %d > %d", id, o.count, x.max)
		}
		live += count
	}
	inHash := 0
	for h, n := range x.heads {
		prev := int32(-1)
		for ; n >= 0; n = x.nodes[n].ownNext {
			if x.nodes[n].hash != h || x.nodes[n].ownPrev != prev {
				t.Fatalf("hash %x: broken owner link at node %d", h, n)
			}
			prev = n
			inHash++
		}
	}
	if inHash != live {
		t.Fatalf("%d nodes in owner lists, %d in LRU lists", inHash, live)
	}
}

func TestPrefixIndex(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, x *prefixIndex)
	}{
		{"longest prefix per owner", func(t *testing.T, x *prefixIndex) {
			a, b := x.addOwner(), x.addOwner()
			x.record(a, chainOf(100, 4))
			x.record(b, chainOf(100, 2))
			x.record(b, chainOf(100, 2))
			c := matchOwners(x, 1, chainOf(100, 8), a, b)
			if c[0].Prefix != 4 || c[1].Prefix != 2 {
				t.Fatalf("prefixes %d %d, want 4 2", c[0].Prefix, c[1].Prefix)
			}
			if c[0].PrefixUses != 1 || c[1].PrefixUses != 2 {
				t.Fatalf("uses %d %d, want 1 2", c[0].PrefixUses, c[1].PrefixUses)
			}
			if c := matchOwners(x, 2, chainOf(999, 3), a, b); c[0].Prefix != 0 || c[1].Prefix != 0 {
				t.Fatal("an unrelated chain matched")
			}
		}},
		{"non-candidate owners are skipped", func(t *testing.T, x *prefixIndex) {
			a, b := x.addOwner(), x.addOwner()
			x.record(a, chainOf(1, 3))
			x.record(b, chainOf(1, 3))
			x.owners[a].epoch = 0 // stale epoch: a is no candidate this pick
			c := matchOwners(x, 7, chainOf(1, 3), b)
			if c[0].Prefix != 3 {
				t.Fatalf("b prefix %d, want 3", c[0].Prefix)
			}
		}},
		{"LRU bound keeps a prompt's first blocks", func(t *testing.T, x *prefixIndex) {
			a := x.addOwner()
			x.record(a, chainOf(10, 6)) // max is 4: blocks 0..3 stay
			if n := x.owners[a].count; n != 4 {
				t.Fatalf("holds %d, want 4", n)
			}
			if c := matchOwners(x, 1, chainOf(10, 6), a); c[0].Prefix != 4 {
				t.Fatalf("prefix %d, want 4", c[0].Prefix)
			}
			x.record(a, chainOf(50, 3)) // evicts the 3 least recent
			if c := matchOwners(x, 2, chainOf(10, 6), a); c[0].Prefix != 1 {
				t.Fatalf("after eviction prefix %d, want 1", c[0].Prefix)
			}
			if c := matchOwners(x, 3, chainOf(50, 3), a); c[0].Prefix != 3 {
				t.Fatalf("new chain prefix %d, want 3", c[0].Prefix)
			}
		}},
		{"drop owner forgets only its blocks", func(t *testing.T, x *prefixIndex) {
			a, b := x.addOwner(), x.addOwner()
			x.record(a, chainOf(1, 4))
			x.record(b, chainOf(1, 3))
			x.dropOwner(a)
			checkIndex(t, x)
			c := matchOwners(x, 1, chainOf(1, 4), b)
			if c[0].Prefix != 3 {
				t.Fatalf("b prefix %d, want 3", c[0].Prefix)
			}
			if len(x.heads) != 3 {
				t.Fatalf("%d hashes indexed, want 3", len(x.heads))
			}
			x.dropOwner(b)
			if len(x.heads) != 0 {
				t.Fatalf("%d hashes left after dropping every owner", len(x.heads))
			}
			c2 := x.addOwner()
			if c2 != a && c2 != b {
				t.Fatalf("owner id %d not reused", c2)
			}
			x.record(c2, chainOf(7, 4))
			if m := matchOwners(x, 2, chainOf(7, 4), c2); m[0].Prefix != 4 {
				t.Fatalf("reused owner prefix %d", m[0].Prefix)
			}
			if len(x.nodes) > 8 {
				t.Fatalf("arena grew to %d: freed nodes not reused", len(x.nodes))
			}
		}},
		{"random churn keeps links consistent", func(t *testing.T, x *prefixIndex) {
			rng := rand.New(rand.NewPCG(3, 3))
			var ids []int32
			for range 3 {
				ids = append(ids, x.addOwner())
			}
			for i := range 3000 {
				switch r := rng.IntN(100); {
				case r < 3 && len(ids) > 0:
					k := rng.IntN(len(ids))
					x.dropOwner(ids[k])
					ids = slices.Delete(ids, k, k+1)
				case r < 6:
					ids = append(ids, x.addOwner())
				case len(ids) > 0:
					x.record(ids[rng.IntN(len(ids))], chainOf(uint64(rng.IntN(20)*100), 1+rng.IntN(7)))
				}
				if i%97 == 0 {
					checkIndex(t, x)
				}
			}
			checkIndex(t, x)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			x := newPrefixIndex(4)
			tc.run(t, x)
			checkIndex(t, x)
		})
	}
}

func TestPrefixAffinityPolicy(t *testing.T) {
	type cand struct {
		id             string
		inflight, capa int
		prefix         int
		uses           uint32
	}
	cases := []struct {
		name  string
		cands []cand
		want  []string // acceptable choices
	}{
		{"longest prefix", []cand{{"a", 0, 0, 2, 9}, {"b", 1, 0, 5, 1}, {"c", 0, 0, 0, 0}}, []string{"b"}},
		{"more uses among equals", []cand{{"a", 0, 0, 4, 3}, {"b", 1, 0, 4, 7}}, []string{"b"}},
		{"less loaded among equals", []cand{{"a", 2, 0, 4, 3}, {"b", 1, 0, 4, 3}}, []string{"b"}},
		{"within the slack", []cand{{"a", 2, 0, 3, 1}, {"b", 0, 0, 0, 0}}, []string{"a"}},
		{"over the slack falls back", []cand{{"a", 3, 0, 3, 1}, {"b", 0, 0, 0, 0}, {"c", 1, 0, 0, 0}}, []string{"b", "c"}},
		{"fallback skips the overloaded", []cand{{"a", 9, 0, 3, 1}, {"b", 0, 0, 0, 0}, {"c", 8, 0, 0, 0}}, []string{"b"}},
		{"slack grows with capacity", []cand{{"a", 10, 40, 3, 1}, {"b", 0, 40, 0, 0}}, []string{"a"}},
		{"slack from capacity is bounded", []cand{{"a", 11, 40, 3, 1}, {"b", 0, 40, 0, 0}}, []string{"b"}},
		{"no prefix: two choices", []cand{{"a", 1, 0, 0, 0}, {"b", 0, 0, 0, 0}}, []string{"b"}},
	}
	policy := PrefixAffinity(PrefixOptions{}, nil)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(8, 8))
			for range 50 {
				cands := make([]Candidate, len(tc.cands))
				for i, c := range tc.cands {
					cands[i] = Candidate{ID: c.id, InFlight: c.inflight, Capacity: c.capa, Prefix: c.prefix, PrefixUses: c.uses}
				}
				i := policy(rng, cands)
				if i < 0 || i >= len(cands) || !slices.Contains(tc.want, cands[i].ID) {
					t.Fatalf("chose %d (%v), want one of %v", i, cands, tc.want)
				}
			}
		})
	}
	if i := policy(rand.New(rand.NewPCG(1, 1)), nil); i != -1 {
		t.Fatalf("no candidates: chose %d", i)
	}
}

// Many prompts over 8 shared 1 KB prefixes and 4 replicas: each prefix
// mostly lands on one replica, and no pick ever lands on a replica more
// than its slack above the least loaded candidate.
func TestPoolSharedPrefixWorkload(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) {
			const (
				replicas = 4
				capacity = 16
				window   = 8 // requests in flight at once
				requests = 4000
			)
			opts := PrefixOptions{}.withDefaults()
			inner := PrefixAffinity(opts, nil)
			var violations, picks int
			checked := func(rng *rand.Rand, cands []Candidate) int {
				least := cands[0].InFlight
				for _, c := range cands {
					least = min(least, c.InFlight)
				}
				i := inner(rng, cands)
				picks++
				if cands[i].InFlight-least > opts.slack(cands[i].Capacity) {
					violations++
				}
				return i
			}
			p := NewPool(PoolOptions{Policy: checked, Seed: seed})
			for i := range replicas {
				if err := p.Add(fmt.Sprint("r", i), capacity); err != nil {
					t.Fatal(err)
				}
			}
			rng := rand.New(rand.NewPCG(seed, 99))
			prefixes := make([][]byte, 8)
			for i := range prefixes {
				prefixes[i] = randomText(rng, 1024)
			}
			landed := make([]map[string]int, len(prefixes))
			for i := range landed {
				landed[i] = map[string]int{}
			}
			perReplica := map[string]int{}
			var held []ReleaseFunc
			for range requests {
				if len(held) == window {
					k := rng.IntN(len(held))
					held[k](nil)
					held = slices.Delete(held, k, k+1)
				}
				which := rng.IntN(len(prefixes))
				prompt := append(slices.Clone(prefixes[which]), randomText(rng, 64+rng.IntN(512))...)
				id, rel, ok := p.Pick(prompt)
				if !ok {
					t.Fatal("no pick")
				}
				landed[which][id]++
				perReplica[id]++
				held = append(held, rel)
			}
			for _, rel := range held {
				rel(nil)
			}
			if violations != 0 {
				t.Fatalf("%d of %d picks went more than the slack above the least loaded", violations, picks)
			}
			worst := 1.0
			for i, m := range landed {
				total, top := 0, 0
				for _, n := range m {
					total += n
					top = max(top, n)
				}
				worst = min(worst, float64(top)/float64(total))
				if top*5 < total*4 {
					t.Errorf("prefix %d: top replica got %d of %d requests (%v), want at least 80%%", i, top, total, m)
				}
			}
			for id, n := range perReplica {
				if n < requests/replicas/4 {
					t.Errorf("replica %s got only %d of %d requests: %v", id, n, requests, perReplica)
				}
			}
			t.Logf("per replica %v; worst prefix concentration %.3f", perReplica, worst)
		})
	}
}

func TestPoolShortPromptsHaveNoAffinity(t *testing.T) {
	p := NewPool(PoolOptions{Seed: 4})
	for _, id := range []string{"a", "b"} {
		p.Add(id, 0)
	}
	counts := map[string]int{}
	for range 10 {
		id, _, ok := p.Pick([]byte("short prompt under one block"))
		if !ok {
			t.Fatal("no pick")
		}
		counts[id]++
	}
	if counts["a"] != 5 || counts["b"] != 5 {
		t.Fatalf("held short prompts landed %v, want 5 and 5 (least loaded)", counts)
	}
	if n := len(p.index.heads); n != 0 {
		t.Fatalf("short prompts indexed %d hashes", n)
	}
}

func TestPoolRemoveDropsPrefixIndex(t *testing.T) {
	p := NewPool(PoolOptions{Seed: 5})
	p.Add("a", 0)
	prompt := randomText(rand.New(rand.NewPCG(1, 2)), 640)
	for range 3 {
		_, rel, _ := p.Pick(prompt)
		rel(nil)
	}
	if n := len(p.index.heads); n != 10 {
		t.Fatalf("%d hashes indexed, want 10", n)
	}
	p.Add("b", 0)
	if _, ok := p.Remove("a"); !ok {
		t.Fatal("remove")
	}
	if n := len(p.index.heads); n != 0 {
		t.Fatalf("%d hashes left after removing their replica", n)
	}
	checkIndex(t, p.index)
	// b now takes the prompt and becomes its home.
	for range 3 {
		id, rel, _ := p.Pick(prompt)
		if id != "b" {
			t.Fatalf("picked %q", id)
		}
		rel(nil)
	}
	if n := len(p.index.heads); n != 10 {
		t.Fatalf("%d hashes indexed for b, want 10", n)
	}
}

func BenchmarkPrefixChain2KB(b *testing.B) {
	seed := maphash.MakeSeed()
	prompt := benchPrompts(1, 2048)[0]
	var buf [64]uint64
	b.SetBytes(int64(len(prompt)))
	for b.Loop() {
		prefixChain(seed, prompt, 64, 512, buf[:0])
	}
}
