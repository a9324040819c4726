package generate

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kernels/kernelstest"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/tokenizer"
	"github.com/stokehq/stoke/internal/testmodel"
	"github.com/stokehq/stoke/weightstore/checkpoint"
)

func testModel(t *testing.T) *model.Model {
	t.Helper()
	return testModelOn(t, nil)
}

// testModelOn is testModel computing with the kernel set set (nil: the
// default).
func testModelOn(t *testing.T, set *kernels.Set) *model.Model {
	t.Helper()
	cfg := model.Config{ModelType: "llama", HiddenSize: 32, IntermediateSize: 64, NumLayers: 2, NumHeads: 4, NumKVHeads: 2,
		HeadDim: 8, VocabSize: 50, MaxPositionEmbeddings: 64, RMSNormEps: 1e-5, RopeTheta: 10000, HiddenAct: "silu", TieWordEmbeddings: true}
	pool := set.NewPool(1)
	t.Cleanup(pool.Close)
	m, err := model.New(cfg, model.RandomSource(cfg, 1, 0.5), pool)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestChunkedPrefillMatchesWhole checks, on every kernel set this CPU
// runs, that prefilling a prompt in chunks gives the greedy ids a single
// prefill gives.
func TestChunkedPrefillMatchesWhole(t *testing.T) {
	kernelstest.ForEachSet(t, func(t *testing.T, set *kernels.Set) { checkChunkedPrefillMatchesWhole(t, testModelOn(t, set)) })
}

func checkChunkedPrefillMatchesWhole(t *testing.T, m *model.Model) {
	prompt := []int32{1, 5, 9, 2, 33, 17, 8, 41, 12, 6, 3, 29, 44, 10, 7, 38, 21, 19}
	opts := Options{MaxTokens: 10, Sampling: sample.Params{TopP: 1}, IgnoreEOS: true}
	whole, err := Run(context.Background(), m, prompt, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	opts.PrefillChunk = 5
	var streamed []int32
	chunked, err := Run(context.Background(), m, prompt, opts, func(id int32) { streamed = append(streamed, id) })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(whole.IDs, chunked.IDs) || !slices.Equal(streamed, chunked.IDs) {
		t.Fatalf("whole %v, chunked %v, streamed %v", whole.IDs, chunked.IDs, streamed)
	}
	if len(whole.IDs) != 10 || whole.FinishReason != "length" {
		t.Fatalf("got %d ids, finish %q", len(whole.IDs), whole.FinishReason)
	}
}

func TestStopsOnStopID(t *testing.T) {
	m := testModel(t)
	prompt := []int32{1, 2, 3}
	free, err := Run(context.Background(), m, prompt, Options{MaxTokens: 8, Sampling: sample.Params{TopP: 1}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	stop := free.IDs[3]
	got, err := Run(context.Background(), m, prompt, Options{MaxTokens: 8, Sampling: sample.Params{TopP: 1}, StopIDs: []int32{stop}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := free.IDs[:slices.Index(free.IDs, stop)+1]
	if !slices.Equal(got.IDs, want) || got.FinishReason != "stop" {
		t.Fatalf("got %v (%s), want %v", got.IDs, got.FinishReason, want)
	}
	ignored, err := Run(context.Background(), m, prompt, Options{MaxTokens: 8, Sampling: sample.Params{TopP: 1}, StopIDs: []int32{stop}, IgnoreEOS: true}, nil)
	if err != nil || !slices.Equal(ignored.IDs, free.IDs) {
		t.Fatalf("ignore-eos gave %v, %v", ignored.IDs, err)
	}
}

func TestRejectsBadRequests(t *testing.T) {
	m := testModel(t)
	ok := sample.Params{TopP: 1}
	for _, tc := range []struct {
		name   string
		prompt []int32
		opts   Options
		want   string
	}{
		{"empty prompt", nil, Options{MaxTokens: 1, Sampling: ok}, "prompt is empty"},
		{"no tokens", []int32{1}, Options{MaxTokens: 0, Sampling: ok}, "max tokens must be at least 1"},
		{"past context", []int32{1, 2}, Options{MaxTokens: 64, Sampling: ok}, "exceeds the context of 64"},
		{"bad sampling", []int32{1}, Options{MaxTokens: 1, Sampling: sample.Params{TopP: 2}}, "top_p"},
		{"token outside vocab", []int32{1, 50}, Options{MaxTokens: 1, Sampling: ok}, "outside the vocabulary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Run(context.Background(), m, tc.prompt, tc.opts, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestCancelled(t *testing.T) {
	m := testModel(t)
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	_, err := Run(ctx, m, []int32{1, 2}, Options{MaxTokens: 20, Sampling: sample.Params{TopP: 1}, IgnoreEOS: true}, func(int32) {
		if n++; n == 3 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) || n != 3 {
		t.Fatalf("err %v after %d tokens", err, n)
	}
}

// TestStoriesTellTheirStory decodes the trained stories260K greedily,
// through its own tokenizer, from BOS alone and from the text of the
// story's first words: both must tell the model's well-known story, as
// llama2.c's run.c does, and give the reference's golden ids, on every
// kernel set this CPU runs.
func TestStoriesTellTheirStory(t *testing.T) {
	dir := testmodel.Dir(t)
	bos := testmodel.GoldenCase(t, "bos")
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	kernelstest.ForEachSet(t, func(t *testing.T, set *kernels.Set) { checkStoriesTellTheirStory(t, set, dir, tok, bos) })
}

func checkStoriesTellTheirStory(t *testing.T, set *kernels.Set, dir string, tok *tokenizer.Tokenizer, bos testmodel.Case) {
	pool := set.NewPool(1)
	t.Cleanup(pool.Close)
	m, ck, err := checkpoint.LoadModel(dir, pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	for _, tc := range []struct {
		name   string
		prompt []int32
	}{
		{"from BOS", []int32{1}},
		{"from text", tok.Encode("Once upon a time", true)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := len(bos.Completion) + 1 - len(tc.prompt)
			res, err := Run(context.Background(), m, tc.prompt, Options{MaxTokens: n, Sampling: sample.Params{TopP: 1}, StopIDs: tok.EOS()}, nil)
			if err != nil {
				t.Fatal(err)
			}
			ids := append(slices.Clone(tc.prompt[1:]), res.IDs...)
			if !slices.Equal(ids, bos.Completion) {
				t.Errorf("prompt %v and completion %v, want the golden story %v", tc.prompt, res.IDs, bos.Completion)
			}
			text := tok.Decode(ids, true)
			if !strings.HasPrefix(text, testmodel.StoryStart) {
				t.Fatalf("the story reads %q, want it to start %q", text, testmodel.StoryStart)
			}
		})
	}
}
