package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/internal/openai"
)

func TestParseSpeculativeConfig(t *testing.T) {
	def := DefaultDisableByBatchSize
	for _, tc := range []struct {
		name, in string
		want     *SpeculativeConfig
		err      string
	}{
		{"empty", "", nil, ""},
		{"ngram", `{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4,"prompt_lookup_min":2}`,
			&SpeculativeConfig{Method: "ngram", NumSpeculativeTokens: 4, PromptLookupMax: 4, PromptLookupMin: 2, DisableByBatchSize: def}, ""},
		{"ngram, vLLM's defaults", `{"method":"ngram","num_speculative_tokens":3}`,
			&SpeculativeConfig{Method: "ngram", NumSpeculativeTokens: 3, PromptLookupMax: 5, PromptLookupMin: 5, DisableByBatchSize: def}, ""},
		{"ngram, max only", `{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3}`,
			&SpeculativeConfig{Method: "ngram", NumSpeculativeTokens: 3, PromptLookupMax: 3, PromptLookupMin: 3, DisableByBatchSize: def}, ""},
		{"ngram, older spelling", `{"model":"[ngram]","num_speculative_tokens":2,"prompt_lookup_min":1,"prompt_lookup_max":2,"disable_by_batch_size":0}`,
			&SpeculativeConfig{Method: "ngram", NumSpeculativeTokens: 2, PromptLookupMax: 2, PromptLookupMin: 1}, ""},
		{"draft model", `{"method":"draft_model","model":"/models/tiny","num_speculative_tokens":4,"disable_by_batch_size":16}`,
			&SpeculativeConfig{Method: "draft_model", Model: "/models/tiny", NumSpeculativeTokens: 4, DisableByBatchSize: 16}, ""},
		{"draft model inferred", `{"model":"/models/tiny","num_speculative_tokens":2}`,
			&SpeculativeConfig{Method: "draft_model", Model: "/models/tiny", NumSpeculativeTokens: 2, DisableByBatchSize: def}, ""},
		{"bad JSON", `{"method":"ngram",`, nil, "speculative config: "},
		{"not an object", `[1]`, nil, "speculative config: "},
		{"trailing", `{"method":"ngram","num_speculative_tokens":2} {}`, nil, "want one JSON object"},
		{"unknown field", `{"method":"ngram","num_speculative_tokens":2,"num_lookahead":3}`, nil, `unknown field "num_lookahead"`},
		{"wrong type", `{"method":"ngram","num_speculative_tokens":"4"}`, nil, "num_speculative_tokens must be a JSON int"},
		{"no method", `{"num_speculative_tokens":4}`, nil, `"method" is required`},
		{"unsupported method", `{"method":"eagle","model":"x","num_speculative_tokens":4}`, nil, `method "eagle" is not supported here`},
		{"no tokens", `{"method":"ngram"}`, nil, `"num_speculative_tokens" is required`},
		{"zero tokens", `{"method":"ngram","num_speculative_tokens":0}`, nil, "num_speculative_tokens must be in [1, 64], got 0"},
		{"too many tokens", `{"method":"ngram","num_speculative_tokens":65}`, nil, "must be in [1, 64], got 65"},
		{"min above max", `{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_min":4,"prompt_lookup_max":2}`, nil, "prompt_lookup_max (2) must be at least prompt_lookup_min (4)"},
		{"min zero", `{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_min":0,"prompt_lookup_max":2}`, nil, "prompt_lookup_min must be at least 1, got 0"},
		{"ngram with a model", `{"method":"ngram","model":"/m","num_speculative_tokens":2}`, nil, "method ngram takes no model"},
		{"draft without a model", `{"method":"draft_model","num_speculative_tokens":2}`, nil, `needs "model"`},
		{"draft with lookup", `{"method":"draft_model","model":"/m","num_speculative_tokens":2,"prompt_lookup_max":3}`, nil, "are for method ngram"},
		{"negative disable", `{"method":"ngram","num_speculative_tokens":2,"disable_by_batch_size":-1}`, nil, "disable_by_batch_size must be 0 (never) or positive, got -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseSpeculativeConfig(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("error %v, want one line with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			if got != nil {
				if err := got.Core().Validate(); err != nil && got.Method == core.SpecNgram {
					t.Fatalf("the parsed config does not validate: %v", err)
				}
			}
		})
	}
}

// specLoader serves a random-weight model whose engines speculate by
// prompt lookup.
func specLoader(t *testing.T) Loader {
	pool := kernels.NewPool(2)
	t.Cleanup(pool.Close)
	return func(ctx context.Context, req engineapi.LoadRequest, _ func(engineapi.LoadProgress)) (*Loaded, error) {
		mc := model.Config{ModelType: "llama", HiddenSize: 64, IntermediateSize: 128, NumLayers: 2, NumHeads: 4, NumKVHeads: 2,
			HeadDim: 16, VocabSize: testVocab, MaxPositionEmbeddings: 2048, RMSNormEps: 1e-5, RopeTheta: 10000, HiddenAct: "silu", TieWordEmbeddings: true}
		m, err := model.New(mc, model.RandomSource(mc, 3, 0.3), pool)
		if err != nil {
			return nil, err
		}
		spec, err := ParseSpeculativeConfig(`{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":3}`)
		if err != nil {
			return nil, err
		}
		return &Loaded{Name: testModel, MaxModelLen: testCtx, VocabSize: testVocab,
			Start: func(metrics *core.Metrics) (*core.Engine, error) {
				storage, err := kvcache.New(m.KVShape(), testBlocks)
				if err != nil {
					return nil, err
				}
				cfg := core.Config{Sched: sched.Config{MaxNumBatchedTokens: 128, MaxNumSeqs: 16, MaxModelLen: testCtx}, Spec: spec.Core()}
				return core.New(cfg, kvcache.NewManager(testBlocks, true), core.NewModelExecutor(m, storage), nil, metrics)
			},
			Close: func() error { return nil }}, nil
	}
}

// TestSpeculativeRequestField checks the "speculative" extension of a
// generation request on an engine that speculates: absent or true, the
// request speculates (the drafts counter grows), false it does not, the
// output is the same greedy tokens either way, and a value that is not a
// boolean is a 400 naming the field.
func TestSpeculativeRequestField(t *testing.T) {
	f := newFixture(t, specLoader(t), "model", Options{})
	drafts := func() float64 { return f.metric(t, `vllm:spec_decode_num_drafts_total{model_name="tiny"}`) }
	complete := func(field string, prompt []int32) []int32 {
		t.Helper()
		p, _ := json.Marshal(prompt)
		body := `{"model":"tiny",` + field + `"prompt":` + string(p) + `,"max_tokens":24,"temperature":0,"ignore_eos":true,"logprobs":0}`
		var resp openai.CompletionResponse
		f.postJSON(t, "/v1/completions", body, &resp)
		ids := make([]int32, 0, 24)
		for _, tok := range resp.Choices[0].Logprobs.Tokens {
			var id int32
			if _, err := fmt.Sscanf(tok, "token_id:%d", &id); err != nil {
				t.Fatalf("token %q: %v", tok, err)
			}
			ids = append(ids, id)
		}
		if len(ids) != 24 {
			t.Fatalf("%s: %d tokens", field, len(ids))
		}
		return ids
	}
	// A prompt that repeats itself and the model's own continuation, for
	// prompt lookup to find.
	var p0 []int32
	for i := range 30 {
		p0 = append(p0, int32(3+i%10))
	}
	prompt := slices.Concat(p0, complete(`"speculative": false,`, p0), p0)
	var first []int32
	for _, tc := range []struct {
		field       string
		speculative bool
	}{{"", true}, {`"speculative": true,`, true}, {`"speculative": false,`, false}} {
		before := drafts()
		ids := complete(tc.field, prompt)
		if first == nil {
			first = ids
		} else if !slices.Equal(ids, first) {
			t.Fatalf("%s: tokens %v, first request's %v", tc.field, ids, first)
		}
		if grew := drafts() > before; grew != tc.speculative {
			t.Fatalf("%q: the drafts counter went from %v to %v", tc.field, before, drafts())
		}
	}
	status, b := f.do(t, http.MethodPost, "/v1/completions", `{"model":"tiny","speculative":"no","prompt":[1,2,3],"max_tokens":2}`)
	var e struct {
		Error struct {
			Param string `json:"param"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); status != http.StatusBadRequest || err != nil || e.Error.Param != "speculative" {
		t.Fatalf("a string for speculative: %d %s", status, b)
	}
}
