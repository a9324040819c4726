package main

import (
	"context"
	"os"
	"slices"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/generate"
	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/weightstore/checkpoint"
)

// TestStoriesConcurrentMatchesAlone serves the real stories260K model the
// way `stoke engine --model` does and checks that 32 concurrent greedy
// requests produce exactly what each produces alone.
func TestStoriesConcurrentMatchesAlone(t *testing.T) {
	if _, err := os.Stat(stories); err != nil {
		t.Skip("test model absent")
	}
	f := engineFlags{maxBatchedTokens: 256, maxNumSeqs: 32, kvMemory: "64MiB", threads: 2}
	loaded, err := modelLoader(f, 64<<20)(context.Background(), stories)
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
