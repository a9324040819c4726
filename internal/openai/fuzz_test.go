package openai

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzDecodeRequest decodes arbitrary bytes as a completions and as a chat
// request. Decoding and the checks must not panic, and a request the checks
// accept must re-encode to JSON that decodes, passes the checks again and
// re-encodes to the same bytes: what the router forwards means what the
// client sent.
func FuzzDecodeRequest(f *testing.F) {
	for _, seed := range []string{
		`{}`, `null`, `[]`, `"x"`, `{"model":`,
		`{"model":"m","prompt":"Hello","max_tokens":16,"temperature":0.7,"top_p":0.9,"stop":["\n"],"seed":1}`,
		`{"model":"m","prompt":[1,2,3],"logprobs":2,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","prompt":["a","b"],"n":2,"logit_bias":{"1":-100}}`,
		`{"model":"m","prompt":"x","stop":"END","top_k":40,"min_p":0.05,"repetition_penalty":1.1,"stop_token_ids":[2],"skip_special_tokens":false,"priority":3}`,
		`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi","name":"u"}],"max_completion_tokens":8}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"logprobs":true,"top_logprobs":3,"response_format":{"type":"text"},"tools":[]}`,
		`{"model":"m","messages":[{"role":"user","content":null}],"add_generation_prompt":false,"presence_penalty":-2,"frequency_penalty":2}`,
		`{"model":"m","messages":[],"temperature":"hot"}`,
		`{"model":"m","prompt":"\ud800","user":"\u00e9"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var c CompletionRequest
		if Decode(data, &c) == nil && c.CheckSupported() == nil {
			var again CompletionRequest
			roundTrip(t, "completion", &c, &again, func() *Error { return again.CheckSupported() })
		}
		var chat ChatCompletionRequest
		if Decode(data, &chat) == nil && chat.CheckSupported() == nil {
			chat.MaxNewTokens()
			chat.IncludeUsage()
			var again ChatCompletionRequest
			roundTrip(t, "chat", &chat, &again, func() *Error { return again.CheckSupported() })
		}
	})
}

// roundTrip encodes req, decodes it into again, checks it with check and
// wants the same encoding back.
func roundTrip(t *testing.T, what string, req, again any, check func() *Error) {
	t.Helper()
	b1, err := json.Marshal(req)
	if err != nil {
		t.Fatalf("%s: re-encode %+v: %v", what, req, err)
	}
	if err := Decode(b1, again); err != nil {
		t.Fatalf("%s: re-encoded %s does not decode: %v", what, b1, err)
	}
	if err := check(); err != nil {
		t.Fatalf("%s: re-encoded %s fails the checks: %v", what, b1, err)
	}
	b2, err := json.Marshal(again)
	if err != nil {
		t.Fatalf("%s: re-encode %+v: %v", what, again, err)
	}
	if !bytes.Equal(b1, b2) {
		t.Fatalf("%s: encoding changed across a round trip:\n%s\n%s", what, b1, b2)
	}
}
