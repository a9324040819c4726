package runtime_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/internal/tier"
	"github.com/stokehq/stoke/runtime"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/push"
	"github.com/stokehq/stoke/weightstore/synth"
)

// BenchmarkTiers measures an acquisition in each cold-start tier on the
// backend $STOKE_BENCH_BACKEND (process, the default, or containerd) and
// logs its time breakdown. The model is
// $STOKE_BENCH_MODEL in the bucket $STOKE_BENCH_SOURCE (S3 settings from
// AWS_*), or else a synthetic $STOKE_BENCH_PRESET (default small, FP8)
// pushed to a file:// bucket. $STOKE_BENCH_ARENA sizes the runtimes' weight
// arena (default 2GiB).
func BenchmarkTiers(b *testing.B) {
	ctx := context.Background()
	bin, err := stokeBinary()
	if err != nil {
		b.Fatal(err)
	}
	source, model := os.Getenv("STOKE_BENCH_SOURCE"), os.Getenv("STOKE_BENCH_MODEL")
	if source == "" {
		preset := os.Getenv("STOKE_BENCH_PRESET")
		if preset == "" {
			preset = "small"
		}
		src := filepath.Join(b.TempDir(), "src")
		if err := synth.Write(ctx, src, synth.Options{Preset: preset, DType: dtype.F8E4M3, ShardSize: 512 << 20, Seed: 1}); err != nil {
			b.Fatal(err)
		}
		root := b.TempDir()
		model = preset
		source = "file://" + root
		dest, err := bucket.Open(ctx, source+"/"+model, bucket.S3Options{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := push.Push(ctx, src, dest, push.Options{}); err != nil {
			b.Fatal(err)
		}
	}
	arena := int64(2 << 30)
	if s := os.Getenv("STOKE_BENCH_ARENA"); s != "" {
		n, err := humanize.ParseBytes(s)
		if err != nil {
			b.Fatal(err)
		}
		arena = int64(n)
	}
	dir, err := os.MkdirTemp("", "rtb-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	kind := os.Getenv("STOKE_BENCH_BACKEND")
	if kind == "" {
		kind = "process"
	}
	setup, ok := backends[kind]
	if !ok {
		b.Fatalf("STOKE_BENCH_BACKEND=%s: no such backend", kind)
	}
	n := &node{dir: dir, source: source}
	setup(b, n, bin)
	be := n.backend
	totals := map[tier.Tier]time.Duration{}
	for i := range b.N {
		cache := filepath.Join(dir, "cache", string(rune('a'+i%26)))
		os.RemoveAll(cache)
		newManager := func(warm int, sleepBudget int64) *runtime.Manager {
			m, err := runtime.New(ctx, runtime.Options{Backend: be, Dir: dir, Slots: []runtime.Class{runtime.OnDemand}, Warm: warm,
				SleepBudget: sleepBudget, Source: source, StartTimeout: time.Minute, WeightArena: arena,
				EngineArgs: []string{"--kv-cache-memory", "256MiB", "--cache-dir", cache, "--path-style"}})
			if err != nil {
				b.Fatal(err)
			}
			return m
		}
		acquire := func(m *runtime.Manager, want tier.Tier) {
			rep, err := m.Acquire(ctx, model, "")
			if err != nil {
				b.Fatal(err)
			}
			if rep.Tier != want {
				b.Fatalf("tier %s, want %s", rep.Tier, want)
			}
			bd := rep.Breakdown
			b.Logf("%s (weights %s): total %.3fs = start %.3f + fetch %.3f + load %.3f + wake %.3f + warm-up %.3f",
				rep.Tier, rep.LoadTier, bd.Total.Seconds(), bd.Start.Seconds(), bd.Fetch.Seconds(), bd.Load.Seconds(), bd.Wake.Seconds(), bd.Warmup.Seconds())
			totals[rep.Tier] += bd.Total
			if err := m.Release(ctx, rep.ID); err != nil {
				b.Fatal(err)
			}
		}
		// A warm blank runtime, releasing to blank: T3, then T2.
		m := newManager(1, 0)
		deadline := time.Now().Add(time.Minute)
		for len(m.Runtimes()) == 0 || m.Runtimes()[0].State != runtime.StateBlank {
			if time.Now().After(deadline) {
				b.Fatal("no warm runtime")
			}
			time.Sleep(10 * time.Millisecond)
		}
		acquire(m, tier.Bucket)
		acquire(m, tier.Cache)
		m.Close(ctx)
		// An empty pool, releasing to sleep: T4, then T1.
		m = newManager(0, 1<<40)
		acquire(m, tier.Start)
		acquire(m, tier.Wake)
		m.Close(ctx)
	}
	for tier, d := range totals {
		b.ReportMetric(d.Seconds()/float64(b.N), string(tier)+"_s")
	}
}
