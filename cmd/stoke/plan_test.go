package main

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stokehq/stoke/bench/load"
	"github.com/stokehq/stoke/bench/plan"
)

// runPlan runs stoke plan with args and --json.
func runPlan(t *testing.T, args ...string) plan.Plan {
	t.Helper()
	out, err := stoke(t, append([]string{"plan", "--json"}, args...)...)
	if err != nil {
		t.Fatalf("plan %v: %v\n%s", args, err, out)
	}
	var p plan.Plan
	if err := json.Unmarshal([]byte(out), &p); err != nil || len(p.Models) != 1 {
		t.Fatalf("plan %s: %v", out, err)
	}
	return p
}

// TestPlanSeeds: the seeds' traffic gives the seeds' token rates and, with
// 20% headroom, a capacity of 1,000 req/s serves their 833 req/s peak; the
// text output shows the arithmetic.
func TestPlanSeeds(t *testing.T) {
	m := runPlan(t, "--rps", "1000", "--input-tokens", "1500", "--output-tokens", "300", "--goodput", "100", "--headroom", "0").Models[0]
	if m.PrefillTokensPerSec != 1_500_000 || m.DecodeTokensPerSec != 300_000 || m.Replicas != 10 {
		t.Fatalf("plan %+v: want 1.5M prefill and 300K decode tokens/s on 10 replicas", m)
	}
	m = runPlan(t, "--rps", "833", "--goodput", "100", "--headroom", "0.2").Models[0]
	if m.CapacityRPS != 1000 || math.Round(m.PeakServed) != 833 {
		t.Fatalf("plan %+v: want a capacity of 1000 req/s serving a peak of 833", m)
	}
	out, err := stoke(t, "plan", "--rps", "1000", "--sim-profile", "llama-3.1-70b-fp8-2xh100", "--accelerator-hourly-usd", "2.5")
	if err != nil || !strings.Contains(out, "1,500,000") || !strings.Contains(out, "accelerators: ") || !strings.Contains(out, "sim profile llama-3.1-70b-fp8-2xh100") {
		t.Fatalf("plan: %v\n%s", err, out)
	}
	for _, bad := range [][]string{
		{"--rps", "10"},
		{"--rps", "10", "--goodput", "1", "--sim-profile", "llama-3.1-8b-fp8-h100"},
		{"--rps", "0", "--goodput", "1"},
		{"--rps", "10", "--goodput", "1", "--peak-to-average", "0.5"},
		{"--rps", "10", "--sim-profile", "no-such-profile"},
	} {
		if out, err := stoke(t, append([]string{"plan"}, bad...)...); err == nil {
			t.Errorf("plan %v planned:\n%s", bad, out)
		}
	}
}

// TestPlanFromSweep: a sweep against one replica of a sim deployment
// measures its goodput; the plan for a peak of several times it asks for
// a replica count which, run at that peak, meets the SLO. Scaled down: a
// tight TPOT SLO puts the knee at a few requests a second.
func TestPlanFromSweep(t *testing.T) {
	if testing.Short() {
		t.Skip("starts serve and sim engines for two loads")
	}
	bucket, data := t.TempDir(), t.TempDir()
	pushTo(t, bucket, "chat", "replicas:\n  min: 1\n  max: 1\n")
	killEnginesAtEnd(t, data)
	s := launchServe(t, nil, freeAddr(t), "--data", data, "--bucket", "file://"+bucket, "--watch-interval", "100ms", "--warm", "0",
		"--slots", "4", "--sim-profile", "llama-3.1-8b-fp8-h100")
	s.waitHealthy(t)
	waitUntil(t, "chat has a replica", time.Minute, func() bool { return readyReplicas(t, s.base, "chat") == 1 })

	shape := []string{"--url", s.base, "--model", "chat", "--input-tokens", "1000", "--output-tokens", "16", "--slo", "ttft=800ms,tpot=12ms", "--seed", "3"}
	dir := filepath.Join(t.TempDir(), "sweep")
	if out, err := stoke(t, append([]string{"bench", "load", "--sweep", "rate=2,4,8,16", "--duration", "4s", "--sweep-pause", "500ms", "--out", dir, "--json"}, shape...)...); err != nil {
		t.Fatalf("sweep: %v\n%s", err, out)
	}
	sw, err := load.ReadSweep(filepath.Join(dir, "sweep.json"))
	if err != nil {
		t.Fatal(err)
	}
	if sw.MaxSLO == nil {
		t.Fatalf("no point of the sweep met the SLO: %+v", sw.Points)
	}
	perReplica := sw.MaxSLO.RequestRate
	peak := 2.5 * perReplica
	p := runPlan(t, "--sweep", filepath.Join(dir, "sweep.json"), "--rps", fmt.Sprint(peak), "--headroom", "0",
		"--input-tokens", "1000", "--output-tokens", "16", "--slo", "ttft=800ms,tpot=12ms")
	m := p.Models[0]
	t.Logf("one replica meets the SLO up to %.3g req/s (sweep %+v); for %.3g req/s the plan asks for %d replicas", perReplica, sw.MaxSLO, peak, m.Replicas)
	if m.Replicas < 2 || m.Replicas > 4 || m.Goodput != perReplica {
		t.Fatalf("plan %+v: want 3 replicas of %v req/s for %v req/s", m, perReplica, peak)
	}

	// The second load: the planned replicas at the planned peak.
	spec := fmt.Sprintf(`{"replicas":{"min":%d,"max":%d}}`, m.Replicas, m.Replicas)
	req, _ := http.NewRequest(http.MethodPut, s.base+"/admin/deployments/chat", strings.NewReader(spec))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("scale chat to %d: %v %v", m.Replicas, resp, err)
	}
	waitUntil(t, "the planned replicas are ready", time.Minute, func() bool { return readyReplicas(t, s.base, "chat") == m.Replicas })
	out, err := stoke(t, append([]string{"bench", "load", "--rate", fmt.Sprint(peak), "--duration", "6s", "--json"}, shape...)...)
	if err != nil {
		t.Fatalf("load at the planned peak: %v\n%s", err, out)
	}
	var rep load.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("at %.3g req/s on %d replicas: %.0f%% of %d requests within the SLO (TTFT p99 %.0f ms, TPOT p99 %.1f ms)",
		peak, m.Replicas, rep.SLOAttainment*100, rep.Completed, rep.TTFT.P99, rep.TPOT.P99)
	if rep.Completed == 0 || rep.SLOAttainment < 0.9 {
		t.Fatalf("the planned fleet missed the SLO: %.0f%% of %d requests within it", rep.SLOAttainment*100, rep.Completed)
	}
}
