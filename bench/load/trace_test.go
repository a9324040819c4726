package load

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseTrace(t *testing.T) {
	trace := `{"time": 2.5, "model": "b", "input_tokens": 10, "output_tokens": 3}

{"time": 0, "input_tokens": 7, "output_tokens": 1, "hash_ids": [1, 2], "note": "extra fields are ignored"}
{"time": 1, "model": "a", "input_tokens": 5, "output_tokens": 2}
{"time": 1, "model": null, "input_tokens": 6, "output_tokens": 2}
`
	got, err := ParseTrace(strings.NewReader(trace))
	if err != nil {
		t.Fatal(err)
	}
	want := []TraceEntry{
		{Time: 0, InputTokens: 7, OutputTokens: 1, Line: 3},
		{Time: time.Second, Model: "a", InputTokens: 5, OutputTokens: 2, Line: 4},
		{Time: time.Second, InputTokens: 6, OutputTokens: 2, Line: 5},
		{Time: 2500 * time.Millisecond, Model: "b", InputTokens: 10, OutputTokens: 3, Line: 1},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("entries\n%+v\nwant (in order of time, ties in file order)\n%+v", got, want)
	}
}

// TestParseTraceErrors: each bad input is refused with one line that names
// the line and what is wrong with it.
func TestParseTraceErrors(t *testing.T) {
	good := `{"time": 0, "input_tokens": 1, "output_tokens": 1}` + "\n"
	for _, tc := range []struct{ name, trace, want string }{
		{"empty", "\n\n", "no requests"},
		{"not JSON", good + "time=1\n", `line 2: not a JSON object: time=1`},
		{"an array", good + good + "[1,2]\n", "line 3: not a JSON object"},
		{"no time", `{"input_tokens": 1, "output_tokens": 1}`, `line 1: no "time"`},
		{"time a string", `{"time": "1s", "input_tokens": 1, "output_tokens": 1}`, `line 1: "time" is "1s", want a number`},
		{"negative time", good + `{"time": -1, "input_tokens": 1, "output_tokens": 1}`, `line 2: "time" is -1, want seconds`},
		{"no input", `{"time": 0, "output_tokens": 1}`, `line 1: no "input_tokens"`},
		{"zero input", `{"time": 0, "input_tokens": 0, "output_tokens": 1}`, `line 1: "input_tokens" is 0, want a whole number ≥ 1`},
		{"fractional output", `{"time": 0, "input_tokens": 3, "output_tokens": 1.5}`, `line 1: "output_tokens" is 1.5, want a whole number`},
		{"typo", `{"time": 0, "input_tokens": 3, "output_token": 2}`, `line 1: no "output_tokens"`},
		{"model a number", `{"time": 0, "model": 7, "input_tokens": 3, "output_tokens": 2}`, `line 1: "model" is 7, want a string`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseTrace(strings.NewReader(tc.trace))
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %v, want one line containing %q", err, tc.want)
			}
		})
	}
}

func TestReadTraceNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.jsonl")
	if err := os.WriteFile(path, []byte(`{"time": 0, "input_tokens": 1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadTrace(path); err == nil || !strings.Contains(err.Error(), path+": line 1: ") {
		t.Fatalf("error %v, want it to name %s and line 1", err, path)
	}
	if _, err := ReadTrace(path + ".missing"); err == nil || !strings.Contains(err.Error(), "t.jsonl.missing") {
		t.Fatalf("error %v, want it to name the missing file", err)
	}
}

// fakeClock is a clock whose Sleep moves time on at once.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(_ context.Context, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d > 0 {
		c.now = c.now.Add(d)
	}
}

// TestTraceReplayTimes: on a fake clock, a trace's requests are sent at
// their times divided by the speed, exactly, with their models (the mix's
// for those without) and lengths; a duration or a count cuts it short.
func TestTraceReplayTimes(t *testing.T) {
	entries, err := ParseTrace(strings.NewReader(`{"time": 0, "model": "a", "input_tokens": 4, "output_tokens": 2}
{"time": 3, "model": "b", "input_tokens": 9, "output_tokens": 5}
{"time": 1, "model": "b", "input_tokens": 5, "output_tokens": 3}
{"time": 1, "input_tokens": 6, "output_tokens": 1}
{"time": 2.5, "model": "a", "input_tokens": 8, "output_tokens": 4}
`))
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	for _, tc := range []struct {
		name     string
		duration time.Duration
		requests int
		sent     []time.Duration
		models   []string
	}{
		{"whole", 0, 0, []time.Duration{0, 500 * time.Millisecond, 500 * time.Millisecond, 1250 * time.Millisecond, 1500 * time.Millisecond},
			[]string{"a", "b", "c", "a", "b"}},
		{"a duration", 1250 * time.Millisecond, 0, []time.Duration{0, 500 * time.Millisecond, 500 * time.Millisecond}, []string{"a", "b", "c"}},
		{"a count", 0, 2, []time.Duration{0, 500 * time.Millisecond}, []string{"a", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec.asked = nil
			start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			clk := &fakeClock{now: start}
			o := Options{URL: srv.URL, Models: OneModel("c"), Trace: entries, TraceSpeed: 2, Duration: tc.duration, Requests: tc.requests, clock: clk}
			results, took, err := Run(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			slices.SortStableFunc(results, func(a, b Result) int { return a.Sent.Compare(b.Sent) })
			var sent []time.Duration
			var models []string
			for _, r := range results {
				sent = append(sent, r.Sent.Sub(start))
				models = append(models, r.Model)
			}
			if !slices.Equal(sent, tc.sent) || took != tc.sent[len(tc.sent)-1] {
				t.Fatalf("sent at %v, took %v: want %v", sent, took, tc.sent)
			}
			// Requests sent at the same moment may come in either order.
			slices.Sort(models)
			want := slices.Sorted(slices.Values(tc.models))
			if !slices.Equal(models, want) {
				t.Fatalf("models %v, want %v", models, want)
			}
			var got, wantAsked []string
			for _, a := range rec.asked {
				got = append(got, fmt.Sprintf("%s/%d/%d", a.Model, len(strings.Fields(a.Prompt)), a.MaxTokens))
			}
			for i := range tc.sent {
				e := entries[i]
				wantAsked = append(wantAsked, fmt.Sprintf("%s/%d/%d", tc.models[i], e.InputTokens, e.OutputTokens))
			}
			slices.Sort(got)
			slices.Sort(wantAsked)
			if !slices.Equal(got, wantAsked) {
				t.Fatalf("the server was asked (model/prompt words/max tokens) %v, want %v", got, wantAsked)
			}
		})
	}
}
