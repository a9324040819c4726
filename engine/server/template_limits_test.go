package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stokehq/stoke/engine/tokenizer"
)

// limitTokenizer is the synthetic tokenizer with its chat template replaced
// by tpl and, when preRegex is set, its split regex replaced by preRegex.
func limitTokenizer(t *testing.T, tpl, preRegex string) *tokenizer.Tokenizer {
	t.Helper()
	tj, tc, err := tokenizer.Synthesize(testVocab, 1)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(tc, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["chat_template"] = tpl
	if tc, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if preRegex != "" {
		var tjm map[string]any
		if err := json.Unmarshal(tj, &tjm); err != nil {
			t.Fatal(err)
		}
		tjm["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": preRegex}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}}
		if tj, err = json.Marshal(tjm); err != nil {
			t.Fatal(err)
		}
	}
	tok, err := tokenizer.New(tj, tc)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func limitFixture(t *testing.T, tok *tokenizer.Tokenizer) *fixture {
	ml := newModelLoader(t, false)
	ml.tok = tok
	f := newFixture(t, ml.load, "model", Options{})
	f.loader = ml
	return f
}

// wantInvalid checks a 400 invalid_request_error naming param with msg.
func wantInvalid(t *testing.T, status int, b []byte, param, msg string) {
	t.Helper()
	if status != http.StatusBadRequest {
		t.Fatalf("status %d, want 400: %s", status, b)
	}
	var body struct {
		Error struct {
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Message string  `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatalf("error body %s: %v", b, err)
	}
	e := body.Error
	if e.Type != "invalid_request_error" || e.Param == nil || *e.Param != param || !strings.Contains(e.Message, msg) {
		t.Fatalf("error %s: want invalid_request_error, param %q, message containing %q", b, param, msg)
	}
}

func TestChatTemplateLimitIs400(t *testing.T) {
	f := limitFixture(t, limitTokenizer(t, `{% for i in range(1000000000) %}x{% endfor %}`, ""))
	chat := `{"model":"` + testModel + `","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	for i := 0; i < 2; i++ { // the engine still serves after a failed render
		start := time.Now()
		status, b := f.do(t, http.MethodPost, "/v1/chat/completions", chat)
		wantInvalid(t, status, b, "messages", "chat template exceeded its limit")
		if took := time.Since(start); took > tokenizer.ChatTemplateTimeout+time.Second {
			t.Errorf("chat request took %v", took)
		}
	}
	status, b := f.do(t, http.MethodPost, "/v1/completions", `{"model":"`+testModel+`","prompt":"hello","max_tokens":2}`)
	if status != http.StatusOK {
		t.Fatalf("completions: status %d: %s", status, b)
	}
}

func TestPreTokenizerRegexLimitIs400(t *testing.T) {
	f := limitFixture(t, limitTokenizer(t, `{% for m in messages %}{{ m.content }}{% endfor %}`, `(a+)+$`))
	long := strings.Repeat("a", 5000) + "b"
	start := time.Now()
	status, b := f.do(t, http.MethodPost, "/v1/completions", `{"model":"`+testModel+`","prompt":"`+long+`","max_tokens":2}`)
	wantInvalid(t, status, b, "prompt", "regex exceeded its match timeout")
	status, b = f.do(t, http.MethodPost, "/v1/chat/completions", `{"model":"`+testModel+`","messages":[{"role":"user","content":"`+long+`"}],"max_tokens":2}`)
	wantInvalid(t, status, b, "messages", "regex exceeded its match timeout")
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("two requests took %v", took)
	}
	status, b = f.do(t, http.MethodPost, "/v1/completions", `{"model":"`+testModel+`","prompt":"hello","max_tokens":2}`)
	if status != http.StatusOK {
		t.Fatalf("completions: status %d: %s", status, b)
	}
}
