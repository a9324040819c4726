package server

import (
	"errors"
	"math/rand/v2"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/internal/openai"
)

// vocabSize is the bound on token ids requests may carry; 0 means none.
func (l *Loaded) vocabSize() int {
	if l.VocabSize > 0 {
		return l.VocabSize
	}
	if l.Tokenizer != nil {
		return l.Tokenizer.VocabSize()
	}
	return 0
}

// checkTokens refuses token ids outside the vocabulary.
func checkTokens(ids []int32, vocab int, param string) *openai.Error {
	for i, id := range ids {
		if id < 0 || (vocab > 0 && int(id) >= vocab) {
			if vocab > 0 {
				return openai.InvalidRequest(param, "%s[%d] = %d is outside the vocabulary [0, %d)", param, i, id, vocab)
			}
			return openai.InvalidRequest(param, "%s[%d] = %d is not a valid token id", param, i, id)
		}
	}
	return nil
}

// maxPromptBytesPerToken bounds the bytes of text one token encodes, so
// generously that no prompt which fits the context is longer than
// MaxModelLen × it in bytes.
const maxPromptBytesPerToken = 32

// checkPromptBytes refuses a text prompt that cannot fit the model's
// context however it tokenizes, before it is tokenized (a 7 MB prompt
// would otherwise take seconds to encode only to be refused).
func checkPromptBytes(l *Loaded, n int, param string) *openai.Error {
	if limit := l.MaxModelLen * maxPromptBytesPerToken; n > limit {
		return openai.ContextTooLong(param, "%s is too long: %d bytes, past the %d bytes a context of %d tokens can hold",
			param, n, limit, l.MaxModelLen)
	}
	return nil
}

// checkPromptSize applies checkPromptBytes to a request's text prompt
// (a completion's prompt, the text of a chat's messages), before anything
// tokenizes it.
func checkPromptSize(l *Loaded, req any) *openai.Error {
	switch r := req.(type) {
	case *openai.CompletionRequest:
		n := 0
		for _, t := range r.Prompt.Texts {
			n += len(t)
		}
		return checkPromptBytes(l, n, "prompt")
	case *openai.ChatCompletionRequest:
		n := 0
		for _, m := range r.Messages {
			n += len(m.Content.Text)
		}
		return checkPromptBytes(l, n, "messages")
	}
	return nil
}

// checkModel refuses a request naming another model than the one served;
// an empty name means the served one.
func checkModel(l *Loaded, name string) *openai.Error {
	if _, ok := l.requestAdapter(name); !ok {
		return openai.ModelNotFound(name)
	}
	return nil
}

// genSpec says how one endpoint names and defaults its fields.
type genSpec struct {
	promptParam   string // "prompt" or "messages"
	maxTokens     *int
	maxParam      string // "max_tokens" or "max_completion_tokens"
	defaultMax    int    // 0: the rest of the context
	logprobs      int    // sample.Params.Logprobs
	logprobsParam string // "logprobs" or "top_logprobs"
	// kvTokens is the KV pool's capacity in tokens (0: unknown); a default
	// max_tokens stays within it.
	kvTokens int
	// echo is a completion's echo: max_tokens may then be 0, and the
	// prompt alone may fill the context.
	echo bool
}

// buildParams checks a request against the model and turns it into engine
// parameters; every refusal names its field.
func buildParams(l *Loaded, g *openai.GenerationParams, prompt []int32, spec genSpec) (core.Params, *openai.Error) {
	if len(prompt) == 0 {
		return core.Params{}, openai.InvalidRequest(spec.promptParam, "%s is empty: it must hold at least one token", spec.promptParam)
	}
	if e := checkTokens(prompt, l.vocabSize(), spec.promptParam); e != nil {
		return core.Params{}, e
	}
	room := l.MaxModelLen - len(prompt)
	promptOnly := spec.echo && spec.maxTokens != nil && *spec.maxTokens == 0
	switch {
	case promptOnly && room < 0:
		return core.Params{}, openai.ContextTooLong(spec.promptParam,
			"%s is too long: %d tokens, the model's context is %d tokens", spec.promptParam, len(prompt), l.MaxModelLen)
	case !promptOnly && room < 1:
		return core.Params{}, openai.ContextTooLong(spec.promptParam,
			"%s is too long: %d tokens, the model's context is %d tokens and must leave room for at least one generated token",
			spec.promptParam, len(prompt), l.MaxModelLen)
	}
	maxTokens := room
	if spec.kvTokens > len(prompt) {
		maxTokens = min(room, spec.kvTokens-len(prompt))
	}
	// The request's CheckSupported has checked the fields' ranges
	// (openai.CheckRanges); what is left depends on the model.
	switch {
	case spec.maxTokens != nil && *spec.maxTokens > room:
		return core.Params{}, openai.ContextTooLong(spec.maxParam,
			"%s is too large: %d prompt tokens plus %s %d exceed the model's context of %d tokens (at most %d left)",
			spec.maxParam, len(prompt), spec.maxParam, *spec.maxTokens, l.MaxModelLen, room)
	case spec.maxTokens != nil:
		maxTokens = *spec.maxTokens
	case spec.defaultMax > 0:
		maxTokens = min(spec.defaultMax, maxTokens)
	}
	for i, st := range g.Stop {
		if st == "" {
			return core.Params{}, openai.InvalidRequest("stop", "stop[%d] is empty: stop strings must not be empty", i)
		}
	}
	if e := checkTokens(g.StopTokenIDs, l.vocabSize(), "stop_token_ids"); e != nil {
		return core.Params{}, e
	}
	sp, e := samplingParams(g, spec)
	if e != nil {
		return core.Params{}, e
	}
	p := core.Params{
		Prompt:      prompt,
		MaxTokens:   maxTokens,
		Sampling:    sp,
		StopIDs:     g.StopTokenIDs,
		Stop:        g.Stop,
		IgnoreEOS:   g.IgnoreEOS,
		SkipSpecial: g.SkipSpecialTokens == nil || *g.SkipSpecialTokens,
		Priority:    g.Priority,
	}
	return p, nil
}

// samplingParams fills sample.Params with OpenAI's defaults (temperature
// and top_p 1) and a random seed when none is given. The request's ranges
// are openai.CheckRanges' to check; sample.Params.Validate stays as the
// engine's own guard.
func samplingParams(g *openai.GenerationParams, spec genSpec) (sample.Params, *openai.Error) {
	sp := sample.Params{Temperature: 1, TopP: 1, Logprobs: spec.logprobs}
	if g.Temperature != nil {
		sp.Temperature = *g.Temperature
	}
	if g.TopP != nil {
		sp.TopP = *g.TopP
	}
	if g.TopK != nil {
		sp.TopK = *g.TopK
	}
	if sp.TopP == 0 {
		// OpenAI takes top_p 0: the smallest set of tokens holding a mass
		// of 0 is the most likely token alone, which is top-k 1.
		sp.TopP, sp.TopK = 1, 1
	}
	if g.MinP != nil {
		sp.MinP = *g.MinP
	}
	if g.PresencePenalty != nil {
		sp.PresencePenalty = *g.PresencePenalty
	}
	if g.FrequencyPenalty != nil {
		sp.FrequencyPenalty = *g.FrequencyPenalty
	}
	if g.RepetitionPenalty != nil {
		sp.RepetitionPenalty = *g.RepetitionPenalty
	}
	if g.Seed != nil {
		sp.Seed = uint64(*g.Seed)
	} else {
		sp.Seed = rand.Uint64()
	}
	if err := sp.Validate(); err != nil {
		var fe *sample.FieldError
		if errors.As(err, &fe) {
			field := fe.Field
			if field == "logprobs" {
				field = spec.logprobsParam
			}
			return sp, openai.InvalidRequest(field, "%s %s", field, fe.Reason)
		}
		return sp, openai.InvalidRequest("", "%v", err)
	}
	return sp, nil
}

// submitError maps an Engine.Submit refusal to an API error.
func submitError(err error) *openai.Error {
	var fe *sample.FieldError
	switch {
	case errors.Is(err, core.ErrDraining):
		return openai.Unavailable("the engine is draining and admits no new requests")
	case errors.Is(err, core.ErrNoPromptLogprobs):
		// Only an echo with logprobs asks for them.
		return openai.Unsupported("echo", "echo with logprobs is not supported here: %v", err)
	case errors.As(err, &fe):
		return openai.InvalidRequest(fe.Field, "%s", fe.Error())
	case errors.Is(err, sched.ErrTooLong):
		return openai.InvalidRequest("max_tokens", "%v", err)
	case errors.Is(err, core.ErrUnknownAdapter):
		return unknownAdapter(err) // unloaded since the request was admitted
	}
	return openai.ServerError("submit request: %v", err)
}
