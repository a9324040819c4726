// Package plan is the capacity planner: from a traffic model (peak request
// rate, peak-to-average, token lengths, SLOs) and what one replica of each
// model serves within the SLO (measured by a load sweep, or estimated from
// a sim profile's step-time model), it sizes a fleet: replicas and
// accelerators per model, dollars per hour and per million tokens,
// headroom, and the sleeping and warm runtimes that cover demand while a
// cold start is under way. Every figure comes with the arithmetic that
// gave it, so an operator can check it.
package plan

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Traffic is the demand a fleet must serve, all models together.
type Traffic struct {
	// PeakRPS is the peak request rate, requests a second.
	PeakRPS float64 `json:"peak_rps"`
	// PeakToAverage is the peak rate over the average one (≥ 1).
	PeakToAverage float64 `json:"peak_to_average"`
	// Ramp is how long demand takes to climb from its average to its peak
	// (0: at once, a burst).
	Ramp time.Duration `json:"ramp"`
}

// Model is one model's share of the traffic and what one of its replicas
// does.
type Model struct {
	Name string `json:"name"`
	// Share is the fraction of the requests it gets (the shares of all
	// models add up to 1).
	Share float64 `json:"share"`
	// InputTokens and OutputTokens are its requests' mean lengths.
	InputTokens  float64 `json:"input_tokens"`
	OutputTokens float64 `json:"output_tokens"`
	// Goodput is the request rate one replica serves with at least 90% of
	// requests within the SLO; GoodputSource says where it comes from.
	Goodput       float64 `json:"goodput_rps"`
	GoodputSource string  `json:"goodput_source"`
	// Accelerators is the GPUs one replica holds.
	Accelerators int `json:"accelerators_per_replica"`
	// HourlyUSD is one replica's cost an hour.
	HourlyUSD float64 `json:"replica_hourly_usd"`
	// ColdStart is how long a cold start from a warm runtime takes (t2/t3,
	// as `stoke bench cold-start` measures), Wake a sleeping replica's
	// (t1).
	ColdStart time.Duration `json:"cold_start"`
	Wake      time.Duration `json:"wake"`
}

// ModelPlan is one model's part of a plan.
type ModelPlan struct {
	Model
	PeakRPS, AverageRPS float64
	// PrefillTokensPerSec and DecodeTokensPerSec are its token rates at
	// peak.
	PrefillTokensPerSec float64 `json:"prefill_tokens_per_sec"`
	DecodeTokensPerSec  float64 `json:"decode_tokens_per_sec"`
	// Replicas serve the peak with the headroom; ReplicasAtAverage the
	// average (what the scaler holds most of the time).
	Replicas          int `json:"replicas"`
	ReplicasAtAverage int `json:"replicas_at_average"`
	// CapacityRPS is Replicas × Goodput; PeakServed the peak it serves
	// with the headroom kept (CapacityRPS ÷ (1 + headroom)).
	CapacityRPS  float64 `json:"capacity_rps"`
	PeakServed   float64 `json:"peak_served_rps"`
	Accelerators int     `json:"accelerators"`
	// HourlyUSDPeak and HourlyUSDAverage are the fleet's cost an hour at
	// peak and average; USDPer1MTokens the cost of a million tokens
	// (prompt and completion) at the average.
	HourlyUSDPeak    float64 `json:"hourly_usd_peak"`
	HourlyUSDAverage float64 `json:"hourly_usd_average"`
	USDPer1MTokens   float64 `json:"usd_per_1m_tokens"`
	// Sleeping is the replicas to keep asleep (woken in t1) for the climb
	// a cold start's lead time cannot cover; Warm the blank runtimes (t2
	// with the node cache) for the rest of the climb to the peak.
	Sleeping int `json:"sleeping"`
	Warm     int `json:"warm"`
	// Steps is the arithmetic, one line each.
	Steps []string `json:"steps"`
}

// Plan is a fleet sized for the traffic.
type Plan struct {
	Traffic  Traffic     `json:"traffic"`
	Headroom float64     `json:"headroom"`
	Models   []ModelPlan `json:"models"`
	// The totals over the models.
	Replicas         int     `json:"replicas"`
	Accelerators     int     `json:"accelerators"`
	HourlyUSDPeak    float64 `json:"hourly_usd_peak"`
	HourlyUSDAverage float64 `json:"hourly_usd_average"`
}

// Make sizes a fleet for traffic split over models, keeping headroom (a
// fraction: 0.2 plans for 20% more than the peak).
func Make(traffic Traffic, models []Model, headroom float64) (Plan, error) {
	switch {
	case !(traffic.PeakRPS > 0) || math.IsInf(traffic.PeakRPS, 0):
		return Plan{}, fmt.Errorf("plan: the peak rate must be positive, got %v", traffic.PeakRPS)
	case traffic.PeakToAverage < 1 || math.IsInf(traffic.PeakToAverage, 0):
		return Plan{}, fmt.Errorf("plan: peak-to-average must be at least 1, got %v", traffic.PeakToAverage)
	case headroom < 0 || math.IsNaN(headroom) || headroom > 10:
		return Plan{}, fmt.Errorf("plan: headroom must be in [0, 10], got %v", headroom)
	case len(models) == 0:
		return Plan{}, errors.New("plan: no model")
	}
	shares := 0.0
	for _, m := range models {
		if !(m.Share > 0) || !(m.Goodput > 0) || m.InputTokens < 0 || m.OutputTokens < 0 || m.Accelerators < 1 || m.HourlyUSD < 0 {
			return Plan{}, fmt.Errorf("plan: model %s: share and goodput must be positive, lengths and cost not negative, accelerators at least 1 (%+v)", m.Name, m)
		}
		shares += m.Share
	}
	if math.Abs(shares-1) > 1e-6 {
		return Plan{}, fmt.Errorf("plan: the models' shares add up to %v, not 1", shares)
	}
	p := Plan{Traffic: traffic, Headroom: headroom}
	for _, m := range models {
		mp := sizeModel(traffic, m, headroom)
		p.Models = append(p.Models, mp)
		p.Replicas += mp.Replicas
		p.Accelerators += mp.Accelerators
		p.HourlyUSDPeak += mp.HourlyUSDPeak
		p.HourlyUSDAverage += mp.HourlyUSDAverage
	}
	return p, nil
}

func sizeModel(t Traffic, m Model, headroom float64) ModelPlan {
	mp := ModelPlan{Model: m, PeakRPS: t.PeakRPS * m.Share}
	mp.AverageRPS = mp.PeakRPS / t.PeakToAverage
	say := func(format string, args ...any) { mp.Steps = append(mp.Steps, fmt.Sprintf(format, args...)) }
	if m.Share != 1 {
		say("peak rate: %s req/s × share %s = %s req/s", num(t.PeakRPS), num(m.Share), num(mp.PeakRPS))
	}
	say("average rate: %s req/s ÷ peak-to-average %s = %s req/s", num(mp.PeakRPS), num(t.PeakToAverage), num(mp.AverageRPS))
	mp.PrefillTokensPerSec = mp.PeakRPS * m.InputTokens
	mp.DecodeTokensPerSec = mp.PeakRPS * m.OutputTokens
	say("prefill at peak: %s req/s × %s input tokens = %s tokens/s", num(mp.PeakRPS), num(m.InputTokens), num(mp.PrefillTokensPerSec))
	say("decode at peak: %s req/s × %s output tokens = %s tokens/s", num(mp.PeakRPS), num(m.OutputTokens), num(mp.DecodeTokensPerSec))
	need := func(rate float64) int {
		if rate <= 0 {
			return 0
		}
		return int(math.Ceil(rate*(1+headroom)/m.Goodput - 1e-9))
	}
	mp.Replicas = need(mp.PeakRPS)
	say("replicas: ceil(%s req/s × (1 + headroom %s) ÷ goodput %s req/s per replica [%s]) = %d",
		num(mp.PeakRPS), num(headroom), num(m.Goodput), m.GoodputSource, mp.Replicas)
	mp.CapacityRPS = float64(mp.Replicas) * m.Goodput
	mp.PeakServed = mp.CapacityRPS / (1 + headroom)
	say("capacity: %d × %s = %s req/s, which serves a peak of %s ÷ %s = %s req/s with the headroom kept",
		mp.Replicas, num(m.Goodput), num(mp.CapacityRPS), num(mp.CapacityRPS), num(1+headroom), num(mp.PeakServed))
	mp.ReplicasAtAverage = max(1, need(mp.AverageRPS))
	say("replicas at the average: ceil(%s × %s ÷ %s) = %d", num(mp.AverageRPS), num(1+headroom), num(m.Goodput), mp.ReplicasAtAverage)
	mp.Accelerators = mp.Replicas * m.Accelerators
	say("accelerators: %d replicas × %d = %d", mp.Replicas, m.Accelerators, mp.Accelerators)
	mp.HourlyUSDPeak = float64(mp.Replicas) * m.HourlyUSD
	mp.HourlyUSDAverage = float64(mp.ReplicasAtAverage) * m.HourlyUSD
	say("cost: %d × $%s = $%s/hour at peak, %d × $%s = $%s/hour at the average",
		mp.Replicas, num(m.HourlyUSD), num(mp.HourlyUSDPeak), mp.ReplicasAtAverage, num(m.HourlyUSD), num(mp.HourlyUSDAverage))
	if tokens := mp.AverageRPS * (m.InputTokens + m.OutputTokens) * 3600; tokens > 0 {
		mp.USDPer1MTokens = mp.HourlyUSDAverage / tokens * 1e6
		say("per 1M tokens: $%s/hour ÷ (%s req/s × %s tokens × 3600 s) × 1e6 = $%s",
			num(mp.HourlyUSDAverage), num(mp.AverageRPS), num(m.InputTokens+m.OutputTokens), num(mp.USDPer1MTokens))
	}
	// The climb from the average to the peak: what demand adds while a
	// cold start is under way must already be loaded (asleep); the rest
	// can come from warm runtimes.
	extra := max(0, mp.Replicas-mp.ReplicasAtAverage)
	rise := mp.PeakRPS - mp.AverageRPS
	covered := 1.0
	if t.Ramp > 0 {
		covered = min(1, m.ColdStart.Seconds()/t.Ramp.Seconds())
	}
	mp.Sleeping = min(extra, need(rise*covered))
	mp.Warm = extra - mp.Sleeping
	ramp := "at once"
	if t.Ramp > 0 {
		ramp = "over " + t.Ramp.String()
	}
	say("the climb to the peak (%s) adds %s req/s; during one cold start (%v) it adds %s × %s = %s req/s: ceil(%s × %s ÷ %s) = %d sleeping (woken in %v), the other %d − %d = %d warm",
		ramp, num(rise), m.ColdStart, num(rise), num(covered), num(rise*covered), num(rise*covered), num(1+headroom), num(m.Goodput),
		mp.Sleeping, m.Wake, extra, mp.Sleeping, mp.Warm)
	return mp
}

// num writes a figure for the arithmetic: integers as such, others with
// up to four significant digits.
func num(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.4g", v)
}
