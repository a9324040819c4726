package openai

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

func TestPromptShapes(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Prompt
		wantErr string
	}{
		{`"hello"`, Prompt{Texts: []string{"hello"}}, ""},
		{`["a","b"]`, Prompt{Texts: []string{"a", "b"}}, ""},
		{`[1,2,3]`, Prompt{Tokens: [][]int32{{1, 2, 3}}}, ""},
		{`[[1],[2,3]]`, Prompt{Tokens: [][]int32{{1}, {2, 3}}}, ""},
		{`null`, Prompt{}, ""},
		{`[]`, Prompt{}, "empty array"},
		{`["a",1]`, Prompt{}, "mixes"},
		{`[1,"a"]`, Prompt{}, "token ids"},
		{`[1.5]`, Prompt{}, "token ids"},
		{`[4294967296]`, Prompt{}, "token ids"},
		{`{"x":1}`, Prompt{}, "must be a string"},
		{`7`, Prompt{}, "must be a string"},
	} {
		var got struct {
			Prompt Prompt `json:"prompt"`
		}
		e := Decode([]byte(`{"prompt":`+tc.in+`}`), &got)
		if tc.wantErr != "" {
			if e == nil || e.Param != "prompt" || !strings.Contains(e.Message, tc.wantErr) || e.Status != http.StatusBadRequest {
				t.Errorf("%s: error %+v, want one about prompt containing %q", tc.in, e, tc.wantErr)
			}
			continue
		}
		if e != nil || !reflect.DeepEqual(got.Prompt, tc.want) {
			t.Errorf("%s: got %+v (%v), want %+v", tc.in, got.Prompt, e, tc.want)
		}
		if tc.want.Len() > 0 {
			b, err := json.Marshal(got.Prompt)
			if err != nil || string(b) != tc.in {
				t.Errorf("%s: marshals back as %s (%v)", tc.in, b, err)
			}
		}
	}
}

func TestStopAndContent(t *testing.T) {
	for _, tc := range []struct {
		body      string
		stop      []string
		content   string
		wantParam string
	}{
		{`{"stop":"END","messages":[{"role":"user","content":"hi"}]}`, []string{"END"}, "hi", ""},
		{`{"stop":["a","b"],"messages":[{"role":"user","content":[{"type":"text","text":"x"},{"type":"text","text":"y"}]}]}`, []string{"a", "b"}, "x\ny", ""},
		{`{"stop":null,"messages":[{"role":"assistant","content":null}]}`, nil, "", ""},
		{`{"stop":[1],"messages":[]}`, nil, "", "stop"},
		{`{"messages":[{"role":"user","content":true}]}`, nil, "", "messages.content"},
		{`{"messages":"hi"}`, nil, "", "messages"},
	} {
		var r ChatCompletionRequest
		e := Decode([]byte(tc.body), &r)
		if tc.wantParam != "" {
			if e == nil || e.Param != tc.wantParam {
				t.Errorf("%s: error %+v, want param %q", tc.body, e, tc.wantParam)
			}
			continue
		}
		if e != nil || !reflect.DeepEqual([]string(r.Stop), tc.stop) || r.Messages[0].Content.Text != tc.content {
			t.Errorf("%s: stop %q content %q (%v)", tc.body, r.Stop, r.Messages[0].Content.Text, e)
		}
	}
}

func TestCheckSupported(t *testing.T) {
	two, zero, one := 2, 0, 1
	for _, tc := range []struct {
		name  string
		req   CompletionRequest
		param string
	}{
		{"ok", CompletionRequest{Prompt: Prompt{Texts: []string{"a"}}}, ""},
		{"n", CompletionRequest{GenerationParams: GenerationParams{N: &two}, Prompt: Prompt{Texts: []string{"a"}}}, "n"},
		{"n zero", CompletionRequest{GenerationParams: GenerationParams{N: &zero}, Prompt: Prompt{Texts: []string{"a"}}}, "n"},
		{"n one", CompletionRequest{GenerationParams: GenerationParams{N: &one, BestOf: &one}, Prompt: Prompt{Texts: []string{"a"}}}, ""},
		{"best_of", CompletionRequest{GenerationParams: GenerationParams{BestOf: &two}, Prompt: Prompt{Texts: []string{"a"}}}, "best_of"},
		{"no prompt", CompletionRequest{}, "prompt"},
		{"batch", CompletionRequest{Prompt: Prompt{Texts: []string{"a", "b"}}}, "prompt"},
		{"echo", CompletionRequest{Prompt: Prompt{Texts: []string{"a"}}, Echo: true}, "echo"},
	} {
		e := tc.req.CheckSupported()
		if (e == nil) != (tc.param == "") || (e != nil && (e.Param != tc.param || e.Status != http.StatusBadRequest)) {
			t.Errorf("%s: %+v, want param %q", tc.name, e, tc.param)
		}
	}
	var chat ChatCompletionRequest
	if e := Decode([]byte(`{"messages":[{"role":"user","content":"x"}],"max_tokens":5,"max_completion_tokens":7}`), &chat); e != nil {
		t.Fatal(e)
	}
	if n, param := chat.MaxNewTokens(); *n != 7 || param != "max_completion_tokens" {
		t.Fatalf("MaxNewTokens = %d, %s", *n, param)
	}
}

func TestDecodeErrors(t *testing.T) {
	for _, tc := range []struct {
		body, param, message string
	}{
		{`{"model":`, "", "invalid JSON"},
		{`{"model": 5}`, "model", "invalid type for model"},
		{`{"max_tokens": 1.5}`, "max_tokens", "max_tokens"},
		{`{"stream_options": {"include_usage": "yes"}}`, "stream_options.include_usage", "include_usage"},
		{`"text"`, "", "JSON object"},
		{``, "", "invalid JSON"},
	} {
		var r CompletionRequest
		e := Decode([]byte(tc.body), &r)
		if e == nil || e.Param != tc.param || !strings.Contains(e.Message, tc.message) || e.Type != TypeInvalidRequest {
			t.Errorf("%q: %+v, want param %q and %q", tc.body, e, tc.param, tc.message)
		}
	}
}

func TestErrorBody(t *testing.T) {
	for _, tc := range []struct {
		err  *Error
		want string
	}{
		{InvalidRequest("top_p", "top_p must be in (0, 1], got %v", 2), `{"error":{"message":"top_p must be in (0, 1], got 2","type":"invalid_request_error","param":"top_p","code":null}}`},
		{ModelNotFound("gpt-9"), `{"error":{"message":"The model ` + "`gpt-9`" + ` does not exist.","type":"invalid_request_error","param":"model","code":"model_not_found"}}`},
		{Unavailable("no model is loaded"), `{"error":{"message":"no model is loaded","type":"service_unavailable_error","param":null,"code":"service_unavailable"}}`},
	} {
		b, err := json.Marshal(tc.err.Body())
		if err != nil || string(b) != tc.want {
			t.Errorf("body %s (%v), want %s", b, err, tc.want)
		}
	}
	statuses := map[int]*Error{400: Unsupported("n", "x"), 404: NotFound("x"), 409: Conflict("x"), 413: BodyTooLarge(10), 500: ServerError("x"), 503: Unavailable("x")}
	for status, e := range statuses {
		if e.Status != status || e.Error() == "" {
			t.Errorf("%+v: want status %d", e, status)
		}
	}
}

func TestResponsesMarshal(t *testing.T) {
	stop := "stop"
	chunk := CompletionResponse{ID: "cmpl-1", Object: ObjectTextCompletion, Created: 1, Model: "m",
		Choices: []CompletionChoice{{Text: "hi"}}}
	b, _ := json.Marshal(chunk)
	if !strings.Contains(string(b), `"finish_reason":null`) || !strings.Contains(string(b), `"logprobs":null`) || strings.Contains(string(b), "usage") {
		t.Fatalf("completion chunk %s", b)
	}
	usage := ChatCompletionChunk{ID: "c", Object: ObjectChatChunk, Choices: []ChatChunkChoice{}, Usage: NewUsage(3, 4, 2)}
	b, _ = json.Marshal(usage)
	if !strings.Contains(string(b), `"choices":[]`) || !strings.Contains(string(b), `"total_tokens":7,"prompt_tokens_details":{"cached_tokens":2}`) {
		t.Fatalf("usage chunk %s", b)
	}
	final := ChatChunkChoice{Delta: ChatDelta{}, FinishReason: &stop}
	b, _ = json.Marshal(final)
	if string(b) != `{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}` {
		t.Fatalf("final chat choice %s", b)
	}
}
