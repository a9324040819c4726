package activator

import (
	"encoding/binary"
	"hash/maphash"
	"math"
	"math/rand/v2"
)

const (
	defaultPrefixBlockSize       = 64
	defaultPrefixBlocksPerRep    = 1 << 16
	defaultPrefixMaxPromptBlocks = 512
	defaultPrefixLoadSlack       = 2
	defaultPrefixLoadSlackFrac   = 0.25
)

// PrefixOptions configure prefix affinity: a prompt is cut into fixed
// blocks of bytes, each block's hash chains the hashes before it, and each
// replica remembers (in a bounded LRU) the block hashes of the prompts
// routed to it. A new prompt goes to the replica that holds its longest
// prefix, since that replica's engine likely still has the prefix's KV
// cache, unless that replica is too loaded.
type PrefixOptions struct {
	// Disabled turns prefix affinity off: no hashing, no index, and the
	// pool's default policy is PowerOfTwoChoices.
	Disabled bool
	// BlockSize is the block length in bytes (default 64). Only full blocks
	// count, so a prompt shorter than one block has no affinity.
	BlockSize int
	// MaxBlocksPerReplica bounds each replica's index (default 65536).
	MaxBlocksPerReplica int
	// MaxPromptBlocks bounds how many leading blocks of a prompt are hashed
	// and indexed (default 512), keeping Pick cheap for huge prompts.
	MaxPromptBlocks int
	// LoadSlack and LoadSlackFraction bound the load affinity may add: a
	// replica is preferred for its prefix only while its requests in
	// flight exceed the least loaded candidate's by at most
	// max(LoadSlack, ceil(LoadSlackFraction × its capacity)); replicas of
	// unlimited capacity use LoadSlack alone. Defaults 2 and 0.25.
	LoadSlack         int
	LoadSlackFraction float64
}

func (o PrefixOptions) withDefaults() PrefixOptions {
	if o.BlockSize <= 0 {
		o.BlockSize = defaultPrefixBlockSize
	}
	if o.MaxBlocksPerReplica <= 0 {
		o.MaxBlocksPerReplica = defaultPrefixBlocksPerRep
	}
	if o.MaxPromptBlocks <= 0 {
		o.MaxPromptBlocks = defaultPrefixMaxPromptBlocks
	}
	if o.LoadSlack <= 0 {
		o.LoadSlack = defaultPrefixLoadSlack
	}
	if o.LoadSlackFraction <= 0 || math.IsNaN(o.LoadSlackFraction) {
		o.LoadSlackFraction = defaultPrefixLoadSlackFrac
	}
	return o
}

// slack is how many more requests in flight than the least loaded
// candidate a replica of the given capacity may have and still be chosen.
func (o PrefixOptions) slack(capacity int) int {
	s := o.LoadSlack
	if capacity > 0 {
		if f := int(math.Ceil(o.LoadSlackFraction * float64(capacity))); f > s {
			s = f
		}
	}
	return s
}

// PrefixAffinity returns a policy that picks the candidate holding the
// longest prefix of the prompt (Candidate.Prefix); among equals the one
// that served that prefix most often, then the less loaded, then at
// random. The choice stands only while that candidate's in-flight count is
// within the slack (see PrefixOptions) of the least loaded candidate's;
// otherwise, and for prompts no candidate holds, fallback (nil:
// PowerOfTwoChoices) chooses among the candidates within the slack, so no
// pick ever lands on a replica more than its slack above the least loaded.
// The policy reorders cands.
func PrefixAffinity(opts PrefixOptions, fallback Policy) Policy {
	opts = opts.withDefaults()
	if fallback == nil {
		fallback = PowerOfTwoChoices
	}
	return func(rng *rand.Rand, cands []Candidate) int {
		if len(cands) == 0 {
			return -1
		}
		least := cands[0].InFlight
		best, ties := -1, 0
		for i := range cands {
			c := &cands[i]
			if c.InFlight < least {
				least = c.InFlight
			}
			if c.Prefix == 0 {
				continue
			}
			if best < 0 {
				best, ties = i, 1
				continue
			}
			switch cmp := comparePrefix(c, &cands[best]); {
			case cmp > 0:
				best, ties = i, 1
			case cmp == 0:
				ties++
				if rng.IntN(ties) == 0 {
					best = i
				}
			}
		}
		if best >= 0 && cands[best].InFlight-least <= opts.slack(cands[best].Capacity) {
			return best
		}
		n := 0
		for i := range cands {
			if cands[i].InFlight-least <= opts.slack(cands[i].Capacity) {
				cands[n], cands[i] = cands[i], cands[n]
				n++
			}
		}
		return fallback(rng, cands[:n])
	}
}

// comparePrefix orders affinity candidates: longer prefix, then more uses
// of it, then fewer requests in flight.
func comparePrefix(a, b *Candidate) int {
	switch {
	case a.Prefix != b.Prefix:
		return cmpInt(a.Prefix, b.Prefix)
	case a.PrefixUses != b.PrefixUses:
		return cmpInt(int(a.PrefixUses), int(b.PrefixUses))
	}
	return cmpInt(b.InFlight, a.InFlight)
}

func cmpInt(a, b int) int {
	switch {
	case a > b:
		return 1
	case a < b:
		return -1
	}
	return 0
}

// prefixChain appends to dst the chained hashes of prompt's full blocks
// (at most maxBlocks): h[i] = hash(h[i-1], block[i]), so equal hashes at i
// mean equal prompts up to the end of block i.
func prefixChain(seed maphash.Seed, prompt []byte, blockSize, maxBlocks int, dst []uint64) []uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	var prev [8]byte
	for off := 0; off+blockSize <= len(prompt) && maxBlocks > 0; off, maxBlocks = off+blockSize, maxBlocks-1 {
		h.Reset()
		h.Write(prev[:])
		h.Write(prompt[off : off+blockSize])
		sum := h.Sum64()
		binary.LittleEndian.PutUint64(prev[:], sum)
		dst = append(dst, sum)
	}
	return dst
}

// prefixIndex remembers which replicas hold which block hashes. Every
// (hash, replica) pair is a node in one arena; the nodes of a replica form
// its LRU list, the nodes of a hash form its owner list. It is not safe
// for concurrent use: the Pool guards it with its lock.
type prefixIndex struct {
	max     int              // nodes per owner
	heads   map[uint64]int32 // hash → first node of its owner list
	nodes   []prefixNode
	free    int32 // free node list through lruNext; -1 when empty
	owners  []prefixOwner
	spareID []int32 // owner ids free for reuse
}

// prefixNode is one block hash held by one owner.
type prefixNode struct {
	hash             uint64
	owner            int32
	uses             uint32
	lruPrev, lruNext int32 // the owner's LRU list, most recent first
	ownPrev, ownNext int32 // the hash's owner list
}

// prefixOwner is one replica's side of the index.
type prefixOwner struct {
	head, tail int32 // most and least recently used node; -1 when empty
	count      int
	// slot and epoch map the owner to its Candidate during one Pick:
	// slot is valid while epoch equals the pick's epoch.
	slot  int
	epoch uint64
}

func newPrefixIndex(maxPerOwner int) *prefixIndex {
	return &prefixIndex{max: maxPerOwner, heads: map[uint64]int32{}, free: -1}
}

// addOwner returns a new owner id.
func (x *prefixIndex) addOwner() int32 {
	o := prefixOwner{head: -1, tail: -1}
	if n := len(x.spareID); n > 0 {
		id := x.spareID[n-1]
		x.spareID = x.spareID[:n-1]
		x.owners[id] = o
		return id
	}
	x.owners = append(x.owners, o)
	return int32(len(x.owners) - 1)
}

// dropOwner forgets everything owner id holds and frees the id.
func (x *prefixIndex) dropOwner(id int32) {
	for n := x.owners[id].head; n >= 0; {
		next := x.nodes[n].lruNext
		x.unlinkHash(n)
		x.freeNode(n)
		n = next
	}
	x.owners[id] = prefixOwner{head: -1, tail: -1}
	x.spareID = append(x.spareID, id)
}

// match fills Prefix and PrefixUses of the candidates whose owners hold
// leading hashes of chain. Owners map to candidates through slot/epoch.
func (x *prefixIndex) match(chain []uint64, epoch uint64, cands []Candidate) {
	for i, h := range chain {
		n, ok := x.heads[h]
		if !ok {
			return
		}
		for ; n >= 0; n = x.nodes[n].ownNext {
			o := &x.owners[x.nodes[n].owner]
			if o.epoch == epoch {
				c := &cands[o.slot]
				c.Prefix = i + 1
				c.PrefixUses = x.nodes[n].uses
			}
		}
	}
}

// record notes that owner id now holds chain. The hashes are touched
// last block first, so a prompt's first blocks are the most recent and
// are evicted last (a prefix stays matchable from its start).
func (x *prefixIndex) record(id int32, chain []uint64) {
	for i := len(chain) - 1; i >= 0; i-- {
		x.touch(id, chain[i])
	}
}

// touch marks hash h as held by owner id and most recently used.
func (x *prefixIndex) touch(id int32, h uint64) {
	head, ok := x.heads[h]
	if !ok {
		head = -1
	}
	for n := head; n >= 0; n = x.nodes[n].ownNext {
		if x.nodes[n].owner == id {
			if x.nodes[n].uses < math.MaxUint32 {
				x.nodes[n].uses++
			}
			x.unlinkLRU(n)
			x.pushLRU(n)
			return
		}
	}
	o := &x.owners[id]
	if o.count >= x.max {
		t := o.tail
		x.unlinkLRU(t)
		x.unlinkHash(t)
		x.freeNode(t) // t holds another hash: h's owner list is untouched
	}
	n := x.allocNode()
	x.nodes[n] = prefixNode{hash: h, owner: id, uses: 1, lruPrev: -1, lruNext: -1, ownPrev: -1, ownNext: head}
	if head >= 0 {
		x.nodes[head].ownPrev = n
	}
	x.heads[h] = n
	x.pushLRU(n)
}

func (x *prefixIndex) allocNode() int32 {
	if n := x.free; n >= 0 {
		x.free = x.nodes[n].lruNext
		return n
	}
	x.nodes = append(x.nodes, prefixNode{})
	return int32(len(x.nodes) - 1)
}

// freeNode puts a node, already unlinked from its lists, on the free list.
func (x *prefixIndex) freeNode(n int32) {
	x.nodes[n] = prefixNode{owner: -1, lruNext: x.free, lruPrev: -1, ownPrev: -1, ownNext: -1}
	x.free = n
}

// pushLRU puts node n at the front of its owner's LRU list.
func (x *prefixIndex) pushLRU(n int32) {
	nd := &x.nodes[n]
	o := &x.owners[nd.owner]
	nd.lruPrev, nd.lruNext = -1, o.head
	if o.head >= 0 {
		x.nodes[o.head].lruPrev = n
	}
	o.head = n
	if o.tail < 0 {
		o.tail = n
	}
	o.count++
}

// unlinkLRU takes node n out of its owner's LRU list.
func (x *prefixIndex) unlinkLRU(n int32) {
	nd := &x.nodes[n]
	o := &x.owners[nd.owner]
	if nd.lruPrev >= 0 {
		x.nodes[nd.lruPrev].lruNext = nd.lruNext
	} else {
		o.head = nd.lruNext
	}
	if nd.lruNext >= 0 {
		x.nodes[nd.lruNext].lruPrev = nd.lruPrev
	} else {
		o.tail = nd.lruPrev
	}
	nd.lruPrev, nd.lruNext = -1, -1
	o.count--
}

// unlinkHash takes node n out of its hash's owner list.
func (x *prefixIndex) unlinkHash(n int32) {
	nd := &x.nodes[n]
	if nd.ownPrev >= 0 {
		x.nodes[nd.ownPrev].ownNext = nd.ownNext
	} else if nd.ownNext >= 0 {
		x.heads[nd.hash] = nd.ownNext
	} else {
		delete(x.heads, nd.hash)
	}
	if nd.ownNext >= 0 {
		x.nodes[nd.ownNext].ownPrev = nd.ownPrev
	}
	nd.ownPrev, nd.ownNext = -1, -1
}
