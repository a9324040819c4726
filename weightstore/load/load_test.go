package load

import (
	"context"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/generate"
	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/server"
	"github.com/stokehq/stoke/weightstore/checkpoint"
)

const stories = "../../../shared/models/stories260K"

// TestStoriesConcurrentMatchesAlone serves the real stories260K model the
// way `stoke engine --model` does and checks that 32 concurrent greedy
// requests produce exactly what each produces alone.
func TestStoriesConcurrentMatchesAlone(t *testing.T) {
	if _, err := os.Stat(stories); err != nil {
		t.Skip("test model absent")
	}
	opts := Options{Engine: server.EngineOptions{Sched: sched.Config{MaxNumBatchedTokens: 256, MaxNumSeqs: 32}, PrefixCaching: true},
		KVCacheBytes: 64 << 20, Threads: 2}
	loaded, err := Checkpoint(opts)(context.Background(), stories)
	if err != nil {
		t.Fatal(err)
	}
	defer loaded.Close()
	e, err := loaded.Start(core.NewMetrics(prometheus.NewRegistry(), loaded.Name))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.Run(ctx)

	prompt := func(i int) []int32 {
		p := []int32{1}
		for j := range 3 + i%13 {
			p = append(p, int32(100+(i*29+j*7)%400))
		}
		return p
	}
	greedy := sample.Params{TopP: 1, Logprobs: -1}
	got := make([][]int32, 32)
	var wg sync.WaitGroup
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := e.Submit(core.Params{Prompt: prompt(i), MaxTokens: 24, Sampling: greedy, IgnoreEOS: true})
			if err != nil {
				t.Error(err)
				return
			}
			for {
				d, ok := s.Next(ctx)
				if !ok {
					return
				}
				got[i] = append(got[i], d.IDs...)
			}
		}()
	}
	wg.Wait()

	pool := kernels.NewPool(1)
	defer pool.Close()
	m, ck, err := checkpoint.LoadModel(stories, pool)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	for i := range got {
		alone, err := generate.Run(ctx, m, prompt(i), generate.Options{MaxTokens: 24, Sampling: greedy, IgnoreEOS: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got[i], alone.IDs) {
			t.Fatalf("request %d: concurrent %v, alone %v", i, got[i], alone.IDs)
		}
	}
}

func TestCheckpointLoaderErrors(t *testing.T) {
	if _, err := os.Stat(stories); err != nil {
		t.Skip("test model absent")
	}
	for _, tc := range []struct {
		name, path string
		opts       Options
		want       string
	}{
		{"no checkpoint", t.TempDir(), Options{KVCacheBytes: 1 << 20}, "config.json"},
		{"kv too small", stories, Options{KVCacheBytes: 100}, "holds no block"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Checkpoint(tc.opts)(context.Background(), tc.path)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
	loaded, err := Checkpoint(Options{Engine: server.EngineOptions{Sched: sched.Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 4, MaxModelLen: 100000}},
		KVCacheBytes: 1 << 20})(context.Background(), stories)
	if err != nil {
		t.Fatal(err)
	}
	defer loaded.Close()
	if loaded.Name != "stories260K" || loaded.MaxModelLen != 512 {
		t.Fatalf("name %q, context %d: want the directory's name and the model's 512", loaded.Name, loaded.MaxModelLen)
	}
}
