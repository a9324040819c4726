package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/internal/openai"
)

// errorCase is one request that must be refused.
type errorCase struct {
	name, method, path, body string
	status                   int
	param                    string // "" means null
	code                     string // checked when set
	message                  string // a substring of the message
}

func checkErrorCases(t *testing.T, f *fixture, cases []errorCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			status, b := f.do(t, method, tc.path, tc.body)
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, b)
			}
			var body openai.ErrorBody
			if err := json.Unmarshal(b, &body); err != nil {
				t.Fatalf("error body %s: %v", b, err)
			}
			e := body.Error
			param := ""
			if e.Param != nil {
				param = *e.Param
			}
			if param != tc.param || e.Type == "" || !strings.Contains(e.Message, tc.message) {
				t.Fatalf("error %s: want param %q and message containing %q", b, tc.param, tc.message)
			}
			if tc.code != "" && (e.Code == nil || *e.Code != tc.code) {
				t.Fatalf("error %s: want code %q", b, tc.code)
			}
		})
	}
}

func TestBadInput(t *testing.T) {
	f := newModelFixture(t, true, Options{MaxBodyBytes: testMaxBody})
	long := make([]int, testCtx+10)
	for i := range long {
		long[i] = i % 100
	}
	full := long[:testCtx]
	cmpl, chat := "/v1/completions", "/v1/chat/completions"
	user := `"messages":[{"role":"user","content":"hi"}]`
	cases := []errorCase{
		{name: "invalid JSON", path: cmpl, body: `{"prompt": "hi",`, status: 400, message: "invalid JSON"},
		{name: "not an object", path: cmpl, body: `[1,2]`, status: 400, message: "JSON object"},
		{name: "wrong type", path: cmpl, body: `{"prompt":"hi","max_tokens":"ten"}`, status: 400, param: "max_tokens", message: "max_tokens"},
		{name: "bad prompt shape", path: cmpl, body: `{"prompt":{"a":1}}`, status: 400, param: "prompt", message: "prompt must be"},
		{name: "no prompt", path: cmpl, body: `{"max_tokens":3}`, status: 400, param: "prompt", message: "prompt is required"},
		{name: "two prompts", path: cmpl, body: `{"prompt":["a","b"]}`, status: 400, param: "prompt", message: "2 prompts"},
		{name: "unknown model", path: cmpl, body: `{"model":"gpt-9","prompt":"hi"}`, status: 404, param: "model", code: "model_not_found", message: "gpt-9"},
		{name: "unknown model chat", path: chat, body: `{"model":"gpt-9",` + user + `}`, status: 404, param: "model", code: "model_not_found", message: "gpt-9"},
		{name: "prompt past context", path: cmpl, body: jsonBody(map[string]any{"prompt": long}), status: 400, param: "prompt", message: "too long"},
		{name: "prompt fills context", path: cmpl, body: jsonBody(map[string]any{"prompt": full}), status: 400, param: "prompt", message: "context is 256"},
		{name: "max_tokens zero", path: cmpl, body: `{"prompt":"hi","max_tokens":0}`, status: 400, param: "max_tokens", message: "at least 1 (0 only with echo)"},
		{name: "max_tokens zero, echo false", path: cmpl, body: `{"prompt":"hi","max_tokens":0,"echo":false}`, status: 400, param: "max_tokens", message: "0 only with echo"},
		{name: "max_tokens past context", path: cmpl, body: `{"prompt":"hi","max_tokens":1000}`, status: 400, param: "max_tokens", message: "context of 256"},
		{name: "max_completion_tokens zero", path: chat, body: `{` + user + `,"max_completion_tokens":0}`, status: 400, param: "max_completion_tokens", message: "at least 1"},
		{name: "chat max_tokens past context", path: chat, body: `{` + user + `,"max_tokens":100000}`, status: 400, param: "max_tokens", message: "too large"},
		{name: "n", path: cmpl, body: `{"prompt":"hi","n":2}`, status: 400, param: "n", message: "n must be 1"},
		{name: "n zero", path: chat, body: `{` + user + `,"n":0}`, status: 400, param: "n", message: "at least 1"},
		{name: "best_of", path: cmpl, body: `{"prompt":"hi","best_of":3}`, status: 400, param: "best_of", message: "best_of"},
		{name: "temperature", path: cmpl, body: `{"prompt":"hi","temperature":-1}`, status: 400, param: "temperature", message: "temperature must be"},
		{name: "top_p", path: chat, body: `{` + user + `,"top_p":1.5}`, status: 400, param: "top_p", message: "top_p must be"},
		{name: "top_k", path: cmpl, body: `{"prompt":"hi","top_k":-3}`, status: 400, param: "top_k", message: "top_k"},
		{name: "min_p", path: cmpl, body: `{"prompt":"hi","min_p":2}`, status: 400, param: "min_p", message: "min_p"},
		{name: "presence_penalty", path: cmpl, body: `{"prompt":"hi","presence_penalty":3}`, status: 400, param: "presence_penalty", message: "presence_penalty"},
		{name: "frequency_penalty", path: chat, body: `{` + user + `,"frequency_penalty":-2.5}`, status: 400, param: "frequency_penalty", message: "frequency_penalty"},
		{name: "repetition_penalty", path: cmpl, body: `{"prompt":"hi","repetition_penalty":-1}`, status: 400, param: "repetition_penalty", message: "repetition_penalty"},
		{name: "logprobs", path: cmpl, body: `{"prompt":"hi","logprobs":21}`, status: 400, param: "logprobs", message: "logprobs"},
		{name: "logprobs past OpenAI's 5", path: cmpl, body: `{"prompt":"hi","logprobs":6}`, status: 400, param: "logprobs", message: "logprobs must be in [0, 5]"},
		{name: "temperature past OpenAI's 2", path: cmpl, body: `{"prompt":"hi","temperature":2.5}`, status: 400, param: "temperature", message: "temperature must be in [0, 2]"},
		{name: "temperature 100", path: chat, body: `{` + user + `,"temperature":100}`, status: 400, param: "temperature", message: "temperature must be in [0, 2]"},
		{name: "top_p negative", path: cmpl, body: `{"prompt":"hi","top_p":-0.1}`, status: 400, param: "top_p", message: "top_p must be in [0, 1]"},
		{name: "max_tokens negative", path: cmpl, body: `{"prompt":"hi","max_tokens":-1}`, status: 400, param: "max_tokens", message: "at least 1"},
		{name: "top_logprobs past 20", path: chat, body: `{` + user + `,"logprobs":true,"top_logprobs":21}`, status: 400, param: "top_logprobs", message: "top_logprobs must be in [0, 20]"},
		{name: "top_logprobs", path: chat, body: `{` + user + `,"logprobs":true,"top_logprobs":50}`, status: 400, param: "top_logprobs", message: "top_logprobs"},
		{name: "top_logprobs alone", path: chat, body: `{` + user + `,"top_logprobs":2}`, status: 400, param: "top_logprobs", message: "logprobs set to true"},
		{name: "token out of vocabulary", path: cmpl, body: `{"prompt":[1,2,9999]}`, status: 400, param: "prompt", message: "prompt[2] = 9999"},
		{name: "negative token", path: cmpl, body: `{"prompt":[-4]}`, status: 400, param: "prompt", message: "-4"},
		{name: "token past int32", path: cmpl, body: `{"prompt":[1,99999999999]}`, status: 400, param: "prompt", message: "token ids"},
		{name: "empty prompt array", path: cmpl, body: `{"prompt":[]}`, status: 400, param: "prompt", message: "empty"},
		{name: "empty stop", path: cmpl, body: `{"prompt":"hi","stop":["x",""]}`, status: 400, param: "stop", message: "stop[1]"},
		{name: "stop wrong type", path: cmpl, body: `{"prompt":"hi","stop":7}`, status: 400, param: "stop", message: "stop must be"},
		{name: "stop_token_ids", path: cmpl, body: `{"prompt":"hi","stop_token_ids":[600]}`, status: 400, param: "stop_token_ids", message: "600"},
		{name: "stream_options without stream", path: cmpl, body: `{"prompt":"hi","stream_options":{"include_usage":true}}`, status: 400, param: "stream_options", message: "stream"},
		{name: "logit_bias", path: cmpl, body: `{"prompt":"hi","logit_bias":{"5":1}}`, status: 400, param: "logit_bias", message: "logit_bias"},
		{name: "echo max_tokens negative", path: cmpl, body: `{"prompt":"hi","echo":true,"max_tokens":-1}`, status: 400, param: "max_tokens", message: "at least 0"},
		{name: "echo prompt past context", path: cmpl, body: jsonBody(map[string]any{"prompt": long, "echo": true, "max_tokens": 0}), status: 400, param: "prompt", message: "too long"},
		{name: "echo prompt filling context, generating", path: cmpl, body: jsonBody(map[string]any{"prompt": full, "echo": true, "max_tokens": 1}), status: 400, param: "prompt", message: "at least one generated token"},
		{name: "echo with suffix", path: cmpl, body: `{"prompt":"hi","echo":true,"suffix":"x"}`, status: 400, param: "suffix", message: "suffix"},
		{name: "echo on chat", path: chat, body: `{` + user + `,"echo":true}`, status: 400, param: "echo", code: "unsupported_parameter", message: "/v1/completions"},
		{name: "no messages", path: chat, body: `{"messages":[]}`, status: 400, param: "messages", message: "at least one"},
		{name: "content type", path: chat, body: `{"messages":[{"role":"user","content":5}]}`, status: 400, param: "messages.content", message: "content"},
		{name: "image part", path: chat, body: `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, status: 400, param: "messages[0].content", message: "image_url"},
		{name: "no role", path: chat, body: `{"messages":[{"content":"hi"}]}`, status: 400, param: "messages[0].role", message: "role"},
		{name: "unknown role", path: chat, body: `{"messages":[{"role":"system","content":"a"},{"role":"user","content":"b"},{"role":"wizard","content":"c"}]}`,
			status: 400, param: "messages[2].role", code: "invalid_value", message: `"wizard"`},
		{name: "unknown role tokenized", path: "/tokenize", body: `{"messages":[{"role":"wizard","content":"c"}]}`,
			status: 400, param: "messages[0].role", code: "invalid_value", message: `"wizard"`},
		{name: "template exception", path: chat, body: `{"messages":[{"role":"tool","content":"42"}]}`, status: 400, param: "messages", message: "tool messages are not supported"},
		{name: "tools", path: chat, body: `{` + user + `,"tools":[{"type":"function"}]}`, status: 400, param: "tools", message: "tools"},
		{name: "body too large", path: cmpl, body: `{"prompt":"` + strings.Repeat("a", testMaxBody) + `"}`, status: 413, message: "limit"},
		{name: "detokenize out of vocabulary", path: "/detokenize", body: `{"tokens":[1,512]}`, status: 400, param: "tokens", message: "512"},
		{name: "tokenize nothing", path: "/tokenize", body: `{}`, status: 400, param: "prompt", message: "required"},
		{name: "load while loaded", path: "/admin/load", body: `{"path":"other"}`, status: 409, message: "already loaded"},
		{name: "load both a path and a source", path: "/admin/load", body: `{"path":"other","source":"file:///b","model":"m"}`, status: 400, param: "path", message: "not both"},
		{name: "load a source without model", path: "/admin/load", body: `{"source":"s3://models"}`, status: 400, param: "model", message: "model is required"},
		{name: "wake while ready", path: "/admin/wake", status: 409, message: "ready"},
		{name: "unknown route", method: http.MethodGet, path: "/v2/nothing", status: 404, message: "no route"},
		{name: "wrong method", method: http.MethodGet, path: cmpl, status: 405, code: "method_not_allowed", message: "not allowed"},
		{name: "wrong method chat", method: http.MethodGet, path: chat, status: 405, code: "method_not_allowed", message: "not allowed"},
	}
	checkErrorCases(t, f, cases)
	// Nothing above reached the engine.
	if st := f.state(t); st.State != engineapi.StateReady || st.Running+st.Waiting != 0 {
		t.Fatalf("state after bad input: %+v", st)
	}
	if status, b := f.do(t, http.MethodPost, cmpl, `{"prompt":"hi","max_tokens":2}`); status != http.StatusOK {
		t.Fatalf("good request after bad ones: %d %s", status, b)
	}
}

// TestRangeEdges checks that the edges of OpenAI's ranges are served, and
// that top_p 0 (which OpenAI takes) keeps only the most likely token, so
// it answers what greedy decoding does.
func TestRangeEdges(t *testing.T) {
	f := newModelFixture(t, true, Options{})
	var greedy openai.CompletionResponse
	f.postJSON(t, "/v1/completions", `{"prompt":"Once","max_tokens":6,"temperature":0,"ignore_eos":true}`, &greedy)
	for _, body := range []string{
		`{"prompt":"Once","max_tokens":6,"top_p":0,"temperature":2,"ignore_eos":true,"seed":1}`,
		`{"prompt":"Once","max_tokens":6,"top_p":0,"temperature":1,"ignore_eos":true,"seed":2,"presence_penalty":0,"frequency_penalty":0,"logprobs":5}`,
	} {
		var resp openai.CompletionResponse
		f.postJSON(t, "/v1/completions", body, &resp)
		if resp.Choices[0].Text != greedy.Choices[0].Text {
			t.Fatalf("%s: %q, want the greedy %q", body, resp.Choices[0].Text, greedy.Choices[0].Text)
		}
	}
	var chat openai.ChatCompletionResponse
	f.postJSON(t, "/v1/chat/completions", `{"messages":[{"role":"developer","content":"a"},{"role":"user","content":"b"}],"max_tokens":2,`+
		`"temperature":2,"top_p":1,"presence_penalty":-2,"frequency_penalty":2,"logprobs":true,"top_logprobs":20}`, &chat)
	if lp := chat.Choices[0].Logprobs; lp == nil || len(lp.Content) == 0 || len(lp.Content[0].TopLogprobs) != 20 {
		t.Fatalf("chat at the edges: %+v", chat.Choices[0])
	}
}

func TestNoTokenizer(t *testing.T) {
	f := newModelFixture(t, false, Options{})
	checkErrorCases(t, f, []errorCase{
		{name: "text prompt", path: "/v1/completions", body: `{"prompt":"hi"}`, status: 400, param: "prompt", message: "no tokenizer"},
		{name: "chat", path: "/v1/chat/completions", body: `{"messages":[{"role":"user","content":"hi"}]}`, status: 400, param: "messages", message: "no tokenizer"},
		{name: "token out of vocabulary", path: "/v1/completions", body: `{"prompt":[700]}`, status: 400, param: "prompt", message: "700"},
	})
	var resp openai.CompletionResponse
	f.postJSON(t, "/v1/completions", `{"prompt":[5,6,7],"max_tokens":4,"temperature":0,"ignore_eos":true,"logprobs":1}`, &resp)
	lp := resp.Choices[0].Logprobs
	if resp.Usage.CompletionTokens != 4 || lp == nil || len(lp.Tokens) != 4 || !strings.HasPrefix(lp.Tokens[0], "token_id:") {
		t.Fatalf("token-id completion without tokenizer: %+v", resp)
	}
}
