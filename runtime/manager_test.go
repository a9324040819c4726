package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/internal/tier"
	"github.com/stokehq/stoke/runtime"
	"github.com/stokehq/stoke/runtime/process"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/manifest"
	"github.com/stokehq/stoke/weightstore/nodecache"
	"github.com/stokehq/stoke/weightstore/push"
	"github.com/stokehq/stoke/weightstore/synth"
)

// stokeBinary is built once for the package's tests.
var stokeBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "stoke-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "stoke")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/stokehq/stoke/cmd/stoke")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build stoke: %v\n%s", err, out)
	}
	return bin, nil
})

func TestMain(m *testing.M) {
	code := m.Run()
	if bin, err := stokeBinary(); err == nil {
		os.RemoveAll(filepath.Dir(bin))
	}
	os.Exit(code)
}

// node is a manager under test with what it runs on.
type node struct {
	dir, source string
	backend     runtime.Backend
	events      chan runtime.Event
	// engines lists the runtimes' host pids still running.
	engines func(t testing.TB) []int
	// cache is a node cache of the backend's kind the manager can keep,
	// and mounts lists the mounts its open views hold (nil: none).
	cache  nodecache.Cache
	mounts func() []string
	// limits checks that the runtimes run under the given memory and CPU
	// limits (nil: the backend sets none).
	limits func(t testing.TB, memory int64, cpus float64)
}

// backends are the runtime backends the tests run on; containerd is added
// on Linux.
var backends = map[string]func(t testing.TB, n *node, bin string){
	"process": func(t testing.TB, n *node, bin string) {
		be, err := process.New(process.Options{Binary: bin, Dir: n.dir})
		if err != nil {
			t.Fatal(err)
		}
		n.backend = be
		n.engines = func(t testing.TB) []int { return engines(t, n.dir) }
		n.cache, err = nodecache.NewDir(filepath.Join(n.dir, "nodecache"), nodecache.DirOptions{})
		if err != nil {
			t.Fatal(err)
		}
	},
}

// newNode pushes a tiny synthetic model under each name into a file://
// bucket and prepares a backend of the kind named.
func newNode(t *testing.T, kind string, models ...string) *node {
	t.Helper()
	bin, err := stokeBinary()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "src")
	if err := synth.Write(ctx, src, synth.Options{Preset: "tiny", DType: dtype.F32, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for _, name := range models {
		b, err := bucket.Open(ctx, "file://"+filepath.Join(root, name), bucket.S3Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := push.Push(ctx, src, b, push.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	// Unix socket paths are short: keep the runtimes' directory near /tmp.
	dir, err := os.MkdirTemp("", "rt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	n := &node{dir: dir, source: "file://" + root, events: make(chan runtime.Event, 1000)}
	backends[kind](t, n, bin)
	return n
}

// pidOf is the host pid of an acquired replica's engine.
func pidOf(t *testing.T, n *node, id string) int {
	t.Helper()
	procs, err := n.backend.Recover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if p.ID() == id {
			return p.(interface{ PID() int }).PID()
		}
	}
	t.Fatalf("no runtime %s", id)
	return 0
}

func (n *node) manager(t *testing.T, slots, warm int, sleepBudget int64, keep bool) *runtime.Manager {
	t.Helper()
	classes := make([]runtime.Class, slots)
	for i := range classes {
		classes[i] = runtime.OnDemand
	}
	m, err := runtime.New(context.Background(), runtime.Options{
		Backend: n.backend, Dir: n.dir, Slots: classes, Warm: warm, SleepBudget: sleepBudget, Source: n.source,
		EngineArgs: []string{"--kv-cache-memory", "8MiB", "--threads", "1", "--cache-dir", filepath.Join(n.dir, "cache")}, WeightArena: 4 << 20,
		HealthInterval: 200 * time.Millisecond, StopGrace: 5 * time.Second, KeepOnClose: keep, MemoryBytes: 1 << 30, CPUs: 1.5,
		OnEvent: func(e runtime.Event) {
			select {
			case n.events <- e:
			default:
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// waitFor polls until cond holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func states(m *runtime.Manager) map[runtime.State]int {
	out := map[runtime.State]int{}
	for _, r := range m.Runtimes() {
		out[r.State]++
	}
	return out
}

// engines lists the stoke engine processes listening under dir, and fails
// on zombies among them.
func engines(t testing.TB, dir string) []int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmdline), "unix://"+dir) {
			continue
		}
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if f := strings.Fields(string(stat)); len(f) > 2 && f[2] == "Z" {
			t.Errorf("engine %d is a zombie", pid)
		}
		pids = append(pids, pid)
	}
	return pids
}

func TestManagerTiersAndFaults(t *testing.T) {
	for kind := range backends {
		t.Run(kind, func(t *testing.T) { testTiersAndFaults(t, kind) })
	}
}

func testTiersAndFaults(t *testing.T, kind string) {
	n := newNode(t, kind, "a", "b", "c")
	ctx := context.Background()
	m := n.manager(t, 2, 1, 1<<30, false)
	defer m.Close(ctx)
	waitFor(t, "a warm blank runtime", func() bool { return states(m)[runtime.StateBlank] == 1 })

	acquire := func(model string, want tier.Tier, wantLoad tier.Tier) *runtime.Replica {
		t.Helper()
		rep, err := m.Acquire(ctx, model, "")
		if err != nil {
			t.Fatalf("acquire %s: %v", model, err)
		}
		if rep.Tier != want || rep.LoadTier != wantLoad || rep.Revision == "" {
			t.Fatalf("acquire %s: tier %s (load %q), revision %q; want %s (load %q)", model, rep.Tier, rep.LoadTier, rep.Revision, want, wantLoad)
		}
		if err := runtime.NewEngineClient(rep.Addr).Complete(ctx, model, []int32{1, 2, 3}); err != nil {
			t.Fatalf("replica of %s does not serve: %v", model, err)
		}
		return rep
	}
	a := acquire("a", tier.Bucket, "t3") // warm blank runtime, bucket
	if a.Breakdown.Fetch <= 0 || a.Breakdown.Start != 0 || a.Breakdown.Warmup <= 0 {
		t.Fatalf("T3 breakdown %+v: want a fetch, a warm-up and no start", a.Breakdown)
	}
	if err := m.Release(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	a = acquire("a", tier.Wake, "") // its sleeping replica wakes
	if err := m.Release(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	// The pool refilled the second slot; b has a's content, so the node
	// cache holds its revision.
	waitFor(t, "the warm pool refilled", func() bool { return states(m)[runtime.StateBlank] == 1 })
	b := acquire("b", tier.Cache, "t2")
	if b.Breakdown.Warmup != 0 {
		t.Fatalf("b: breakdown %+v, want no warm-up for the revision a served", b.Breakdown)
	}
	// Both slots taken: c evicts the idle sleeping replica of a.
	c := acquire("c", tier.Cache, "t2")
	if c.ID != a.ID {
		t.Fatalf("c got runtime %s, want the evicted sleeping %s", c.ID, a.ID)
	}
	rec := httptest.NewRecorder()
	m.RuntimesHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/admin/runtimes", nil))
	var listed struct {
		Data []runtime.Info `json:"data"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &listed); err != nil || len(listed.Data) != 2 || listed.Data[0].Model != "c" || listed.Data[1].Model != "b" ||
		listed.Data[0].State != runtime.StateReady || !listed.Data[1].InUse {
		t.Fatalf("GET /admin/runtimes: %s (%v)", rec.Body, err)
	}
	if n.limits != nil {
		n.limits(t, 1<<30, 1.5)
	}
	if _, err := m.Acquire(ctx, "a", ""); !errors.Is(err, runtime.ErrNoCapacity) {
		t.Fatalf("acquire on a full node: %v, want ErrNoCapacity", err)
	}

	// SIGKILL b's runtime mid-serve: it is marked gone and its slot reused.
	if pids := n.engines(t); len(pids) != 2 {
		t.Fatalf("%d engines running, want 2", len(pids))
	}
	syscall.Kill(pidOf(t, n, b.ID), syscall.SIGKILL)
	waitFor(t, "the killed runtime marked gone", func() bool {
		for {
			select {
			case e := <-n.events:
				if e.Runtime == b.ID && e.State == runtime.StateGone {
					return true
				}
			default:
				return false
			}
		}
	})
	if err := m.Release(ctx, b.ID); err == nil {
		t.Fatal("released a runtime that is gone")
	}
	b2 := acquire("b", tier.Start, "t2") // its slot is free again
	if b2.Breakdown.Start <= 0 || b2.Breakdown.Warmup != 0 {
		t.Fatalf("T4 breakdown %+v: want a start time and no warm-up, the revision having served", b2.Breakdown)
	}
	if got := len(n.engines(t)); got != 2 {
		t.Fatalf("%d engines after the replacement, want 2", got)
	}
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if pids := n.engines(t); len(pids) != 0 {
		t.Fatalf("engines %v left after Close", pids)
	}
}

func TestManagerReleaseToBlankAndReadopt(t *testing.T) {
	for kind := range backends {
		t.Run(kind, func(t *testing.T) { testReleaseToBlankAndReadopt(t, kind) })
	}
}

func testReleaseToBlankAndReadopt(t *testing.T, kind string) {
	n := newNode(t, kind, "a")
	ctx := context.Background()
	m := n.manager(t, 2, 0, 0, true) // no sleep budget: release unloads
	// A model the bucket does not hold: the load fails, the runtime goes
	// back to blank and keeps its slot.
	if _, err := m.Acquire(ctx, "missing", ""); err == nil || !strings.Contains(err.Error(), "not a pushed revision") {
		t.Fatalf("acquire of a missing model: %v", err)
	}
	if rs := m.Runtimes(); len(rs) != 1 || rs[0].State != runtime.StateBlank || rs[0].InUse {
		t.Fatalf("after a failed load: %+v, want one idle blank runtime", rs)
	}
	a, err := m.Acquire(ctx, "a", "")
	if err != nil {
		t.Fatal(err)
	}
	if a.Tier != tier.Bucket || a.LoadTier != "t3" {
		t.Fatalf("acquire after the failed one: %s/%s, want t3 into the blank runtime", a.Tier, a.LoadTier)
	}
	if err := m.Release(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if s := states(m); s[runtime.StateBlank] != 1 || len(m.Runtimes()) != 1 {
		t.Fatalf("after release with no sleep budget: %v, want one blank runtime", s)
	}
	a, err = m.Acquire(ctx, "a", "")
	if err != nil {
		t.Fatal(err)
	}
	if a.Tier != tier.Cache {
		t.Fatalf("second acquire: %s, want t2 from the node cache", a.Tier)
	}
	// A new manager re-adopts the ready runtime, model and all; a stale
	// record of a dead runtime is cleaned away.
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(n.dir, "rt-9-9.json")
	if kind == "process" {
		os.WriteFile(stale, []byte(`{"id":"rt-9-9","pid":999999,"socket":"`+filepath.Join(n.dir, "rt-9-9.sock")+`"}`), 0o600)
	}
	m2 := n.manager(t, 2, 0, 0, false)
	rs := m2.Runtimes()
	if len(rs) != 1 || rs[0].ID != a.ID || rs[0].State != runtime.StateReady || rs[0].Model != "a" || rs[0].Revision != a.Revision {
		t.Fatalf("re-adopted %+v, want %s ready with a@%s", rs, a.ID, a.Revision)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("the stale record is still there (%v)", err)
	}
	if err := m2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if pids := n.engines(t); len(pids) != 0 {
		t.Fatalf("engines %v left after Close", pids)
	}
}

func TestManagerStartFailures(t *testing.T) {
	n := newNode(t, "process")
	ctx := context.Background()
	// An engine that exits at once (a bad flag) never becomes blank.
	m, err := runtime.New(ctx, runtime.Options{Backend: n.backend, Dir: n.dir, Slots: []runtime.Class{runtime.Spot}, Source: n.source,
		EngineArgs: []string{"--no-such-flag"}, StartTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(ctx)
	if _, err := m.Acquire(ctx, "a", ""); err == nil || !strings.Contains(err.Error(), "did not start") {
		t.Fatalf("acquire with a runtime that cannot start: %v", err)
	}
	waitFor(t, "the slot freed", func() bool { return len(m.Runtimes()) == 0 })
	if pids := n.engines(t); len(pids) != 0 {
		t.Fatalf("engines %v left behind", pids)
	}
	// A runtime that does not serve within its start deadline is stopped.
	m2, err := runtime.New(ctx, runtime.Options{Backend: n.backend, Dir: n.dir, Slots: []runtime.Class{runtime.Spot}, Source: n.source,
		StartTimeout: time.Millisecond, StopGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close(ctx)
	if _, err := m2.Acquire(ctx, "a", ""); err == nil || !strings.Contains(err.Error(), "did not start") {
		t.Fatalf("acquire with a runtime past its start deadline: %v", err)
	}
	waitFor(t, "the slot freed", func() bool { return len(m2.Runtimes()) == 0 })
	if pids := n.engines(t); len(pids) != 0 {
		t.Fatalf("engines %v left behind", pids)
	}
	if _, err := runtime.New(ctx, runtime.Options{Backend: n.backend, Dir: n.dir, Slots: []runtime.Class{runtime.Spot}, Warm: 2}); err == nil {
		t.Fatal("a warm pool larger than the node was accepted")
	}
}

// TestManagerLoadsFromCacheViews has the manager keep the node cache: a
// load from the bucket fills it behind the runtime's back, and the next
// load of the pinned revision reads the cache's read-only view directly.
func TestManagerLoadsFromCacheViews(t *testing.T) {
	for kind := range backends {
		t.Run(kind, func(t *testing.T) {
			n := newNode(t, kind, "a")
			ctx := context.Background()
			raw, err := os.ReadFile(filepath.Join(strings.TrimPrefix(n.source, "file://"), "a", manifest.FileName))
			if err != nil {
				t.Fatal(err)
			}
			man, err := manifest.Parse(raw)
			if err != nil {
				t.Fatal(err)
			}
			b, err := bucket.Open(ctx, n.source, bucket.S3Options{})
			if err != nil {
				t.Fatal(err)
			}
			m, err := runtime.New(ctx, runtime.Options{Backend: n.backend, Dir: n.dir, Slots: []runtime.Class{runtime.OnDemand}, Source: n.source,
				Cache: n.cache, Bucket: b, EngineArgs: []string{"--kv-cache-memory", "8MiB", "--threads", "1", "--no-cache"}})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close(ctx)
			first, err := m.Acquire(ctx, "a", man.Revision)
			if err != nil {
				t.Fatal(err)
			}
			if first.LoadTier != "t3" {
				t.Fatalf("first load: %s, want t3 from the bucket", first.LoadTier)
			}
			waitFor(t, "the manager's prefetch into the node cache", func() bool {
				v, err := n.cache.OpenRevision(ctx, man.Revision)
				if err != nil {
					return false
				}
				v.Close()
				return true
			})
			if err := m.Release(ctx, first.ID); err != nil { // no sleep budget: unloaded
				t.Fatal(err)
			}
			rep, err := m.Acquire(ctx, "a", man.Revision)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Tier != tier.Cache || rep.LoadTier != "t2" || rep.Revision != man.Revision {
				t.Fatalf("second load: %s/%s@%s, want t2 from the cache view", rep.Tier, rep.LoadTier, rep.Revision)
			}
			if err := runtime.NewEngineClient(rep.Addr).Complete(ctx, "a", []int32{1, 2}); err != nil {
				t.Fatalf("a replica loaded from a view does not serve: %v", err)
			}
			if n.mounts != nil && len(n.mounts()) == 0 {
				t.Fatal("no view is mounted while the replica reads it")
			}
			for _, tier := range []string{"t3", "t2"} {
				if got := loadedBytes(t, m, tier); got != float64(man.TotalBytes) {
					t.Fatalf("stoke_weight_bytes_loaded_total{tier=%q} = %v, want the revision's %d bytes", tier, got, man.TotalBytes)
				}
			}
			if err := m.Release(ctx, rep.ID); err != nil {
				t.Fatal(err)
			}
			if n.mounts != nil {
				if left := n.mounts(); len(left) != 0 {
					t.Fatalf("views still mounted after the unload: %v", left)
				}
			}
		})
	}
}

// TestManagerRetiresUnresponsiveRuntime stops a runtime answering (SIGSTOP)
// and checks the health checks retire it: killed, slot freed, event out.
func TestManagerRetiresUnresponsiveRuntime(t *testing.T) {
	n := newNode(t, "process", "a")
	ctx := context.Background()
	m := n.manager(t, 1, 0, 1<<30, false)
	defer m.Close(ctx)
	rep, err := m.Acquire(ctx, "a", "")
	if err != nil {
		t.Fatal(err)
	}
	syscall.Kill(pidOf(t, n, rep.ID), syscall.SIGSTOP)
	waitFor(t, "the frozen runtime retired", func() bool {
		for {
			select {
			case e := <-n.events:
				if e.Runtime == rep.ID && e.State == runtime.StateGone && strings.Contains(e.Reason, "health checks") {
					return true
				}
			default:
				return false
			}
		}
	})
	waitFor(t, "its process gone", func() bool { return len(n.engines(t)) == 0 })
	if rs := m.Runtimes(); len(rs) != 0 {
		t.Fatalf("runtimes after the retirement: %+v", rs)
	}
	if _, err := m.Acquire(ctx, "a", ""); err != nil {
		t.Fatalf("the freed slot does not take a new runtime: %v", err)
	}
}

// loadedBytes reads stoke_weight_bytes_loaded_total for a tier from the
// manager's collector.
func loadedBytes(t *testing.T, m *runtime.Manager, tier string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Collector())
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "stoke_weight_bytes_loaded_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			if s.GetLabel()[0].GetValue() == tier {
				return s.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestManagerSleepLimit releases two replicas of a model whose sleep
// limit is one: the first sleeps, the second goes back to blank though the
// sleep budget has room; without the limit both sleep.
func TestManagerSleepLimit(t *testing.T) {
	for _, tc := range []struct {
		name         string
		limit        int
		wantSleeping int
	}{
		{"limit of one", 1, 1},
		{"no limit", -1, 2},
		{"never sleep", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, "process", "a")
			ctx := context.Background()
			m := n.manager(t, 2, 0, 1<<30, false)
			defer m.Close(ctx)
			m.SetSleepLimit("a", tc.limit)
			var reps []*runtime.Replica
			for range 2 {
				rep, err := m.Acquire(ctx, "a", "")
				if err != nil {
					t.Fatal(err)
				}
				reps = append(reps, rep)
			}
			for _, rep := range reps {
				if err := m.Release(ctx, rep.ID); err != nil {
					t.Fatal(err)
				}
			}
			if s := states(m); s[runtime.StateSleeping] != tc.wantSleeping || s[runtime.StateBlank] != 2-tc.wantSleeping {
				t.Fatalf("after releasing two replicas: %v, want %d sleeping and the rest blank", s, tc.wantSleeping)
			}
		})
	}
}

// TestManagerStopIdleStopsStartingRuntimes empties the warm pool while
// its runtime is still starting, as the cold-start bench does for t4:
// nothing is left to come up blank afterwards.
func TestManagerStopIdleStopsStartingRuntimes(t *testing.T) {
	n := newNode(t, "process", "a")
	ctx := context.Background()
	m := n.manager(t, 2, 1, 0, false)
	defer m.Close(ctx)
	if err := m.SetWarm(0); err != nil {
		t.Fatal(err)
	}
	if err := m.StopIdle(ctx); err != nil {
		t.Fatal(err)
	}
	if rs := m.Runtimes(); len(rs) != 0 {
		t.Fatalf("runtimes after StopIdle: %+v, want none", rs)
	}
	waitFor(t, "no engine process left", func() bool { return len(n.engines(t)) == 0 })
	rep, err := m.Acquire(ctx, "a", "")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Tier != tier.Start {
		t.Fatalf("acquire after StopIdle: %s, want t4 (a runtime started for it)", rep.Tier)
	}
}

// TestManagerAcquireHandsOutReadoptedReady restarts the manager over two
// ready replicas, one loaded from the bucket and one from a node cache
// view (whose engine knows only the directory it read): the new manager
// re-adopts both with their revision, and Acquire hands each out as t0,
// loading nothing, before it would start or load anything.
func TestManagerAcquireHandsOutReadoptedReady(t *testing.T) {
	n := newNode(t, "process", "a")
	ctx := context.Background()
	raw, err := os.ReadFile(filepath.Join(strings.TrimPrefix(n.source, "file://"), "a", manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	man, err := manifest.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	b, err := bucket.Open(ctx, n.source, bucket.S3Options{})
	if err != nil {
		t.Fatal(err)
	}
	newManager := func(keep bool) *runtime.Manager {
		m, err := runtime.New(ctx, runtime.Options{Backend: n.backend, Dir: n.dir, Slots: []runtime.Class{runtime.OnDemand, runtime.OnDemand},
			Source: n.source, Cache: n.cache, Bucket: b, SleepBudget: 1 << 30, KeepOnClose: keep,
			EngineArgs: []string{"--kv-cache-memory", "8MiB", "--threads", "1", "--no-cache"}})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := newManager(true)
	first, err := m.Acquire(ctx, "a", man.Revision)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the manager's prefetch into the node cache", func() bool {
		v, err := n.cache.OpenRevision(ctx, man.Revision)
		if err == nil {
			v.Close()
		}
		return err == nil
	})
	second, err := m.Acquire(ctx, "a", man.Revision)
	if err != nil {
		t.Fatal(err)
	}
	if first.LoadTier != "t3" || second.LoadTier != "t2" {
		t.Fatalf("loads %s and %s, want t3 (bucket) and t2 (cache view)", first.LoadTier, second.LoadTier)
	}
	loads := map[string]string{} // runtime → its engine's last load, as it reports it
	for _, rep := range []*runtime.Replica{first, second} {
		st, err := runtime.NewEngineClient(rep.Addr).State(ctx)
		if err != nil || st.Load == nil {
			t.Fatalf("state of %s: %+v, %v", rep.ID, st, err)
		}
		b, _ := json.Marshal(st.Load)
		loads[rep.ID] = string(b)
	}
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}

	m2 := newManager(false)
	defer m2.Close(ctx)
	for _, r := range m2.Runtimes() {
		if r.State != runtime.StateReady || r.InUse || r.Model != "a" || r.Revision != man.Revision {
			t.Fatalf("re-adopted %+v, want idle and ready with a@%s", r, man.Revision)
		}
	}
	got := map[string]bool{}
	for range 2 {
		rep, err := m2.Acquire(ctx, "a", man.Revision)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Tier != tier.Hot || rep.LoadTier != "" || rep.WeightBytes != 0 || rep.Revision != man.Revision || loads[rep.ID] == "" {
			t.Fatalf("acquired %+v, want t0 of a re-adopted replica, nothing loaded", rep)
		}
		if rep.Breakdown.Fetch != 0 || rep.Breakdown.Load != 0 || rep.Breakdown.Warmup != 0 || rep.Breakdown.Start != 0 {
			t.Fatalf("t0 breakdown %+v: want nothing but the total", rep.Breakdown)
		}
		got[rep.ID] = true
		cl := runtime.NewEngineClient(rep.Addr)
		if err := cl.Complete(ctx, "a", []int32{1, 2}); err != nil {
			t.Fatalf("t0 replica does not serve: %v", err)
		}
		st, err := cl.State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := json.Marshal(st.Load); string(b) != loads[rep.ID] {
			t.Fatalf("engine of %s loaded again: %s, was %s", rep.ID, b, loads[rep.ID])
		}
	}
	if len(got) != 2 {
		t.Fatalf("acquired %v, want both re-adopted replicas", got)
	}
	for _, r := range m2.Runtimes() {
		if !r.InUse {
			t.Fatalf("runtime %s not in use after its t0 acquisition", r.ID)
		}
	}
	for _, tier := range []string{"t2", "t3"} {
		if v := loadedBytes(t, m2, tier); v != 0 {
			t.Fatalf("the new manager loaded %v bytes at %s", v, tier)
		}
	}
	// Handed back, a t0 replica sleeps like any other.
	for id := range got {
		if err := m2.Release(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if s := states(m2); s[runtime.StateSleeping] != 2 {
		t.Fatalf("after release: %v, want two sleeping", s)
	}
}

// TestManagerRetireSurplus releases replicas with no sleep budget: they
// go back to blank, and with RetireSurplus those beyond the warm pool are
// stopped, freeing their slots (a cluster's pods), while without it they
// stay blank for the next cold start.
func TestManagerRetireSurplus(t *testing.T) {
	for _, tc := range []struct {
		name      string
		warm      int
		retire    bool
		wantBlank int
	}{
		{"kept blank", 0, false, 2},
		{"retired, no warm pool", 0, true, 0},
		{"retired down to the warm pool", 1, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, "process", "a")
			ctx := context.Background()
			classes := []runtime.Class{runtime.OnDemand, runtime.OnDemand, runtime.OnDemand}
			m, err := runtime.New(ctx, runtime.Options{Backend: n.backend, Dir: n.dir, Slots: classes, Warm: tc.warm, Source: n.source,
				EngineArgs: []string{"--kv-cache-memory", "8MiB", "--threads", "1", "--no-cache"}, RetireSurplus: tc.retire})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close(ctx)
			var reps []*runtime.Replica
			for range 2 {
				rep, err := m.Acquire(ctx, "a", "")
				if err != nil {
					t.Fatal(err)
				}
				reps = append(reps, rep)
			}
			for _, rep := range reps {
				if err := m.Release(ctx, rep.ID); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, "the warm pool to settle", func() bool {
				s := states(m)
				return s[runtime.StateStarting] == 0 && len(m.Runtimes()) == s[runtime.StateBlank]
			})
			if s := states(m); s[runtime.StateBlank] < tc.wantBlank || (tc.retire && s[runtime.StateBlank] != tc.wantBlank) {
				t.Fatalf("after releasing two replicas: %v, want %d blank", s, tc.wantBlank)
			}
		})
	}
}
