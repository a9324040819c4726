package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/internal/openai"
)

// DefaultDisableByBatchSize is disable_by_batch_size when a speculative
// config leaves it out: from this many running decoding requests in a step
// on, the step does not speculate. Verifying k drafts computes k more
// positions per request; while a decode step is bound by reading the
// weights that is nearly free, but the larger the batch, the more of the
// step is arithmetic, and the more accepted tokens a step must yield to
// pay. Measured on the CPU engine (2 cores): a step verifying 4 drafts
// costs 1.35 plain steps at batch 1, 1.7 at 4, 2.2 at 8 and 2.9 at 16 on
// the memory-bound synth 100m shape (BenchmarkSpeculativeVerifyCost), and
// about 3 already at batch 1 on stories260K, which fits in cache. Prompt
// lookup on stories260K (BenchmarkSpeculativeBreakEven) yields 4.1 tokens
// per draft on extractive prompts, gaining about 29% at concurrency 1, 17%
// at 8 and nothing left at 16, and 1.6 on its golden prompts, losing 6% at
// 1 and 13% at 16. From 8 on only strongly extractive traffic still gains,
// little, while the rest loses: 8 is the default. Raise it (0: never
// disable) for extractive work on memory-bound models.
const DefaultDisableByBatchSize = 8

// SpeculativeConfig is vLLM's --speculative-config, the JSON object that
// turns on speculative decoding: {"method":"ngram",
// "num_speculative_tokens":4, "prompt_lookup_max":4,
// "prompt_lookup_min":2} or {"method":"draft_model", "model":"DIR",
// "num_speculative_tokens":4}, either with "disable_by_batch_size".
// ParseSpeculativeConfig fills it in; its fields are then complete.
type SpeculativeConfig struct {
	// Method is core.SpecNgram or core.SpecDraftModel.
	Method string `json:"method"`
	// Model is the draft model's checkpoint directory (draft_model).
	Model string `json:"model,omitempty"`
	// NumSpeculativeTokens is how many tokens are proposed per step.
	NumSpeculativeTokens int `json:"num_speculative_tokens"`
	// PromptLookupMax and PromptLookupMin bound prompt lookup's n-grams
	// (ngram; vLLM's defaults: both 5 when neither is given, the other's
	// value when one is).
	PromptLookupMax int `json:"prompt_lookup_max,omitempty"`
	PromptLookupMin int `json:"prompt_lookup_min,omitempty"`
	// DisableByBatchSize turns speculation off for steps with at least
	// this many running decoding requests; 0 never turns it off. Left out,
	// it is DefaultDisableByBatchSize.
	DisableByBatchSize int `json:"disable_by_batch_size"`
}

// specJSON is SpeculativeConfig as it arrives, telling absent fields from
// zero ones.
type specJSON struct {
	Method               string `json:"method"`
	Model                string `json:"model"`
	NumSpeculativeTokens *int   `json:"num_speculative_tokens"`
	PromptLookupMax      *int   `json:"prompt_lookup_max"`
	PromptLookupMin      *int   `json:"prompt_lookup_min"`
	DisableByBatchSize   *int   `json:"disable_by_batch_size"`
}

// ParseSpeculativeConfig parses and checks a --speculative-config value;
// "" means no speculation (nil). Its errors are one line, naming the field.
func ParseSpeculativeConfig(text string) (*SpeculativeConfig, error) {
	if strings.TrimSpace(text) == "" {
		return nil, nil
	}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	var in specJSON
	if err := dec.Decode(&in); err != nil {
		return nil, fmt.Errorf("speculative config: %w", specJSONError(err))
	}
	if dec.More() {
		return nil, errors.New("speculative config: want one JSON object, found more after it")
	}
	c := &SpeculativeConfig{Method: in.Method, Model: in.Model, DisableByBatchSize: DefaultDisableByBatchSize}
	if c.Model == "[ngram]" && (c.Method == "" || c.Method == core.SpecNgram) { // vLLM's older spelling
		c.Method, c.Model = core.SpecNgram, ""
	}
	if c.Method == "" && c.Model != "" {
		c.Method = core.SpecDraftModel // vLLM infers it from a model
	}
	bad := func(format string, args ...any) (*SpeculativeConfig, error) {
		return nil, fmt.Errorf("speculative config: "+format, args...)
	}
	switch c.Method {
	case core.SpecNgram:
		if c.Model != "" {
			return bad("method ngram takes no model, got %q", c.Model)
		}
		c.PromptLookupMin, c.PromptLookupMax = 5, 5
		switch {
		case in.PromptLookupMin != nil && in.PromptLookupMax != nil:
			c.PromptLookupMin, c.PromptLookupMax = *in.PromptLookupMin, *in.PromptLookupMax
		case in.PromptLookupMin != nil:
			c.PromptLookupMin, c.PromptLookupMax = *in.PromptLookupMin, *in.PromptLookupMin
		case in.PromptLookupMax != nil:
			c.PromptLookupMin, c.PromptLookupMax = *in.PromptLookupMax, *in.PromptLookupMax
		}
		switch {
		case c.PromptLookupMin < 1:
			return bad("prompt_lookup_min must be at least 1, got %d", c.PromptLookupMin)
		case c.PromptLookupMax < c.PromptLookupMin:
			return bad("prompt_lookup_max (%d) must be at least prompt_lookup_min (%d)", c.PromptLookupMax, c.PromptLookupMin)
		}
	case core.SpecDraftModel:
		if c.Model == "" {
			return bad(`method draft_model needs "model": the draft checkpoint's directory`)
		}
		if in.PromptLookupMax != nil || in.PromptLookupMin != nil {
			return bad("prompt_lookup_max and prompt_lookup_min are for method ngram, not draft_model")
		}
	case "":
		return bad(`"method" is required: "ngram" or "draft_model"`)
	default:
		return bad("method %q is not supported here (want %q or %q)", c.Method, core.SpecNgram, core.SpecDraftModel)
	}
	if in.NumSpeculativeTokens == nil {
		return bad(`"num_speculative_tokens" is required`)
	}
	c.NumSpeculativeTokens = *in.NumSpeculativeTokens
	if c.NumSpeculativeTokens < 1 || c.NumSpeculativeTokens > core.MaxSpeculativeTokens {
		return bad("num_speculative_tokens must be in [1, %d], got %d", core.MaxSpeculativeTokens, c.NumSpeculativeTokens)
	}
	if in.DisableByBatchSize != nil {
		c.DisableByBatchSize = *in.DisableByBatchSize
		if c.DisableByBatchSize < 0 {
			return bad("disable_by_batch_size must be 0 (never) or positive, got %d", c.DisableByBatchSize)
		}
	}
	return c, nil
}

// specJSONError makes a decoding error of the config read as one line
// naming the field.
func specJSONError(err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te) && te.Field != "":
		return fmt.Errorf("%s must be a JSON %s, got %s", te.Field, te.Type, te.Value)
	case errors.As(err, &se):
		return fmt.Errorf("invalid JSON at byte %d: %v", se.Offset, se)
	case errors.Is(err, io.EOF):
		return errors.New("empty JSON")
	}
	return errors.New(strings.TrimPrefix(err.Error(), "json: "))
}

// Core returns the engine's speculation settings; a draft model is the
// loader's to add (core.SpecConfig.Draft). A nil config is no speculation.
func (c *SpeculativeConfig) Core() core.SpecConfig {
	if c == nil {
		return core.SpecConfig{}
	}
	return core.SpecConfig{Method: c.Method, NumSpeculativeTokens: c.NumSpeculativeTokens,
		PromptLookupMax: c.PromptLookupMax, PromptLookupMin: c.PromptLookupMin, DisableByBatchSize: c.DisableByBatchSize}
}

// extensionsKey is where decodeRequest leaves a request's stoke
// extensions in the gin context.
const extensionsKey = "stoke.extensions"

// extensions are the body fields of a generation request that neither
// OpenAI nor vLLM define.
type extensions struct {
	// Speculative false keeps the request out of speculative decoding on
	// an engine that speculates; true or absent lets it speculate (an
	// engine without speculation ignores it).
	Speculative *bool `json:"speculative"`
}

// decodeRequest is decodeBody for generation requests: it also reads the
// stoke extensions of the body (a wrong type is a 400 naming the field)
// for applyExtensions.
func (s *Server) decodeRequest(c *gin.Context, req any) *openai.Error {
	b, e := s.readBody(c)
	if e != nil {
		return e
	}
	if e := openai.Decode(b, req); e != nil {
		return e
	}
	if !bytes.Contains(b, []byte(`"speculative"`)) {
		return nil // nothing to decode twice
	}
	var ext extensions
	if e := openai.Decode(b, &ext); e != nil {
		return e
	}
	c.Set(extensionsKey, ext)
	return nil
}

// applyExtensions sets the engine parameters the request's extensions
// ask for.
func applyExtensions(c *gin.Context, p *core.Params) {
	v, ok := c.Get(extensionsKey)
	if !ok {
		return
	}
	if ext := v.(extensions); ext.Speculative != nil {
		p.DisableSpeculation = !*ext.Speculative
	}
}
