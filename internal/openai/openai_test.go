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
		{"echo", CompletionRequest{Prompt: Prompt{Texts: []string{"a"}}, Echo: true}, ""},
		{"echo, max_tokens 0", CompletionRequest{GenerationParams: GenerationParams{MaxTokens: &zero}, Prompt: Prompt{Texts: []string{"a"}}, Echo: true}, ""},
		{"max_tokens 0 without echo", CompletionRequest{GenerationParams: GenerationParams{MaxTokens: &zero}, Prompt: Prompt{Texts: []string{"a"}}}, "max_tokens"},
		{"echo with suffix", CompletionRequest{Prompt: Prompt{Texts: []string{"a"}}, Echo: true, Suffix: "b"}, "suffix"},
	} {
		e := tc.req.CheckSupported()
		if (e == nil) != (tc.param == "") || (e != nil && (e.Param != tc.param || e.Status != http.StatusBadRequest)) {
			t.Errorf("%s: %+v, want param %q", tc.name, e, tc.param)
		}
	}
	for _, tc := range []struct {
		body, param string
	}{
		{`{"messages":[{"role":"user","content":"x"}],"echo":true}`, "echo"},
		{`{"messages":[{"role":"user","content":"x"}],"echo":false}`, ""},
	} {
		var r ChatCompletionRequest
		if e := Decode([]byte(tc.body), &r); e != nil {
			t.Fatal(e)
		}
		checkParam(t, r.CheckSupported(), tc.param)
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
	// An echoed prompt's first token has null logprobs; the rest are
	// numbers as without echo.
	lp := -0.5
	echoed := CompletionLogprobs{Tokens: []string{"A", "a"}, TokenLogprobs: []*float64{nil, &lp},
		TopLogprobs: []map[string]float64{nil, {"a": -0.5}}, TextOffset: []int{0, 0}}
	b, _ = json.Marshal(echoed)
	if string(b) != `{"tokens":["A","a"],"token_logprobs":[null,-0.5],"top_logprobs":[null,{"a":-0.5}],"text_offset":[0,0]}` {
		t.Fatalf("echoed logprobs %s", b)
	}
	final := ChatChunkChoice{Delta: ChatDelta{}, FinishReason: &stop}
	b, _ = json.Marshal(final)
	if string(b) != `{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}` {
		t.Fatalf("final chat choice %s", b)
	}
}

// TestRanges checks every sampling field against OpenAI's documented
// range (vLLM's for its extensions), on both endpoints: the edges pass,
// one step past them is a 400 naming the field.
func TestRanges(t *testing.T) {
	for _, tc := range []struct {
		name, fields, param string
	}{
		{"defaults", ``, ""},
		{"temperature 0", `"temperature":0`, ""},
		{"temperature 2", `"temperature":2`, ""},
		{"temperature above 2", `"temperature":2.5`, "temperature"},
		{"temperature 100", `"temperature":100`, "temperature"},
		{"temperature negative", `"temperature":-0.1`, "temperature"},
		{"top_p 0", `"top_p":0`, ""},
		{"top_p 1", `"top_p":1`, ""},
		{"top_p above 1", `"top_p":1.01`, "top_p"},
		{"top_p negative", `"top_p":-0.5`, "top_p"},
		{"presence_penalty edges", `"presence_penalty":-2,"frequency_penalty":2`, ""},
		{"presence_penalty above 2", `"presence_penalty":2.1`, "presence_penalty"},
		{"presence_penalty below -2", `"presence_penalty":-3`, "presence_penalty"},
		{"frequency_penalty above 2", `"frequency_penalty":2.5`, "frequency_penalty"},
		{"frequency_penalty below -2", `"frequency_penalty":-2.01`, "frequency_penalty"},
		{"n 1", `"n":1`, ""},
		{"n 0", `"n":0`, "n"},
		{"n negative", `"n":-3`, "n"},
		{"max_tokens 1", `"max_tokens":1`, ""},
		{"max_tokens 0", `"max_tokens":0`, "max_tokens"},
		{"max_tokens negative", `"max_tokens":-5`, "max_tokens"},
		{"top_k off", `"top_k":-1`, ""},
		{"top_k below -1", `"top_k":-2`, "top_k"},
		{"min_p edges", `"min_p":1`, ""},
		{"min_p above 1", `"min_p":1.5`, "min_p"},
		{"repetition_penalty 0", `"repetition_penalty":0`, ""},
		{"repetition_penalty negative", `"repetition_penalty":-1`, "repetition_penalty"},
	} {
		for _, endpoint := range []string{"completions", "chat"} {
			t.Run(endpoint+"/"+tc.name, func(t *testing.T) {
				body := "{" + tc.fields
				if tc.fields != "" {
					body += ","
				}
				var e *Error
				if endpoint == "chat" {
					var r ChatCompletionRequest
					if de := Decode([]byte(body+`"messages":[{"role":"user","content":"x"}]}`), &r); de != nil {
						t.Fatal(de)
					}
					e = r.CheckSupported()
				} else {
					var r CompletionRequest
					if de := Decode([]byte(body+`"prompt":"x"}`), &r); de != nil {
						t.Fatal(de)
					}
					e = r.CheckSupported()
				}
				checkParam(t, e, tc.param)
			})
		}
	}
}

// TestEndpointRanges checks the fields one endpoint has alone: the
// completions logprobs (0..5) and the chat top_logprobs (0..20) and
// max_completion_tokens.
func TestEndpointRanges(t *testing.T) {
	for _, tc := range []struct {
		name, body, param string
	}{
		{"logprobs 0", `{"prompt":"x","logprobs":0}`, ""},
		{"logprobs 5", `{"prompt":"x","logprobs":5}`, ""},
		{"logprobs 6", `{"prompt":"x","logprobs":6}`, "logprobs"},
		{"logprobs negative", `{"prompt":"x","logprobs":-1}`, "logprobs"},
		{"echo, max_tokens 0", `{"prompt":"x","echo":true,"max_tokens":0,"logprobs":0}`, ""},
		{"echo, max_tokens negative", `{"prompt":"x","echo":true,"max_tokens":-1}`, "max_tokens"},
		{"no echo, max_tokens 0", `{"prompt":"x","echo":false,"max_tokens":0}`, "max_tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r CompletionRequest
			if e := Decode([]byte(tc.body), &r); e != nil {
				t.Fatal(e)
			}
			checkParam(t, r.CheckSupported(), tc.param)
		})
	}
	user := `"messages":[{"role":"user","content":"x"}]`
	for _, tc := range []struct {
		name, body, param string
	}{
		{"top_logprobs 0", `{` + user + `,"logprobs":true,"top_logprobs":0}`, ""},
		{"top_logprobs 20", `{` + user + `,"logprobs":true,"top_logprobs":20}`, ""},
		{"top_logprobs 21", `{` + user + `,"logprobs":true,"top_logprobs":21}`, "top_logprobs"},
		{"top_logprobs negative", `{` + user + `,"logprobs":true,"top_logprobs":-1}`, "top_logprobs"},
		{"max_completion_tokens 1", `{` + user + `,"max_completion_tokens":1}`, ""},
		{"max_completion_tokens 0", `{` + user + `,"max_completion_tokens":0}`, "max_completion_tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r ChatCompletionRequest
			if e := Decode([]byte(tc.body), &r); e != nil {
				t.Fatal(e)
			}
			checkParam(t, r.CheckSupported(), tc.param)
		})
	}
}

// checkParam wants no error when param is "", else a 400 blaming param
// whose message names it.
func checkParam(t *testing.T, e *Error, param string) {
	t.Helper()
	if param == "" {
		if e != nil {
			t.Fatalf("refused: %+v", e)
		}
		return
	}
	if e == nil || e.Param != param || e.Status != http.StatusBadRequest || e.Type != TypeInvalidRequest || !strings.Contains(e.Message, param) {
		t.Fatalf("error %+v, want a 400 naming %q", e, param)
	}
}

func TestCheckMessages(t *testing.T) {
	for _, tc := range []struct {
		name, messages, param, code, message string
	}{
		{"every OpenAI role", `[{"role":"system","content":"a"},{"role":"developer","content":"b"},{"role":"user","content":"c"},` +
			`{"role":"assistant","content":"d"},{"role":"tool","content":"e"},{"role":"function","name":"f","content":"g"}]`, "", "", ""},
		{"unknown role", `[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"wizard","content":"c"}]`,
			"messages[2].role", "invalid_value", `"wizard"`},
		{"roles are case-sensitive", `[{"role":"User","content":"a"}]`, "messages[0].role", "invalid_value", `"User"`},
		{"no role", `[{"role":"user","content":"a"},{"content":"b"}]`, "messages[1].role", "", "required"},
		{"image part", `[{"role":"user","content":[{"type":"image_url"}]}]`, "messages[0].content", "unsupported_parameter", "image_url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r ChatCompletionRequest
			if e := Decode([]byte(`{"messages":`+tc.messages+`}`), &r); e != nil {
				t.Fatal(e)
			}
			e := r.CheckSupported()
			if tc.param == "" {
				if e != nil {
					t.Fatalf("refused: %+v", e)
				}
				return
			}
			if e == nil || e.Param != tc.param || e.Status != http.StatusBadRequest || e.Type != TypeInvalidRequest ||
				e.Code != tc.code || !strings.Contains(e.Message, tc.message) || !strings.Contains(e.Message, tc.param) {
				t.Fatalf("error %+v, want param %q, code %q, message containing %q", e, tc.param, tc.code, tc.message)
			}
		})
	}
}

func TestRouteErrors(t *testing.T) {
	e := MethodNotAllowed("GET", "/v1/chat/completions", "POST")
	b, err := json.Marshal(e.Body())
	want := `{"error":{"message":"method GET is not allowed on /v1/chat/completions (allowed: POST)","type":"invalid_request_error","param":null,"code":"method_not_allowed"}}`
	if err != nil || e.Status != http.StatusMethodNotAllowed || string(b) != want {
		t.Fatalf("405: %d %s, want %s", e.Status, b, want)
	}
	if e := RouteNotFound("GET", "/v2/x"); e.Status != http.StatusNotFound || !strings.Contains(e.Message, "GET /v2/x") {
		t.Fatalf("404: %+v", e)
	}
}
