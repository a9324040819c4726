//go:build cuda

package cudaload

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gorgonia.org/cu"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/cudaexec"
	"github.com/stokehq/stoke/engine/device/cuda"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/server"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/internal/testmodel"
	"github.com/stokehq/stoke/internal/tier"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/load"
	"github.com/stokehq/stoke/weightstore/loader"
	"github.com/stokehq/stoke/weightstore/nodecache"
	"github.com/stokehq/stoke/weightstore/push"
	"github.com/stokehq/stoke/weightstore/synth"
)

func openGPU(t testing.TB) *cuda.Device {
	t.Helper()
	dev, err := cuda.Open(0, cuda.Options{})
	if err != nil {
		t.Skipf("no usable CUDA device: %v", err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

// workDir is where the large synthetic checkpoint and its bucket and node
// cache live: $STOKE_GPUCHECK_DIR (kept between runs, so a rerun skips
// generating it), else a temporary directory.
func workDir(t *testing.T) string {
	if d := os.Getenv("STOKE_GPUCHECK_DIR"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

// cachedRevision makes sure a synthetic preset checkpoint is in a file://
// bucket and in a node cache under dir, and returns them.
func cachedRevision(t *testing.T, dir, preset string, dt dtype.DType) (root, revision string, cache nodecache.Cache, total int64) {
	ctx := context.Background()
	ck := filepath.Join(dir, preset+"-"+dt.String())
	start := time.Now()
	if _, err := os.Stat(filepath.Join(ck, "config.json")); err != nil {
		if err := synth.Write(ctx, ck, synth.Options{Preset: preset, DType: dt, Seed: 1}); err != nil {
			t.Fatal(err)
		}
		t.Logf("synthesized %s %s in %v", preset, dt, time.Since(start).Round(time.Millisecond))
	}
	root = "file://" + filepath.Join(dir, "bucket")
	dest, err := bucket.Open(ctx, root+"/"+preset, bucket.S3Options{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := push.Push(ctx, ck, dest, push.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := nodecache.NewDir(filepath.Join(dir, "cache"), nodecache.DirOptions{})
	if err != nil {
		t.Fatal(err)
	}
	src, err := bucket.Open(ctx, root, bucket.S3Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := loader.Prefetch(ctx, c, loader.Request{Bucket: src, Model: preset, Revision: m.Revision}, loader.Options{}); err != nil {
		t.Fatal(err)
	}
	return root, m.Revision, c, m.TotalBytes
}

// TestT2LoadAndThroughput streams a synthetic 1b FP8 checkpoint (about
// 1.5 GB) from the node cache into device memory (T2) and reports GB/s,
// then builds the GPU model over those very buffers and reports decode
// tokens/s at 1, 16 and 64 streams and prefill tokens/s of a 2,048-token
// prompt, beside the HBM bound for the bytes a decode step reads.
func TestT2LoadAndThroughput(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no 1.5 GB checkpoint")
	}
	dev := openGPU(t)
	ctx := context.Background()
	root, revision, cache, total := cachedRevision(t, workDir(t), "1b", dtype.F8E4M3)
	b, err := bucket.Open(ctx, root, bucket.S3Options{})
	if err != nil {
		t.Fatal(err)
	}
	var res *loader.Result
	// The loader's defaults twice (the first read may find the page cache
	// cold), then with more reads in flight.
	for attempt, opts := range []loader.Options{{}, {}, {Parallel: 16, ChunkSize: 8 << 20}} {
		if res != nil {
			res.Free()
		}
		res, err = loader.LoadRevision(ctx, dev, cache, loader.Request{Bucket: b, Model: "1b", Revision: revision}, opts)
		if err != nil {
			t.Fatal(err)
		}
		if res.Tier != tier.Cache {
			t.Fatalf("tier %s, want %s", res.Tier, tier.Cache)
		}
		t.Logf("GPUCHECK t2_load attempt=%d parallel=%d chunk_MiB=%d bytes=%d seconds=%.3f GBps=%.2f alloc_seconds=%.3f", attempt,
			max(opts.Parallel, 8), max(opts.ChunkSize, 4<<20)>>20, total, res.Elapsed.Seconds(), float64(total)/res.Elapsed.Seconds()/1e9, res.Alloc.Seconds())
	}
	defer res.Free()
	tensors, cfg, err := FromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	m, err := cudaexec.New(ctx, dev, cfg, tensors, cudaexec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	clock, _ := dev.Attribute(cu.MemoryClockRate)
	width, _ := dev.Attribute(cu.GlobalMemoryBusWidth)
	peak := 2 * float64(clock) * 1e3 * float64(width) / 8
	t.Logf("GPUCHECK device=%q hbm_peak_GBps=%.0f weight_bytes=%d decode_bound_steps_per_s=%.0f", dev.Model(), peak/1e9, m.WeightBytes(), peak/float64(m.WeightBytes()))
	const prompt, steps = 128, 16
	perSeq := (prompt + steps + 8 + kvcache.BlockSize - 1) / kvcache.BlockSize
	blocks := max(64*perSeq, 2048/kvcache.BlockSize+1)
	x, err := m.NewExecutor(ctx, blocks)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	vocab := cfg.VocabSize
	for _, streams := range []int{1, 16, 64} {
		tables := make([][]int32, streams)
		for s := range tables {
			for j := range perSeq {
				tables[s] = append(tables[s], int32(s*perSeq+j))
			}
		}
		// Prefill every stream's prompt, 16 streams a batch.
		for s0 := 0; s0 < streams; s0 += 16 {
			bt := &model.Batch{BlockTables: tables}
			for s := s0; s < min(streams, s0+16); s++ {
				for p := range prompt {
					bt.Tokens = append(bt.Tokens, int32((p*7919+s*104729)%vocab))
					bt.Positions = append(bt.Positions, int32(p))
					bt.Seqs = append(bt.Seqs, int32(s))
				}
				bt.LogitRows = append(bt.LogitRows, len(bt.Tokens)-1)
			}
			if err := x.Forward(ctx, bt, make([]float32, len(bt.LogitRows)*vocab)); err != nil {
				t.Fatal(err)
			}
		}
		logits := make([]float32, streams*vocab)
		decode := func(pos int) {
			bt := &model.Batch{BlockTables: tables}
			for s := range streams {
				bt.Tokens = append(bt.Tokens, int32((pos*31+s)%vocab))
				bt.Positions = append(bt.Positions, int32(pos))
				bt.Seqs = append(bt.Seqs, int32(s))
				bt.LogitRows = append(bt.LogitRows, s)
			}
			if err := x.Forward(ctx, bt, logits); err != nil {
				t.Fatal(err)
			}
		}
		decode(prompt) // warm-up
		start := time.Now()
		for i := range steps {
			decode(prompt + 1 + i)
		}
		el := time.Since(start)
		for _, v := range logits[:vocab] {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("decode at %d streams: logit %v", streams, v)
			}
		}
		t.Logf("GPUCHECK decode streams=%d steps=%d step_ms=%.3f tok_per_s=%.0f", streams, steps, el.Seconds()*1e3/steps, float64(streams*steps)/el.Seconds())
	}
	// Prefill of one 2,048-token prompt (after a warm-up of the same size).
	const long = 2048
	table := make([]int32, long/kvcache.BlockSize)
	for j := range table {
		table[j] = int32(j)
	}
	for attempt := range 2 {
		bt := &model.Batch{BlockTables: [][]int32{table}, LogitRows: []int{long - 1}}
		for p := range long {
			bt.Tokens = append(bt.Tokens, int32((p*7919+attempt)%vocab))
			bt.Positions = append(bt.Positions, int32(p))
			bt.Seqs = append(bt.Seqs, 0)
		}
		start := time.Now()
		if err := x.Forward(ctx, bt, make([]float32, vocab)); err != nil {
			t.Fatal(err)
		}
		el := time.Since(start)
		if attempt == 1 {
			t.Logf("GPUCHECK prefill tokens=%d seconds=%.3f tok_per_s=%.0f", long, el.Seconds(), long/el.Seconds())
		}
	}
}

// TestServeStoriesFromBucket serves stories260K through Checkpoint (the
// loader `stoke engine --device cuda` uses) from a bucket, first as T3
// (teeing into the node cache) then as T2, and checks the golden greedy
// completions on the GPU each time.
func TestServeStoriesFromBucket(t *testing.T) {
	cases, stories := testmodel.Golden(t), testmodel.Dir(t)
	openGPU(t).Close()
	ctx := context.Background()
	root := "file://" + t.TempDir()
	dest, err := bucket.Open(ctx, root+"/stories", bucket.S3Options{})
	if err != nil {
		t.Fatal(err)
	}
	man, err := push.Push(ctx, stories, dest, push.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cache, err := nodecache.NewDir(t.TempDir(), nodecache.DirOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ld, closeDev, err := Checkpoint(load.Options{Engine: server.EngineOptions{Sched: sched.Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 8}},
		KVCacheBytes: 64 << 20, Cache: cache}, Options{Device: "cuda"})
	if err != nil {
		t.Fatal(err)
	}
	defer closeDev()
	for _, want := range []tier.Tier{tier.Bucket, tier.Cache} {
		var last engineapi.LoadProgress
		loaded, err := ld(ctx, engineapi.LoadRequest{Source: root, Model: "stories", Revision: man.Revision}, func(p engineapi.LoadProgress) { last = p })
		if err != nil {
			t.Fatal(err)
		}
		if last.Tier != want {
			t.Errorf("tier %s, want %s", last.Tier, want)
		}
		e, err := loaded.Start(core.NewMetrics(prometheus.NewRegistry(), loaded.Name))
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { e.Run(runCtx); close(done) }()
		exact := true
		for _, c := range cases {
			s, err := e.Submit(core.Params{Prompt: c.PromptIDs, MaxTokens: len(c.Completion), Sampling: sample.Params{TopP: 1, Logprobs: -1}, IgnoreEOS: true})
			if err != nil {
				t.Fatal(err)
			}
			var got []int32
			for {
				d, ok := s.Next(runCtx)
				if !ok {
					break
				}
				got = append(got, d.IDs...)
			}
			if !slices.Equal(got, c.Completion) {
				exact = false
				t.Errorf("%s from %s: %v, want %v", c.Name, want, got, c.Completion)
			}
		}
		cancel()
		<-done
		// Close waits for the T3 load's commit to the node cache, so the
		// next load finds the revision there.
		if err := loaded.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("GPUCHECK golden_served tier=%s cases=%d exact=%v", want, len(cases), exact)
	}
}
