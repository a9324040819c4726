package kvcache

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
)

// blockHash identifies the content of a full block together with everything
// before it in its sequence: the truncated sha256 of the parent block's
// hash, the block's token ids and, for a sequence's first block, the extra
// key (such as a LoRA adapter id).
type blockHash [16]byte

// noBlock ends the eviction queue's links.
const noBlock int32 = -1

// blockMeta is the allocator's record of one block. A block is in exactly
// one of three states: referenced (ref > 0), cached-free (ref == 0 and
// hashed: in the eviction queue, still findable by its hash) or free
// (ref == 0, not hashed: on the free list).
type blockMeta struct {
	ref        int32
	prev, next int32 // eviction queue links, meaningful only while cached-free
	hashed     bool
	hash       blockHash
}

// seqState is one live sequence's block table and how far its full blocks
// have been hashed.
type seqState struct {
	table  []int32
	hashed int       // leading table entries whose chained hash is known
	last   blockHash // chained hash of table[hashed-1]
	extra  string
}

// Manager hands out the blocks of a pool to sequences: per-sequence block
// tables, reference counts, and, with prefix caching, a map from chained
// content hashes to full blocks so that sequences with a common prefix share
// its blocks, and blocks of finished sequences stay findable until an LRU
// queue evicts them. It holds no key or value data (that is Cache's job). It
// is not safe for concurrent use: the engine loop owns it.
type Manager struct {
	blocks        []blockMeta
	free          []int32 // free blocks, taken from the end
	head, tail    int32   // eviction queue of cached-free blocks; head goes first
	queued        int
	used          int // blocks with a live reference
	byHash        map[blockHash]int32
	seqs          map[uint64]*seqState
	prefix        bool
	queries, hits int64
	buf           []byte // hash input scratch
}

// NewManager makes an allocator over block ids 0..numBlocks-1, all free.
// prefixCaching turns on content hashing and sharing of full blocks.
func NewManager(numBlocks int, prefixCaching bool) *Manager {
	numBlocks = max(0, min(numBlocks, math.MaxInt32))
	m := &Manager{
		blocks: make([]blockMeta, numBlocks),
		free:   make([]int32, numBlocks),
		head:   noBlock,
		tail:   noBlock,
		byHash: make(map[blockHash]int32),
		seqs:   make(map[uint64]*seqState),
		prefix: prefixCaching,
		buf:    make([]byte, len(blockHash{})+4*BlockSize),
	}
	for i := range m.free {
		m.free[i] = int32(numBlocks - 1 - i)
	}
	return m
}

// NumBlocks is the pool's capacity in blocks.
func (m *Manager) NumBlocks() int { return len(m.blocks) }

// NumFreeBlocks is the number of blocks with no live reference: free ones
// and cached ones that may be evicted.
func (m *Manager) NumFreeBlocks() int { return len(m.free) + m.queued }

// Usage is the fraction of blocks referenced by live sequences, a block
// shared by several counting once (vllm:kv_cache_usage_perc).
func (m *Manager) Usage() float64 {
	if len(m.blocks) == 0 {
		return 0
	}
	return float64(m.used) / float64(len(m.blocks))
}

// PrefixStats returns the prefix cache's counters in tokens: tokens looked
// up and tokens found cached (vllm:prefix_cache_queries and
// vllm:prefix_cache_hits).
func (m *Manager) PrefixStats() (queries, hits int64) { return m.queries, m.hits }

// LookupPrefix returns the longest run of cached full blocks at the start of
// tokens for the given extra key, and the number of tokens they cover. It
// always leaves at least one token uncovered so the model has a position to
// compute logits for. It adds len(tokens) to the query counter and
// numTokens to the hit counter, and takes no references: pass blocks to
// Allocate before any other Allocate call can evict them.
func (m *Manager) LookupPrefix(tokens []int32, extra string) (blocks []int32, numTokens int) {
	if !m.prefix || len(tokens) == 0 {
		return nil, 0
	}
	m.queries += int64(len(tokens))
	var parent blockHash
	most := (len(tokens) - 1) / BlockSize
	for i := range most {
		h := m.hash(parent, i == 0, tokens[i*BlockSize:(i+1)*BlockSize], extra)
		b, ok := m.byHash[h]
		if !ok {
			break
		}
		if blocks == nil {
			blocks = make([]int32, 0, most)
		}
		blocks = append(blocks, b)
		parent = h
	}
	numTokens = len(blocks) * BlockSize
	m.hits += int64(numTokens)
	return blocks, numTokens
}

// Allocate makes seq's block table cover numTokens positions.
//
// For a new sequence, cached (a LookupPrefix result for the same tokens and
// extra) becomes the start of its table, each block gaining a reference; a
// cached block nobody referenced leaves the eviction queue. For a sequence
// that already has a table, cached and extra are ignored and the table only
// grows. New blocks come from the free list, then by evicting the least
// recently freed cached block, whose hash is forgotten.
//
// With prefix caching, every block that tokens[:numTokens] fills completely
// is registered under its chained hash so later sequences can share it,
// unless another block already holds that hash. tokens holds the sequence's
// known tokens; blocks past its end are registered by a later call that
// passes them.
//
// It returns false and changes nothing when there are not enough blocks,
// when numTokens is negative, or when cached no longer matches tokens (a
// block was evicted or reused since the lookup).
func (m *Manager) Allocate(seq uint64, tokens []int32, numTokens int, cached []int32, extra string) bool {
	if numTokens < 0 {
		return false
	}
	need := (numTokens + BlockSize - 1) / BlockSize
	if s, ok := m.seqs[seq]; ok {
		grow := need - len(s.table)
		if grow > m.NumFreeBlocks() {
			return false
		}
		for range grow {
			s.table = append(s.table, m.take())
		}
		m.register(s, tokens, numTokens)
		return true
	}

	var last blockHash
	reclaimed := 0 // cached blocks that leave the eviction queue
	for i, b := range cached {
		if b < 0 || int(b) >= len(m.blocks) || (i+1)*BlockSize > len(tokens) {
			return false
		}
		meta := &m.blocks[b]
		h := m.hash(last, i == 0, tokens[i*BlockSize:(i+1)*BlockSize], extra)
		if !meta.hashed || meta.hash != h {
			return false
		}
		last = h
		if meta.ref == 0 {
			reclaimed++
		}
	}
	grow := max(need-len(cached), 0)
	if grow > m.NumFreeBlocks()-reclaimed {
		return false
	}
	s := &seqState{
		table:  make([]int32, 0, len(cached)+grow),
		hashed: len(cached),
		last:   last,
		extra:  extra,
	}
	for _, b := range cached {
		meta := &m.blocks[b]
		if meta.ref == 0 {
			m.unlink(b)
			m.used++
		}
		meta.ref++
		s.table = append(s.table, b)
	}
	for range grow {
		s.table = append(s.table, m.take())
	}
	m.seqs[seq] = s
	m.register(s, tokens, numTokens)
	return true
}

// Table returns seq's block table, or nil for an unknown sequence. The
// slice belongs to the Manager; fetch it again after Allocate.
func (m *Manager) Table(seq uint64) []int32 {
	if s, ok := m.seqs[seq]; ok {
		return s.table
	}
	return nil
}

// Has reports whether seq has a block table.
func (m *Manager) Has(seq uint64) bool {
	_, ok := m.seqs[seq]
	return ok
}

// Free drops seq's references. Blocks left with none join the eviction
// queue in reverse table order, so a finished sequence's last blocks are
// evicted first, and stay findable by hash until evicted; blocks that were
// never registered go straight back to the free list. Freeing an unknown
// sequence does nothing.
func (m *Manager) Free(seq uint64) {
	s, ok := m.seqs[seq]
	if !ok {
		return
	}
	delete(m.seqs, seq)
	for i := len(s.table) - 1; i >= 0; i-- {
		b := s.table[i]
		meta := &m.blocks[b]
		meta.ref--
		if meta.ref > 0 {
			continue
		}
		m.used--
		if meta.hashed {
			m.pushBack(b)
		} else {
			m.free = append(m.free, b)
		}
	}
}

// take hands out one block with a single reference, from the free list if
// it has one, else by evicting the head of the eviction queue. The caller
// has checked that a block is available.
func (m *Manager) take() int32 {
	var b int32
	if n := len(m.free); n > 0 {
		b = m.free[n-1]
		m.free = m.free[:n-1]
	} else {
		b = m.head
		m.unlink(b)
		meta := &m.blocks[b]
		delete(m.byHash, meta.hash)
		meta.hashed = false
		meta.hash = blockHash{}
	}
	m.blocks[b].ref = 1
	m.used++
	return b
}

// register hashes s's blocks that tokens[:numTokens] newly fills and
// registers each under its hash unless another block holds it already.
func (m *Manager) register(s *seqState, tokens []int32, numTokens int) {
	if !m.prefix {
		return
	}
	full := min(numTokens, len(tokens), len(s.table)*BlockSize) / BlockSize
	for i := s.hashed; i < full; i++ {
		h := m.hash(s.last, i == 0, tokens[i*BlockSize:(i+1)*BlockSize], s.extra)
		if _, taken := m.byHash[h]; !taken {
			b := s.table[i]
			m.blocks[b].hashed = true
			m.blocks[b].hash = h
			m.byHash[h] = b
		}
		s.last = h
		s.hashed = i + 1
	}
}

// hash computes a block's chained hash; first marks a sequence's first
// block, whose hash also covers extra.
func (m *Manager) hash(parent blockHash, first bool, tokens []int32, extra string) blockHash {
	n := len(parent) + 4*BlockSize
	if first {
		n += len(extra)
	}
	if cap(m.buf) < n {
		m.buf = make([]byte, n)
	}
	buf := m.buf[:n]
	copy(buf, parent[:])
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(buf[len(parent)+4*i:], uint32(t))
	}
	if first {
		copy(buf[len(parent)+4*BlockSize:], extra)
	}
	sum := sha256.Sum256(buf)
	var h blockHash
	copy(h[:], sum[:])
	return h
}

// pushBack appends a cached-free block to the tail of the eviction queue.
func (m *Manager) pushBack(b int32) {
	meta := &m.blocks[b]
	meta.prev, meta.next = m.tail, noBlock
	if m.tail != noBlock {
		m.blocks[m.tail].next = b
	} else {
		m.head = b
	}
	m.tail = b
	m.queued++
}

// unlink removes a block from the eviction queue.
func (m *Manager) unlink(b int32) {
	meta := &m.blocks[b]
	if meta.prev != noBlock {
		m.blocks[meta.prev].next = meta.next
	} else {
		m.head = meta.next
	}
	if meta.next != noBlock {
		m.blocks[meta.next].prev = meta.prev
	} else {
		m.tail = meta.prev
	}
	meta.prev, meta.next = noBlock, noBlock
	m.queued--
}
