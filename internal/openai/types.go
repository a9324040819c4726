package openai

import "encoding/json"

// Object names used in responses.
const (
	ObjectTextCompletion = "text_completion"
	ObjectChatCompletion = "chat.completion"
	ObjectChatChunk      = "chat.completion.chunk"
	ObjectList           = "list"
	ObjectModel          = "model"
)

// StreamOptions is "stream_options".
type StreamOptions struct {
	// IncludeUsage asks for a last chunk, before [DONE], whose usage is
	// set and whose choices are empty.
	IncludeUsage bool `json:"include_usage"`
}

// GenerationParams are the fields completions and chat requests share,
// OpenAI's and vLLM's extras alike. Pointers tell an absent field from a
// zero.
type GenerationParams struct {
	Model       string   `json:"model"`
	MaxTokens   *int     `json:"max_tokens,omitempty"`
	Temperature *float64 `json:"temperature,omitempty"`
	TopP        *float64 `json:"top_p,omitempty"`
	N           *int     `json:"n,omitempty"`
	// BestOf is accepted only as 1 (or absent).
	BestOf           *int               `json:"best_of,omitempty"`
	Stream           bool               `json:"stream,omitempty"`
	StreamOptions    *StreamOptions     `json:"stream_options,omitempty"`
	Stop             StringList         `json:"stop,omitempty"`
	Seed             *int64             `json:"seed,omitempty"`
	PresencePenalty  *float64           `json:"presence_penalty,omitempty"`
	FrequencyPenalty *float64           `json:"frequency_penalty,omitempty"`
	LogitBias        map[string]float64 `json:"logit_bias,omitempty"`
	User             string             `json:"user,omitempty"`

	// vLLM extensions.
	TopK              *int     `json:"top_k,omitempty"`
	MinP              *float64 `json:"min_p,omitempty"`
	RepetitionPenalty *float64 `json:"repetition_penalty,omitempty"`
	IgnoreEOS         bool     `json:"ignore_eos,omitempty"`
	// Priority orders waiting requests, higher first.
	Priority          int     `json:"priority,omitempty"`
	SkipSpecialTokens *bool   `json:"skip_special_tokens,omitempty"`
	StopTokenIDs      []int32 `json:"stop_token_ids,omitempty"`
}

// IncludeUsage reports whether a streamed response ends with a usage chunk.
func (g *GenerationParams) IncludeUsage() bool {
	return g.StreamOptions != nil && g.StreamOptions.IncludeUsage
}

// CheckSupported returns a 400 for a shared field out of its range
// (CheckRanges) or one stoke does not implement: n or best_of above 1,
// logit_bias.
func (g *GenerationParams) CheckSupported() *Error {
	if err := g.CheckRanges(); err != nil {
		return err
	}
	return g.checkUnsupported()
}

// checkUnsupported refuses the shared fields stoke does not implement.
func (g *GenerationParams) checkUnsupported() *Error {
	switch {
	case g.N != nil && *g.N > 1:
		return Unsupported("n", "n must be 1: several choices per request are not supported yet, got %d", *g.N)
	case g.BestOf != nil && *g.BestOf != 1:
		return Unsupported("best_of", "best_of is not supported (only 1), got %d", *g.BestOf)
	case len(g.LogitBias) > 0:
		return Unsupported("logit_bias", "logit_bias is not supported")
	case g.StreamOptions != nil && !g.Stream:
		return InvalidRequest("stream_options", "stream_options is only allowed when stream is true")
	}
	return nil
}

// CompletionRequest is the body of POST /v1/completions.
type CompletionRequest struct {
	GenerationParams
	Prompt Prompt `json:"prompt"`
	// Logprobs asks for this many alternatives per token
	// (0..MaxCompletionLogprobs).
	Logprobs *int `json:"logprobs,omitempty"`
	// Echo starts the choice's text with the prompt and, with Logprobs,
	// its logprobs with the prompt's tokens (the first one's null), as
	// OpenAI's legacy completions do; max_tokens may then be 0, which
	// scores the prompt and generates nothing.
	Echo   bool   `json:"echo,omitempty"`
	Suffix string `json:"suffix,omitempty"`
}

// CheckSupported extends GenerationParams.CheckSupported with the
// completions-only fields (their ranges included) and one prompt.
func (r *CompletionRequest) CheckSupported() *Error {
	if err := r.CheckRanges(); err != nil {
		return err
	}
	if err := r.GenerationParams.checkUnsupported(); err != nil {
		return err
	}
	switch {
	case r.Prompt.Len() == 0:
		return InvalidRequest("prompt", "prompt is required")
	case r.Prompt.Len() > 1:
		return Unsupported("prompt", "prompt must hold one prompt: batches of %d prompts are not supported yet", r.Prompt.Len())
	case r.Suffix != "":
		return Unsupported("suffix", "suffix is not supported")
	}
	return nil
}

// ChatMessage is one message of a chat request.
type ChatMessage struct {
	Role    string  `json:"role"`
	Content Content `json:"content"`
	Name    string  `json:"name,omitempty"`
}

// ChatCompletionRequest is the body of POST /v1/chat/completions.
type ChatCompletionRequest struct {
	GenerationParams
	Messages []ChatMessage `json:"messages"`
	// MaxCompletionTokens is the newer name of max_tokens; it wins when
	// both are given.
	MaxCompletionTokens *int `json:"max_completion_tokens,omitempty"`
	Logprobs            bool `json:"logprobs,omitempty"`
	TopLogprobs         *int `json:"top_logprobs,omitempty"`
	// AddGenerationPrompt (vLLM) ends the prompt with the assistant header;
	// absent means true.
	AddGenerationPrompt *bool           `json:"add_generation_prompt,omitempty"`
	Tools               json.RawMessage `json:"tools,omitempty"`
	ResponseFormat      *ResponseFormat `json:"response_format,omitempty"`
	// Echo is refused when true: only /v1/completions echoes its prompt
	// (the field is read so that it is not silently ignored).
	Echo bool `json:"echo,omitempty"`
}

// ResponseFormat is "response_format"; only {"type":"text"} is served.
type ResponseFormat struct {
	Type string `json:"type"`
}

// MaxNewTokens is max_completion_tokens, else max_tokens, else nil.
func (r *ChatCompletionRequest) MaxNewTokens() (*int, string) {
	if r.MaxCompletionTokens != nil {
		return r.MaxCompletionTokens, "max_completion_tokens"
	}
	return r.MaxTokens, "max_tokens"
}

// CheckSupported extends GenerationParams.CheckSupported with the chat
// fields (their ranges included) and the messages (CheckMessages).
func (r *ChatCompletionRequest) CheckSupported() *Error {
	if err := r.CheckRanges(); err != nil {
		return err
	}
	if err := r.GenerationParams.checkUnsupported(); err != nil {
		return err
	}
	switch {
	case len(r.Messages) == 0:
		return InvalidRequest("messages", "messages must hold at least one message")
	case r.TopLogprobs != nil && !r.Logprobs:
		return InvalidRequest("top_logprobs", "top_logprobs needs logprobs set to true")
	case r.Echo:
		return Unsupported("echo", "echo is not supported by chat completions: use /v1/completions with echo to have the prompt (and its logprobs) returned")
	case len(r.Tools) > 0 && string(r.Tools) != "null" && string(r.Tools) != "[]":
		return Unsupported("tools", "tools are not supported")
	case r.ResponseFormat != nil && r.ResponseFormat.Type != "" && r.ResponseFormat.Type != "text":
		return Unsupported("response_format", "response_format %q is not supported (only \"text\")", r.ResponseFormat.Type)
	}
	return CheckMessages(r.Messages)
}

// Usage counts a request's tokens.
type Usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// PromptTokensDetails says how many prompt tokens the prefix cache supplied.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// NewUsage fills a Usage, total included.
func NewUsage(prompt, completion, cached int) *Usage {
	return &Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion,
		PromptTokensDetails: &PromptTokensDetails{CachedTokens: cached}}
}

// CompletionLogprobs is the completions "logprobs" object: parallel arrays
// per token of the choice's text, the prompt's first when it is echoed.
// The echoed prompt's first token has no logprob: its TokenLogprobs entry
// is nil and its TopLogprobs entry a nil map, both JSON null.
type CompletionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []*float64           `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	// TextOffset is each token's byte offset in the choice's text.
	TextOffset []int `json:"text_offset"`
}

// CompletionChoice is one choice of a completion or of a streamed chunk.
type CompletionChoice struct {
	Index    int                 `json:"index"`
	Text     string              `json:"text"`
	Logprobs *CompletionLogprobs `json:"logprobs"`
	// FinishReason is "stop" or "length"; null in chunks before the last.
	FinishReason *string `json:"finish_reason"`
}

// CompletionResponse is a /v1/completions response and, streamed, each
// chunk (same object name, as OpenAI sends).
type CompletionResponse struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []CompletionChoice `json:"choices"`
	Usage   *Usage             `json:"usage,omitempty"`
}

// TopLogprob is one alternative in a chat logprobs entry.
type TopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// TokenLogprob is one generated token in a chat logprobs list.
type TokenLogprob struct {
	Token       string       `json:"token"`
	Logprob     float64      `json:"logprob"`
	Bytes       []int        `json:"bytes"`
	TopLogprobs []TopLogprob `json:"top_logprobs"`
}

// ChatLogprobs is the chat "logprobs" object.
type ChatLogprobs struct {
	Content []TokenLogprob `json:"content"`
}

// ResponseMessage is the assistant message of a chat completion.
type ResponseMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ChatChoice is one choice of a chat completion.
type ChatChoice struct {
	Index        int             `json:"index"`
	Message      ResponseMessage `json:"message"`
	Logprobs     *ChatLogprobs   `json:"logprobs"`
	FinishReason string          `json:"finish_reason"`
}

// ChatCompletionResponse is a non-streamed /v1/chat/completions response.
type ChatCompletionResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []ChatChoice `json:"choices"`
	Usage   *Usage       `json:"usage,omitempty"`
}

// ChatDelta is what a chunk adds to the message.
type ChatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// ChatChunkChoice is one choice of a streamed chat chunk.
type ChatChunkChoice struct {
	Index        int           `json:"index"`
	Delta        ChatDelta     `json:"delta"`
	Logprobs     *ChatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

// ChatCompletionChunk is one streamed chat event.
type ChatCompletionChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []ChatChunkChoice `json:"choices"`
	Usage   *Usage            `json:"usage,omitempty"`
}

// Model is one entry of /v1/models.
type Model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// MaxModelLen is vLLM's extension: the context length.
	MaxModelLen int `json:"max_model_len,omitempty"`
	// Parent is vLLM's extension for a LoRA adapter: the base model it
	// applies to.
	Parent string `json:"parent,omitempty"`
}

// ModelList is the /v1/models response.
type ModelList struct {
	Object string  `json:"object"`
	Data   []Model `json:"data"`
}

// TokenizeRequest is vLLM's POST /tokenize body: a prompt or chat messages.
type TokenizeRequest struct {
	Model    string        `json:"model,omitempty"`
	Prompt   *string       `json:"prompt,omitempty"`
	Messages []ChatMessage `json:"messages,omitempty"`
	// AddSpecialTokens (default true for a prompt, false for messages)
	// adds BOS and the like.
	AddSpecialTokens    *bool `json:"add_special_tokens,omitempty"`
	AddGenerationPrompt *bool `json:"add_generation_prompt,omitempty"`
}

// TokenizeResponse is the /tokenize answer.
type TokenizeResponse struct {
	Tokens      []int32 `json:"tokens"`
	Count       int     `json:"count"`
	MaxModelLen int     `json:"max_model_len"`
}

// DetokenizeRequest is vLLM's POST /detokenize body.
type DetokenizeRequest struct {
	Model  string  `json:"model,omitempty"`
	Tokens []int32 `json:"tokens"`
}

// DetokenizeResponse is the /detokenize answer.
type DetokenizeResponse struct {
	Prompt string `json:"prompt"`
}
