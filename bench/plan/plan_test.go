package plan

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stokehq/stoke/bench/load"
)

// TestSeedTraffic: the seeds' traffic, 1,000 req/s of 1,500 in and 300
// out, is 1.5M prefill and 300K decode tokens a second; with 20% headroom a
// fleet whose capacity is 1,000 req/s serves a peak of 833 req/s.
func TestSeedTraffic(t *testing.T) {
	m := Model{Name: "llama", Share: 1, InputTokens: 1500, OutputTokens: 300, Goodput: 100, GoodputSource: "a sweep",
		Accelerators: 2, HourlyUSD: 8, ColdStart: 20 * time.Second, Wake: time.Second}
	p, err := Make(Traffic{PeakRPS: 1000, PeakToAverage: 2}, []Model{m}, 0)
	if err != nil {
		t.Fatal(err)
	}
	mp := p.Models[0]
	if mp.PrefillTokensPerSec != 1_500_000 || mp.DecodeTokensPerSec != 300_000 {
		t.Fatalf("token rates %v prefill, %v decode; want 1.5M and 300K", mp.PrefillTokensPerSec, mp.DecodeTokensPerSec)
	}
	if mp.Replicas != 10 || mp.Accelerators != 20 || mp.HourlyUSDPeak != 80 || mp.ReplicasAtAverage != 5 || mp.HourlyUSDAverage != 40 {
		t.Fatalf("plan %+v: want 10 replicas (20 GPUs, $80/h) at peak and 5 ($40/h) at the average", mp)
	}
	// $40/h over 500 req/s × 1,800 tokens × 3,600 s.
	if want := 40 / (500 * 1800 * 3600.0) * 1e6; math.Abs(mp.USDPer1MTokens-want) > 1e-12 {
		t.Fatalf("$ per 1M tokens %v, want %v", mp.USDPer1MTokens, want)
	}

	p, err = Make(Traffic{PeakRPS: 833, PeakToAverage: 1}, []Model{m}, 0.2)
	if err != nil {
		t.Fatal(err)
	}
	mp = p.Models[0]
	if mp.Replicas != 10 || mp.CapacityRPS != 1000 || math.Round(mp.PeakServed) != 833 {
		t.Fatalf("with 20%% headroom: %d replicas, capacity %v, serving a peak of %v; want 10, 1000, 833", mp.Replicas, mp.CapacityRPS, mp.PeakServed)
	}
	text := strings.Join(mp.Steps, "\n")
	for _, want := range []string{"ceil(833 req/s × (1 + headroom 0.2) ÷ goodput 100 req/s per replica [a sweep]) = 10", "1000 ÷ 1.2 = 833.3"} {
		if !strings.Contains(text, want) {
			t.Errorf("the arithmetic does not say %q:\n%s", want, text)
		}
	}
}

// TestWarmAndSleeping: the replicas a climb to the peak adds are kept
// asleep for what demand adds during one cold start, warm for the rest.
func TestWarmAndSleeping(t *testing.T) {
	m := Model{Name: "m", Share: 1, InputTokens: 100, OutputTokens: 100, Goodput: 10, Accelerators: 1, ColdStart: 30 * time.Second}
	for _, tc := range []struct {
		name            string
		ramp            time.Duration
		sleeping, warm  int
		peak, atAverage int
	}{
		{"a burst: everything asleep", 0, 6, 0, 10, 4},
		{"a slow climb: a cold start covers a fifth", 150 * time.Second, 2, 4, 10, 4},
		{"a climb slower than nothing", time.Hour, 1, 5, 10, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Make(Traffic{PeakRPS: 100, PeakToAverage: 2.5, Ramp: tc.ramp}, []Model{m}, 0)
			if err != nil {
				t.Fatal(err)
			}
			mp := p.Models[0]
			if mp.Replicas != tc.peak || mp.ReplicasAtAverage != tc.atAverage || mp.Sleeping != tc.sleeping || mp.Warm != tc.warm {
				t.Fatalf("replicas %d (%d at average), sleeping %d, warm %d; want %d (%d), %d, %d",
					mp.Replicas, mp.ReplicasAtAverage, mp.Sleeping, mp.Warm, tc.peak, tc.atAverage, tc.sleeping, tc.warm)
			}
		})
	}
}

func TestMakeRefuses(t *testing.T) {
	ok := Model{Name: "m", Share: 1, Goodput: 1, Accelerators: 1}
	for _, tc := range []struct {
		name     string
		traffic  Traffic
		models   []Model
		headroom float64
	}{
		{"no rate", Traffic{PeakToAverage: 1}, []Model{ok}, 0},
		{"peak below average", Traffic{PeakRPS: 1, PeakToAverage: 0.5}, []Model{ok}, 0},
		{"negative headroom", Traffic{PeakRPS: 1, PeakToAverage: 1}, []Model{ok}, -0.1},
		{"no model", Traffic{PeakRPS: 1, PeakToAverage: 1}, nil, 0},
		{"no goodput", Traffic{PeakRPS: 1, PeakToAverage: 1}, []Model{{Name: "m", Share: 1, Accelerators: 1}}, 0},
		{"shares not adding up", Traffic{PeakRPS: 1, PeakToAverage: 1}, []Model{{Name: "a", Share: 0.5, Goodput: 1, Accelerators: 1}}, 0},
	} {
		if _, err := Make(tc.traffic, tc.models, tc.headroom); err == nil {
			t.Errorf("%s: planned", tc.name)
		}
	}
}

// TestSimGoodput: the estimate's TPOT and TTFT at the rate it returns sit
// on the SLO's edge (the binding one), a tighter SLO gives a lower rate,
// and a profile that misses the SLO unloaded has none.
func TestSimGoodput(t *testing.T) {
	m := StepModel{Name: "8b", Overhead: 5500 * time.Microsecond, PrefillPerToken: 22 * time.Microsecond, DecodePerSeq: 10 * time.Microsecond,
		DecodePerContextToken: 50 * time.Nanosecond, MaxNumSeqs: 256, KVCapacityTokens: 491520}
	slo := load.SLO{TTFT: 800 * time.Millisecond, TPOT: 40 * time.Millisecond}
	rate, steps, err := SimGoodput(m, 1500, 300, slo)
	if err != nil {
		t.Fatal(err)
	}
	k := 10e-6 + 1650*50e-9
	tpot := 5.5e-3 / (1 - rate*1500*22e-6 - rate*300*k)
	if rate <= 0 || tpot > 0.040+1e-9 || tpot < 0.039 {
		t.Fatalf("rate %v gives TPOT %v s: want the 40 ms SLO binding\n%s", rate, tpot, strings.Join(steps, "\n"))
	}
	tighter, _, err := SimGoodput(m, 1500, 300, load.SLO{TTFT: slo.TTFT, TPOT: 20 * time.Millisecond})
	if err != nil || !(tighter < rate) {
		t.Fatalf("a 20 ms TPOT gives %v (%v), want less than %v", tighter, err, rate)
	}
	if _, _, err := SimGoodput(m, 1500, 300, load.SLO{TTFT: 10 * time.Millisecond, TPOT: slo.TPOT}); err == nil {
		t.Fatal("a 10 ms TTFT for 1,500-token prompts was met")
	}
}
