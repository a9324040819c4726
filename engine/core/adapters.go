package core

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sched"
)

// Errors of the adapter pool. Callers tell them apart with errors.Is.
var (
	// ErrUnknownAdapter is returned for a request or an unload naming an
	// adapter the pool does not hold.
	ErrUnknownAdapter = errors.New("unknown LoRA adapter")
	// ErrAdapterInUse refuses to unload an adapter requests still use.
	ErrAdapterInUse = errors.New("LoRA adapter is in use")
	// ErrAdapterExists refuses to load a second adapter under a name
	// already taken by another path or revision.
	ErrAdapterExists = errors.New("a LoRA adapter of that name is already loaded")
	// ErrLoRADisabled is returned when an engine without an adapter pool
	// (LoRA off) is asked for an adapter.
	ErrLoRADisabled = errors.New("LoRA is not enabled on this engine")
)

// AdapterSpec names a LoRA adapter and where its weights come from.
type AdapterSpec struct {
	// Name is what requests call it ("BASE:Name" or Name).
	Name string
	// Path is a PEFT directory on this node or a bucket prefix (the
	// AdapterLoadFunc decides what it can read).
	Path string
	// Revision pins a bucket adapter's revision; "" takes the current one.
	Revision string
}

// AdapterLoadFunc reads an adapter's weights and checks them against the
// served base model: a bad adapter's error wraps model.ErrInvalidAdapter,
// a missing one's fs.ErrNotExist.
type AdapterLoadFunc func(ctx context.Context, spec AdapterSpec) (*model.Adapter, error)

// AdapterPoolConfig sizes an adapter pool.
type AdapterPoolConfig struct {
	// Slots is how many adapters hold their weights at once, and so how
	// many distinct adapters one batch can mix (vLLM's --max-loras).
	Slots int
	// MaxRank bounds an adapter's r (--max-lora-rank).
	MaxRank int
	// Load reads an adapter into a slot.
	Load AdapterLoadFunc
	// Preload are the adapters Preload registers (--lora-modules).
	Preload []AdapterSpec
}

// Defaults of vLLM-style LoRA serving.
const (
	DefaultMaxLoras    = 8
	DefaultMaxLoRARank = 16
)

// AdapterPool holds the adapters an engine serves over one base model:
// every registered adapter (name, path, revision), and a bounded number of
// slots that hold adapters' weights. An adapter is loaded into a slot on
// demand, when a request needs it, and its slot is pinned for as long as a
// request using it runs; when every slot is taken, the least recently used
// adapter no request uses is evicted (its weights dropped; it stays
// registered and is read again when next needed), and when every slot is
// pinned, requests that need another adapter wait, in order, until one
// frees. The pool outlives engines (sleep and wake) and is safe for
// concurrent use.
type AdapterPool struct {
	slots, maxRank int
	load           AdapterLoadFunc
	preload        []AdapterSpec
	ctx            context.Context // cancelled by Close: loads in flight stop
	cancel         context.CancelFunc

	mu      sync.Mutex
	entries map[string]*adapterEntry
	used    int // slots holding weights or being loaded
	tick    uint64
	gen     uint64
	loads   uint64
	evicted uint64
}

// slotState is where an adapter's weights are.
type slotState int

const (
	unloaded slotState = iota
	loading
	loaded
)

// adapterEntry is one registered adapter.
type adapterEntry struct {
	spec   AdapterSpec
	rank   int
	digest string
	// gen numbers registrations: a name loaded again is another adapter
	// to the prefix cache even where its files keep no digest.
	gen     uint64
	state   slotState
	weights *model.Adapter
	attempt *loadAttempt // while loading
	removed bool         // unregistered while loading
	pins    int          // requests holding its slot
	refs    int          // requests naming it, from Submit to their end
	lastUse uint64

	requests atomic.Uint64
	tokens   atomic.Uint64
}

// loadAttempt is one load of an adapter into a slot; the requests waiting
// for it fail with its error.
type loadAttempt struct {
	done bool
	err  error
	wake func()
}

// adapterUse is one request's hold on an adapter.
type adapterUse struct {
	pool    *AdapterPool
	entry   *adapterEntry
	attempt *loadAttempt
	// pinned: the request holds the adapter's slot; waiting: it is in the
	// engine's queue for one; released: its hold is given back.
	pinned, waiting, released bool
}

// NewAdapterPool returns an empty pool.
func NewAdapterPool(cfg AdapterPoolConfig) (*AdapterPool, error) {
	switch {
	case cfg.Slots < 1:
		return nil, fmt.Errorf("adapter pool: slots (--max-loras) must be positive, got %d", cfg.Slots)
	case cfg.MaxRank < 1:
		return nil, fmt.Errorf("adapter pool: the maximum rank (--max-lora-rank) must be positive, got %d", cfg.MaxRank)
	case cfg.Load == nil:
		return nil, errors.New("adapter pool: AdapterPoolConfig.Load is required")
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &AdapterPool{slots: cfg.Slots, maxRank: cfg.MaxRank, load: cfg.Load, preload: slices.Clone(cfg.Preload),
		ctx: ctx, cancel: cancel, entries: map[string]*adapterEntry{}}, nil
}

// Slots is the number of adapter slots.
func (p *AdapterPool) Slots() int { return p.slots }

// MaxRank is the largest rank the pool takes.
func (p *AdapterPool) MaxRank() int { return p.maxRank }

// Preload registers the adapters of AdapterPoolConfig.Preload, stopping at
// the first that fails.
func (p *AdapterPool) Preload(ctx context.Context) error {
	for _, spec := range p.preload {
		if _, _, err := p.Register(ctx, spec); err != nil {
			return err
		}
	}
	return nil
}

// Close stops loads in flight; the pool serves nothing afterwards.
func (p *AdapterPool) Close() { p.cancel() }

// CheckAdapterName refuses a name requests could not address: empty, or
// holding engineapi.AdapterSeparator, whitespace or control characters.
func CheckAdapterName(name string) error {
	switch {
	case name == "":
		return errors.New("the adapter name is empty")
	case strings.Contains(name, engineapi.AdapterSeparator):
		return fmt.Errorf("the adapter name %q holds %q, which separates a base from its adapter in model names", name, engineapi.AdapterSeparator)
	case strings.ContainsFunc(name, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return fmt.Errorf("the adapter name %q holds whitespace or control characters", name)
	}
	return nil
}

// Register makes an adapter servable: its weights are read now, to check
// them against the base (a bad adapter changes nothing), and kept in a
// slot when one is free. Registering a name again with the same path and
// revision is a no-op (created false); with another, ErrAdapterExists.
func (p *AdapterPool) Register(ctx context.Context, spec AdapterSpec) (info engineapi.AdapterInfo, created bool, err error) {
	if err := CheckAdapterName(spec.Name); err != nil {
		return info, false, fmt.Errorf("load LoRA adapter: %w", err)
	}
	if spec.Path == "" {
		return info, false, fmt.Errorf("load LoRA adapter %s: the path is empty", spec.Name)
	}
	if info, done, err := p.registered(spec); done {
		return info, false, err
	}
	a, err := p.read(ctx, spec)
	if err != nil {
		return info, false, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.entries[spec.Name]; e != nil { // registered meanwhile
		info, _, err := p.sameLocked(e, spec)
		return info, false, err
	}
	p.gen++
	e := &adapterEntry{spec: spec, rank: a.Rank(), digest: a.Digest, gen: p.gen}
	if p.used < p.slots {
		p.used++
		p.loads++
		p.tick++
		e.state, e.weights, e.lastUse = loaded, a, p.tick
	}
	p.entries[spec.Name] = e
	return p.infoLocked(e), true, nil
}

// registered reports whether spec's name is taken: done with no error
// when by the same adapter.
func (p *AdapterPool) registered(spec AdapterSpec) (engineapi.AdapterInfo, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.entries[spec.Name]
	if e == nil {
		return engineapi.AdapterInfo{}, false, nil
	}
	return p.sameLocked(e, spec)
}

func (p *AdapterPool) sameLocked(e *adapterEntry, spec AdapterSpec) (engineapi.AdapterInfo, bool, error) {
	if e.spec.Path == spec.Path && e.spec.Revision == spec.Revision {
		return p.infoLocked(e), true, nil
	}
	return engineapi.AdapterInfo{}, true, fmt.Errorf("%w: %s is %s (revision %q); unload it first", ErrAdapterExists,
		spec.Name, e.spec.Path, e.spec.Revision)
}

// read loads spec's weights and checks what the pool itself bounds.
func (p *AdapterPool) read(ctx context.Context, spec AdapterSpec) (*model.Adapter, error) {
	a, err := p.load(ctx, spec)
	if err == nil && a == nil {
		err = errors.New("the loader returned no adapter")
	}
	if err == nil && a.Rank() > p.maxRank {
		err = fmt.Errorf("%w: r = %d exceeds the engine's maximum LoRA rank %d (--max-lora-rank)", model.ErrInvalidAdapter, a.Rank(), p.maxRank)
	}
	if err != nil {
		return nil, fmt.Errorf("load LoRA adapter %s from %s: %w", spec.Name, spec.Path, err)
	}
	return a, nil
}

// Unregister forgets an adapter and frees its slot. An adapter that
// requests use (running, or waiting for a slot) is not unloaded:
// ErrAdapterInUse, and nothing changes.
func (p *AdapterPool) Unregister(name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.entries[name]
	if e == nil {
		return fmt.Errorf("unload LoRA adapter %s: %w", name, ErrUnknownAdapter)
	}
	if e.refs > 0 {
		return fmt.Errorf("unload LoRA adapter %s: %w by %d requests (%d running); retry once they finish",
			name, ErrAdapterInUse, e.refs, e.pins)
	}
	delete(p.entries, name)
	switch e.state {
	case loaded:
		p.used--
		e.weights = nil
	case loading:
		e.removed = true // the load frees its slot when it ends
	}
	return nil
}

// Has reports whether name is registered.
func (p *AdapterPool) Has(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.entries[name] != nil
}

// Names lists the registered adapters, sorted.
func (p *AdapterPool) Names() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	names := make([]string, 0, len(p.entries))
	for n := range p.entries {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Lookup describes one registered adapter.
func (p *AdapterPool) Lookup(name string) (engineapi.AdapterInfo, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.entries[name]
	if e == nil {
		return engineapi.AdapterInfo{}, false
	}
	return p.infoLocked(e), true
}

// Info describes the pool and every registered adapter, sorted by name.
func (p *AdapterPool) Info() engineapi.AdaptersInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	info := engineapi.AdaptersInfo{Slots: p.slots, MaxRank: p.maxRank, Adapters: []engineapi.AdapterInfo{}}
	for _, e := range p.entries {
		info.Adapters = append(info.Adapters, p.infoLocked(e))
	}
	slices.SortFunc(info.Adapters, func(a, b engineapi.AdapterInfo) int { return cmp.Compare(a.Name, b.Name) })
	return info
}

func (p *AdapterPool) infoLocked(e *adapterEntry) engineapi.AdapterInfo {
	return engineapi.AdapterInfo{Name: e.spec.Name, Path: e.spec.Path, Revision: e.spec.Revision, Rank: e.rank,
		Loaded: e.state == loaded, Running: e.pins, Waiting: e.refs - e.pins}
}

// use takes a request's hold on name from Submit to its end, and returns
// the prefix-cache salt of the adapter's registration.
func (p *AdapterPool) use(name string) (*adapterUse, string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.entries[name]
	if e == nil {
		return nil, "", fmt.Errorf("%w: %s", ErrUnknownAdapter, name)
	}
	e.refs++
	e.requests.Add(1)
	id := e.digest
	if id == "" {
		id = "registration-" + strconv.FormatUint(e.gen, 10)
	}
	salt := "lora\x00" + e.spec.Name + "\x00" + e.spec.Revision + "\x00" + id
	return &adapterUse{pool: p, entry: e}, salt, nil
}

// acquire pins the slot of u's adapter when its weights are loaded. When
// they are not and newSlot is set, it starts loading them into a free
// slot, or one whose adapter it evicts (the least recently used that no
// request uses); ready is false until the load is done, and wake is called
// when it is. needSlot reports that u waits because every slot is pinned
// (or newSlot is false). err is the failure of the load u waited for.
func (p *AdapterPool) acquire(u *adapterUse, wake func(), newSlot bool) (a *model.Adapter, ready, needSlot bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := u.entry
	if at := u.attempt; at != nil && at.done && at.err != nil {
		return nil, false, false, at.err
	}
	switch e.state {
	case loaded:
		e.pins++
		p.tick++
		e.lastUse = p.tick
		return e.weights, true, false, nil
	case loading:
		u.attempt = e.attempt
		e.attempt.wake = wake
		return nil, false, false, nil
	}
	if !newSlot {
		return nil, false, true, nil
	}
	if p.used >= p.slots && !p.evictLocked() {
		return nil, false, true, nil
	}
	p.used++
	at := &loadAttempt{wake: wake}
	e.state, e.attempt, u.attempt = loading, at, at
	go p.fill(e, at)
	return nil, false, false, nil
}

// evictLocked drops the weights of the least recently used adapter no
// request uses (none runs with it, none waits for it: an adapter loaded
// for a waiting request stays until the request pins it), freeing its
// slot; false when there is none.
func (p *AdapterPool) evictLocked() bool {
	var victim *adapterEntry
	for _, e := range p.entries {
		if e.state == loaded && e.refs == 0 && (victim == nil || e.lastUse < victim.lastUse) {
			victim = e
		}
	}
	if victim == nil {
		return false
	}
	victim.state, victim.weights = unloaded, nil
	p.used--
	p.evicted++
	return true
}

// fill reads e's weights for load attempt at and wakes the engine.
func (p *AdapterPool) fill(e *adapterEntry, at *loadAttempt) {
	a, err := p.read(p.ctx, e.spec)
	if err == nil && e.digest != "" && a.Digest != e.digest {
		err = fmt.Errorf("load LoRA adapter %s from %s: its files changed since it was loaded (digest %s, now %s); unload it and load it again",
			e.spec.Name, e.spec.Path, e.digest, a.Digest)
	}
	p.mu.Lock()
	at.done, at.err = true, err
	wake := at.wake
	if e.attempt == at {
		e.attempt = nil
	}
	switch {
	case e.removed:
		p.used--
	case err != nil:
		e.state = unloaded
		p.used--
	default:
		p.loads++
		p.tick++
		e.state, e.weights, e.lastUse = loaded, a, p.tick
	}
	p.mu.Unlock()
	if wake != nil {
		wake()
	}
}

// unpin gives back u's slot; the adapter stays loaded until evicted.
func (p *AdapterPool) unpin(u *adapterUse) {
	p.mu.Lock()
	defer p.mu.Unlock()
	u.entry.pins--
	p.tick++
	u.entry.lastUse = p.tick
}

// unref ends u's hold.
func (p *AdapterPool) unref(u *adapterUse) {
	p.mu.Lock()
	defer p.mu.Unlock()
	u.entry.refs--
}

// adapterSnapshot is what the metrics read of the pool at a scrape.
type adapterSnapshot struct {
	slots, used       int
	loads, evictions  uint64
	adapters          []adapterCounts
	running, awaiting []string
}

type adapterCounts struct {
	name             string
	requests, tokens uint64
}

func (p *AdapterPool) snapshot() adapterSnapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := adapterSnapshot{slots: p.slots, used: p.used, loads: p.loads, evictions: p.evicted}
	for name, e := range p.entries {
		s.adapters = append(s.adapters, adapterCounts{name: name, requests: e.requests.Load(), tokens: e.tokens.Load()})
		if e.pins > 0 {
			s.running = append(s.running, name)
		}
		if e.refs > e.pins {
			s.awaiting = append(s.awaiting, name)
		}
	}
	slices.SortFunc(s.adapters, func(a, b adapterCounts) int { return cmp.Compare(a.name, b.name) })
	slices.Sort(s.running)
	slices.Sort(s.awaiting)
	return s
}

// AdapterBinder is an Executor that applies LoRA adapters: once a
// request's adapter holds a slot, the engine binds it to the request
// (before the request's first step) and unbinds it (nil) when the request
// ends. An engine with an adapter pool needs one.
type AdapterBinder interface {
	BindAdapter(r *sched.Request, a *model.Adapter)
}

// BindAdapter applies a to r's tokens in every step from now on; nil
// stops.
func (x *ModelExecutor) BindAdapter(r *sched.Request, a *model.Adapter) {
	if a == nil {
		delete(x.adapters, r)
		return
	}
	if x.adapters == nil {
		x.adapters = map[*sched.Request]*model.Adapter{}
	}
	x.adapters[r] = a
}

// stepAdapters fills dst with the adapter of every work item of step
// (aligned with the batch's block tables), or leaves it empty when no
// item has one, so a step without adapters runs the base model alone.
func (x *ModelExecutor) stepAdapters(step sched.Step, dst []*model.Adapter) []*model.Adapter {
	dst = dst[:0]
	if len(x.adapters) == 0 {
		return dst
	}
	some := false
	for _, w := range step.Work {
		a := x.adapters[w.Req]
		dst = append(dst, a)
		some = some || a != nil
	}
	if !some {
		return dst[:0]
	}
	return dst
}

// BindAdapter does nothing: the sim computes no logits, so it generates
// for an adapter what it generates for the base.
func (x *SimExecutor) BindAdapter(*sched.Request, *model.Adapter) {}

// checkAdapterExecutor refuses an adapter pool on an executor that would
// not apply the adapters.
func checkAdapterExecutor(cfg Config, exec Executor) error {
	if cfg.Adapters == nil {
		return nil
	}
	if _, ok := exec.(AdapterBinder); !ok {
		return fmt.Errorf("engine: executor %T does not apply LoRA adapters (no BindAdapter), but the engine has an adapter pool", exec)
	}
	return nil
}

// useAdapter takes the hold of a submitted request on its adapter and
// salts its prefix-cache entries with the adapter's registration (and the
// client's salt after it).
func (e *Engine) useAdapter(p Params, sreq *sched.Request) (*adapterUse, error) {
	if p.Adapter == "" {
		return nil, nil
	}
	if e.cfg.Adapters == nil {
		return nil, fmt.Errorf("%w: the request names adapter %s", ErrLoRADisabled, p.Adapter)
	}
	u, salt, err := e.cfg.Adapters.use(p.Adapter)
	if err != nil {
		return nil, err
	}
	if p.CacheSalt != "" {
		salt += "\x00" + p.CacheSalt
	}
	sreq.CacheSalt = salt
	return u, nil
}

// adapterReady returns, in order, the requests of inbox and of the
// adapter queue that may join the scheduler: those without an adapter and
// those whose adapter's slot they could pin. The others wait in the
// queue (and in e.live, so aborts find them) while their adapter loads
// or until a slot frees; once one request waits for a slot, later ones
// may only use adapters already loaded or loading, so slots go to
// waiting requests in order. A request whose adapter fails to load ends
// with the error.
func (e *Engine) adapterReady(inbox []*request) []*request {
	if len(e.adapterWait) == 0 && !slices.ContainsFunc(inbox, func(r *request) bool { return r.lora != nil }) {
		return inbox
	}
	pending := append(e.adapterWait, inbox...)
	e.adapterWait = nil
	ready := make([]*request, 0, len(pending))
	blocked := false
	for _, r := range pending {
		u := r.lora
		if u == nil {
			ready = append(ready, r)
			continue
		}
		a, ok, needSlot, err := u.pool.acquire(u, e.signal, !blocked)
		switch {
		case err != nil:
			u.waiting = false
			e.live[r.sreq.ID] = r
			e.end(r, FinishError, "", err)
		case ok:
			u.pinned, u.waiting = true, false
			if b, isBinder := e.exec.(AdapterBinder); isBinder {
				b.BindAdapter(r.sreq, a)
			}
			ready = append(ready, r)
		default:
			blocked = blocked || needSlot
			u.waiting = true
			e.live[r.sreq.ID] = r
			e.adapterWait = append(e.adapterWait, r)
		}
	}
	return ready
}

// dropAdapter gives back a request's hold on its adapter (its slot, if
// pinned) once: when it ends, or is refused before it runs.
func (e *Engine) dropAdapter(r *request) {
	u := r.lora
	if u == nil || u.released {
		return
	}
	u.released = true
	if u.waiting {
		e.adapterWait = slices.DeleteFunc(e.adapterWait, func(w *request) bool { return w == r })
		u.waiting = false
	}
	if u.pinned {
		if b, ok := e.exec.(AdapterBinder); ok {
			b.BindAdapter(r.sreq, nil)
		}
		u.pool.unpin(u)
		u.pinned = false
	}
	u.pool.unref(u)
}

// loraCollector exports the adapter pool's series at each scrape, under
// stoke's names and vLLM's vllm:lora_requests_info; it exports nothing
// until an engine with a pool is attached.
type loraCollector struct {
	pool                        atomic.Pointer[AdapterPool]
	requests, tokens            *prometheus.Desc
	loads, evictions, slots, vi *prometheus.Desc
}

func newLoRACollector(modelName string) *loraCollector {
	labels := prometheus.Labels{"model_name": modelName}
	return &loraCollector{
		requests: prometheus.NewDesc("stoke_engine_lora_requests_total", "Requests submitted for each LoRA adapter.", []string{"adapter"}, labels),
		tokens:   prometheus.NewDesc("stoke_engine_lora_generated_tokens_total", "Tokens generated with each LoRA adapter.", []string{"adapter"}, labels),
		loads:    prometheus.NewDesc("stoke_engine_lora_loads_total", "LoRA adapters read into a slot.", nil, labels),
		evictions: prometheus.NewDesc("stoke_engine_lora_evictions_total",
			"LoRA adapters whose slot went to another adapter (least recently used first).", nil, labels),
		slots: prometheus.NewDesc("stoke_engine_lora_slots", "LoRA adapter slots (--max-loras) by state: used (holding or loading an adapter) or free.",
			[]string{"state"}, labels),
		vi: prometheus.NewDesc("vllm:lora_requests_info", "Running and waiting LoRA adapters (comma-separated) and the slots; the value is the time of the scrape.",
			[]string{"running_lora_adapters", "waiting_lora_adapters", "max_lora"}, nil),
	}
}

// Describe sends nothing: the series exist only once an adapter pool is
// attached, so the collector is unchecked.
func (c *loraCollector) Describe(chan<- *prometheus.Desc) {}

// Collect exports the attached pool's series.
func (c *loraCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.pool.Load()
	if p == nil {
		return
	}
	s := p.snapshot()
	for _, a := range s.adapters {
		ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(a.requests), a.name)
		ch <- prometheus.MustNewConstMetric(c.tokens, prometheus.CounterValue, float64(a.tokens), a.name)
	}
	ch <- prometheus.MustNewConstMetric(c.loads, prometheus.CounterValue, float64(s.loads))
	ch <- prometheus.MustNewConstMetric(c.evictions, prometheus.CounterValue, float64(s.evictions))
	ch <- prometheus.MustNewConstMetric(c.slots, prometheus.GaugeValue, float64(s.used), "used")
	ch <- prometheus.MustNewConstMetric(c.slots, prometheus.GaugeValue, float64(s.slots-s.used), "free")
	ch <- prometheus.MustNewConstMetric(c.vi, prometheus.GaugeValue, float64(time.Now().UnixNano())/1e9,
		strings.Join(s.running, ","), strings.Join(s.awaiting, ","), strconv.Itoa(s.slots))
}
