// Package runtime runs engine runtimes on a node's capacity: slots with a
// capacity class, each runtime's lifecycle (starting → blank → loading →
// ready → sleeping → draining → stopped, or gone when it dies), health
// checks, and the warm pool that makes cold starts fast. Acquire hands out
// a replica of a model revision by the cheapest tier available: wake a
// sleeping replica (T1), load into a warm blank runtime from the node
// cache (T2) or the bucket (T3), or start a runtime first (T4). Backends
// (package process, package containerd) start the runtimes themselves.
// Cordon (cordon.go) takes a class of slots out of service when its
// capacity is reclaimed; package spot watches for the spot interruption
// notices that say so.
package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/internal/tier"

	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/loader"
	"github.com/stokehq/stoke/weightstore/manifest"
	"github.com/stokehq/stoke/weightstore/nodecache"
)

// Class is a slot's capacity class.
type Class string

// The capacity classes.
const (
	OnDemand Class = "on-demand"
	Spot     Class = "spot"
)

// ErrNoCapacity reports a node with no free slot and nothing to evict.
var ErrNoCapacity = errors.New("no free runtime slot on this node")

// Options configure a Manager.
type Options struct {
	// Backend starts the runtimes.
	Backend Backend
	// Dir holds the runtimes' sockets.
	Dir string
	// Slots lists the node's slots by capacity class; its length is the
	// node's capacity.
	Slots []Class
	// Warm is how many blank runtimes to keep started.
	Warm int
	// SleepBudget is the weight memory sleeping replicas may hold; a
	// released replica past it is unloaded to blank instead.
	SleepBudget int64
	// Source is the bucket (s3://… or file://…) models load from.
	Source string
	// Cache, when set, is the node cache the manager keeps for its
	// runtimes (the runtimes themselves then run without one): a pinned
	// revision it holds loads straight from its read-only view (T2), and
	// after a load from the bucket (T3) the manager fills it from Bucket,
	// the opened Source.
	Cache  nodecache.Cache
	Bucket bucket.Bucket
	// WeightArena is the weight memory of a slot: every runtime pre-faults
	// an arena of this size when it starts, so a warm runtime's loads pay
	// no page faults (0: none).
	WeightArena int64
	// EngineArgs are passed to every runtime's engine (its KV cache, node
	// cache, threads).
	EngineArgs []string
	// MemoryBytes and CPUs limit each runtime where the backend can.
	MemoryBytes int64
	CPUs        float64
	// StartTimeout bounds how long a runtime may take to serve its blank
	// state (default 30 s).
	StartTimeout time.Duration
	// HealthInterval is the time between health checks (default 2 s); a
	// runtime failing HealthFailures (default 3) in a row is stopped.
	HealthInterval time.Duration
	HealthFailures int
	// RetireSurplus stops a released runtime that went back to blank when
	// the warm pool is full without it. A node's processes use only the
	// node's own slots, and a blank one left there makes the next cold
	// start cheaper; a cluster's pods hold capacity other work could use,
	// so scaling to zero must delete them.
	RetireSurplus bool
	// StopGrace is how long a stopped runtime may drain (default 10 s).
	StopGrace time.Duration
	// KeepOnClose leaves runtimes running when the manager closes, for the
	// next manager to re-adopt.
	KeepOnClose bool
	// OnEvent, when set, receives every event; it must not block.
	OnEvent func(Event)
	// Logger receives the manager's logs (slog.Default() when nil).
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.StartTimeout <= 0 {
		o.StartTimeout = 30 * time.Second
	}
	if o.HealthInterval <= 0 {
		o.HealthInterval = 2 * time.Second
	}
	if o.HealthFailures <= 0 {
		o.HealthFailures = 3
	}
	if o.StopGrace <= 0 {
		o.StopGrace = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Event reports a change in a runtime.
type Event struct {
	Time    time.Time `json:"time"`
	Runtime string    `json:"runtime"`
	Slot    int       `json:"slot"`
	State   State     `json:"state"`
	Model   string    `json:"model,omitempty"`
	// Reason says why, for gone runtimes and failures.
	Reason string `json:"reason,omitempty"`
}

// Info describes a runtime, as GET /admin/runtimes lists it.
type Info struct {
	ID       string `json:"id"`
	Slot     int    `json:"slot"`
	Class    Class  `json:"class"`
	State    State  `json:"state"`
	Model    string `json:"model,omitempty"`
	Revision string `json:"revision,omitempty"`
	// Addr is where its engine listens ("unix:///path" or "host:port");
	// Socket is the path of a unix socket address.
	Addr     string    `json:"addr"`
	Socket   string    `json:"socket,omitempty"`
	InUse    bool      `json:"in_use"`
	Weights  int64     `json:"weight_bytes,omitempty"`
	Started  time.Time `json:"started"`
	LastUsed time.Time `json:"last_used,omitzero"`
	// Cordoned says its slot's class is cordoned (Cordon): nothing new
	// starts there, and the runtime stops once released.
	Cordoned bool `json:"cordoned,omitempty"`
}

// Breakdown is where an acquisition's time went.
type Breakdown struct {
	// Start is starting a runtime until it serves (T4 only).
	Start time.Duration `json:"start_seconds"`
	// Fetch is streaming the weights into the runtime (T2–T4).
	Fetch time.Duration `json:"fetch_seconds"`
	// Load is the rest of the load: building the model and its engine.
	Load time.Duration `json:"load_seconds"`
	// Wake is waking a sleeping replica (T1).
	Wake time.Duration `json:"wake_seconds"`
	// Warmup is a one-token completion that checks freshly loaded
	// weights serve (not after a wake).
	Warmup time.Duration `json:"warmup_seconds"`
	// Total is the whole acquisition.
	Total time.Duration `json:"total_seconds"`
}

// MarshalJSON writes the durations as seconds.
func (b Breakdown) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]float64{
		"start_seconds": b.Start.Seconds(), "fetch_seconds": b.Fetch.Seconds(), "load_seconds": b.Load.Seconds(),
		"wake_seconds": b.Wake.Seconds(), "warmup_seconds": b.Warmup.Seconds(), "total_seconds": b.Total.Seconds(),
	})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (b *Breakdown) UnmarshalJSON(data []byte) error {
	var m map[string]float64
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	d := func(k string) time.Duration { return time.Duration(m[k] * float64(time.Second)) }
	*b = Breakdown{Start: d("start_seconds"), Fetch: d("fetch_seconds"), Load: d("load_seconds"), Wake: d("wake_seconds"),
		Warmup: d("warmup_seconds"), Total: d("total_seconds")}
	return nil
}

// Replica is an acquired runtime serving a model revision.
type Replica struct {
	ID string
	// Addr is where its engine listens ("unix:///path" or "host:port").
	Addr     string
	Model    string
	Revision string
	// Tier is how it was acquired; LoadTier is where its weights came
	// from (tier.Cache or tier.Bucket) when it loaded any.
	Tier     tier.Tier
	LoadTier tier.Tier
	// WeightBytes is how many weight bytes it loaded (0 when woken).
	WeightBytes int64
	Breakdown   Breakdown
}

// runtimeState is the manager's view of one runtime.
type runtimeState struct {
	id       string
	slot     int
	state    State
	model    string
	revision string
	weights  int64
	inUse    bool
	proc     Process
	client   *EngineClient
	started  time.Time
	lastUsed time.Time
	fails    int
	retiring bool // failed its health checks; being stopped
	// fallingAsleep reserves its weights in the sleep budget while a
	// Release puts it to sleep.
	fallingAsleep bool
	warm          chan struct{}      // closed once a starting runtime is blank or gone
	view          nodecache.Revision // the cache view its weights are read from, if any
}

// Manager runs the runtimes of one node.
type Manager struct {
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	runtimes map[string]*runtimeState
	slots    []string // runtime id per slot, "" when free
	seq      int
	closed   bool
	// cordoned holds the slot classes Cordon took out of service.
	cordoned map[Class]bool

	loads       loadMetrics
	sleepLimits map[string]int // per model, from SetSleepLimit
	// served holds the revisions a replica on this node has served: a
	// later load of one skips the warm-up, as a wake does.
	served map[string]bool

	wg   sync.WaitGroup
	stop chan struct{}
}

// New starts a manager: it re-adopts the runtimes an earlier manager left
// running (or stops those that do not fit or do not answer) and starts
// filling the warm pool.
func New(ctx context.Context, opts Options) (*Manager, error) {
	opts = opts.withDefaults()
	if opts.Backend == nil || opts.Dir == "" || len(opts.Slots) == 0 {
		return nil, errors.New("new runtime manager: Backend, Dir and at least one slot are required")
	}
	if opts.Warm > len(opts.Slots) {
		return nil, fmt.Errorf("new runtime manager: a warm pool of %d does not fit %d slots", opts.Warm, len(opts.Slots))
	}
	m := &Manager{opts: opts, log: opts.Logger.With("component", "runtime-manager", "backend", opts.Backend.Name()),
		runtimes: map[string]*runtimeState{}, slots: make([]string, len(opts.Slots)), stop: make(chan struct{}), seq: int(time.Now().UnixNano() % 1e6), loads: newLoadMetrics(), sleepLimits: map[string]int{}, served: map[string]bool{}, cordoned: map[Class]bool{}}
	procs, err := opts.Backend.Recover(ctx)
	if err != nil {
		return nil, fmt.Errorf("new runtime manager: recover runtimes: %w", err)
	}
	for _, p := range procs {
		m.adopt(ctx, p)
	}
	m.wg.Add(1)
	go m.healthLoop()
	m.fillPool()
	return m, nil
}

// adopt takes over a runtime from an earlier manager when it answers and a
// slot is free, and stops it otherwise.
func (m *Manager) adopt(ctx context.Context, p Process) {
	client := clientOf(p)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	st, err := client.State(cctx)
	cancel()
	m.mu.Lock()
	slot := m.freeSlotLocked()
	m.mu.Unlock()
	if err != nil || slot < 0 {
		reason := "no free slot"
		if err != nil {
			reason = err.Error()
		}
		m.log.Info("stopping a runtime from an earlier run", "runtime", p.ID(), "reason", reason)
		p.Stop(ctx, m.opts.StopGrace)
		client.Close()
		return
	}
	r := &runtimeState{id: p.ID(), slot: slot, proc: p, client: client, started: time.Now(), warm: make(chan struct{})}
	close(r.warm)
	switch st.State {
	case engineapi.StateReady, engineapi.StateSleeping:
		r.state, r.model = State(st.State), st.Model
		if st.Load != nil {
			r.revision, r.weights = st.Load.Revision, st.Load.TotalBytes
			if r.revision == "" && st.Load.Request.Path != "" {
				r.revision, r.weights, r.view = m.adoptedView(ctx, st.Load.Request.Path)
			}
		}
	default:
		r.state = StateBlank
	}
	m.mu.Lock()
	m.runtimes[r.id], m.slots[slot] = r, r.id
	m.mu.Unlock()
	m.watchExit(r)
	m.log.Info("re-adopted a runtime", "runtime", r.id, "state", r.state, "model", r.model)
	m.emit(r, "re-adopted")
}

// adoptedView finds the revision of a re-adopted runtime that loaded a
// directory (a node cache view: the engine knows only its path) from the
// manifest there, and holds a view of it in the cache as a load would.
func (m *Manager) adoptedView(ctx context.Context, dir string) (revision string, weights int64, view nodecache.Revision) {
	raw, err := os.ReadFile(filepath.Join(dir, manifest.FileName))
	if err != nil {
		return "", 0, nil
	}
	man, err := manifest.Parse(raw)
	if err != nil {
		return "", 0, nil
	}
	return man.Revision, man.TotalBytes, m.openView(ctx, man.Revision)
}

// Runtimes lists every runtime, by slot.
func (m *Manager) Runtimes() []Info {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Info, 0, len(m.runtimes))
	for _, r := range m.runtimes {
		out = append(out, Info{ID: r.id, Slot: r.slot, Class: m.opts.Slots[r.slot], State: r.state, Model: r.model, Revision: r.revision,
			Addr: r.proc.Addr(), Socket: socketPath(r.proc.Addr()), InUse: r.inUse, Weights: r.weights, Started: r.started, LastUsed: r.lastUsed, Cordoned: m.cordonedLocked(r.slot)})
	}
	slices.SortFunc(out, func(a, b Info) int { return a.Slot - b.Slot })
	return out
}

// Acquire returns a replica of model at revision ("" for the bucket's
// current one) by the cheapest tier available: an idle ready replica (T0:
// one a restarted manager re-adopted), a sleeping one, a warm blank
// runtime, a new runtime. The replica is the caller's until Release.
func (m *Manager) Acquire(ctx context.Context, model, revision string) (*Replica, error) {
	start := time.Now()
	r, how, err := m.claim(model, revision)
	if err != nil {
		return nil, err
	}
	rep := &Replica{ID: r.id, Addr: r.proc.Addr(), Model: model, Revision: revision, Tier: tier.Bucket}
	fail := func(err error) (*Replica, error) {
		m.unclaim(r, err)
		return nil, fmt.Errorf("acquire %s: %w", model, err)
	}
	if how == claimHot { // it serves already: nothing to load, wake or warm up
		if m.isCordoned(r) {
			return fail(ErrCordoned)
		}
		m.mu.Lock()
		rep.Tier, rep.Revision = tier.Hot, r.revision
		m.mu.Unlock()
		rep.Breakdown.Total = time.Since(start)
		m.log.Info("acquired a replica", "runtime", r.id, "model", model, "revision", rep.Revision, "tier", rep.Tier, "seconds", rep.Breakdown.Total.Seconds())
		return rep, nil
	}
	if how == claimStarted || how == claimEvicted {
		if err := m.waitWarm(ctx, r); err != nil {
			return fail(err)
		}
		if how == claimStarted {
			rep.Tier, rep.Breakdown.Start = tier.Start, time.Since(start)
		}
	}
	switch how {
	case claimSleeping:
		rep.Tier = tier.Wake
		t := time.Now()
		if err := r.client.Wake(ctx); err != nil {
			return fail(err)
		}
		rep.Breakdown.Wake = time.Since(t)
		rep.Revision = r.revision
	default:
		m.setState(r, StateLoading, model, "")
		t := time.Now()
		req := engineapi.LoadRequest{Source: m.opts.Source, Model: model, Revision: revision}
		view := m.openView(ctx, revision)
		if view != nil {
			req = engineapi.LoadRequest{Path: view.Dir(), ServedModelName: model}
		}
		st, err := r.client.Load(ctx, req)
		if err != nil {
			if view != nil {
				view.Close()
			}
			return fail(err)
		}
		total := time.Since(t)
		switch {
		case view != nil:
			rep.LoadTier, rep.Revision = tier.Cache, revision
			m.mu.Lock()
			r.view, r.revision, r.weights = view, revision, view.Manifest().TotalBytes
			m.mu.Unlock()
		case st.Load != nil:
			rep.LoadTier, rep.Revision = st.Load.Tier, st.Load.Revision
			rep.Breakdown.Fetch = time.Duration(st.Load.ElapsedSeconds * float64(time.Second))
			m.mu.Lock()
			r.revision, r.weights = st.Load.Revision, st.Load.TotalBytes
			m.mu.Unlock()
			if m.opts.Cache != nil && st.Load.Tier == tier.Bucket {
				m.mu.Lock()
				if !m.closed {
					m.wg.Add(1)
					go m.prefetchAfterLoad(model, st.Load.Revision)
				}
				m.mu.Unlock()
			}
		}
		rep.Breakdown.Load = max(0, total-rep.Breakdown.Fetch)
		m.mu.Lock()
		rep.WeightBytes = r.weights
		m.mu.Unlock()
		if rep.LoadTier != "" {
			m.loads.observe(string(rep.LoadTier), rep.WeightBytes, total.Seconds())
		}
		if rep.Tier != tier.Start && rep.LoadTier == tier.Cache {
			rep.Tier = tier.Cache
		}
	}
	// The warm-up checks that freshly loaded weights serve, once per
	// revision: a woken replica, or a revision that has served here
	// before, goes straight to ready.
	m.mu.Lock()
	warm := how == claimSleeping || (rep.Revision != "" && m.served[rep.Revision])
	m.mu.Unlock()
	if !warm {
		t := time.Now()
		if err := r.client.Complete(ctx, model, []int32{1}); err != nil {
			return fail(fmt.Errorf("warm-up: %w", err))
		}
		rep.Breakdown.Warmup = time.Since(t)
		if rep.Revision != "" {
			m.mu.Lock()
			m.served[rep.Revision] = true
			m.mu.Unlock()
		}
	}
	if m.isCordoned(r) { // while it loaded: hand out no replica there
		return fail(ErrCordoned)
	}
	m.setState(r, StateReady, model, "")
	rep.Breakdown.Total = time.Since(start)
	rep.Addr = r.proc.Addr() // known now that it serves, whatever the backend
	m.fillPool()
	m.log.Info("acquired a replica", "runtime", r.id, "model", model, "revision", rep.Revision, "tier", rep.Tier, "load_tier", rep.LoadTier, "seconds", rep.Breakdown.Total.Seconds())
	return rep, nil
}

// openView opens the node cache's view of a pinned revision, or returns nil
// when there is no such cache or it lacks the revision.
func (m *Manager) openView(ctx context.Context, revision string) nodecache.Revision {
	if m.opts.Cache == nil || revision == "" {
		return nil
	}
	v, err := m.opts.Cache.OpenRevision(ctx, revision)
	if err != nil {
		if !errors.Is(err, nodecache.ErrNotExist) {
			m.log.Warn("node cache view failed; loading from the bucket", "revision", revision, "err", err)
		}
		return nil
	}
	return v
}

// Prefetch fills the node cache with a revision from the bucket, so that
// the next load of it on this node is T2. It is the one place the node
// cache is filled: after a load from the bucket (T3), and when a
// deployment moves to a new revision.
func (m *Manager) Prefetch(ctx context.Context, model, revision string) error {
	if m.opts.Cache == nil || m.opts.Bucket == nil {
		return nil
	}
	if _, err := loader.Prefetch(ctx, m.opts.Cache, loader.Request{Bucket: m.opts.Bucket, Model: model, Revision: revision}, loader.Options{}); err != nil {
		return fmt.Errorf("prefetch %s@%s into the node cache: %w", model, revision, err)
	}
	return nil
}

// prefetchAfterLoad is Prefetch in the background, after a runtime loaded
// a revision from the bucket; it ends when the manager closes.
func (m *Manager) prefetchAfterLoad(model, revision string) {
	defer m.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-m.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := m.Prefetch(ctx, model, revision); err != nil && !errors.Is(err, context.Canceled) {
		m.log.Warn("node cache prefetch failed", "err", err)
	}
}

// closeView releases the cache view a runtime's weights were read from.
func (m *Manager) closeView(r *runtimeState) {
	m.mu.Lock()
	v := r.view
	r.view = nil
	m.mu.Unlock()
	if v != nil {
		if err := v.Close(); err != nil {
			m.log.Warn("close node cache view", "runtime", r.id, "err", err)
		}
	}
}

// claimKind says which runtime an acquisition got.
type claimKind int

const (
	claimHot      claimKind = iota // an idle ready replica of the revision (re-adopted)
	claimSleeping                  // a sleeping replica of the revision
	claimBlank                     // a warm blank runtime
	claimStarted                   // a runtime starting (for the pool, or now in a free slot)
	claimEvicted                   // an idle sleeping replica of another model, being unloaded
)

// claim picks the runtime an acquisition uses and marks it in use: an
// idle ready replica of the revision, a sleeping one, a blank runtime, a
// new runtime in a free slot, or a blank one made from the least recently
// used idle sleeping replica.
func (m *Manager) claim(model, revision string) (*runtimeState, claimKind, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, 0, errors.New("acquire: the runtime manager is closed")
	}
	var asleep, blank, starting, sleeper *runtimeState
	for _, r := range m.sortedRuntimes() {
		if r.inUse || m.cordonedLocked(r.slot) {
			continue
		}
		same := r.model == model && (revision == "" || r.revision == revision)
		switch {
		case r.state == StateReady && same:
			r.inUse = true
			return r, claimHot, nil
		case r.state == StateSleeping && same && asleep == nil:
			asleep = r
		case r.state == StateBlank && blank == nil:
			blank = r
		case r.state == StateStarting && starting == nil:
			starting = r
		case r.state == StateSleeping && (sleeper == nil || r.lastUsed.Before(sleeper.lastUsed)):
			sleeper = r
		}
	}
	if asleep != nil {
		asleep.inUse = true
		return asleep, claimSleeping, nil
	}
	if blank != nil {
		blank.inUse = true
		return blank, claimBlank, nil
	}
	if starting != nil {
		starting.inUse = true
		return starting, claimStarted, nil
	}
	if slot := m.freeSlotLocked(); slot >= 0 {
		r, err := m.startLocked(slot)
		if err != nil {
			return nil, 0, err
		}
		r.inUse = true
		return r, claimStarted, nil
	}
	if sleeper != nil {
		sleeper.inUse = true
		sleeper.warm = make(chan struct{})
		go m.evictSleeper(sleeper)
		return sleeper, claimEvicted, nil
	}
	return nil, 0, fmt.Errorf("acquire %s: %w (%d slots, all busy)", model, ErrNoCapacity, len(m.slots))
}

// evictSleeper unloads an idle sleeping replica so its runtime can take a
// new model; waitWarm waits for it like for a starting runtime.
func (m *Manager) evictSleeper(r *runtimeState) {
	ctx, cancel := context.WithTimeout(context.Background(), m.opts.StopGrace)
	err := m.unloadToBlank(ctx, r, "evicted for another model")
	cancel()
	if err == nil { // wake the acquisition waiting for it
		m.mu.Lock()
		close(r.warm)
		m.mu.Unlock()
	}
}

// becameBlank records that a starting runtime serves its blank state,
// waking whoever waits for it.
func (m *Manager) becameBlank(r *runtimeState) {
	m.setState(r, StateBlank, "", "")
	m.mu.Lock()
	close(r.warm)
	m.mu.Unlock()
}

// unclaim gives back a runtime whose acquisition failed: back to blank if
// it still answers and its slot is not cordoned, otherwise stopped.
func (m *Manager) unclaim(r *runtimeState, cause error) {
	m.log.Warn("acquisition failed", "runtime", r.id, "err", cause)
	if m.isCordoned(r) { // a blank runtime there would serve nobody
		m.markGone(r, fmt.Sprintf("failed to serve in a cordoned slot: %v", cause))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := r.client.State(ctx)
	if err == nil && st.State == engineapi.StateBlank {
		m.mu.Lock()
		r.inUse = false
		m.mu.Unlock()
		m.setState(r, StateBlank, "", cause.Error())
		m.fillPool()
		return
	}
	m.markGone(r, fmt.Sprintf("failed to serve: %v", cause))
}

// Release returns a replica: it sleeps (weights kept, KV freed) when the
// sleep budget has room for its weights and its model has fewer sleeping
// replicas than its SetSleepLimit, and is unloaded back to blank
// otherwise. A replica in a cordoned slot (Cordon) is stopped instead,
// freeing its slot.
func (m *Manager) Release(ctx context.Context, id string) error {
	m.mu.Lock()
	r, ok := m.runtimes[id]
	if !ok || !r.inUse {
		m.mu.Unlock()
		return fmt.Errorf("release %s: not an acquired runtime", id)
	}
	if m.cordonedLocked(r.slot) {
		m.mu.Unlock()
		m.retire(r, "released in a cordoned slot")
		return nil
	}
	var sleeping int64
	sleepers := 0
	for _, o := range m.runtimes {
		if o.state == StateSleeping || o.fallingAsleep {
			sleeping += o.weights
			if o.model == r.model {
				sleepers++
			}
		}
	}
	limit, limited := m.sleepLimits[r.model]
	canSleep := sleeping+r.weights <= m.opts.SleepBudget && (!limited || sleepers < limit)
	r.fallingAsleep = canSleep
	m.mu.Unlock()
	if canSleep {
		err := r.client.Sleep(ctx)
		m.mu.Lock()
		r.fallingAsleep = false
		m.mu.Unlock()
		if err != nil {
			m.markGone(r, fmt.Sprintf("sleep failed: %v", err))
			return fmt.Errorf("release %s: %w", id, err)
		}
		m.setState(r, StateSleeping, r.model, "")
	} else if err := m.unloadToBlank(ctx, r, ""); err != nil {
		return fmt.Errorf("release %s: %w", id, err)
	}
	m.mu.Lock()
	r.inUse, r.lastUsed = false, time.Now()
	surplus := m.opts.RetireSurplus && !canSleep && m.warmLocked() > m.opts.Warm
	m.mu.Unlock()
	if surplus { // a blank runtime beyond the warm pool frees its slot
		m.retire(r, "released beyond the warm pool")
	}
	return nil
}

// retire stops a released runtime (draining → gone), freeing its slot;
// its requests were drained by whoever released it.
func (m *Manager) retire(r *runtimeState, reason string) {
	m.mu.Lock()
	drain, model := canMove(r.state, StateDraining), r.model
	m.mu.Unlock()
	if drain {
		m.setState(r, StateDraining, model, reason)
	}
	m.markGone(r, reason)
}

// warmLocked counts the blank and starting runtimes no one holds; m.mu is
// held.
func (m *Manager) warmLocked() int {
	warm := 0
	for _, r := range m.runtimes {
		if !r.inUse && (r.state == StateBlank || r.state == StateStarting) {
			warm++
		}
	}
	return warm
}

// SetSleepLimit caps how many replicas of model Release keeps asleep; a
// negative n removes the cap (the sleep budget alone decides). Replicas
// already asleep stay so.
func (m *Manager) SetSleepLimit(model string, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n < 0 {
		delete(m.sleepLimits, model)
		return
	}
	m.sleepLimits[model] = n
}

// Unload sends an idle sleeping replica back to blank (its weights
// freed), as Release does past the sleep budget.
func (m *Manager) Unload(ctx context.Context, id string) error {
	m.mu.Lock()
	r, ok := m.runtimes[id]
	if !ok || r.inUse || r.state != StateSleeping {
		m.mu.Unlock()
		return fmt.Errorf("unload %s: not an idle sleeping runtime", id)
	}
	r.inUse = true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		r.inUse = false
		m.mu.Unlock()
	}()
	if err := m.unloadToBlank(ctx, r, "unloaded by an operator"); err != nil {
		return fmt.Errorf("unload %s: %w", id, err)
	}
	return nil
}

// unloadToBlank unloads a runtime's model (draining → blank); a runtime
// whose engine fails to unload is gone.
func (m *Manager) unloadToBlank(ctx context.Context, r *runtimeState, reason string) error {
	m.setState(r, StateDraining, r.model, reason)
	if err := r.client.Unload(ctx); err != nil {
		m.markGone(r, fmt.Sprintf("unload failed: %v", err))
		return err
	}
	m.closeView(r)
	m.setState(r, StateBlank, "", "")
	return nil
}

// StopIdle stops every runtime nobody uses (starting, blank and sleeping
// ones), freeing their slots; the warm pool refills unless SetWarm(0).
func (m *Manager) StopIdle(ctx context.Context) error {
	m.mu.Lock()
	var idle []*runtimeState
	for _, r := range m.runtimes {
		if !r.inUse && (r.state == StateStarting || r.state == StateBlank || r.state == StateSleeping) {
			r.inUse = true // nobody claims it while it stops
			idle = append(idle, r)
		}
	}
	m.mu.Unlock()
	var errs []error
	for _, r := range idle {
		errs = append(errs, r.proc.Stop(ctx, m.opts.StopGrace))
		m.markGone(r, "stopped by an operator")
	}
	return errors.Join(errs...)
}

// SetWarm changes the warm pool's size; a larger one starts runtimes now.
func (m *Manager) SetWarm(n int) error {
	m.mu.Lock()
	if n < 0 || n > len(m.slots) {
		m.mu.Unlock()
		return fmt.Errorf("warm pool of %d: want 0 to %d", n, len(m.slots))
	}
	m.opts.Warm = n
	m.mu.Unlock()
	m.fillPool()
	return nil
}

// startLocked starts a runtime in slot; m.mu is held.
func (m *Manager) startLocked(slot int) (*runtimeState, error) {
	m.seq++
	id := fmt.Sprintf("rt-%d-%d", slot, m.seq)
	for m.runtimes[id] != nil { // an adopted runtime's name
		m.seq++
		id = fmt.Sprintf("rt-%d-%d", slot, m.seq)
	}
	args := m.opts.EngineArgs
	if m.opts.WeightArena > 0 {
		args = append(slices.Clip(args), "--weight-arena", strconv.FormatInt(m.opts.WeightArena, 10))
	}
	spec := Spec{ID: id, Socket: filepath.Join(m.opts.Dir, id+".sock"), EngineArgs: args, MemoryBytes: m.opts.MemoryBytes, CPUs: m.opts.CPUs, Class: m.opts.Slots[slot]}
	p, err := m.opts.Backend.Start(context.Background(), spec)
	if err != nil {
		return nil, fmt.Errorf("start a runtime in slot %d: %w", slot, err)
	}
	r := &runtimeState{id: id, slot: slot, state: StateStarting, proc: p, client: clientOf(p), started: time.Now(), warm: make(chan struct{})}
	m.runtimes[id], m.slots[slot] = r, id
	m.watchExit(r)
	go m.awaitBlank(r)
	m.emitLocked(r, "")
	return r, nil
}

// awaitBlank polls a starting runtime until it serves its blank state,
// and stops it when it does not within StartTimeout.
func (m *Manager) awaitBlank(r *runtimeState) {
	deadline := time.Now().Add(m.opts.StartTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-r.proc.Done():
			return // watchExit marks it gone
		case <-time.After(5 * time.Millisecond):
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := r.client.State(ctx)
		cancel()
		if err == nil && st.State == engineapi.StateBlank {
			m.becameBlank(r)
			return
		}
	}
	m.markGone(r, fmt.Sprintf("not serving within the start deadline of %v", m.opts.StartTimeout))
}

// waitWarm waits until a starting (or evicted) runtime is blank.
func (m *Manager) waitWarm(ctx context.Context, r *runtimeState) error {
	m.mu.Lock()
	warm := r.warm
	m.mu.Unlock()
	select {
	case <-warm:
	case <-r.proc.Done():
	case <-ctx.Done():
		return ctx.Err()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if r.state != StateBlank {
		return fmt.Errorf("runtime %s did not start: %s", r.id, r.state)
	}
	return nil
}

// fillPool starts runtimes until Warm of them are blank or starting and
// not in use, as free slots allow.
func (m *Manager) fillPool() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	for warm := m.warmLocked(); warm < m.opts.Warm; warm++ {
		slot := m.freeSlotLocked()
		if slot < 0 {
			return
		}
		if _, err := m.startLocked(slot); err != nil {
			m.log.Warn("warm pool: cannot start a runtime", "err", err)
			return
		}
	}
}

// watchExit marks a runtime gone when its process exits.
func (m *Manager) watchExit(r *runtimeState) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		select {
		case <-r.proc.Done():
			m.markGone(r, "exited")
		case <-m.stop:
		}
	}()
}

// markGone stops a dead or misbehaving runtime (killing it if it still
// runs), frees its slot, tells the listeners and refills the pool.
func (m *Manager) markGone(r *runtimeState, reason string) {
	m.mu.Lock()
	if m.runtimes[r.id] != r {
		m.mu.Unlock()
		return
	}
	delete(m.runtimes, r.id)
	if m.slots[r.slot] == r.id {
		m.slots[r.slot] = ""
	}
	r.state = StateGone
	m.emitLocked(r, reason)
	closed := m.closed
	m.mu.Unlock()
	r.client.Close()
	m.log.Warn("runtime gone", "runtime", r.id, "slot", r.slot, "reason", reason)
	ctx, cancel := context.WithTimeout(context.Background(), m.opts.StopGrace)
	r.proc.Stop(ctx, time.Second) // kills it if need be; removes what it left behind
	cancel()
	m.closeView(r)
	if !closed {
		m.fillPool()
	}
}

func (m *Manager) healthLoop() {
	defer m.wg.Done()
	t := time.NewTicker(m.opts.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		m.mu.Lock()
		var check []*runtimeState
		for _, r := range m.runtimes {
			if r.state != StateStarting && r.state != StateLoading && r.state != StateDraining {
				check = append(check, r)
			}
		}
		m.mu.Unlock()
		for _, r := range check {
			ctx, cancel := context.WithTimeout(context.Background(), m.opts.HealthInterval)
			_, err := r.client.State(ctx)
			cancel()
			m.mu.Lock()
			if err == nil {
				r.fails = 0
			} else {
				r.fails++
			}
			dead := r.fails >= m.opts.HealthFailures && !r.retiring
			r.retiring = r.retiring || dead
			m.mu.Unlock()
			if dead {
				go m.markGone(r, fmt.Sprintf("failed %d health checks: %v", m.opts.HealthFailures, err))
			}
		}
	}
}

// Close stops the manager: every runtime is stopped, unless KeepOnClose
// leaves them to the next manager.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	rs := m.sortedRuntimes()
	m.mu.Unlock()
	close(m.stop)
	m.wg.Wait()
	var errs []error
	for _, r := range rs {
		r.client.Close()
		if !m.opts.KeepOnClose {
			errs = append(errs, r.proc.Stop(ctx, m.opts.StopGrace))
			m.closeView(r)
		}
	}
	return errors.Join(errs...)
}

func (m *Manager) sortedRuntimes() []*runtimeState {
	rs := make([]*runtimeState, 0, len(m.runtimes))
	for _, r := range m.runtimes {
		rs = append(rs, r)
	}
	slices.SortFunc(rs, func(a, b *runtimeState) int { return a.slot - b.slot })
	return rs
}

// setState moves r to st, when the lifecycle allows it: a runtime that
// is gone stays gone, and any other refused move is a bug, logged as one.
func (m *Manager) setState(r *runtimeState, st State, model, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !canMove(r.state, st) {
		if r.state != StateGone {
			m.log.Error("refused a runtime state change", "err", errMove(r.id, r.state, st))
		}
		return
	}
	r.state = st
	if model != "" || st == StateBlank {
		r.model = model
	}
	if st == StateBlank {
		r.revision, r.weights = "", 0
	}
	m.emitLocked(r, reason)
}

func (m *Manager) emit(r *runtimeState, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.emitLocked(r, reason)
}

func (m *Manager) emitLocked(r *runtimeState, reason string) {
	if m.opts.OnEvent != nil {
		m.opts.OnEvent(Event{Time: time.Now(), Runtime: r.id, Slot: r.slot, State: r.state, Model: r.model, Reason: reason})
	}
}

// EngineState reads runtime id's engine state (GET /admin/state) through
// the manager's client of it: the one admin client each engine has.
func (m *Manager) EngineState(ctx context.Context, id string) (engineapi.StateInfo, error) {
	m.mu.Lock()
	r, ok := m.runtimes[id]
	m.mu.Unlock()
	if !ok {
		return engineapi.StateInfo{}, fmt.Errorf("engine state of %s: no such runtime", id)
	}
	return r.client.State(ctx)
}

// socketPath is the path of a unix socket address, "" for a TCP one.
func socketPath(addr string) string {
	path, ok := strings.CutPrefix(addr, "unix://")
	if !ok {
		return ""
	}
	return path
}
