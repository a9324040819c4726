package kvcache

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// tokensFrom returns n token ids that depend on seed, distinct across
// seeds with overwhelming probability.
func tokensFrom(seed uint64, n int) []int32 {
	rng := rand.New(rand.NewPCG(seed, 99))
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(rng.IntN(32000))
	}
	return out
}

// concat joins token slices into a new one.
func concat(parts ...[]int32) []int32 {
	var out []int32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// checkInvariants verifies the allocator's internal bookkeeping: every
// block is referenced, cached-free (in the queue, hashed) or free (on the
// free list, not hashed); the queue is well linked; the hash map and the
// blocks agree; reference counts equal appearances in live tables.
func checkInvariants(t *testing.T, m *Manager) {
	t.Helper()
	refs := make([]int32, len(m.blocks))
	for seq, s := range m.seqs {
		seen := map[int32]bool{}
		for _, b := range s.table {
			if seen[b] {
				t.Fatalf("sequence %d holds block %d twice: %v", seq, b, s.table)
			}
			seen[b] = true
			refs[b]++
		}
	}
	inQueue := make([]bool, len(m.blocks))
	n, prev := 0, noBlock
	for b := m.head; b != noBlock; b = m.blocks[b].next {
		if n > len(m.blocks) || inQueue[b] {
			t.Fatal("eviction queue has a cycle")
		}
		meta := m.blocks[b]
		if meta.prev != prev || meta.ref != 0 || !meta.hashed {
			t.Fatalf("queued block %d: prev %d (want %d), ref %d, hashed %v", b, meta.prev, prev, meta.ref, meta.hashed)
		}
		inQueue[b] = true
		prev = b
		n++
	}
	if prev != m.tail || n != m.queued {
		t.Fatalf("queue walk ends at %d after %d blocks; tail %d, queued %d", prev, n, m.tail, m.queued)
	}
	onFree := make([]bool, len(m.blocks))
	for _, b := range m.free {
		if onFree[b] || m.blocks[b].ref != 0 || m.blocks[b].hashed {
			t.Fatalf("free list entry %d: duplicate %v, ref %d, hashed %v", b, onFree[b], m.blocks[b].ref, m.blocks[b].hashed)
		}
		onFree[b] = true
	}
	used, hashed := 0, 0
	for b, meta := range m.blocks {
		if meta.ref != refs[b] {
			t.Fatalf("block %d has %d references, tables hold it %d times", b, meta.ref, refs[b])
		}
		states := 0
		if meta.ref > 0 {
			used++
			states++
		}
		if inQueue[b] {
			states++
		}
		if onFree[b] {
			states++
		}
		if states != 1 {
			t.Fatalf("block %d is in %d states (ref %d, queued %v, free %v)", b, states, meta.ref, inQueue[b], onFree[b])
		}
		if meta.hashed {
			hashed++
			if got, ok := m.byHash[meta.hash]; !ok || got != int32(b) {
				t.Fatalf("block %d's hash maps to %d (present %v)", b, got, ok)
			}
		}
	}
	if hashed != len(m.byHash) {
		t.Fatalf("%d hashed blocks but %d map entries", hashed, len(m.byHash))
	}
	if used != m.used || used+m.NumFreeBlocks() != m.NumBlocks() {
		t.Fatalf("%d referenced blocks (counter %d) + %d free != %d", used, m.used, m.NumFreeBlocks(), m.NumBlocks())
	}
	if !m.prefix && (len(m.byHash) != 0 || m.queued != 0) {
		t.Fatalf("prefix caching off but %d hashes, %d queued", len(m.byHash), m.queued)
	}
}

func TestAllocateAndFreeAccounting(t *testing.T) {
	type step struct {
		seq       uint64
		numTokens int  // -1: free seq
		ok        bool // expected Allocate result
		blocks    int  // seq's table length afterwards
		free      int  // NumFreeBlocks afterwards
	}
	steps := []step{
		{1, 1, true, 1, 3},
		{1, 16, true, 1, 3},
		{1, 17, true, 2, 2},
		{1, 10, true, 2, 2}, // never shrinks
		{1, 64, true, 4, 0},
		{1, 65, false, 4, 0},
		{2, 1, false, 0, 0},
		{2, 0, true, 0, 0}, // an empty table needs no block
		{1, -1, true, 0, 4},
		{2, 33, true, 3, 1},
		{3, 17, false, 0, 1},
		{3, 16, true, 1, 0},
		{2, -1, true, 0, 3},
		{3, -1, true, 0, 4},
	}
	for _, prefix := range []bool{false, true} {
		t.Run(fmt.Sprintf("prefix=%v", prefix), func(t *testing.T) {
			m := NewManager(4, prefix)
			tokens := tokensFrom(1, 80)
			for i, st := range steps {
				if st.numTokens < 0 {
					m.Free(st.seq)
					if m.Has(st.seq) || m.Table(st.seq) != nil {
						t.Fatalf("step %d: sequence %d still has a table after Free", i, st.seq)
					}
				} else if got := m.Allocate(st.seq, tokens, st.numTokens, nil, ""); got != st.ok {
					t.Fatalf("step %d: Allocate(%d, %d tokens) = %v, want %v", i, st.seq, st.numTokens, got, st.ok)
				}
				if got := len(m.Table(st.seq)); got != st.blocks {
					t.Fatalf("step %d: sequence %d has %d blocks, want %d", i, st.seq, got, st.blocks)
				}
				if got := m.NumFreeBlocks(); got != st.free {
					t.Fatalf("step %d: %d free blocks, want %d", i, got, st.free)
				}
				if got, want := m.Usage(), float64(4-st.free)/4; got != want {
					t.Fatalf("step %d: usage %v, want %v", i, got, want)
				}
				checkInvariants(t, m)
			}
			if m.NumBlocks() != 4 {
				t.Fatalf("NumBlocks = %d", m.NumBlocks())
			}
		})
	}
}

func TestManagerDegenerate(t *testing.T) {
	for _, n := range []int{0, -3} {
		m := NewManager(n, true)
		if m.NumBlocks() != 0 || m.NumFreeBlocks() != 0 || m.Usage() != 0 {
			t.Fatalf("NewManager(%d): %d blocks, %d free, usage %v", n, m.NumBlocks(), m.NumFreeBlocks(), m.Usage())
		}
		if m.Allocate(1, []int32{1}, 1, nil, "") {
			t.Fatalf("NewManager(%d) allocated a block", n)
		}
		m.Free(1) // unknown sequence: no-op
		checkInvariants(t, m)
	}
}

// snapshot copies the Manager's state for comparison.
type snapshot struct {
	Blocks        []blockMeta
	Free          []int32
	Head, Tail    int32
	Queued, Used  int
	ByHash        map[blockHash]int32
	Tables        map[uint64][]int32
	Queries, Hits int64
}

func snap(m *Manager) snapshot {
	s := snapshot{
		Blocks: slices.Clone(m.blocks), Free: slices.Clone(m.free),
		Head: m.head, Tail: m.tail, Queued: m.queued, Used: m.used,
		ByHash: map[blockHash]int32{}, Tables: map[uint64][]int32{},
		Queries: m.queries, Hits: m.hits,
	}
	for h, b := range m.byHash {
		s.ByHash[h] = b
	}
	for seq, st := range m.seqs {
		s.Tables[seq] = slices.Clone(st.table)
	}
	return s
}

func TestAllocateRefusalHasNoSideEffects(t *testing.T) {
	prefix := tokensFrom(2, 48)
	long := concat(prefix, tokensFrom(3, 40))
	for _, tc := range []struct {
		name   string
		seq    uint64
		tokens []int32
		n      int
		cached func(m *Manager) []int32
		extra  string
	}{
		// State for every case: pool of 6; sequence 1 (done) left its 3
		// full blocks in the eviction queue; sequence 2 holds 2 blocks
		// (20 tokens); 1 block is on the free list.
		{"existing sequence grows past the pool", 2, long, 20 + 5*BlockSize, nil, ""},
		{"new sequence needs more than the pool", 3, long, 5 * BlockSize, nil, ""},
		{"reclaimed cached blocks are not free", 3, long, 5*BlockSize + 1, func(m *Manager) []int32 {
			b, _ := m.LookupPrefix(long, "")
			return b
		}, ""},
		{"stale cached blocks", 3, long, 49, func(m *Manager) []int32 { return []int32{2, 1, 0} }, ""},
		{"cached for other tokens", 3, tokensFrom(4, 60), 49, func(m *Manager) []int32 {
			b, _ := m.LookupPrefix(long, "")
			return b
		}, ""},
		{"cached under another extra", 3, long, 49, func(m *Manager) []int32 {
			b, _ := m.LookupPrefix(long, "")
			return b
		}, "x"},
		{"cached id out of range", 3, long, 49, func(m *Manager) []int32 { return []int32{99} }, ""},
		{"cached longer than tokens", 3, long[:20], 20, func(m *Manager) []int32 {
			b, _ := m.LookupPrefix(long, "")
			return b
		}, ""},
		{"negative token count", 3, long, -1, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewManager(6, true)
			if !m.Allocate(1, prefix, 48, nil, "") || !m.Allocate(2, tokensFrom(5, 20), 20, nil, "") {
				t.Fatal("setup allocation failed")
			}
			m.Free(1)
			var cached []int32
			if tc.cached != nil {
				cached = tc.cached(m)
			}
			before := snap(m)
			if m.Allocate(tc.seq, tc.tokens, tc.n, cached, tc.extra) {
				t.Fatalf("Allocate(%d, %d tokens, cached %v) succeeded", tc.seq, tc.n, cached)
			}
			if after := snap(m); !reflect.DeepEqual(before, after) {
				t.Fatalf("refused Allocate changed state:\nbefore %+v\nafter  %+v", before, after)
			}
			checkInvariants(t, m)
		})
	}
}

func TestPrefixSharing(t *testing.T) {
	shared := tokensFrom(10, 32)
	a := concat(shared, tokensFrom(11, 8))
	b := concat(shared, tokensFrom(12, 8))
	m := NewManager(8, true)
	if !m.Allocate(1, a, len(a), nil, "") {
		t.Fatal("allocate a")
	}
	cached, hit := m.LookupPrefix(b, "")
	if hit != 32 || !slices.Equal(cached, m.Table(1)[:2]) {
		t.Fatalf("lookup of b: %v (%d tokens), want %v (32)", cached, hit, m.Table(1)[:2])
	}
	if !m.Allocate(2, b, len(b), cached, "") {
		t.Fatal("allocate b")
	}
	ta, tb := m.Table(1), m.Table(2)
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"shared block ids", tb[:2], ta[:2]},
		{"own last block", tb[2] != ta[2], true},
		{"shared refcounts", []int32{m.blocks[ta[0]].ref, m.blocks[ta[1]].ref}, []int32{2, 2}},
		{"private refcounts", []int32{m.blocks[ta[2]].ref, m.blocks[tb[2]].ref}, []int32{1, 1}},
		{"usage counts shared blocks once", m.Usage(), 4.0 / 8},
		{"free", m.NumFreeBlocks(), 4},
	} {
		if !reflect.DeepEqual(tc.got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	checkInvariants(t, m)

	m.Free(1)
	if m.blocks[ta[0]].ref != 1 || m.Usage() != 3.0/8 {
		t.Fatalf("after freeing a: shared ref %d, usage %v", m.blocks[ta[0]].ref, m.Usage())
	}
	// a's partial last block was never registered: straight to the free list.
	if m.blocks[ta[2]].hashed || !slices.Contains(m.free, ta[2]) {
		t.Fatalf("a's partial block %d: hashed %v, on free list %v", ta[2], m.blocks[ta[2]].hashed, slices.Contains(m.free, ta[2]))
	}
	m.Free(2)
	if m.Usage() != 0 || m.NumFreeBlocks() != 8 || m.queued != 2 {
		t.Fatalf("after freeing both: usage %v, free %d, queued %d", m.Usage(), m.NumFreeBlocks(), m.queued)
	}
	checkInvariants(t, m)
}

func TestIncrementalAllocationRegistersFilledBlocks(t *testing.T) {
	tokens := tokensFrom(20, 70)
	m := NewManager(8, true)
	// Chunked prefill of 20 tokens, then 30, then decode one at a time.
	steps := []struct{ numTokens, wantHashed int }{
		{20, 1}, {50, 3}, {63, 3}, {64, 4}, {65, 4}, {70, 4},
	}
	for _, st := range steps {
		if !m.Allocate(7, tokens[:st.numTokens], st.numTokens, nil, "") {
			t.Fatalf("allocate %d tokens", st.numTokens)
		}
		if got := len(m.byHash); got != st.wantHashed {
			t.Fatalf("after %d tokens: %d blocks registered, want %d", st.numTokens, got, st.wantHashed)
		}
		// A second reader sees exactly the registered blocks (minus the last token rule).
		_, hit := m.LookupPrefix(concat(tokens[:st.numTokens], []int32{0}), "")
		if hit != st.wantHashed*BlockSize {
			t.Fatalf("after %d tokens: lookup hits %d tokens, want %d", st.numTokens, hit, st.wantHashed*BlockSize)
		}
	}
	// Tokens known only up to 40 of 64 positions: only 2 blocks registered
	// until the rest is passed.
	m2 := NewManager(8, true)
	if !m2.Allocate(1, tokens[:40], 64, nil, "") || len(m2.byHash) != 2 {
		t.Fatalf("short tokens: %d registered, want 2", len(m2.byHash))
	}
	if !m2.Allocate(1, tokens[:64], 64, nil, "") || len(m2.byHash) != 4 {
		t.Fatalf("full tokens: %d registered, want 4", len(m2.byHash))
	}
	checkInvariants(t, m)
	checkInvariants(t, m2)
}

func TestDuplicateContentKeepsFirstRegistration(t *testing.T) {
	tokens := tokensFrom(30, 33)
	m := NewManager(8, true)
	// Both compute the same two blocks; b does not look up, so it gets
	// its own copies, which stay unregistered.
	if !m.Allocate(1, tokens, 33, nil, "") || !m.Allocate(2, tokens, 33, nil, "") {
		t.Fatal("allocate")
	}
	ta, tb := m.Table(1), m.Table(2)
	if len(m.byHash) != 2 || m.byHash[m.blocks[ta[0]].hash] != ta[0] || m.blocks[tb[0]].hashed {
		t.Fatalf("registered %d hashes; first block of a hashed %v, of b hashed %v", len(m.byHash), m.blocks[ta[0]].hashed, m.blocks[tb[0]].hashed)
	}
	m.Free(2)
	if m.queued != 0 || len(m.free) != 8-3 {
		t.Fatalf("after freeing the duplicate: queued %d, free list %d", m.queued, len(m.free))
	}
	cached, hit := m.LookupPrefix(tokens, "")
	if hit != 32 || !slices.Equal(cached, ta[:2]) {
		t.Fatalf("lookup after duplicate freed: %v (%d), want %v", cached, hit, ta[:2])
	}
	checkInvariants(t, m)
}

func TestPrefixStats(t *testing.T) {
	base := tokensFrom(40, 64)
	for _, prefix := range []bool{false, true} {
		m := NewManager(16, prefix)
		if !m.Allocate(1, base, 64, nil, "") {
			t.Fatal("allocate")
		}
		var queries, hits int64
		for _, tc := range []struct {
			tokens []int32
			hit    int
		}{
			{base, 48},                   // 4 full blocks cached, last token left
			{base[:40], 32},              // 2 of the 2 full blocks in 40 tokens
			{tokensFrom(41, 50), 0},      // miss
			{concat(base, base[:5]), 64}, // all 4 blocks
			{nil, 0},
		} {
			_, hit := m.LookupPrefix(tc.tokens, "")
			want := tc.hit
			if !prefix {
				want = 0
			} else {
				queries += int64(len(tc.tokens))
				hits += int64(tc.hit)
			}
			if hit != want {
				t.Fatalf("prefix=%v: lookup of %d tokens hit %d, want %d", prefix, len(tc.tokens), hit, want)
			}
			if q, h := m.PrefixStats(); q != queries || h != hits {
				t.Fatalf("prefix=%v: stats (%d, %d), want (%d, %d)", prefix, q, h, queries, hits)
			}
		}
		checkInvariants(t, m)
	}
}

func TestLookupLeavesLastToken(t *testing.T) {
	tokens := tokensFrom(50, 48)
	m := NewManager(8, true)
	if !m.Allocate(1, tokens, 48, nil, "") {
		t.Fatal("allocate")
	}
	for _, tc := range []struct{ n, hit int }{
		{48, 32}, {33, 32}, {32, 16}, {17, 16}, {16, 0}, {1, 0}, {0, 0},
	} {
		blocks, hit := m.LookupPrefix(tokens[:tc.n], "")
		if hit != tc.hit || len(blocks) != tc.hit/BlockSize {
			t.Errorf("prompt of %d tokens: %d blocks, %d tokens hit; want %d tokens", tc.n, len(blocks), hit, tc.hit)
		}
		if !slices.Equal(blocks, m.Table(1)[:len(blocks)]) {
			t.Errorf("prompt of %d tokens: blocks %v, not a prefix of %v", tc.n, blocks, m.Table(1))
		}
	}
}

func TestExtraSeparatesPrefixes(t *testing.T) {
	tokens := tokensFrom(60, 40)
	m := NewManager(16, true)
	if !m.Allocate(1, tokens, 40, nil, "adapter-a") {
		t.Fatal("allocate")
	}
	for _, tc := range []struct {
		extra string
		hit   int
	}{
		{"adapter-a", 32}, {"adapter-b", 0}, {"", 0}, {"adapter-", 0},
	} {
		if _, hit := m.LookupPrefix(tokens, tc.extra); hit != tc.hit {
			t.Errorf("extra %q: hit %d tokens, want %d", tc.extra, hit, tc.hit)
		}
	}
	// A sequence under another adapter computes its own blocks.
	if !m.Allocate(2, tokens, 40, nil, "adapter-b") {
		t.Fatal("allocate b")
	}
	if shared := slices.ContainsFunc(m.Table(2), func(b int32) bool { return slices.Contains(m.Table(1), b) }); shared {
		t.Fatalf("tables %v and %v share a block across adapters", m.Table(1), m.Table(2))
	}
	if _, hit := m.LookupPrefix(tokens, "adapter-b"); hit != 32 {
		t.Fatalf("adapter-b after its own allocation: hit %d, want 32", hit)
	}
	checkInvariants(t, m)
}

func TestEvictionOrder(t *testing.T) {
	// Pool of 5: a fills 3 blocks, b fills 2; both finish, a first. The
	// free list is empty, so each new block evicts from the queue.
	a, b := tokensFrom(70, 48), tokensFrom(71, 32)
	probeA, probeB := concat(a, []int32{1}), concat(b, []int32{1})
	m := NewManager(5, true)
	if !m.Allocate(1, a, 48, nil, "") || !m.Allocate(2, b, 32, nil, "") {
		t.Fatal("allocate")
	}
	ta, tb := slices.Clone(m.Table(1)), slices.Clone(m.Table(2))
	m.Free(1)
	m.Free(2)
	if len(m.free) != 0 || m.queued != 5 {
		t.Fatalf("after freeing: free list %d, queued %d", len(m.free), m.queued)
	}
	steps := []struct {
		evicted     int32
		hitA, hitB  int
		description string
	}{
		{ta[2], 32, 32, "a's last block first"},
		{ta[1], 16, 32, "then a's middle block"},
		{ta[0], 0, 32, "then a's first block"},
		{tb[1], 0, 16, "then b, freed later"},
		{tb[0], 0, 0, "b's first block last"},
	}
	for i, st := range steps {
		seq := uint64(10 + i)
		if !m.Allocate(seq, tokensFrom(uint64(100+i), 5), 5, nil, "") {
			t.Fatalf("%s: allocate failed", st.description)
		}
		if got := m.Table(seq)[0]; got != st.evicted {
			t.Fatalf("%s: evicted %d, want %d", st.description, got, st.evicted)
		}
		if m.blocks[st.evicted].hashed {
			t.Fatalf("%s: evicted block %d kept its hash", st.description, st.evicted)
		}
		_, hitA := m.LookupPrefix(probeA, "")
		_, hitB := m.LookupPrefix(probeB, "")
		if hitA != st.hitA || hitB != st.hitB {
			t.Fatalf("%s: hits a %d, b %d; want %d, %d", st.description, hitA, hitB, st.hitA, st.hitB)
		}
		checkInvariants(t, m)
	}
	if m.Allocate(99, nil, 1, nil, "") {
		t.Fatal("allocated a sixth block")
	}
}

func TestFreeListBeforeEviction(t *testing.T) {
	// Pool of 6: a leaves 3 cached blocks; new blocks come from the 3 free
	// ones before any cached block is evicted.
	a := tokensFrom(75, 48)
	probe := concat(a, []int32{1})
	m := NewManager(6, true)
	if !m.Allocate(1, a, 48, nil, "") {
		t.Fatal("allocate a")
	}
	m.Free(1)
	for _, st := range []struct {
		numTokens, wantHit int
	}{
		{16, 48}, {48, 48}, {49, 32}, {80, 16}, {96, 0},
	} {
		if !m.Allocate(2, nil, st.numTokens, nil, "") {
			t.Fatalf("allocate %d tokens", st.numTokens)
		}
		if _, hit := m.LookupPrefix(probe, ""); hit != st.wantHit {
			t.Fatalf("after another sequence took %d tokens: a's prefix hits %d, want %d", st.numTokens, hit, st.wantHit)
		}
	}
	checkInvariants(t, m)
}

func TestEvictionIsLeastRecentlyFreed(t *testing.T) {
	// a and b finish (a first); c then reuses a's prefix and finishes,
	// making a's blocks the most recently freed, so b's go first.
	a, b := tokensFrom(80, 32), tokensFrom(81, 32)
	m := NewManager(4, true)
	if !m.Allocate(1, a, 32, nil, "") || !m.Allocate(2, b, 32, nil, "") {
		t.Fatal("allocate")
	}
	ta, tb := slices.Clone(m.Table(1)), slices.Clone(m.Table(2))
	m.Free(1)
	m.Free(2)
	cached, hit := m.LookupPrefix(concat(a, []int32{5}), "")
	if hit != 32 {
		t.Fatalf("lookup of a's prefix hit %d", hit)
	}
	if !m.Allocate(3, concat(a, []int32{5}), 32, cached, "") {
		t.Fatal("allocate c from cache")
	}
	if m.queued != 2 || m.NumFreeBlocks() != 2 {
		t.Fatalf("reclaiming a's blocks: queued %d, free %d", m.queued, m.NumFreeBlocks())
	}
	m.Free(3)
	for i, want := range []int32{tb[1], tb[0], ta[1], ta[0]} {
		seq := uint64(10 + i)
		if !m.Allocate(seq, nil, 1, nil, "") || m.Table(seq)[0] != want {
			t.Fatalf("allocation %d got %v, want block %d", i, m.Table(seq), want)
		}
	}
	checkInvariants(t, m)
}

func TestFreeThenLookupReusesKV(t *testing.T) {
	// A finished request's KV is found again: same blocks, same data, no
	// new block needed for the cached part.
	shape := Shape{Layers: 2, KVHeads: 1, HeadDim: 2}
	c, err := New(shape, 8)
	if err != nil {
		t.Fatal(err)
	}
	m := NewManager(8, true)
	prompt := tokensFrom(90, 50)
	if !m.Allocate(1, prompt, 50, nil, "") {
		t.Fatal("allocate")
	}
	write := func(table []int32, from, to int) {
		for p := from; p < to; p++ {
			for l := range shape.Layers {
				c.Keys(l, table[p/BlockSize], p%BlockSize)[0] = float32(prompt[p])
				c.Values(l, table[p/BlockSize], p%BlockSize)[1] = float32(-prompt[p])
			}
		}
	}
	write(m.Table(1), 0, 50)
	first := slices.Clone(m.Table(1))
	m.Free(1)

	cached, hit := m.LookupPrefix(prompt, "")
	if hit != 48 || !slices.Equal(cached, first[:3]) {
		t.Fatalf("lookup after free: %v (%d tokens), want %v (48)", cached, hit, first[:3])
	}
	freeBefore := len(m.free)
	if !m.Allocate(2, prompt, 50, cached, "") {
		t.Fatal("allocate from cache")
	}
	if got := len(m.free); got != freeBefore-1 {
		t.Fatalf("allocating 50 tokens with 48 cached took %d fresh blocks, want 1", freeBefore-got)
	}
	table := m.Table(2)
	for p := range hit {
		for l := range shape.Layers {
			k := c.Keys(l, table[p/BlockSize], p%BlockSize)[0]
			v := c.Values(l, table[p/BlockSize], p%BlockSize)[1]
			if k != float32(prompt[p]) || v != float32(-prompt[p]) {
				t.Fatalf("layer %d position %d: cached k,v = %v,%v want %v", l, p, k, v, prompt[p])
			}
		}
	}
	checkInvariants(t, m)
}

// refSeq is the stress test's own record of one sequence.
type refSeq struct {
	tokens   []int32
	extra    string
	computed int // positions written
}

// identity names the content a full block holds: the extra key and every
// token up to the block's end.
func identity(extra string, tokens []int32) string {
	buf := make([]byte, 0, len(extra)+1+4*len(tokens))
	buf = append(buf, extra...)
	buf = append(buf, 0)
	for _, t := range tokens {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(t))
	}
	return string(buf)
}

func TestStressAgainstReference(t *testing.T) {
	for _, tc := range []struct {
		seed   uint64
		blocks int
		prefix bool
	}{
		{1, 24, true}, {2, 8, true}, {3, 64, true}, {4, 24, false},
	} {
		t.Run(fmt.Sprintf("seed=%d/blocks=%d/prefix=%v", tc.seed, tc.blocks, tc.prefix), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(tc.seed, 1))
			m := NewManager(tc.blocks, tc.prefix)
			bases := [][]int32{tokensFrom(tc.seed*10, 96), tokensFrom(tc.seed*10+1, 96), tokensFrom(tc.seed*10+2, 96)}
			content := make([]string, tc.blocks) // identity of each block's written content, "" if partial
			seqs := map[uint64]*refSeq{}
			var next uint64
			hits := 0

			// write simulates the model filling positions [from, to) of s.
			write := func(seq uint64, s *refSeq, from, to int) {
				table := m.Table(seq)
				for p := from; p < to; p++ {
					b := table[p/BlockSize]
					if r := m.blocks[b].ref; r != 1 {
						t.Fatalf("sequence %d writes position %d into block %d shared by %d", seq, p, b, r)
					}
					content[b] = ""
					if p%BlockSize == BlockSize-1 {
						content[b] = identity(s.extra, s.tokens[:p+1])
					}
				}
				s.computed = max(s.computed, to)
			}
			referenced := func() int {
				n := 0
				for b := range tc.blocks {
					if m.blocks[b].ref > 0 {
						n++
					}
				}
				return n
			}

			for op := range 3000 {
				switch r := rng.IntN(10); {
				case r < 4 || len(seqs) == 0: // a new request
					base := bases[rng.IntN(len(bases))]
					tokens := slices.Clone(base[:1+rng.IntN(len(base))])
					if rng.IntN(3) == 0 {
						tokens = append(tokens, tokensFrom(uint64(op), 1+rng.IntN(20))...)
					}
					extra := []string{"", "lora"}[rng.IntN(2)]
					cached, hit := m.LookupPrefix(tokens, extra)
					if !tc.prefix && (cached != nil || hit != 0) {
						t.Fatalf("op %d: lookup with caching off returned %v", op, cached)
					}
					if hit >= len(tokens) || hit != len(cached)*BlockSize {
						t.Fatalf("op %d: lookup of %d tokens hit %d with %d blocks", op, len(tokens), hit, len(cached))
					}
					for i, b := range cached {
						if want := identity(extra, tokens[:(i+1)*BlockSize]); content[b] != want {
							t.Fatalf("op %d: cached block %d (index %d) holds other content", op, b, i)
						}
					}
					if rng.IntN(5) == 0 {
						cached, hit = nil, 0 // recompute instead of sharing
					}
					hits += hit
					n := hit + 1 + rng.IntN(len(tokens)-hit) // chunked prefill
					reclaimed := 0
					for _, b := range cached {
						if m.blocks[b].ref == 0 {
							reclaimed++
						}
					}
					grow := max((n+BlockSize-1)/BlockSize-len(cached), 0)
					want := grow <= tc.blocks-referenced()-reclaimed
					seq := next
					next++
					if got := m.Allocate(seq, tokens, n, cached, extra); got != want {
						t.Fatalf("op %d: Allocate new sequence = %v, reference says %v", op, got, want)
					}
					if want {
						s := &refSeq{tokens: tokens, extra: extra, computed: hit}
						seqs[seq] = s
						if !slices.Equal(m.Table(seq)[:len(cached)], cached) {
							t.Fatalf("op %d: table %v does not start with cached %v", op, m.Table(seq), cached)
						}
						write(seq, s, hit, n)
					}
				case r < 8: // a running request's next step
					seq := randomKey(rng, seqs)
					s := seqs[seq]
					if s.computed == len(s.tokens) {
						s.tokens = append(s.tokens, int32(rng.IntN(32000))) // decode
					}
					n := s.computed + 1 + rng.IntN(len(s.tokens)-s.computed)
					have := len(m.Table(seq))
					want := (n+BlockSize-1)/BlockSize-have <= tc.blocks-referenced()
					if got := m.Allocate(seq, s.tokens, n, nil, s.extra); got != want {
						t.Fatalf("op %d: Allocate to %d tokens = %v, reference says %v", op, n, got, want)
					}
					if want {
						write(seq, s, s.computed, n)
					} else if len(m.Table(seq)) != have {
						t.Fatalf("op %d: refused Allocate changed the table", op)
					}
				default: // finish or preempt
					seq := randomKey(rng, seqs)
					m.Free(seq)
					delete(seqs, seq)
				}
				checkInvariants(t, m)
				for seq := range seqs {
					if !m.Has(seq) {
						t.Fatalf("op %d: live sequence %d lost its table", op, seq)
					}
				}
				if got, want := m.NumFreeBlocks(), tc.blocks-referenced(); got != want {
					t.Fatalf("op %d: %d free blocks, reference %d", op, got, want)
				}
				if got, want := m.Usage(), float64(referenced())/float64(tc.blocks); got != want {
					t.Fatalf("op %d: usage %v, reference %v", op, got, want)
				}
			}
			if tc.prefix && hits == 0 {
				t.Fatal("the stress run never hit the prefix cache")
			}
			for seq := range seqs {
				m.Free(seq)
			}
			if m.NumFreeBlocks() != tc.blocks || m.Usage() != 0 {
				t.Fatalf("after freeing everything: %d free, usage %v", m.NumFreeBlocks(), m.Usage())
			}
			checkInvariants(t, m)
		})
	}
}

// randomKey picks one key of a non-empty map, reproducibly for a given rng.
func randomKey(rng *rand.Rand, seqs map[uint64]*refSeq) uint64 {
	keys := make([]uint64, 0, len(seqs))
	for k := range seqs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys[rng.IntN(len(keys))]
}

func BenchmarkAllocateFree(b *testing.B) {
	tokens := tokensFrom(1, 1000)
	for _, bc := range []struct {
		name          string
		prefix, reuse bool
	}{
		{"no-caching", false, false},
		{"caching-miss", true, false},
		{"caching-hit", true, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			m := NewManager(128, bc.prefix)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				var cached []int32
				if bc.reuse {
					cached, _ = m.LookupPrefix(tokens, "")
				} else if bc.prefix {
					tokens[0] = int32(i) // a new prefix every time: every block misses
				}
				if !m.Allocate(1, tokens, len(tokens), cached, "") {
					b.Fatal("allocate")
				}
				m.Free(1)
			}
		})
	}
}

func BenchmarkDecodeSteps(b *testing.B) {
	// One Allocate per generated token, as the engine loop does, over a
	// 1,000-token sequence; ns/op is per step.
	tokens := tokensFrom(2, 1000)
	for _, prefix := range []bool{false, true} {
		b.Run(fmt.Sprintf("prefix=%v", prefix), func(b *testing.B) {
			m := NewManager(128, prefix)
			b.ReportAllocs()
			n := 0
			for i := 0; b.Loop(); i++ {
				if n == len(tokens) {
					m.Free(1)
					n = 0
					tokens[0] = int32(i) // a fresh prefix for the next sequence
				}
				n++
				if !m.Allocate(1, tokens, n, nil, "") {
					b.Fatal("allocate")
				}
			}
		})
	}
}
