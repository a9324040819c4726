package openai

import (
	"fmt"
	"slices"
	"strings"
)

// The ranges of the request fields: OpenAI's documented ones, and vLLM's
// for its extensions. This file is the one place they live: the
// CheckSupported methods of both /v1/completions and /v1/chat/completions
// requests check them, and every refusal is a 400 naming its field.
const (
	MinTemperature = 0.0
	MaxTemperature = 2.0
	// MinTopP is 0 as OpenAI documents it: nucleus sampling over a mass
	// of 0 keeps only the most likely token.
	MinTopP = 0.0
	MaxTopP = 1.0
	// MinPenalty and MaxPenalty bound presence_penalty and
	// frequency_penalty.
	MinPenalty = -2.0
	MaxPenalty = 2.0
	// MaxCompletionLogprobs bounds the completions "logprobs".
	MaxCompletionLogprobs = 5
	// MaxTopLogprobs bounds the chat "top_logprobs".
	MaxTopLogprobs = 20
)

// floatIn refuses *v outside [lo, hi]; nil (absent) passes.
func floatIn(param string, v *float64, lo, hi float64) *Error {
	if v == nil || (*v >= lo && *v <= hi) {
		return nil
	}
	return InvalidRequest(param, "%s must be in [%v, %v], got %v", param, lo, hi, *v)
}

// floatAtLeast refuses *v below lo; nil (absent) passes.
func floatAtLeast(param string, v *float64, lo float64, why string) *Error {
	if v == nil || *v >= lo {
		return nil
	}
	return InvalidRequest(param, "%s must be at least %v%s, got %v", param, lo, why, *v)
}

// intIn refuses *v outside [lo, hi]; nil (absent) passes.
func intIn(param string, v *int, lo, hi int) *Error {
	if v == nil || (*v >= lo && *v <= hi) {
		return nil
	}
	return InvalidRequest(param, "%s must be in [%d, %d], got %d", param, lo, hi, *v)
}

// intAtLeast refuses *v below lo; nil (absent) passes.
func intAtLeast(param string, v *int, lo int, why string) *Error {
	if v == nil || *v >= lo {
		return nil
	}
	return InvalidRequest(param, "%s must be at least %d%s, got %d", param, lo, why, *v)
}

// first returns the first refusal of checks, or nil.
func first(checks ...*Error) *Error {
	for _, e := range checks {
		if e != nil {
			return e
		}
	}
	return nil
}

// CheckRanges refuses the first field the two generation endpoints share
// that is outside its range.
func (g *GenerationParams) CheckRanges() *Error {
	return g.checkRanges(intAtLeast("max_tokens", g.MaxTokens, 1, ""))
}

// checkRanges is CheckRanges with maxTokens, the endpoint's own check of
// max_tokens, first.
func (g *GenerationParams) checkRanges(maxTokens *Error) *Error {
	return first(
		maxTokens,
		floatIn("temperature", g.Temperature, MinTemperature, MaxTemperature),
		floatIn("top_p", g.TopP, MinTopP, MaxTopP),
		intAtLeast("n", g.N, 1, ""),
		floatIn("presence_penalty", g.PresencePenalty, MinPenalty, MaxPenalty),
		floatIn("frequency_penalty", g.FrequencyPenalty, MinPenalty, MaxPenalty),
		// vLLM's extensions.
		intAtLeast("top_k", g.TopK, -1, " (0 or -1 keeps every token)"),
		floatIn("min_p", g.MinP, 0, 1),
		floatAtLeast("repetition_penalty", g.RepetitionPenalty, 0, " (0 or 1 turns it off)"),
	)
}

// CheckRanges extends GenerationParams.CheckRanges with logprobs (0..5)
// and lets max_tokens be 0 with echo (the prompt alone, scored).
func (r *CompletionRequest) CheckRanges() *Error {
	maxTokens := intAtLeast("max_tokens", r.MaxTokens, 1, " (0 only with echo)")
	if r.Echo {
		maxTokens = intAtLeast("max_tokens", r.MaxTokens, 0, " (0 with echo returns the prompt alone)")
	}
	return first(r.GenerationParams.checkRanges(maxTokens),
		intIn("logprobs", r.Logprobs, 0, MaxCompletionLogprobs))
}

// CheckRanges extends GenerationParams.CheckRanges with
// max_completion_tokens and top_logprobs (0..20).
func (r *ChatCompletionRequest) CheckRanges() *Error {
	return first(r.GenerationParams.CheckRanges(),
		intAtLeast("max_completion_tokens", r.MaxCompletionTokens, 1, ""),
		intIn("top_logprobs", r.TopLogprobs, 0, MaxTopLogprobs))
}

// ChatRoles are the message roles OpenAI accepts. "function" is the
// deprecated predecessor of "tool"; OpenAI still takes it, so stoke does
// too.
var ChatRoles = []string{"system", "developer", "user", "assistant", "tool", "function"}

// CheckMessages refuses a message without a known role or with content
// parts other than text; the param names the message, as in
// "messages[2].role".
func CheckMessages(msgs []ChatMessage) *Error {
	for i, m := range msgs {
		if m.Role == "" {
			param := fmt.Sprintf("messages[%d].role", i)
			return InvalidRequest(param, "%s is required: one of %s", param, quoteList(ChatRoles))
		}
		if !slices.Contains(ChatRoles, m.Role) {
			param := fmt.Sprintf("messages[%d].role", i)
			e := InvalidRequest(param, "invalid value for %s: %q; supported values are %s", param, m.Role, quoteList(ChatRoles))
			e.Code = "invalid_value"
			return e
		}
		for _, p := range m.Content.Parts {
			if p.Type != "text" {
				param := fmt.Sprintf("messages[%d].content", i)
				return Unsupported(param, "%s: content parts of type %q are not supported (only \"text\")", param, p.Type)
			}
		}
	}
	return nil
}

// quoteList writes 'a', 'b' and 'c'.
func quoteList(items []string) string {
	q := make([]string, len(items))
	for i, s := range items {
		q[i] = "'" + s + "'"
	}
	if len(q) < 2 {
		return strings.Join(q, "")
	}
	return strings.Join(q[:len(q)-1], ", ") + " and " + q[len(q)-1]
}
