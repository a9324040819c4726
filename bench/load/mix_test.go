package load

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseMix(t *testing.T) {
	for _, tc := range []struct {
		in      string
		names   []string
		weights []float64
	}{
		{"a", []string{"a"}, nil},
		{"a,b,c", []string{"a", "b", "c"}, nil},
		{" a , b ", []string{"a", "b"}, nil},
		{"a=3,b=1", []string{"a", "b"}, []float64{3, 1}},
		{"a=3,b", []string{"a", "b"}, []float64{3, 1}},
		{"chat@sha256:ab=0.5,code=1.5", []string{"chat@sha256:ab", "code"}, []float64{0.5, 1.5}},
	} {
		m, err := ParseMix(tc.in)
		if err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		if !slices.Equal(m.Names, tc.names) || !slices.Equal(m.Weights, tc.weights) {
			t.Errorf("%q: %+v, want names %v weights %v", tc.in, m, tc.names, tc.weights)
		}
		if back, err := ParseMix(m.String()); err != nil || !slices.Equal(back.Names, m.Names) || !slices.Equal(back.Weights, m.Weights) {
			t.Errorf("%q: String %q reads back as %+v, %v", tc.in, m.String(), back, err)
		}
	}
	for _, bad := range []string{"", ",", "a,a", "a=0", "a=-1", "a=x", "=3", "a=NaN", "a=3,a=1"} {
		if m, err := ParseMix(bad); err == nil {
			t.Errorf("%q parsed as %+v", bad, m)
		}
	}
}

func TestMixShares(t *testing.T) {
	m, _ := ParseMix("a=3,b=1")
	if got := m.Shares(); !slices.Equal(got, []float64{0.75, 0.25}) {
		t.Errorf("shares %v, want [0.75 0.25]", got)
	}
	m, _ = ParseMix("a,b")
	if got := m.Shares(); !slices.Equal(got, []float64{0.5, 0.5}) {
		t.Errorf("shares %v, want [0.5 0.5]", got)
	}
}

// TestMixRoundRobin: without weights the models come in turn.
func TestMixRoundRobin(t *testing.T) {
	m, _ := ParseMix("a,b,c")
	rng := rand.New(rand.NewPCG(1, 2))
	var got []string
	for i := range 7 {
		got = append(got, m.pick(i, rng))
	}
	if want := []string{"a", "b", "c", "a", "b", "c", "a"}; !slices.Equal(got, want) {
		t.Fatalf("picked %v, want %v", got, want)
	}
}

// TestMixWeightsDrawnInProportion: weighted models are drawn in
// proportion to their weights (a seeded RNG, so the counts are fixed).
func TestMixWeightsDrawnInProportion(t *testing.T) {
	m, _ := ParseMix("a=1,b=2,c=5")
	rng := rand.New(rand.NewPCG(7, 8))
	counts := map[string]int{}
	const n = 16000
	for i := range n {
		counts[m.pick(i, rng)]++
	}
	for name, want := range map[string]float64{"a": 1.0 / 8, "b": 2.0 / 8, "c": 5.0 / 8} {
		if got := float64(counts[name]) / n; math.Abs(got-want) > 0.015 {
			t.Errorf("%s drawn %.3f of the time, want %.3f (counts %v)", name, got, want, counts)
		}
	}
}

// recorder is a streaming server that records what each request asked.
type recorder struct {
	mu    sync.Mutex
	asked []asked
}

// asked is one request as the server saw it.
type asked struct {
	Model     string `json:"model"`
	Prompt    string `json:"prompt"`
	MaxTokens int    `json:"max_tokens"`
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var a asked
	if err := json.NewDecoder(r.Body).Decode(&a); err != nil {
		http.Error(w, `{"error":{"code":"bad_json"}}`, 400)
		return
	}
	rec.mu.Lock()
	rec.asked = append(rec.asked, a)
	rec.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	for range a.MaxTokens {
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\" x\"}]}\n\n")
	}
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n",
		len(strings.Fields(a.Prompt)), a.MaxTokens)
}

// models counts the requests by model.
func (rec *recorder) models() map[string]int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	out := map[string]int{}
	for _, a := range rec.asked {
		out[a.Model]++
	}
	return out
}

func fixed(t *testing.T, s string) Dist {
	t.Helper()
	d, err := ParseDist(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestRunModelMix: a run sends each model the requests the mix gives it,
// and the report breaks down by model with the same counts.
func TestRunModelMix(t *testing.T) {
	for _, tc := range []struct {
		mix  string
		o    Options
		want map[string]float64 // expected shares
		cut  float64            // tolerance
	}{
		{"a,b,c", Options{Rate: 2000, Requests: 30}, map[string]float64{"a": 1.0 / 3, "b": 1.0 / 3, "c": 1.0 / 3}, 0},
		{"a=3,b=1", Options{Concurrency: 8, Requests: 400}, map[string]float64{"a": 0.75, "b": 0.25}, 0.06},
	} {
		t.Run(tc.mix, func(t *testing.T) {
			rec := &recorder{}
			srv := httptest.NewServer(rec)
			defer srv.Close()
			o := tc.o
			o.URL, o.Input, o.Output, o.Seed = srv.URL, fixed(t, "4"), fixed(t, "2"), 11
			var err error
			if o.Models, err = ParseMix(tc.mix); err != nil {
				t.Fatal(err)
			}
			results, d, err := Run(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			rep := Summarize(results, d, SLO{})
			served := rec.models()
			if len(rep.Models) != len(tc.want) {
				t.Fatalf("report by model %v, want the models %v", rep.Models, tc.want)
			}
			for name, share := range tc.want {
				if got := rep.Models[name].Completed; got != served[name] {
					t.Errorf("%s: report says %d requests, the server saw %d", name, got, served[name])
				}
				if got := float64(served[name]) / float64(o.Requests); math.Abs(got-share) > tc.cut+1e-9 {
					t.Errorf("%s: got %.3f of the requests, want %.3f ± %.2f (%v)", name, got, share, tc.cut, served)
				}
			}
		})
	}
}

// TestRunSharedPrefixes: with a prefix mix every prompt starts with one of
// the groups' fixed prefixes, every group is used, and what follows is
// each request's own; without one, no two prompts share a first word.
func TestRunSharedPrefixes(t *testing.T) {
	rec := &recorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	o := Options{URL: srv.URL, Models: OneModel("m"), Rate: 5000, Requests: 60, Input: fixed(t, "5"), Output: fixed(t, "1"),
		PrefixTokens: 20, PrefixGroups: 3, Seed: 3, Tag: "run1"}
	results, d, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	prefixes := []string{sharedPrefix("run1", 0, 20), sharedPrefix("run1", 1, 20), sharedPrefix("run1", 2, 20)}
	for i, p := range prefixes {
		if n := len(strings.Fields(p)); n != 20 {
			t.Errorf("prefix %d has %d words, want 20: %q", i, n, p)
		}
		for j, q := range prefixes {
			if i != j && strings.HasPrefix(p, q) {
				t.Errorf("prefix %d starts with prefix %d", i, j)
			}
		}
	}
	used := map[int]int{}
	own := map[string]bool{}
	for _, a := range rec.asked {
		g := slices.IndexFunc(prefixes, func(p string) bool { return strings.HasPrefix(a.Prompt, p) })
		if g < 0 {
			t.Fatalf("prompt %q starts with none of the shared prefixes", a.Prompt)
		}
		used[g]++
		rest := strings.TrimPrefix(a.Prompt, prefixes[g])
		if n := len(strings.Fields(rest)); n != 5 {
			t.Errorf("the part of its own %q has %d words, want 5", rest, n)
		}
		if own[rest] {
			t.Errorf("two requests share their own part %q", rest)
		}
		own[rest] = true
	}
	if len(rec.asked) != 60 || len(used) != 3 {
		t.Fatalf("%d requests, groups used %v: want 60 requests over 3 groups", len(rec.asked), used)
	}
	if rep := Summarize(results, d, SLO{}); rep.TotalInputTokens != 60*25 {
		t.Errorf("input tokens %d, want 60 × (20 + 5)", rep.TotalInputTokens)
	}

	rec.asked = nil
	o.PrefixTokens, o.PrefixGroups = 0, 0
	if _, _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	first := map[string]bool{}
	for _, a := range rec.asked {
		w := strings.Fields(a.Prompt)[0]
		if first[w] {
			t.Fatalf("two prompts start with %q without a prefix mix", w)
		}
		first[w] = true
	}
}

// TestRunTagsSeparateRuns: two runs with the same seed but their own tags
// send prompts that differ from the first word on (no cached prefix is
// shared across runs or sweep points).
func TestRunTagsSeparateRuns(t *testing.T) {
	rec := &recorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	o := Options{URL: srv.URL, Models: OneModel("m"), Rate: 5000, Requests: 5, Input: fixed(t, "3"), Output: fixed(t, "1"), Seed: 3}
	for range 2 {
		if _, _, err := Run(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
	first := map[string]bool{}
	for _, a := range rec.asked {
		first[strings.Fields(a.Prompt)[0]] = true
	}
	if len(first) != 10 {
		t.Fatalf("10 prompts of two runs start with %d distinct words, want 10", len(first))
	}
}

func TestSummarizeByModel(t *testing.T) {
	ok := func(model string, ttft int) Result {
		return Result{Model: model, Sent: t0, Status: 200, InputTokens: 3, OutputTokens: 1, Events: []time.Time{at(ttft)}, End: at(ttft)}
	}
	results := []Result{ok("a", 100), ok("a", 900), ok("b", 100), {Model: "b", Status: 503}}
	rep := Summarize(results, time.Second, SLO{TTFT: 500 * time.Millisecond})
	a, b := rep.Models["a"], rep.Models["b"]
	if len(rep.Models) != 2 || a.Completed != 2 || b.Completed != 1 || b.Failed != 1 || a.Models != nil {
		t.Fatalf("by model %+v", rep.Models)
	}
	// Two of the four requests are within 500ms; a: 1 of 2, b: 1 of 2 (its
	// failure counts against it).
	if rep.SLOAttainment != 0.5 || a.SLOAttainment != 0.5 || b.SLOAttainment != 0.5 || a.RequestGoodput != 1 {
		t.Fatalf("attainment %v, a %v, b %v, a's goodput %v", rep.SLOAttainment, a.SLOAttainment, b.SLOAttainment, a.RequestGoodput)
	}
	if got := Summarize([]Result{{Status: 200}}, time.Second, SLO{}); got.Models != nil {
		t.Fatalf("results that name no model broke down as %v", got.Models)
	}
}

func TestTally(t *testing.T) {
	tally := NewTally(t0)
	for range 5 {
		tally.Sent()
	}
	for _, ms := range []int{10, 20, 30, 40} {
		tally.Done(Result{Sent: t0, Status: 200, Events: []time.Time{at(ms)}, End: at(ms)})
	}
	s := tally.Snapshot(at(2000))
	if s.Done != 4 || s.InFlight != 1 || s.Failed != 0 || s.RequestRate != 2 || s.TTFTP50 != 25 || math.Abs(s.TTFTP99-39.7) > 1e-9 {
		t.Fatalf("snapshot %+v: want 4 done, 1 in flight, 2 req/s, TTFT p50 25 p99 39.7", s)
	}
	tally.Done(Result{Status: 500})
	if s := tally.Snapshot(at(2000)); s.Failed != 1 || s.InFlight != 0 || s.TTFTP50 != 25 {
		t.Fatalf("after a failure %+v", s)
	}
}
