package main

import (
	"encoding/json"
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
