package load

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/server"
	"github.com/stokehq/stoke/internal/testmodel"
	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/synth"
)

// TestCheckpointServesLoRAModules serves stories260K the way `stoke engine
// --model DIR --enable-lora --lora-modules …` does and checks that greedy
// requests naming each adapter give the tokens of the checkpoint with that
// adapter merged into its weights, and base requests the base's.
func TestCheckpointServesLoRAModules(t *testing.T) {
	stories := testmodel.Dir(t)
	dir := t.TempDir()
	ck, err := readConfig(stories)
	if err != nil {
		t.Fatal(err)
	}
	var modules []core.AdapterSpec
	merged := map[string]string{}
	for i, kind := range []synth.AdapterOptions{
		{Rank: 8, Seed: 1, Delta: 0.02},
		{Rank: 4, TargetModules: []string{"q_proj", "v_proj", "down_proj"}, Seed: 2, Delta: 0.03},
	} {
		name := fmt.Sprintf("a%d", i)
		path := filepath.Join(dir, name)
		if err := synth.WriteAdapter(path, ck, kind); err != nil {
			t.Fatal(err)
		}
		merged[name] = filepath.Join(dir, name+"-merged")
		if err := synth.MergeAdapter(context.Background(), stories, path, merged[name]); err != nil {
			t.Fatal(err)
		}
		modules = append(modules, core.AdapterSpec{Name: name, Path: path})
	}
	serve := func(path string, lora bool) *server.Loaded {
		opts := Options{Engine: server.EngineOptions{Sched: sched.Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 8}, PrefixCaching: true,
			LoRA: server.LoRAOptions{Enabled: lora, MaxLoras: 1, Modules: modules}}, KVCacheBytes: 16 << 20, Threads: 2}
		loaded, err := Checkpoint(opts)(context.Background(), engineapi.LoadRequest{Path: path}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { loaded.Close() })
		if lora {
			if err := loaded.Adapters.Preload(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		return loaded
	}
	ctx := context.Background()
	greedy := func(loaded *server.Loaded, adapter string) [][]int32 {
		e, err := loaded.Start(core.NewMetrics(prometheus.NewRegistry(), loaded.Name))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { e.Run(ctx); close(done) }()
		defer func() { cancel(); <-done }()
		var out [][]int32
		for _, c := range testmodel.Golden(t) {
			s, err := e.Submit(core.Params{Prompt: c.PromptIDs, MaxTokens: 24, Sampling: sample.Params{TopP: 1, Logprobs: -1}, IgnoreEOS: true, Adapter: adapter})
			if err != nil {
				t.Fatal(err)
			}
			var ids []int32
			for {
				d, ok := s.Next(ctx)
				if !ok {
					break
				}
				if d.Err != nil {
					t.Fatal(d.Err)
				}
				ids = append(ids, d.IDs...)
			}
			out = append(out, ids)
		}
		return out
	}
	withLoRA := serve(stories, true)
	if info := withLoRA.Adapters.Info(); len(info.Adapters) != 2 || info.Slots != 1 || info.MaxRank != 16 {
		t.Fatalf("after --lora-modules: %+v", info)
	}
	base := greedy(serve(stories, false), "")
	if got := greedy(withLoRA, ""); !slices.EqualFunc(got, base, slices.Equal) {
		t.Fatalf("base requests on the LoRA engine: %v, want %v", got, base)
	}
	for name, dir := range merged {
		got, want := greedy(withLoRA, name), greedy(serve(dir, false), "")
		if !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("adapter %s: %v, the merged checkpoint %v", name, got, want)
		}
		if slices.EqualFunc(got, base, slices.Equal) {
			t.Fatalf("adapter %s gives the base's tokens", name)
		}
	}
}

func TestAdapterLoaderErrors(t *testing.T) {
	stories := testmodel.Dir(t)
	cfg, err := readConfig(stories)
	if err != nil {
		t.Fatal(err)
	}
	other := cfg
	other.HiddenSize, other.NumHeads, other.NumKVHeads = 128, 8, 4
	dir := t.TempDir()
	if err := synth.WriteAdapter(filepath.Join(dir, "other"), other, synth.AdapterOptions{Rank: 4}); err != nil {
		t.Fatal(err)
	}
	if err := synth.WriteAdapter(filepath.Join(dir, "big"), cfg, synth.AdapterOptions{Rank: 32}); err != nil {
		t.Fatal(err)
	}
	load := Options{Engine: server.EngineOptions{LoRA: server.LoRAOptions{Enabled: true}}}.adapterLoader(cfg)
	for _, tc := range []struct {
		name, path string
		want       error
	}{
		{"another base", filepath.Join(dir, "other"), model.ErrInvalidAdapter},
		{"rank past --max-lora-rank", filepath.Join(dir, "big"), model.ErrInvalidAdapter},
		{"missing", filepath.Join(dir, "nope"), fs.ErrNotExist},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := load(context.Background(), core.AdapterSpec{Name: "x", Path: tc.path}); !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
		})
	}
}

// readConfig is the model config of the checkpoint in dir.
func readConfig(dir string) (model.Config, error) {
	ck, err := checkpoint.Open(dir)
	if err != nil {
		return model.Config{}, err
	}
	defer ck.Close()
	return ck.Config(), nil
}
