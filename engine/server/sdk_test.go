package server

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func sdkClient(f *fixture) openai.Client {
	return openai.NewClient(option.WithBaseURL(f.ts.URL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0),
		option.WithHTTPClient(f.ts.Client()))
}

func TestSDKCompletion(t *testing.T) {
	f := newModelFixture(t, true, Options{})
	client := sdkClient(f)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	params := openai.CompletionNewParams{
		Model:       testModel,
		Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
		MaxTokens:   openai.Int(12),
		Temperature: openai.Float(0),
	}
	ignoreEOS := option.WithJSONSet("ignore_eos", true)
	resp, err := client.Completions.New(ctx, params, ignoreEOS)
	if err != nil {
		t.Fatal(err)
	}
	prompt := f.loader.tok.Encode("Once upon a time", true)
	if len(resp.Choices) != 1 || resp.Choices[0].FinishReason != "length" || resp.Model != testModel || !strings.HasPrefix(resp.ID, "cmpl-") {
		t.Fatalf("completion: %+v", resp)
	}
	if u := resp.Usage; u.CompletionTokens != 12 || u.PromptTokens != int64(len(prompt)) || u.TotalTokens != u.PromptTokens+12 {
		t.Fatalf("usage %+v, prompt of %d tokens", u, len(prompt))
	}

	// The same request streamed gives the same text, then a usage chunk.
	params.StreamOptions.IncludeUsage = openai.Bool(true)
	stream := client.Completions.NewStreaming(ctx, params, ignoreEOS)
	var text strings.Builder
	var usageChunks, finishes int
	for stream.Next() {
		ch := stream.Current()
		if len(ch.Choices) == 0 {
			usageChunks++
			if ch.Usage.CompletionTokens != 12 || ch.Usage.PromptTokens != int64(len(prompt)) {
				t.Fatalf("streamed usage %+v", ch.Usage)
			}
			continue
		}
		text.WriteString(ch.Choices[0].Text)
		if ch.Choices[0].FinishReason != "" {
			finishes++
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != resp.Choices[0].Text || usageChunks != 1 || finishes != 1 {
		t.Fatalf("streamed %q (%d usage chunks, %d finishes), want %q", text.String(), usageChunks, finishes, resp.Choices[0].Text)
	}
}

func TestSDKChat(t *testing.T) {
	f := newModelFixture(t, true, Options{})
	client := sdkClient(f)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	params := openai.ChatCompletionNewParams{
		Model:               testModel,
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("Tell me a story.")},
		MaxCompletionTokens: openai.Int(10),
		Temperature:         openai.Float(0),
	}
	ignoreEOS := option.WithJSONSet("ignore_eos", true)
	resp, err := client.Chat.Completions.New(ctx, params, ignoreEOS)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Choices) != 1 || resp.Choices[0].Message.Role != "assistant" || resp.Choices[0].FinishReason != "length" ||
		!strings.HasPrefix(resp.ID, "chatcmpl-") || resp.Usage.CompletionTokens != 10 {
		t.Fatalf("chat completion: %+v", resp)
	}
	// The prompt is the chat template's rendering, as /tokenize reports it.
	var tk struct{ Count int }
	f.postJSON(t, "/tokenize", `{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Tell me a story."}]}`, &tk)
	if resp.Usage.PromptTokens != int64(tk.Count) {
		t.Fatalf("chat prompt has %d tokens, /tokenize says %d", resp.Usage.PromptTokens, tk.Count)
	}

	params.StreamOptions.IncludeUsage = openai.Bool(true)
	stream := client.Chat.Completions.NewStreaming(ctx, params, ignoreEOS)
	acc := openai.ChatCompletionAccumulator{}
	var text strings.Builder
	var usageChunks int
	var finish string
	for stream.Next() {
		ch := stream.Current()
		acc.AddChunk(ch)
		if len(ch.Choices) == 0 {
			usageChunks++
			if ch.Usage.CompletionTokens != 10 || ch.Usage.PromptTokens != resp.Usage.PromptTokens {
				t.Fatalf("streamed usage %+v", ch.Usage)
			}
			continue
		}
		text.WriteString(ch.Choices[0].Delta.Content)
		if ch.Choices[0].FinishReason != "" {
			finish = ch.Choices[0].FinishReason
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != resp.Choices[0].Message.Content || usageChunks != 1 || finish != "length" {
		t.Fatalf("streamed %q (%d usage chunks, finish %q), want %q", text.String(), usageChunks, finish, resp.Choices[0].Message.Content)
	}
	if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != resp.Choices[0].Message.Content {
		t.Fatalf("SDK accumulator: %+v", acc.Choices)
	}
}

func TestSimServesReadableText(t *testing.T) {
	f := newFixture(t, simLoader(t), "llama-3.1-8b-fp8-h100", Options{})
	client := sdkClient(f)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ask := func() string {
		resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:     "nvidia/Llama-3.1-8B-Instruct-FP8",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say something.")},
			MaxTokens: openai.Int(40),
			Seed:      openai.Int(7),
		})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Usage.CompletionTokens != 40 || resp.Choices[0].FinishReason != "length" {
			t.Fatalf("sim chat: %+v", resp)
		}
		return resp.Choices[0].Message.Content
	}
	text := ask()
	words := regexp.MustCompile(`[A-Za-z]{2,}`).FindAllString(text, -1)
	if !utf8.ValidString(text) || len(words) < 5 {
		t.Fatalf("sim text is not readable words: %q", text)
	}
	if again := ask(); again != text {
		t.Fatalf("same seed, different sim text: %q vs %q", text, again)
	}
}
