package rollout

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/stokehq/stoke/internal/config"
)

func TestParseSet(t *testing.T) {
	for _, tc := range []struct {
		name, in, err string
		items         int
	}{
		{name: "two lines and a blank", in: "{\"prompt\":\"a\",\"reference\":\"b\"}\n\n{\"prompt\":\"c\",\"reference\":\"d\",\"max_tokens\":4}\n", items: 2},
		{name: "empty", in: "\n", err: "no lines"},
		{name: "not json", in: "{\"prompt\":\"a\",\"reference\":\"b\"}\nnope\n", err: "line 2"},
		{name: "unknown field", in: `{"prompt":"a","reference":"b","answer":"c"}`, err: "unknown field"},
		{name: "no reference", in: `{"prompt":"a"}`, err: "reference is required"},
		{name: "no prompt", in: `{"reference":"a"}`, err: "prompt is required"},
		{name: "max_tokens too big", in: `{"prompt":"a","reference":"b","max_tokens":100000}`, err: "max_tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			items, err := ParseSet([]byte(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseSet = %v, want an error with %q", err, tc.err)
				}
				return
			}
			if err != nil || len(items) != tc.items {
				t.Fatalf("ParseSet = %d items, %v; want %d", len(items), err, tc.items)
			}
		})
	}
}

// answers is a Complete that answers from a table by prompt, after a
// number of 503s, and keeps what it was sent.
type answers struct {
	unavailable int
	byPrompt    map[string]string
	sent        []map[string]any
}

func (a *answers) complete(_ context.Context, body []byte) (int, []byte, error) {
	var req map[string]any
	if err := json.Unmarshal(body, &req); err != nil {
		return 0, nil, err
	}
	if a.unavailable > 0 {
		a.unavailable--
		return http.StatusServiceUnavailable, []byte(`{"error":{"message":"no replica"}}`), nil
	}
	a.sent = append(a.sent, req)
	ans, ok := a.byPrompt[req["prompt"].(string)]
	if !ok {
		return http.StatusBadRequest, []byte(`{"error":{"message":"unknown prompt"}}`), nil
	}
	return http.StatusOK, []byte(ans), nil
}

func TestRunExactMatch(t *testing.T) {
	a := &answers{unavailable: 1, byPrompt: map[string]string{
		"one": `{"choices":[{"text":" once upon "}]}`,
		"two": `{"choices":[{"text":"a dog"}]}`,
	}}
	items := []Item{{Prompt: "one", Reference: "once upon"}, {Prompt: "two", Reference: "a cat", MaxTokens: 3}}
	gate := config.Default().Rollout.Eval
	s, err := Run(context.Background(), a.complete, items, gate)
	if err != nil {
		t.Fatal(err)
	}
	if s.Items != 2 || s.Matched != 1 || s.Value != 0.5 {
		t.Fatalf("score %+v, want 1 of 2 matched", s)
	}
	if len(a.sent) != 2 || a.sent[0]["max_tokens"] != float64(gate.MaxTokens) || a.sent[1]["max_tokens"] != float64(3) ||
		a.sent[0]["temperature"] != float64(0) {
		t.Fatalf("requests %v: want greedy, the gate's max_tokens then the line's", a.sent)
	}
}

func TestRunLogLikelihood(t *testing.T) {
	// "Hi there": prompt "Hi" (offsets 0, 1), reference " there" (offsets 2, 5).
	a := &answers{byPrompt: map[string]string{
		"Hi there": `{"choices":[{"text":"Hi there","logprobs":{"tokens":["H","i"," th","ere"],` +
			`"token_logprobs":[null,-1.5,-2,-0.5],"text_offset":[0,1,2,5]}}]}`,
		"Hinope": `{"choices":[{"text":"Hinope","logprobs":{"tokens":["H","inope"],"token_logprobs":[null,null],"text_offset":[0,1]}}]}`,
	}}
	gate := config.Eval{Metric: config.EvalLogLikelihood, MaxTokens: 1}
	s, err := Run(context.Background(), a.complete, []Item{{Prompt: "Hi", Reference: " there"}}, gate)
	if err != nil {
		t.Fatal(err)
	}
	if s.Tokens != 2 || math.Abs(s.Value-(-1.25)) > 1e-12 {
		t.Fatalf("score %+v, want the mean of -2 and -0.5 over 2 tokens", s)
	}
	if req := a.sent[0]; req["echo"] != true || req["max_tokens"] != float64(0) {
		t.Fatalf("request %v, want echo with max_tokens 0", req)
	}
	if _, err := Run(context.Background(), a.complete, []Item{{Prompt: "Hi", Reference: "nope"}}, gate); err == nil {
		t.Fatal("a reference token with no log-probability scored")
	}
}

func TestJudge(t *testing.T) {
	for _, tc := range []struct {
		name              string
		stable, candidate float64
		maxRegression     float64
		promote           bool
	}{
		{"equal", 0.8, 0.8, 0, true},
		{"better", 0.5, 0.9, 0, true},
		{"worse within the allowance", 0.8, 0.75, 0.05, true},
		{"worse past it", 0.8, 0.7, 0.05, false},
		{"log-likelihood worse", -1.2, -3.4, 0.5, false},
		{"NaN", math.NaN(), 0.5, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := Judge(config.Eval{Metric: config.EvalExactMatch, MaxRegression: tc.maxRegression}, Score{Value: tc.stable}, Score{Value: tc.candidate})
			if v.Promote != tc.promote {
				t.Fatalf("Judge = %+v, want promote %v", v, tc.promote)
			}
			if !strings.HasPrefix(v.String(), map[bool]string{true: "promoted", false: "rejected"}[tc.promote]) {
				t.Errorf("verdict %q does not say it", v)
			}
		})
	}
}
