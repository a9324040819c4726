package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kernels/kernelstest"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sched"
)

// loraModelConfig is the shape of the adapter tests' random base model.
func loraModelConfig() model.Config {
	return model.Config{ModelType: "llama", HiddenSize: 64, IntermediateSize: 128, NumLayers: 2, NumHeads: 4, NumKVHeads: 2,
		HeadDim: 16, VocabSize: 512, MaxPositionEmbeddings: 2048, RMSNormEps: 1e-5, RopeTheta: 10000, HiddenAct: "silu", TieWordEmbeddings: true}
}

// memoryAdapters is an AdapterLoadFunc over random adapters built in
// memory, one per path, that counts its loads and may be slowed down.
type memoryAdapters struct {
	cfg   model.Config
	delay time.Duration
	loads atomic.Int64
	mu    sync.Mutex
	fail  map[string]error // paths whose next loads fail
	order []string         // the paths loaded, in order
}

func (m *memoryAdapters) load(ctx context.Context, spec AdapterSpec) (*model.Adapter, error) {
	m.loads.Add(1)
	if m.delay > 0 {
		select {
		case <-time.After(m.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	m.mu.Lock()
	err := m.fail[spec.Path]
	m.order = append(m.order, spec.Path)
	m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var seed uint64
	for _, c := range spec.Path {
		seed = seed*31 + uint64(c)
	}
	ac := model.AdapterConfig{R: 8, LoraAlpha: 16, TargetModules: model.TargetModules{AllLinear: true}}
	a, err := model.NewAdapter(&m.cfg, ac, model.RandomAdapterSource(m.cfg, ac.R, nil, seed, model.AdapterStd(ac, 0.1)), 16)
	if err != nil {
		return nil, err
	}
	a.Digest = spec.Path
	return a, nil
}

func newTestPool(t *testing.T, slots int, loader *memoryAdapters) *AdapterPool {
	t.Helper()
	p, err := NewAdapterPool(AdapterPoolConfig{Slots: slots, MaxRank: 16, Load: loader.load})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func register(t *testing.T, p *AdapterPool, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, _, err := p.Register(context.Background(), AdapterSpec{Name: n, Path: "mem/" + n}); err != nil {
			t.Fatal(err)
		}
	}
}

func loadedNames(p *AdapterPool) []string {
	var out []string
	for _, a := range p.Info().Adapters {
		if a.Loaded {
			out = append(out, a.Name)
		}
	}
	return out
}

// pin acquires name's slot for a request, waiting for its load.
func pin(t *testing.T, p *AdapterPool, name string) *adapterUse {
	t.Helper()
	u, _, err := p.use(name)
	if err != nil {
		t.Fatal(err)
	}
	woke := make(chan struct{}, 1)
	wake := func() {
		select {
		case woke <- struct{}{}:
		default:
		}
	}
	for {
		_, ok, needSlot, err := p.acquire(u, wake, true)
		switch {
		case err != nil:
			t.Fatal(err)
		case ok:
			u.pinned = true
			return u
		case needSlot:
			t.Fatalf("%s: no slot", name)
		}
		select {
		case <-woke:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the load never finished", name)
		}
	}
}

func unpin(p *AdapterPool, u *adapterUse) {
	p.unpin(u)
	p.unref(u)
}

// TestAdapterPoolEvictsLeastRecentlyUsed checks the slot pool: adapters
// fill free slots when registered, a new adapter evicts the least recently
// used one that nothing pins, pinned slots are never evicted, and a
// request that needs a slot while all are pinned is told to wait.
func TestAdapterPoolEvictsLeastRecentlyUsed(t *testing.T) {
	loader := &memoryAdapters{cfg: loraModelConfig()}
	p := newTestPool(t, 2, loader)
	register(t, p, "a", "b", "c")
	if got := loadedNames(p); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("loaded after registering a, b, c into 2 slots: %v", got)
	}
	unpin(p, pin(t, p, "a")) // a is now more recent than b
	unpin(p, pin(t, p, "c")) // evicts b
	if got := loadedNames(p); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("loaded after using a then c: %v (want b evicted)", got)
	}
	ua, uc := pin(t, p, "a"), pin(t, p, "c")
	ub, _, err := p.use("b")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, needSlot, err := p.acquire(ub, func() {}, true); ok || !needSlot || err != nil {
		t.Fatalf("b with every slot pinned: ready %v, needSlot %v, err %v; want to wait for a slot", ok, needSlot, err)
	}
	unpin(p, uc) // c frees; a stays pinned
	p.unref(ub)
	unpin(p, pin(t, p, "b"))
	if got := loadedNames(p); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("loaded after c freed its slot for b: %v (a is pinned)", got)
	}
	unpin(p, ua)
	s := p.snapshot()
	if s.loads != 4 || s.evictions != 2 || s.used != 2 {
		t.Fatalf("loads %d, evictions %d, used %d: want 4 (a, b at registration; c, b), 2, 2", s.loads, s.evictions, s.used)
	}
	for _, a := range p.Info().Adapters {
		if a.Running != 0 || a.Waiting != 0 {
			t.Fatalf("%s still has holds: %+v", a.Name, a)
		}
	}
}

func TestAdapterPoolRegisterAndUnregister(t *testing.T) {
	loader := &memoryAdapters{cfg: loraModelConfig(), fail: map[string]error{
		"mem/bad": fmt.Errorf("%w: tensor x has shape [1 2]", model.ErrInvalidAdapter),
	}}
	p := newTestPool(t, 2, loader)
	register(t, p, "a")
	before := p.Info()
	for _, tc := range []struct {
		name string
		spec AdapterSpec
		want error
		msg  string
	}{
		{"bad weights", AdapterSpec{Name: "x", Path: "mem/bad"}, model.ErrInvalidAdapter, "shape"},
		{"taken name", AdapterSpec{Name: "a", Path: "mem/other"}, ErrAdapterExists, "unload it first"},
		{"empty name", AdapterSpec{Path: "mem/x"}, nil, "empty"},
		{"separator in the name", AdapterSpec{Name: "b:c", Path: "mem/x"}, nil, `":"`},
		{"no path", AdapterSpec{Name: "y"}, nil, "path is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := p.Register(context.Background(), tc.spec)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %v, want %v mentioning %q", err, tc.want, tc.msg)
			}
			if after := p.Info(); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatalf("a refused load changed the pool: %+v, was %+v", after, before)
			}
		})
	}
	if _, created, err := p.Register(context.Background(), AdapterSpec{Name: "a", Path: "mem/a"}); err != nil || created {
		t.Fatalf("registering a again: created %v, err %v; want a no-op", created, err)
	}
	if err := p.Unregister("nope"); !errors.Is(err, ErrUnknownAdapter) {
		t.Fatalf("unregister unknown: %v", err)
	}
	u := pin(t, p, "a")
	if err := p.Unregister("a"); !errors.Is(err, ErrAdapterInUse) {
		t.Fatalf("unregister in use: %v", err)
	}
	unpin(p, u)
	if err := p.Unregister("a"); err != nil {
		t.Fatal(err)
	}
	if p.Has("a") || p.snapshot().used != 0 {
		t.Fatalf("after unregister: %+v", p.Info())
	}
}

// loraFixture is an engine over a random model with an adapter pool.
type loraFixture struct {
	engine *Engine
	pool   *AdapterPool
	loader *memoryAdapters
	reg    *prometheus.Registry
}

func newLoRAFixture(t *testing.T, set *kernels.Set, slots int, cfg sched.Config, adapters ...string) *loraFixture {
	t.Helper()
	mc := loraModelConfig()
	pool := set.NewPool(2)
	t.Cleanup(pool.Close)
	m, err := model.New(mc, model.RandomSource(mc, 3, 0.3), pool)
	if err != nil {
		t.Fatal(err)
	}
	blocks := 512
	storage, err := kvcache.New(m.KVShape(), blocks)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxModelLen == 0 {
		cfg.MaxModelLen = mc.MaxPositionEmbeddings
	}
	loader := &memoryAdapters{cfg: mc}
	ap := newTestPool(t, slots, loader)
	register(t, ap, adapters...)
	reg := prometheus.NewRegistry()
	e, err := New(Config{Sched: cfg, Adapters: ap}, kvcache.NewManager(blocks, true), NewModelExecutor(m, storage), nil, NewMetrics(reg, "test"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return &loraFixture{engine: e, pool: ap, loader: loader, reg: reg}
}

// adapterOf is request i's adapter in the concurrent tests: eight
// adapters, and every ninth request on the base.
func adapterOf(i int) string {
	if i%9 == 8 {
		return ""
	}
	return fmt.Sprintf("lora%d", i%9)
}

func adapterNames(n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("lora%d", i))
	}
	return out
}

// TestConcurrentAdaptersMatchAlone runs 32 concurrent greedy requests over
// eight adapters (and some on the base) through an engine with four
// adapter slots, so requests wait for slots and adapters are evicted and
// read again, and checks each gives exactly the tokens it gives alone on
// an idle engine, on every kernel set; and that the adapters matter.
func TestConcurrentAdaptersMatchAlone(t *testing.T) {
	kernelstest.ForEachSet(t, func(t *testing.T, set *kernels.Set) {
		busy := newLoRAFixture(t, set, 4, sched.Config{MaxNumBatchedTokens: 96, MaxNumSeqs: 32}, adapterNames(8)...)
		idle := newLoRAFixture(t, set, 8, sched.Config{MaxNumBatchedTokens: 2048, MaxNumSeqs: 32}, adapterNames(8)...)
		const n, maxTokens = 32, 12
		params := func(i int) Params {
			return Params{Prompt: testPrompt(i%4, 5+i%23), MaxTokens: maxTokens, Sampling: greedy(), IgnoreEOS: true, Adapter: adapterOf(i)}
		}
		concurrent := make([][]int32, n)
		streams := make([]*Stream, n)
		for i := range n {
			s, err := busy.engine.Submit(params(i))
			if err != nil {
				t.Fatal(err)
			}
			streams[i] = s
		}
		var wg sync.WaitGroup
		for i, s := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, concurrent[i], _ = collect(t, s)
			}()
		}
		wg.Wait()
		differ := 0
		for i := range n {
			s, err := idle.engine.Submit(params(i))
			if err != nil {
				t.Fatal(err)
			}
			_, alone, last := collect(t, s)
			if last.Err != nil {
				t.Fatal(last.Err)
			}
			if !slices.Equal(concurrent[i], alone) {
				t.Fatalf("request %d (adapter %q): concurrent %v, alone %v", i, adapterOf(i), concurrent[i], alone)
			}
			base := params(i)
			base.Adapter = ""
			s, err = idle.engine.Submit(base)
			if err != nil {
				t.Fatal(err)
			}
			if _, ids, _ := collect(t, s); !slices.Equal(ids, alone) {
				differ++
			}
		}
		if differ < n/2 {
			t.Fatalf("only %d of %d requests differ from the base model: the adapters do not apply", differ, n)
		}
		if s := busy.pool.snapshot(); s.evictions == 0 {
			t.Fatalf("eight adapters over four slots evicted none: %+v", s)
		}
		waitFor(t, func() bool { s := busy.engine.Stats(); return s.Running+s.Waiting == 0 })
		for _, a := range busy.pool.Info().Adapters {
			if a.Running != 0 || a.Waiting != 0 {
				t.Fatalf("%s still held after every request ended: %+v", a.Name, a)
			}
		}
	})
}

// TestAdapterRequestWaitsForSlot checks that with one slot, a request for
// a second adapter waits (counted as waiting) until the first adapter's
// request ends, then runs; that an adapter in use is not unloaded; and
// that an aborted waiting request gives its hold back.
func TestAdapterRequestWaitsForSlot(t *testing.T) {
	f := newLoRAFixture(t, nil, 1, sched.Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 8}, "a", "b", "c")
	first, err := f.engine.Submit(Params{Prompt: testPrompt(1, 10), MaxTokens: 2030, Sampling: greedy(), IgnoreEOS: true, Adapter: "a"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, ok := first.Next(ctx); !ok {
		t.Fatal("no output from the first request")
	}
	second, err := f.engine.Submit(Params{Prompt: testPrompt(2, 10), MaxTokens: 4, Sampling: greedy(), IgnoreEOS: true, Adapter: "b"})
	if err != nil {
		t.Fatal(err)
	}
	third, err := f.engine.Submit(Params{Prompt: testPrompt(3, 10), MaxTokens: 4, Sampling: greedy(), IgnoreEOS: true, Adapter: "c"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return f.engine.Stats().Waiting == 2 })
	if err := f.pool.Unregister("a"); !errors.Is(err, ErrAdapterInUse) {
		t.Fatalf("unload of a running adapter: %v, want ErrAdapterInUse", err)
	}
	if err := f.pool.Unregister("b"); !errors.Is(err, ErrAdapterInUse) {
		t.Fatalf("unload of an adapter a request waits for: %v, want ErrAdapterInUse", err)
	}
	f.engine.Abort(third.ID)
	if _, _, last := collect(t, third); last.Finish != FinishAbort {
		t.Fatalf("aborted waiting request finished %q", last.Finish)
	}
	if err := f.pool.Unregister("c"); err != nil {
		t.Fatalf("unload of c after its only request was aborted: %v", err)
	}
	if info, _ := f.pool.Lookup("b"); info.Waiting != 1 || info.Loaded {
		t.Fatalf("b while a holds the only slot: %+v", info)
	}
	f.engine.Abort(first.ID)
	if _, ids, last := collect(t, second); last.Finish != FinishLength || len(ids) != 4 || last.Err != nil {
		t.Fatalf("second request after the slot freed: %q, %d ids, %v", last.Finish, len(ids), last.Err)
	}
	if got := loadedNames(f.pool); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("loaded: %v, want b in the only slot", got)
	}
}

// TestAdapterSlotsGoInOrder checks that requests waiting for a slot get
// one in the order they came: with one slot held by a, b's request (first)
// loads b before c's request loads c.
func TestAdapterSlotsGoInOrder(t *testing.T) {
	f := newLoRAFixture(t, nil, 1, sched.Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 8}, "a", "b", "c")
	long, err := f.engine.Submit(Params{Prompt: testPrompt(1, 10), MaxTokens: 2030, Sampling: greedy(), IgnoreEOS: true, Adapter: "a"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, ok := long.Next(ctx); !ok {
		t.Fatal("no output from the first request")
	}
	var streams []*Stream
	for i, name := range []string{"b", "c", "b"} {
		s, err := f.engine.Submit(Params{Prompt: testPrompt(2+i, 10), MaxTokens: 3, Sampling: greedy(), IgnoreEOS: true, Adapter: name})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	waitFor(t, func() bool { return f.engine.Stats().Waiting == 3 })
	f.engine.Abort(long.ID)
	for _, s := range streams {
		if _, ids, last := collect(t, s); len(ids) != 3 || last.Err != nil {
			t.Fatalf("waiting request: %v, %v", ids, last.Err)
		}
	}
	f.loader.mu.Lock()
	order := slices.Clone(f.loader.order)
	f.loader.mu.Unlock()
	// a, b, c at registration (b and c only checked: one slot), then b
	// and c for the requests, b's two sharing one load.
	if want := []string{"mem/a", "mem/b", "mem/c", "mem/b", "mem/c"}; !slices.Equal(order, want) {
		t.Fatalf("loads %v, want %v", order, want)
	}
}

func TestSubmitRejectsUnknownAdapters(t *testing.T) {
	f := newLoRAFixture(t, nil, 2, sched.Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 8}, "a")
	if _, err := f.engine.Submit(Params{Prompt: testPrompt(1, 5), MaxTokens: 2, Sampling: greedy(), Adapter: "nope"}); !errors.Is(err, ErrUnknownAdapter) {
		t.Fatalf("unknown adapter: %v", err)
	}
	plain := newFixture(t, 64, sched.Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 8})
	if _, err := plain.engine.Submit(Params{Prompt: testPrompt(1, 5), MaxTokens: 2, Sampling: greedy(), Adapter: "a"}); !errors.Is(err, ErrLoRADisabled) {
		t.Fatalf("adapter on an engine without LoRA: %v", err)
	}
}

// TestAdapterFailingToLoadEndsItsRequests checks that a request whose
// adapter cannot be read into a slot (its files went bad after it was
// registered) ends with the error, and the slot is not lost.
func TestAdapterFailingToLoadEndsItsRequests(t *testing.T) {
	f := newLoRAFixture(t, nil, 1, sched.Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 8}, "a", "b")
	f.loader.mu.Lock()
	f.loader.fail = map[string]error{"mem/b": errors.New("disk on fire")}
	f.loader.mu.Unlock()
	s, err := f.engine.Submit(Params{Prompt: testPrompt(1, 5), MaxTokens: 2, Sampling: greedy(), Adapter: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, last := collect(t, s); last.Finish != FinishError || last.Err == nil || !strings.Contains(last.Err.Error(), "disk on fire") {
		t.Fatalf("request for an adapter failing to load: %q, %v", last.Finish, last.Err)
	}
	s, err = f.engine.Submit(Params{Prompt: testPrompt(1, 5), MaxTokens: 2, Sampling: greedy(), Adapter: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ids, last := collect(t, s); last.Err != nil || len(ids) != 2 {
		t.Fatalf("request for a good adapter after a failed load: %v, %v", ids, last.Err)
	}
}

// TestPrefixCacheIsPerAdapter checks that cached prompt blocks are shared
// by requests of one adapter and never across adapters or with the base.
func TestPrefixCacheIsPerAdapter(t *testing.T) {
	f := newLoRAFixture(t, nil, 2, sched.Config{MaxNumBatchedTokens: 512, MaxNumSeqs: 8}, "a", "b")
	prompt := testPrompt(9, 100)
	cached := func(adapter, salt string) int {
		s, err := f.engine.Submit(Params{Prompt: prompt, MaxTokens: 1, Sampling: greedy(), IgnoreEOS: true, Adapter: adapter, CacheSalt: salt})
		if err != nil {
			t.Fatal(err)
		}
		_, _, last := collect(t, s)
		return last.Usage.CachedTokens
	}
	for _, tc := range []struct {
		adapter, salt string
		hit           bool
	}{
		{"a", "", false}, {"a", "", true}, {"", "", false}, {"b", "", false}, {"", "", true}, {"b", "", true},
		{"a", "tenant", false}, {"a", "tenant", true},
	} {
		if got := cached(tc.adapter, tc.salt); (got > 0) != tc.hit {
			t.Fatalf("adapter %q salt %q: %d cached tokens, want a hit: %v", tc.adapter, tc.salt, got, tc.hit)
		}
	}
}

func TestLoRAMetrics(t *testing.T) {
	f := newLoRAFixture(t, nil, 1, sched.Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 8}, "a", "b")
	for _, name := range []string{"a", "b", "a"} {
		s, err := f.engine.Submit(Params{Prompt: testPrompt(1, 5), MaxTokens: 3, Sampling: greedy(), IgnoreEOS: true, Adapter: name})
		if err != nil {
			t.Fatal(err)
		}
		collect(t, s)
	}
	want := `
# HELP stoke_engine_lora_evictions_total LoRA adapters whose slot went to another adapter (least recently used first).
# TYPE stoke_engine_lora_evictions_total counter
stoke_engine_lora_evictions_total{model_name="test"} 2
# HELP stoke_engine_lora_generated_tokens_total Tokens generated with each LoRA adapter.
# TYPE stoke_engine_lora_generated_tokens_total counter
stoke_engine_lora_generated_tokens_total{adapter="a",model_name="test"} 6
stoke_engine_lora_generated_tokens_total{adapter="b",model_name="test"} 3
# HELP stoke_engine_lora_loads_total LoRA adapters read into a slot.
# TYPE stoke_engine_lora_loads_total counter
stoke_engine_lora_loads_total{model_name="test"} 3
# HELP stoke_engine_lora_requests_total Requests submitted for each LoRA adapter.
# TYPE stoke_engine_lora_requests_total counter
stoke_engine_lora_requests_total{adapter="a",model_name="test"} 2
stoke_engine_lora_requests_total{adapter="b",model_name="test"} 1
# HELP stoke_engine_lora_slots LoRA adapter slots (--max-loras) by state: used (holding or loading an adapter) or free.
# TYPE stoke_engine_lora_slots gauge
stoke_engine_lora_slots{model_name="test",state="free"} 0
stoke_engine_lora_slots{model_name="test",state="used"} 1
`
	names := []string{"stoke_engine_lora_evictions_total", "stoke_engine_lora_generated_tokens_total", "stoke_engine_lora_loads_total",
		"stoke_engine_lora_requests_total", "stoke_engine_lora_slots"}
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "vllm:lora_requests_info" {
			found = true
			labels := map[string]string{}
			for _, l := range mf.GetMetric()[0].GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["max_lora"] != "1" || labels["running_lora_adapters"] != "" || labels["waiting_lora_adapters"] != "" {
				t.Fatalf("vllm:lora_requests_info labels %v", labels)
			}
		}
	}
	if !found {
		t.Fatal("no vllm:lora_requests_info series")
	}
}
