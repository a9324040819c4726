package load

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// TestReadStreamDefinitions: on a scripted stream with known event times,
// TTFT is the first event with text (not the role chunk), ITLs the gaps
// between text events, TPOT (E2E − TTFT) / (tokens − 1) with the tokens
// the usage chunk reports, as vLLM's bench defines them.
func TestReadStreamDefinitions(t *testing.T) {
	stream := strings.Join([]string{
		`data: {"choices":[{"delta":{"role":"assistant"}}]}`,                     // t=40: no text
		`data: {"choices":[{"delta":{"content":"Once"}}]}`,                       // t=100
		`data: {"choices":[{"delta":{"content":" upon"}}]}`,                      // t=120
		`data: {"choices":[{"delta":{"content":" a time"}}]}`,                    // t=150 (two tokens in one event)
		`data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":4}}`, // t=151
		`data: [DONE]`,
	}, "\n\n") + "\n\n"
	times := []time.Time{at(40), at(100), at(120), at(150), at(151), at(160)}
	next := 0
	now := func() time.Time { t := times[min(next, len(times)-1)]; next++; return t }
	r := readStream(strings.NewReader(stream), Result{Sent: t0, Status: 200}, now)
	if !r.OK() || len(r.Events) != 3 || r.InputTokens != 7 || r.OutputTokens != 4 {
		t.Fatalf("result %+v: want 3 text events and usage 7/4", r)
	}
	if got := r.TTFT(); got != 100*time.Millisecond {
		t.Errorf("TTFT %v, want 100ms (the role chunk carries no token)", got)
	}
	if got := r.E2E(); got != 160*time.Millisecond {
		t.Errorf("E2E %v, want 160ms", got)
	}
	if got, ok := r.TPOT(); !ok || got != 20*time.Millisecond {
		t.Errorf("TPOT %v, want (160 − 100) / (4 − 1) = 20ms", got)
	}
	if got := r.ITLs(); fmt.Sprint(got) != "[20ms 30ms]" {
		t.Errorf("ITLs %v, want [20ms 30ms]", got)
	}
}

func TestReadStreamErrors(t *testing.T) {
	for _, tc := range []struct{ name, stream, code string }{
		{"an error event", "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"error\":{\"code\":\"replica_failed\"}}\n\n", "replica_failed"},
		{"no text at all", "data: [DONE]\n\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := readStream(strings.NewReader(tc.stream), Result{Sent: t0, Status: 200}, time.Now)
			if r.Code != tc.code || r.OK() {
				t.Fatalf("result %+v: want code %q and not OK", r, tc.code)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	ok := func(ttft, end, tokens int) Result {
		r := Result{Sent: t0, Status: 200, InputTokens: 10, OutputTokens: tokens, End: at(end)}
		for i := range tokens {
			r.Events = append(r.Events, at(ttft+i*(end-ttft)/max(1, tokens-1)))
		}
		return r
	}
	results := []Result{ok(100, 400, 4), ok(900, 1000, 2), ok(200, 200, 1), {Status: 429, Code: "rate_limit_exceeded"}, {Status: 503}}
	rep := Summarize(results, 2*time.Second, SLO{TTFT: 800 * time.Millisecond, TPOT: 90 * time.Millisecond})
	if rep.Completed != 3 || rep.Failed != 2 || rep.Errors["rate_limit_exceeded"] != 1 || rep.Errors["status_503"] != 1 {
		t.Fatalf("report %+v", rep)
	}
	// The first misses the TPOT bound ((400−100)/3 = 100ms), the second the
	// TTFT one (900ms); only the third (one token, TTFT 200ms) is good.
	if rep.RequestGoodput != 0.5 || rep.RequestThroughput != 1.5 || rep.OutputThroughput != 3.5 || rep.TotalTokenThroughput != 18.5 {
		t.Fatalf("goodput %v, throughput %v, output %v, total %v", rep.RequestGoodput, rep.RequestThroughput, rep.OutputThroughput, rep.TotalTokenThroughput)
	}
	if rep.TTFT.Median != 200 || rep.TTFT.Mean != 400 || rep.TPOT.Mean != 100 {
		t.Fatalf("TTFT %+v, TPOT %+v: want median 200, mean 400 and TPOT mean (100+100)/2", rep.TTFT, rep.TPOT)
	}
}

func TestParseDist(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		in       string
		min, max int
		mean     float64
	}{
		{"128", 128, 128, 128},
		{"fixed:64", 64, 64, 64},
		{"uniform:10-20", 10, 20, 15},
		{"normal:100,10", 40, 160, 100},
		{"lognormal:100,0.5", 1, 2000, 100 * math.Exp(0.125)},
	} {
		d, err := ParseDist(tc.in)
		if err != nil {
			t.Fatalf("%s: %v", tc.in, err)
		}
		sum := 0
		for range 4000 {
			v := d.Draw(rng)
			if v < tc.min || v > tc.max {
				t.Fatalf("%s drew %d, outside [%d, %d]", tc.in, v, tc.min, tc.max)
			}
			sum += v
		}
		if got := float64(sum) / 4000; math.Abs(got-tc.mean) > 0.05*tc.mean+1 {
			t.Errorf("%s: mean %v, want about %v", tc.in, got, tc.mean)
		}
	}
	for _, bad := range []string{"", "fixed:0", "uniform:9-3", "gaussian:1,2", "normal:1", "lognormal:0,1", "uniform:a-b"} {
		if _, err := ParseDist(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestInterarrival: gaps average 1/rate whatever the burstiness, and a
// burstiness below 1 spreads them more.
func TestInterarrival(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	cv := func(b float64) (mean, cv float64) {
		var sum, sq float64
		const n = 20000
		for range n {
			g := interarrival(rng, 50, b)
			sum += g
			sq += g * g
		}
		mean = sum / n
		return mean, math.Sqrt(sq/n-mean*mean) / mean
	}
	for _, b := range []float64{0.5, 1, 4} {
		mean, c := cv(b)
		if math.Abs(mean-0.02) > 0.001 {
			t.Errorf("burstiness %v: mean gap %v, want 0.02", b, mean)
		}
		if want := 1 / math.Sqrt(b); math.Abs(c-want) > 0.05*want {
			t.Errorf("burstiness %v: coefficient of variation %v, want %v", b, c, want)
		}
	}
}

// TestRunCountsAndSends: an open loop and a closed loop each send the
// requests asked for, with the lengths drawn, to a server that streams.
func TestRunCountsAndSends(t *testing.T) {
	var got atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		if r.URL.Path != "/v1/completions" || r.Header.Get("Authorization") != "Bearer k" {
			http.Error(w, `{"error":{"code":"bad"}}`, 400)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	in, _ := ParseDist("5")
	out, _ := ParseDist("2")
	for _, o := range []Options{{Rate: 500, Requests: 40}, {Concurrency: 4, Requests: 40}} {
		got.Store(0)
		o.URL, o.Models, o.APIKey, o.Input, o.Output, o.Seed = srv.URL, OneModel("m"), "k", in, out, 7
		results, d, err := Run(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		rep := Summarize(results, d, SLO{})
		if rep.Completed != 40 || got.Load() != 40 || rep.TotalOutputTokens != 80 || rep.TotalInputTokens != 200 {
			t.Fatalf("%+v: report %+v, server saw %d", o, rep, got.Load())
		}
	}
}

// BenchmarkReadStream measures the load generator's own cost per streamed
// answer: a chat stream of 64 token events, a usage event and [DONE].
func BenchmarkReadStream(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"chat","choices":[{"index":0,"delta":{"role":"assistant"}}]}` + "\n\n")
	for range 64 {
		sb.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"chat","choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	}
	sb.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"chat","choices":[],"usage":{"prompt_tokens":512,"completion_tokens":64,"total_tokens":576}}` + "\n\ndata: [DONE]\n\n")
	stream := sb.String()
	b.ReportAllocs()
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		r := readStream(strings.NewReader(stream), Result{Sent: t0, Status: 200}, time.Now)
		if len(r.Events) != 64 || r.OutputTokens != 64 {
			b.Fatalf("%d events, %d tokens", len(r.Events), r.OutputTokens)
		}
	}
}

// TestReadStreamLayouts: the undecoded fast path and the decoded one agree:
// compact token events, spaced JSON (as Python's json.dumps writes it), an
// empty content, and text in the same event as the usage.
func TestReadStreamLayouts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events []string
		texts  int
		tokens int
	}{
		{"compact", []string{`{"choices":[{"delta":{"role":"assistant","content":""}}]}`, `{"choices":[{"delta":{"content":"a"}}]}`,
			`{"choices":[{"delta":{"content":"\"b"}}]}`}, 2, 2},
		{"spaced", []string{`{"choices": [{"delta": {"content": "a"}}]}`, `{"choices": [{"delta": {"content": ""}}]}`,
			`{"choices": [{"text": "b"}], "usage": null}`}, 2, 2},
		{"text with usage", []string{`{"choices":[{"text":"a"}]}`, `{"choices":[{"text":"b"}],"usage":{"prompt_tokens":3,"completion_tokens":5}}`}, 2, 5},
		{"logprobs content array", []string{`{"choices":[{"delta":{"content":"a"},"logprobs":{"content":[{"token":"a"}]}}]}`}, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stream := "data: " + strings.Join(tc.events, "\n\ndata: ") + "\n\ndata: [DONE]\n\n"
			r := readStream(strings.NewReader(stream), Result{Sent: t0, Status: 200}, time.Now)
			if len(r.Events) != tc.texts || r.OutputTokens != tc.tokens {
				t.Fatalf("%d text events, %d tokens; want %d and %d", len(r.Events), r.OutputTokens, tc.texts, tc.tokens)
			}
		})
	}
}
