package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	oai "github.com/openai/openai-go/v3"

	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/tokenizer"
	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/testmodel"
)

// tokenMatchesBytes reports whether a logprobs token and its bytes agree:
// whole characters are the bytes themselves, anything else is written
// "bytes:…".
func tokenMatchesBytes(token string, b []int) bool {
	raw := make([]byte, len(b))
	for i, c := range b {
		if c < 0 || c > 255 {
			return false
		}
		raw[i] = byte(c)
	}
	if utf8.Valid(raw) {
		return token == string(raw)
	}
	return strings.HasPrefix(token, "bytes:")
}

// rawResponse sends a request and returns the status, headers and body.
func (f *fixture) rawResponse(t *testing.T, method, path string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, f.ts.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := f.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

func storiesTokenizer(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	tok, err := tokenizer.Load(testmodel.Dir(t))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestLogprobBytes checks that logprobs report a token's raw bytes: the
// byte-fallback token <0xE2> (the first byte of "’") is [226], not the
// replacement character, and alternatives that are different bytes stay
// apart in the completions top_logprobs map.
func TestLogprobBytes(t *testing.T) {
	tok := storiesTokenizer(t)
	id := func(s string) int32 {
		t.Helper()
		v, ok := tok.TokenID(s)
		if !ok {
			t.Fatalf("no token %q", s)
		}
		return v
	}
	e2, e3, the := id("<0xE2>"), id("<0xE3>"), id("▁the")
	lps := []sample.Logprobs{
		{Chosen: sample.TokenLogprob{ID: e2, Logprob: -0.5}, Top: []sample.TokenLogprob{{ID: e2, Logprob: -0.5}, {ID: e3, Logprob: -1.5}, {ID: the, Logprob: -2.5}}},
		{Chosen: sample.TokenLogprob{ID: the, Logprob: -0.25}, Top: []sample.TokenLogprob{{ID: the, Logprob: -0.25}, {ID: e2, Logprob: -3}}},
	}
	h := head{tok: tok, logprobs: 2}

	chat := (&chatFormat{head: h}).logprobs(lps)
	for _, tc := range []struct {
		name  string
		got   openai.TopLogprob
		token string
		bytes []int
	}{
		{"chosen <0xE2>", openai.TopLogprob{Token: chat.Content[0].Token, Bytes: chat.Content[0].Bytes}, `bytes:\xe2`, []int{0xE2}},
		{"alternative <0xE2>", chat.Content[0].TopLogprobs[0], `bytes:\xe2`, []int{0xE2}},
		{"alternative <0xE3>", chat.Content[0].TopLogprobs[1], `bytes:\xe3`, []int{0xE3}},
		{"alternative ▁the", chat.Content[0].TopLogprobs[2], " the", []int{' ', 't', 'h', 'e'}},
		{"chosen ▁the", openai.TopLogprob{Token: chat.Content[1].Token, Bytes: chat.Content[1].Bytes}, " the", []int{' ', 't', 'h', 'e'}},
	} {
		t.Run("chat "+tc.name, func(t *testing.T) {
			if tc.got.Token != tc.token || !slices.Equal(tc.got.Bytes, tc.bytes) {
				t.Fatalf("token %q bytes %v, want %q %v", tc.got.Token, tc.got.Bytes, tc.token, tc.bytes)
			}
		})
	}

	cmpl := (&completionFormat{head: h}).logprobs([]int32{e2, the}, lps)
	if !slices.Equal(cmpl.Tokens, []string{`bytes:\xe2`, " the"}) || !slices.Equal(cmpl.TextOffset, []int{0, 1}) {
		t.Fatalf("completion tokens %q, text offsets %v: want [bytes:\\xe2, \" the\"] at [0 1]", cmpl.Tokens, cmpl.TextOffset)
	}
	if top := cmpl.TopLogprobs[0]; len(top) != 3 || top[`bytes:\xe2`] != -0.5 || top[`bytes:\xe3`] != -1.5 || top[" the"] != -2.5 {
		t.Fatalf("completion top_logprobs %v: want <0xE2>, <0xE3> and ▁the apart", top)
	}

	// Served: every token of a real chat request agrees with its bytes,
	// none of which is the replacement character.
	ml := newModelLoader(t, false)
	ml.tok = tok
	f := newFixture(t, ml.load, "model", Options{})
	var resp openai.ChatCompletionResponse
	f.postJSON(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0,"ignore_eos":true,"logprobs":true,"top_logprobs":20}`, &resp)
	replacement := []int{0xEF, 0xBF, 0xBD}
	for _, c := range resp.Choices[0].Logprobs.Content {
		for _, e := range append([]openai.TopLogprob{{Token: c.Token, Bytes: c.Bytes}}, c.TopLogprobs...) {
			if !tokenMatchesBytes(e.Token, e.Bytes) || slices.Equal(e.Bytes, replacement) {
				t.Fatalf("served token %q with bytes %v", e.Token, e.Bytes)
			}
		}
	}
}

// TestRetrieveModel checks GET /v1/models/{id}, the SDKs' models.retrieve,
// with a model name holding a slash.
func TestRetrieveModel(t *testing.T) {
	f := newFixture(t, simLoader(t), "llama-3.1-8b-fp8-h100", Options{})
	const name = "nvidia/Llama-3.1-8B-Instruct-FP8"
	for _, tc := range []struct {
		name, path string
		status     int
	}{
		{"the model", "/v1/models/" + name, 200},
		{"the model, slash escaped", "/v1/models/" + url.PathEscape(name), 200},
		{"unknown", "/v1/models/gpt-9", 404},
		{"a prefix of the name", "/v1/models/nvidia", 404},
		{"the name and more", "/v1/models/" + name + "/x", 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, _, b := f.rawResponse(t, http.MethodGet, tc.path)
			if status != tc.status {
				t.Fatalf("GET %s: %d %s, want %d", tc.path, status, b, tc.status)
			}
			if status == 200 {
				var m map[string]any
				if err := json.Unmarshal(b, &m); err != nil || m["id"] != name || m["object"] != "model" || m["owned_by"] != "stoke" || m["created"] == nil {
					t.Fatalf("model object %s", b)
				}
				return
			}
			var e openai.ErrorBody
			if err := json.Unmarshal(b, &e); err != nil || e.Error.Code == nil || *e.Error.Code != "model_not_found" || e.Error.Type != openai.TypeInvalidRequest {
				t.Fatalf("error %s, want model_not_found", b)
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := sdkClient(f)
	m, err := client.Models.Get(ctx, name)
	if err != nil || m.ID != name || m.OwnedBy != "stoke" {
		t.Fatalf("SDK models.retrieve: %+v, %v", m, err)
	}
	var apiErr *oai.Error
	if _, err := client.Models.Get(ctx, "gpt-9"); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Fatalf("SDK models.retrieve of an unknown model: %v", err)
	}
}

// TestMethodNotAllowed checks that a served path asked with another
// method is a 405 with an Allow header and an OpenAI error, and that an
// unknown path stays a 404 in OpenAI shape.
func TestMethodNotAllowed(t *testing.T) {
	f := newModelFixture(t, true, Options{})
	for _, tc := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{"GET", "/v1/chat/completions", 405, "POST"},
		{"GET", "/v1/completions", 405, "POST"},
		{"DELETE", "/v1/models", 405, "GET"},
		{"POST", "/v1/models/tiny", 405, "GET"},
		{"GET", "/admin/load", 405, "POST"},
		{"POST", "/health", 405, "GET"},
		{"GET", "/v2/nothing", 404, ""},
		{"POST", "/v1/nothing", 404, ""},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			status, h, b := f.rawResponse(t, tc.method, tc.path)
			var e openai.ErrorBody
			if status != tc.status || h.Get("Allow") != tc.allow || json.Unmarshal(b, &e) != nil || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("%d, Allow %q, %s: want %d, Allow %q and an OpenAI error", status, h.Get("Allow"), b, tc.status, tc.allow)
			}
			if tc.status == 405 && (e.Error.Code == nil || *e.Error.Code != "method_not_allowed" || !strings.Contains(e.Error.Message, tc.allow)) {
				t.Fatalf("405 body %s", b)
			}
		})
	}
}
