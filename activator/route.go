package activator

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ReleaseFunc ends a request that Pool.Pick routed: it gives the replica
// its in-flight slot back and reports the outcome to the replica's circuit
// breaker (see BreakerOptions: nil is a success, context.Canceled is
// ignored, any other error is a failure). Only the first call counts;
// later calls do nothing. It stays safe after the replica was removed.
// Every successful Pick must be released exactly once the request ends,
// or the replica's slot (and a half-open breaker's probe) stays taken.
type ReleaseFunc func(err error)

// releaseNothing is the ReleaseFunc of a failed Pick.
func releaseNothing(error) {}

// Replica is a snapshot of one replica of a Pool.
type Replica struct {
	// ID names the replica within its pool.
	ID string
	// Capacity is how many requests it may serve at once (0: no limit).
	Capacity int
	// InFlight is how many requests it serves now.
	InFlight int
	// Breaker is its circuit breaker's state.
	Breaker BreakerState
}

// Candidate is what a Policy sees of a replica that could take a request:
// it is ready, below its capacity, and its breaker lets a request through.
type Candidate struct {
	// ID names the replica.
	ID string
	// InFlight is its requests in flight now.
	InFlight int
	// Capacity is its limit of requests in flight (0: none).
	Capacity int
	// Prefix is how many leading blocks of the prompt the replica is
	// believed to hold in its KV cache (0 without prefix affinity).
	Prefix int
	// PrefixUses is how many routed prompts included the deepest of those
	// blocks on this replica; it ranks replicas holding the same prefix.
	PrefixUses uint32

	rep *poolReplica
	// adapter is the replica's affinity for the request's adapter
	// (adapterNone…adapterLoaded; -1 when over the load slack).
	adapter int
}

// Policy chooses one of cands and returns its index, or -1 to choose none.
// cands is never empty; a policy may reorder it (the pool reads the choice
// from the reordered slice) but must not keep it. It runs under the pool's
// lock with the pool's random source, so it must be quick and must not call
// into the Pool.
type Policy func(rng *rand.Rand, cands []Candidate) int

// PowerOfTwoChoices is the least-in-flight policy by two random choices:
// it draws two distinct candidates and keeps the one with fewer requests in
// flight, breaking ties at random.
func PowerOfTwoChoices(rng *rand.Rand, cands []Candidate) int {
	switch len(cands) {
	case 0:
		return -1
	case 1:
		return 0
	}
	i := rng.IntN(len(cands))
	j := rng.IntN(len(cands) - 1)
	if j >= i {
		j++
	}
	switch a, b := cands[i].InFlight, cands[j].InFlight; {
	case a < b:
		return i
	case b < a:
		return j
	case rng.IntN(2) == 0:
		return i
	}
	return j
}

// PoolOptions configure a Pool. The zero value routes by prefix affinity
// bounded by load, falling back to PowerOfTwoChoices, with breakers on.
type PoolOptions struct {
	// Policy picks among the candidates; nil means PrefixAffinity over
	// PowerOfTwoChoices, or PowerOfTwoChoices when Prefix.Disabled.
	Policy Policy
	// Prefix configures the prefix index (and the default policy).
	Prefix PrefixOptions
	// Breaker configures the replicas' circuit breakers.
	Breaker BreakerOptions
	// OnFree, when set, is called outside the pool's lock whenever up to n
	// request slots may have become free: a release (n=1), a replica added
	// (n=its capacity), a capacity raised (n=the increase), a breaker's
	// cooldown ended (n=1). Unlimited capacity reports math.MaxInt32.
	// Wire it to Buffer.Notify.
	OnFree func(n int)
	// Seed seeds the pool's random source; 0 picks one at random.
	Seed uint64
	// AdapterSlots is how many LoRA adapters each replica's engine holds
	// at once (its --max-loras), for adapter affinity; default
	// DefaultAdapterSlots.
	AdapterSlots int
	// ShareWindow is how long a flow stays active, for the slot shares
	// (see PickFor), after it last asked for a slot; default
	// DefaultShareWindow.
	ShareWindow time.Duration
}

// Pool is the set of ready replicas of one deployment with exact
// in-flight accounting: Pick chooses a replica by policy among those with
// room and a closed (or probing) breaker and counts the request on it
// until its ReleaseFunc runs. Safe for concurrent use.
type Pool struct {
	policy  Policy
	prefix  PrefixOptions
	breaker BreakerOptions
	onFree  func(n int)
	seed    maphash.Seed

	mu       sync.Mutex
	rng      *rand.Rand
	replicas []*poolReplica
	byID     map[string]*poolReplica
	draining map[string][]*poolReplica // removed, requests still in flight
	index    *prefixIndex              // nil without prefix affinity
	cands    []Candidate               // scratch for Pick
	epoch    uint64                    // Pick count, for prefixOwner.epoch
	shares   *flowShares
	// adapterSlots is PoolOptions.AdapterSlots.
	adapterSlots int
	now          func() int64 // unix nanoseconds; a test's clock
}

// poolReplica is one replica's accounting.
type poolReplica struct {
	id       string
	capacity int // guarded by Pool.mu
	owner    int32
	breaker  *replicaBreaker // nil when breakers are disabled

	adapters adapterSet // guarded by Pool.mu

	inflight  atomic.Int64
	removed   atomic.Bool
	drainOnce sync.Once
	drained   chan struct{}
}

// NewPool returns an empty pool.
func NewPool(opts PoolOptions) *Pool {
	p := &Pool{
		prefix:   opts.Prefix.withDefaults(),
		breaker:  opts.Breaker.withDefaults(),
		onFree:   opts.OnFree,
		seed:     maphash.MakeSeed(),
		byID:     map[string]*poolReplica{},
		draining: map[string][]*poolReplica{},
		now:      func() int64 { return time.Now().UnixNano() },
	}
	window := opts.ShareWindow
	if window <= 0 {
		window = DefaultShareWindow
	}
	p.shares = newFlowShares(window)
	p.adapterSlots = opts.AdapterSlots
	if p.adapterSlots <= 0 {
		p.adapterSlots = DefaultAdapterSlots
	}
	seed := opts.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	p.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	if !p.prefix.Disabled {
		p.index = newPrefixIndex(p.prefix.MaxBlocksPerReplica)
	}
	p.policy = opts.Policy
	if p.policy == nil {
		if p.prefix.Disabled {
			p.policy = PowerOfTwoChoices
		} else {
			p.policy = PrefixAffinity(p.prefix, PowerOfTwoChoices)
		}
	}
	return p
}

// Add makes a ready replica routable with room for capacity requests at
// once (0: no limit), e.g. the engine's max-num-seqs.
func (p *Pool) Add(id string, capacity int) error {
	if id == "" {
		return errors.New("add replica: empty id")
	}
	if capacity < 0 {
		return fmt.Errorf("add replica %s: capacity %d is negative", id, capacity)
	}
	r := &poolReplica{id: id, capacity: capacity, owner: -1, drained: make(chan struct{})}
	if !p.breaker.Disabled {
		r.breaker = newReplicaBreaker(id, p.breaker, func() {
			if !r.removed.Load() && p.onFree != nil {
				p.onFree(1)
			}
		})
	}
	p.mu.Lock()
	if _, dup := p.byID[id]; dup {
		p.mu.Unlock()
		return fmt.Errorf("add replica %s: already in the pool", id)
	}
	if p.index != nil {
		r.owner = p.index.addOwner()
	}
	p.replicas = append(p.replicas, r)
	p.byID[id] = r
	p.mu.Unlock()
	p.freed(capacity)
	return nil
}

// freed reports slots that may have freed to OnFree.
func (p *Pool) freed(n int) {
	if p.onFree == nil {
		return
	}
	if n == 0 {
		n = math.MaxInt32
	}
	p.onFree(n)
}

// Remove takes a replica out of rotation and forgets its prefix index.
// Its requests in flight go on and their releases stay exact; drained is
// closed once the last of them is released (at once when there are none).
// ok is false when the pool has no such replica.
func (p *Pool) Remove(id string) (drained <-chan struct{}, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.byID[id]
	if !ok {
		return nil, false
	}
	delete(p.byID, id)
	if i := slices.Index(p.replicas, r); i >= 0 {
		last := len(p.replicas) - 1
		p.replicas[i] = p.replicas[last]
		p.replicas[last] = nil
		p.replicas = p.replicas[:last]
	}
	if p.index != nil {
		p.index.dropOwner(r.owner)
	}
	clear(p.cands[:cap(p.cands)])
	r.removed.Store(true)
	if r.inflight.Load() == 0 {
		r.drainOnce.Do(func() { close(r.drained) })
	} else {
		p.draining[id] = append(p.draining[id], r)
	}
	return r.drained, true
}

// SetCapacity changes how many requests a replica may serve at once
// (0: no limit). Requests already in flight above a lowered capacity go
// on; new ones wait until the count is below it.
func (p *Pool) SetCapacity(id string, capacity int) error {
	if capacity < 0 {
		return fmt.Errorf("set capacity of replica %s: capacity %d is negative", id, capacity)
	}
	p.mu.Lock()
	r, ok := p.byID[id]
	if !ok {
		p.mu.Unlock()
		return fmt.Errorf("set capacity of replica %s: not in the pool", id)
	}
	old := r.capacity
	r.capacity = capacity
	p.mu.Unlock()
	switch {
	case old == 0:
	case capacity == 0:
		p.freed(0)
	case capacity > old:
		p.freed(capacity - old)
	}
	return nil
}

// Pick chooses a replica for a request whose prompt (the text that
// precedes generation, or any stable bytes standing for it; nil for
// none) is given, counts the request on it, and returns its id and the
// ReleaseFunc that ends the request. ok is false, with a no-op release,
// when no replica has room right now; the caller then waits in the
// deployment's Buffer. A retry names the replicas that already failed the
// request in avoid: they are picked only when no other has room.
func (p *Pool) Pick(prompt []byte, avoid ...string) (replicaID string, release ReleaseFunc, ok bool) {
	replicaID, release, room := p.PickFor("", prompt, avoid...)
	return replicaID, release, room == RoomTaken
}

// PickFor is Pick for a request of flow (a tenant; "" for the shared
// flow), which takes its share of the slots: while other flows are active,
// a flow at or above its fair share of the pool's slots gets no slot that
// would leave none free for another flow below its share (see
// flowShares). room says how it went: RoomTaken (the request has a slot),
// RoomHeld (slots are free, kept for other flows) or RoomNone.
func (p *Pool) PickFor(flow string, prompt []byte, avoid ...string) (replicaID string, release ReleaseFunc, room Room) {
	return p.PickAdapter(flow, "", prompt, avoid...)
}

// PickAdapter is PickFor for a request that applies a LoRA adapter
// ("" for none): among the replicas within the load slack it prefers one
// that holds the adapter, then one with a free adapter slot, then one the
// adapter is being loaded on, and only then one that must evict another;
// prefix affinity and load choose among the best of them.
func (p *Pool) PickAdapter(flow, adapter string, prompt []byte, avoid ...string) (replicaID string, release ReleaseFunc, room Room) {
	var stack [64]uint64
	var chain []uint64
	if p.index != nil {
		chain = prefixChain(p.seed, prompt, p.prefix.BlockSize, p.prefix.MaxPromptBlocks, stack[:0])
	}
	p.mu.Lock()
	r, done, held := p.pickLocked(flow, adapter, chain, avoid)
	if r == nil && !held && len(avoid) > 0 {
		r, done, held = p.pickLocked(flow, adapter, chain, nil)
	}
	if r != nil && adapter != "" {
		r.adapters.routed(adapter)
	}
	p.mu.Unlock()
	switch {
	case held:
		return "", releaseNothing, RoomHeld
	case r == nil:
		return "", releaseNothing, RoomNone
	}
	var once atomic.Bool
	return r.id, func(err error) {
		if !once.CompareAndSwap(false, true) {
			return
		}
		if flow != "" || adapter != "" {
			p.mu.Lock()
			if flow != "" {
				p.shares.released(flow, p.now())
			}
			if adapter != "" {
				r.adapters.answered(adapter, err == nil, p.adapterSlots)
			}
			p.mu.Unlock()
		}
		left := r.inflight.Add(-1)
		if done != nil {
			done(err)
		}
		if r.removed.Load() {
			if left == 0 {
				r.drainOnce.Do(func() { close(r.drained) })
			}
			return
		}
		if p.onFree != nil {
			p.onFree(1)
		}
	}, RoomTaken
}

// pickLocked runs the policy over the candidates and takes a slot on the
// chosen replica for flow. It returns nil when none can take the request,
// and held when slots are free but flow's share keeps it from them.
func (p *Pool) pickLocked(flow, adapter string, chain []uint64, avoid []string) (_ *poolReplica, _ func(error), held bool) {
	now := p.now()
	p.epoch++
	cands := p.cands[:0]
	free, total := 0, 0
	for _, r := range p.replicas {
		n := int(r.inflight.Load())
		if total >= 0 {
			if r.capacity == 0 {
				total = -1 // no limit: no shares
			} else {
				total += r.capacity
			}
		}
		if r.capacity > 0 && n >= r.capacity {
			continue
		}
		if r.breaker != nil && !r.breaker.admits(now) {
			continue
		}
		if slices.Contains(avoid, r.id) {
			continue
		}
		if p.index != nil {
			o := &p.index.owners[r.owner]
			o.slot, o.epoch = len(cands), p.epoch
		}
		cands = append(cands, Candidate{ID: r.id, InFlight: n, Capacity: r.capacity, rep: r})
		free += r.capacity - n
	}
	p.cands = cands
	if !p.shares.admits(flow, free, max(total, 0), now) {
		return nil, nil, free > 0
	}
	if len(chain) > 0 && len(cands) > 0 {
		p.index.match(chain, p.epoch, cands)
	}
	cands = p.byAdapter(cands, adapter)
	for len(cands) > 0 {
		i := p.policy(p.rng, cands)
		if i < 0 || i >= len(cands) {
			return nil, nil, false
		}
		r := cands[i].rep
		var done func(error)
		if r.breaker != nil {
			d, err := r.breaker.allow()
			if err != nil {
				// Lost the half-open probe to another request, or the breaker
				// opened since admits: offer the others.
				cands[i] = cands[len(cands)-1]
				cands = cands[:len(cands)-1]
				continue
			}
			done = d
		}
		r.inflight.Add(1)
		if flow != "" {
			p.shares.took(flow)
		}
		if len(chain) > 0 {
			p.index.record(r.owner, chain)
		}
		return r, done, false
	}
	return nil, nil, false
}

// InFlight returns the requests in flight on replica id, counting those of
// a removed replica of that id that are still draining; 0 for an unknown id.
func (p *Pool) InFlight(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	if r, ok := p.byID[id]; ok {
		n += int(r.inflight.Load())
	}
	left := p.draining[id][:0]
	for _, r := range p.draining[id] {
		if k := r.inflight.Load(); k > 0 {
			n += int(k)
			left = append(left, r)
		}
	}
	if len(left) == 0 {
		delete(p.draining, id)
	} else {
		p.draining[id] = left
	}
	return n
}

// Len returns the number of replicas in rotation.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.replicas)
}

// Replicas returns a snapshot of the replicas in rotation, ordered by id.
func (p *Pool) Replicas() []Replica {
	p.mu.Lock()
	reps := slices.Clone(p.replicas)
	out := make([]Replica, len(reps))
	for i, r := range reps {
		out[i] = Replica{ID: r.id, Capacity: r.capacity, InFlight: int(r.inflight.Load())}
	}
	p.mu.Unlock()
	for i, r := range reps {
		if r.breaker != nil {
			out[i].Breaker = r.breaker.current()
		}
	}
	slices.SortFunc(out, func(a, b Replica) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// BreakerState returns the state of replica id's circuit breaker (an open
// one whose cooldown ended reads half-open); ok is false for an unknown id.
func (p *Pool) BreakerState(id string) (state BreakerState, ok bool) {
	p.mu.Lock()
	r, ok := p.byID[id]
	p.mu.Unlock()
	if !ok {
		return BreakerClosed, false
	}
	if r.breaker == nil {
		return BreakerClosed, true
	}
	return r.breaker.current(), true
}
