package main

import (
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stokehq/stoke/bench/load"
)

// TestBenchLoad runs `stoke bench load` against stoke serve on a sim
// engine: every request completes, and the tokens it reports are the ones
// serve and the engine counted, exactly.
func TestBenchLoad(t *testing.T) {
	bucketDir := t.TempDir()
	pushTo(t, bucketDir, "chat", "replicas:\n  min: 1\n  max: 1\n")
	data := t.TempDir()
	killEnginesAtEnd(t, data)
	s := launchServe(t, nil, freeAddr(t), "--data", data, "--bucket", "file://"+bucketDir, "--watch-interval", "100ms", "--warm", "0",
		"--slots", "1", "--sim-profile", "llama-3.1-8b-fp8-h100")
	s.waitHealthy(t)
	waitUntil(t, "chat has a ready replica", 60*time.Second, func() bool { return readyReplicas(t, s.base, "chat") == 1 })
	engineBefore := engineTokens(t, s.base)
	metric := scrape(t, s.base)
	serveBefore := metric(`stoke_tokens_total{kind="completion",model="chat"}`) + metric(`stoke_tokens_total{kind="prompt",model="chat"}`)

	out, err := stoke(t, "bench", "load", "--url", s.base, "--model", "chat", "--rate", "40", "--requests", "30",
		"--input-tokens", "uniform:8-24", "--output-tokens", "normal:12,4", "--seed", "5", "--json")
	if err != nil {
		t.Fatalf("bench load: %v\n%s", err, out)
	}
	var rep load.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("report %s: %v", out, err)
	}
	if rep.Completed != 30 || rep.Failed != 0 || rep.TTFT.P99 <= 0 || rep.TPOT.Mean <= 0 {
		t.Fatalf("report %+v: want 30 requests completed with latencies", rep)
	}
	reported := float64(rep.TotalInputTokens + rep.TotalOutputTokens)
	metric = scrape(t, s.base)
	served := metric(`stoke_tokens_total{kind="completion",model="chat"}`) + metric(`stoke_tokens_total{kind="prompt",model="chat"}`) - serveBefore
	if engine := float64(engineTokens(t, s.base) - engineBefore); reported != served || reported != engine {
		t.Fatalf("bench load reported %v tokens, serve counted %v, the engine %v", reported, served, engine)
	}
}

// TestBenchLoadSweepAndTrace runs, against one stoke serve with two sim
// models, a three-point rate sweep (its table, and files that read back:
// sweep.json through load.ReadSweep, the PNG as an image, the page with
// its table and the plot inside) and a two-model trace replay (every
// model served exactly the requests and tokens the trace gave it).
func TestBenchLoadSweepAndTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("a sweep takes seconds a point")
	}
	bucketDir := t.TempDir()
	pushTo(t, bucketDir, "chat", "replicas:\n  min: 1\n  max: 1\n")
	pushTo(t, bucketDir, "code", "replicas:\n  min: 1\n  max: 1\n")
	data := t.TempDir()
	killEnginesAtEnd(t, data)
	s := launchServe(t, nil, freeAddr(t), "--data", data, "--bucket", "file://"+bucketDir, "--watch-interval", "100ms", "--warm", "0",
		"--slots", "2", "--sim-profile", "llama-3.1-8b-fp8-h100")
	s.waitHealthy(t)
	waitUntil(t, "chat and code have a ready replica", 60*time.Second, func() bool {
		return readyReplicas(t, s.base, "chat") == 1 && readyReplicas(t, s.base, "code") == 1
	})

	t.Run("sweep", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "sweep")
		out, err := stoke(t, "bench", "load", "--url", s.base, "--model", "chat", "--sweep", "rate=4,16,64", "--duration", "3s",
			"--sweep-pause", "300ms", "--input-tokens", "uniform:16-48", "--output-tokens", "16", "--seed", "3", "--out", dir)
		if err != nil {
			t.Fatalf("bench load --sweep: %v\n%s", err, out)
		}
		t.Logf("stoke bench load --sweep rate=4,16,64 printed:\n%s", out)
		rows := 0
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) == 10 && (f[0] == "4" || f[0] == "16" || f[0] == "64") {
				rows++
			}
		}
		if rows != 3 || !strings.Contains(out, "TTFT p99") || !strings.Contains(out, "knee: rate=") || !strings.Contains(out, "max SLO: ") {
			t.Fatalf("the table has %d point rows (want 3), or lacks its header, knee or max-SLO line:\n%s", rows, out)
		}
		sw, err := load.ReadSweep(filepath.Join(dir, load.SweepJSONFile))
		if err != nil {
			t.Fatal(err)
		}
		if len(sw.Points) != 3 || sw.Param != load.SweepRate || sw.URL != s.base || len(sw.Models) != 1 || sw.Models[0].Name != "chat" ||
			sw.InputTokensMean != 32 || sw.OutputTokensMean != 16 || sw.SLO.TTFT != 800 || sw.Knee == nil {
			t.Fatalf("sweep.json: %+v", sw)
		}
		for i, p := range sw.Points {
			if p.Load != []float64{4, 16, 64}[i] || p.Completed == 0 || p.Failed != 0 || p.TTFT.P99 <= 0 || p.OutputThroughput <= 0 {
				t.Fatalf("point %d: %+v", i, p)
			}
		}
		if lo, hi := sw.Points[0].RequestRate, sw.Points[2].RequestRate; hi < 4*lo {
			t.Errorf("achieved %v req/s at rate 64 against %v at rate 4", hi, lo)
		}
		f, err := os.Open(filepath.Join(dir, load.SweepPNGFile))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		img, err := png.Decode(f)
		if err != nil {
			t.Fatalf("sweep.png: %v", err)
		}
		if b := img.Bounds(); b.Dx() < 400 || b.Dy() < 400 {
			t.Fatalf("sweep.png is %v", b)
		}
		page, err := os.ReadFile(filepath.Join(dir, load.SweepHTMLFile))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`<table id="points">`, "<td>64</td>", `src="data:image/png;base64,iVBOR`, "--sweep=rate=4,16,64"} {
			if !strings.Contains(string(page), want) {
				t.Errorf("sweep.html lacks %q", want)
			}
		}
	})

	t.Run("trace", func(t *testing.T) {
		var lines []string
		want := map[string]int{}
		tokens := map[string]int{}
		for i := range 30 {
			model, name := []string{"chat", "code", "code", ""}[i%4], ""
			if model != "" {
				name = fmt.Sprintf(`"model": %q, `, model)
			} else {
				model = "chat" // --model
			}
			out := 4 + i%5
			want[model]++
			tokens[model] += out
			lines = append(lines, fmt.Sprintf(`{"time": %.2f, %s"input_tokens": %d, "output_tokens": %d}`, float64(i)*0.1, name, 8+i%7, out))
		}
		path := filepath.Join(t.TempDir(), "trace.jsonl")
		if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		metric := scrape(t, s.base)
		before := map[string]float64{}
		for m := range want {
			before[m] = metric(`stoke_tokens_total{kind="completion",model="` + m + `"}`)
		}
		out, err := stoke(t, "bench", "load", "--url", s.base, "--model", "chat", "--trace", path, "--trace-speed", "2", "--json")
		if err != nil {
			t.Fatalf("bench load --trace: %v\n%s", err, out)
		}
		var rep load.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("report %s: %v", out, err)
		}
		metric = scrape(t, s.base)
		if rep.Completed != 30 || rep.Failed != 0 || len(rep.Models) != 2 {
			t.Fatalf("report %+v: want the trace's 30 requests over 2 models", rep)
		}
		for m, n := range want {
			got := rep.Models[m]
			served := metric(`stoke_tokens_total{kind="completion",model="`+m+`"}`) - before[m]
			if got.Completed != n || got.TotalOutputTokens != tokens[m] || served != float64(tokens[m]) {
				t.Errorf("%s: %d requests and %d output tokens reported, %v served: the trace gave it %d and %d", m, got.Completed,
					got.TotalOutputTokens, served, n, tokens[m])
			}
		}
		// The trace spans 2.9 s; at twice its speed the replay takes about
		// half that (generous bounds: the last answers are waited for).
		if rep.Duration < 1.4 || rep.Duration > 10 {
			t.Errorf("the replay took %.2f s, want about 1.45 s at speed 2", rep.Duration)
		}
	})
}

func TestBenchLoadFlagErrors(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "t.jsonl")
	if err := os.WriteFile(trace, []byte("{\"time\": 0, \"input_tokens\": 3, \"output_tokens\": 1}\n{\"time\": 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", "m"}, "give --rate, --concurrency, --trace or --sweep"},
		{[]string{"--rate", "1"}, "--model: name the model"},
		{[]string{"--model", "a=x", "--rate", "1"}, "--model: model mix"},
		{[]string{"--model", "m", "--sweep", "rate=1", "--rate", "2"}, "leave out --rate and --concurrency"},
		{[]string{"--model", "m", "--sweep", "qps=1"}, "--sweep: "},
		{[]string{"--model", "m", "--trace", trace, "--rate", "2"}, "leave out --rate"},
		{[]string{"--model", "m", "--trace", trace}, trace + ": line 2: no \"input_tokens\""},
		{[]string{"--model", "m", "--rate", "1", "--prefix-groups", "0", "--prefix-tokens", "5"}, "--prefix-groups"},
	} {
		out, err := stoke(t, append([]string{"bench", "load"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error %v, want one line containing %q\n%s", tc.args, err, tc.want, out)
		}
	}
}
