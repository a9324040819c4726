package load

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/server"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/internal/testmodel"
	"github.com/stokehq/stoke/weightstore/synth"
)

// TestSpeculativeDraftModel serves stories260K with a draft model from a
// directory, as `stoke engine --speculative-config
// '{"method":"draft_model","model":DIR,…}'` does: its golden prompts come
// out as the reference's greedy completions while the draft proposes, and
// a draft of another vocabulary is refused at load.
func TestSpeculativeDraftModel(t *testing.T) {
	dir := testmodel.Dir(t)
	draft := func(vocab int) string {
		cfg := model.Config{HiddenSize: 32, IntermediateSize: 64, NumLayers: 1, NumHeads: 4, NumKVHeads: 2, HeadDim: 8,
			VocabSize: vocab, MaxPositionEmbeddings: 512, RopeTheta: 10000, TieWordEmbeddings: true}
		d := filepath.Join(t.TempDir(), "draft")
		if err := synth.Write(context.Background(), d, synth.Options{Config: &cfg, DType: dtype.F32, Seed: 5}); err != nil {
			t.Fatal(err)
		}
		return d
	}
	load := func(draftDir string) (*server.Loaded, error) {
		spec, err := server.ParseSpeculativeConfig(`{"method":"draft_model","model":"` + draftDir + `","num_speculative_tokens":3,"disable_by_batch_size":0}`)
		if err != nil {
			t.Fatal(err)
		}
		opts := Options{Engine: server.EngineOptions{Sched: sched.Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 8}, PrefixCaching: true, Speculative: spec}, KVCacheBytes: 16 << 20, Threads: 2}
		return Checkpoint(opts)(context.Background(), engineapi.LoadRequest{Path: dir}, nil)
	}
	if _, err := load(draft(1000)); err == nil || !strings.Contains(err.Error(), "vocabulary of 1000 tokens, the model's has 512") {
		t.Fatalf("a draft of another vocabulary: %v", err)
	}
	if _, err := load(filepath.Join(t.TempDir(), "absent")); err == nil || !strings.Contains(err.Error(), "draft model") {
		t.Fatalf("an absent draft: %v", err)
	}
	loaded, err := load(draft(512))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loaded.Close() })
	e, err := loaded.Start(core.NewMetrics(prometheus.NewRegistry(), loaded.Name))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	for _, c := range testmodel.Golden(t) {
		s, err := e.Submit(core.Params{Prompt: c.PromptIDs, MaxTokens: len(c.Completion), Sampling: sample.Params{TopP: 1, Logprobs: -1}, IgnoreEOS: true})
		if err != nil {
			t.Fatal(err)
		}
		var ids []int32
		for {
			d, ok := s.Next(ctx)
			if !ok {
				break
			}
			ids = append(ids, d.IDs...)
		}
		if !slices.Equal(ids, c.Completion) {
			t.Fatalf("%s: %v, golden %v", c.Name, ids, c.Completion)
		}
	}
	if st := e.SpecStats(); st.Drafts == 0 {
		t.Fatalf("the draft model proposed nothing: %+v", st)
	}
}
