package tokenizer

import (
	"hash/maphash"
	"strings"
	"sync"
	"unicode/utf8"
)

// merge is what a pair of adjacent symbols becomes: rank orders merges (lower
// first), id is the merged token.
type merge struct {
	rank int32
	id   int32
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// bpeModel is the BPE model of a tokenizer.json. It turns one pre-token into
// ids. All fields are read-only after construction except the cache, which
// guards itself.
type bpeModel struct {
	vocab  map[string]int32
	merges map[uint64]merge

	unk          int32 // -1: unknown characters are dropped
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	fallbackIDs  [256]int32 // ids of "<0xNN>" tokens, -1 where absent

	// byteLevel means pre-tokens are raw bytes whose symbols are the
	// byte-level alphabet; byteIDs holds each byte's token.
	byteLevel bool
	byteIDs   [256]int32

	cache *wordCache
}

// smallWord is the symbol count up to which the quadratic merge loop beats a
// heap.
const smallWord = 48

// maxCachedWord is the longest pre-token (in bytes) kept in the cache.
const maxCachedWord = 128

// encodeWord appends the ids of one pre-token to dst.
func (m *bpeModel) encodeWord(word string, dst []int32) []int32 {
	if word == "" {
		return dst
	}
	cacheable := len(word) <= maxCachedWord
	if cacheable {
		if ids, ok := m.cache.get(word); ok {
			return append(dst, ids...)
		}
	}
	start := len(dst)
	if id, ok := m.wholeWord(word); ok {
		dst = append(dst, id)
	} else {
		dst = m.symbols(word, dst)
	}
	syms := dst[start:]
	if len(syms) > 1 {
		if len(syms) <= smallWord {
			syms = m.mergeSmall(syms)
		} else {
			syms = m.mergeHeap(syms)
		}
	}
	dst = dst[:start+len(syms)]
	if cacheable {
		m.cache.put(word, syms)
	}
	return dst
}

// wholeWord returns the token of a pre-token the vocabulary holds whole,
// for ignore_merges models, which take such a word as it is rather than
// merging its symbols.
func (m *bpeModel) wholeWord(word string) (int32, bool) {
	if !m.ignoreMerges {
		return 0, false
	}
	if m.byteLevel {
		var spelled [2 * maxCachedWord]byte
		id, ok := m.vocab[string(byteLevel.appendEncoded(spelled[:0], word))]
		return id, ok
	}
	id, ok := m.vocab[word]
	return id, ok
}

// symbols appends the initial symbols of word: one per byte for byte-level
// models, one per character otherwise (with byte fallback or unk for
// characters outside the vocabulary).
func (m *bpeModel) symbols(word string, dst []int32) []int32 {
	if m.byteLevel {
		for i := 0; i < len(word); i++ {
			if id := m.byteIDs[word[i]]; id >= 0 {
				dst = append(dst, id)
			} else {
				dst = m.appendUnk(dst)
			}
		}
		return dst
	}
	lastUnk := false
	for i := 0; i < len(word); {
		_, size := utf8.DecodeRuneInString(word[i:])
		ch := word[i : i+size]
		i += size
		if id, ok := m.vocab[ch]; ok {
			dst = append(dst, id)
			lastUnk = false
			continue
		}
		if m.byteFallback {
			all := true
			for j := 0; j < len(ch); j++ {
				if m.fallbackIDs[ch[j]] < 0 {
					all = false
					break
				}
			}
			if all {
				for j := 0; j < len(ch); j++ {
					dst = append(dst, m.fallbackIDs[ch[j]])
				}
				lastUnk = false
				continue
			}
		}
		if m.unk < 0 {
			continue
		}
		if m.fuseUnk && lastUnk {
			continue
		}
		dst = append(dst, m.unk)
		lastUnk = true
	}
	return dst
}

func (m *bpeModel) appendUnk(dst []int32) []int32 {
	if m.unk < 0 {
		return dst
	}
	if m.fuseUnk && len(dst) > 0 && dst[len(dst)-1] == m.unk {
		return dst
	}
	return append(dst, m.unk)
}

// mergeSmall applies merges to a short symbol sequence in place: repeatedly
// the lowest-ranked adjacent pair (leftmost on ties) is merged.
func (m *bpeModel) mergeSmall(syms []int32) []int32 {
	for len(syms) > 1 {
		best := int32(-1)
		bestRank := int32(0)
		bestID := int32(0)
		for i := 0; i+1 < len(syms); i++ {
			mg, ok := m.merges[pairKey(syms[i], syms[i+1])]
			if ok && (best < 0 || mg.rank < bestRank) {
				best, bestRank, bestID = int32(i), mg.rank, mg.id
			}
		}
		if best < 0 {
			break
		}
		syms[best] = bestID
		syms = append(syms[:best+1], syms[best+2:]...)
	}
	return syms
}

// heapItem is a candidate merge of the symbol at pos with its right
// neighbour.
type heapItem struct {
	rank, pos, id int32
}

func heapLess(a, b heapItem) bool {
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos)
}

func heapPush(h []heapItem, it heapItem) []heapItem {
	h = append(h, it)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !heapLess(h[i], h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	return h
}

func heapPop(h []heapItem) (heapItem, []heapItem) {
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		c := l
		if r := l + 1; r < n && heapLess(h[r], h[l]) {
			c = r
		}
		if !heapLess(h[c], h[i]) {
			break
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
	return top, h
}

// mergeHeap is mergeSmall for long sequences: symbols form a linked list and
// candidate merges sit in a priority queue ordered by (rank, position), so
// the result is the same and the cost O(n log n).
func (m *bpeModel) mergeHeap(syms []int32) []int32 {
	n := len(syms)
	prev := make([]int32, n)
	next := make([]int32, n)
	for i := range syms {
		prev[i] = int32(i - 1)
		next[i] = int32(i + 1)
	}
	next[n-1] = -1
	h := make([]heapItem, 0, n)
	for i := 0; i+1 < n; i++ {
		if mg, ok := m.merges[pairKey(syms[i], syms[i+1])]; ok {
			h = heapPush(h, heapItem{mg.rank, int32(i), mg.id})
		}
	}
	const dead = -1
	for len(h) > 0 {
		var it heapItem
		it, h = heapPop(h)
		p := it.pos
		if syms[p] == dead {
			continue
		}
		q := next[p]
		if q < 0 {
			continue
		}
		if mg, ok := m.merges[pairKey(syms[p], syms[q])]; !ok || mg.id != it.id || mg.rank != it.rank {
			continue
		}
		syms[p] = it.id
		syms[q] = dead
		nq := next[q]
		next[p] = nq
		if nq >= 0 {
			prev[nq] = p
			if mg, ok := m.merges[pairKey(syms[p], syms[nq])]; ok {
				h = heapPush(h, heapItem{mg.rank, p, mg.id})
			}
		}
		if pp := prev[p]; pp >= 0 {
			if mg, ok := m.merges[pairKey(syms[pp], syms[p])]; ok {
				h = heapPush(h, heapItem{mg.rank, pp, mg.id})
			}
		}
	}
	out := syms[:0]
	for i := int32(0); i >= 0; i = next[i] {
		out = append(out, syms[i])
	}
	return out
}

// wordCache remembers the ids of recent pre-tokens. It is sharded to keep
// lock contention low and bounded: a full shard is emptied.
type wordCache struct {
	seed   maphash.Seed
	shards [16]cacheShard
}

type cacheShard struct {
	mu sync.RWMutex
	m  map[string][]int32
}

// cacheShardEntries bounds each shard.
const cacheShardEntries = 4096

func newWordCache() *wordCache {
	c := &wordCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]int32)
	}
	return c
}

func (c *wordCache) shard(word string) *cacheShard {
	return &c.shards[maphash.String(c.seed, word)%uint64(len(c.shards))]
}

func (c *wordCache) get(word string) ([]int32, bool) {
	s := c.shard(word)
	s.mu.RLock()
	ids, ok := s.m[word]
	s.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(word string, ids []int32) {
	s := c.shard(word)
	v := append([]int32(nil), ids...)
	s.mu.Lock()
	if len(s.m) >= cacheShardEntries {
		clear(s.m)
	}
	s.m[strings.Clone(word)] = v
	s.mu.Unlock()
}
