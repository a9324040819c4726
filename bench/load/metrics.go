package load

import (
	"math"
	"slices"
	"strconv"
	"time"
)

// Result is one request as the load generator saw it: when it was sent,
// when each event that carried text arrived, how it ended.
type Result struct {
	// Sent is when the request left; Events the arrival times of the
	// stream's events that carried generated text, in order; End when
	// the answer ended.
	Sent   time.Time
	Events []time.Time
	End    time.Time
	// Model is the model the request named.
	Model string
	// InputTokens and OutputTokens are the usage the server reported
	// (OutputTokens falls back to the events counted).
	InputTokens, OutputTokens int
	// Status is the HTTP status (0 when the request never got one); Code
	// the error's code, for failures.
	Status int
	Code   string
}

// OK reports whether the request succeeded with at least one token.
func (r Result) OK() bool { return r.Status == 200 && r.Code == "" && len(r.Events) > 0 }

// TTFT is the time to the first token: from sending to the first event
// with text.
func (r Result) TTFT() time.Duration { return r.Events[0].Sub(r.Sent) }

// E2E is the request's whole latency.
func (r Result) E2E() time.Duration { return r.End.Sub(r.Sent) }

// TPOT is the time per output token after the first, as vLLM defines it:
// (E2E − TTFT) / (output tokens − 1); ok is false for a one-token answer.
func (r Result) TPOT() (d time.Duration, ok bool) {
	if r.OutputTokens < 2 {
		return 0, false
	}
	return (r.E2E() - r.TTFT()) / time.Duration(r.OutputTokens-1), true
}

// ITLs are the gaps between successive events with text (vLLM's
// inter-token latencies, one per event after the first).
func (r Result) ITLs() []time.Duration {
	out := make([]time.Duration, 0, max(0, len(r.Events)-1))
	for i := 1; i < len(r.Events); i++ {
		out = append(out, r.Events[i].Sub(r.Events[i-1]))
	}
	return out
}

// SLO is what a request must meet to count towards goodput (zero: no
// bound).
type SLO struct {
	TTFT, TPOT, E2E time.Duration
}

// meets reports whether r is within the SLO.
func (s SLO) meets(r Result) bool {
	if s.TTFT > 0 && r.TTFT() > s.TTFT || s.E2E > 0 && r.E2E() > s.E2E {
		return false
	}
	if tpot, ok := r.TPOT(); ok && s.TPOT > 0 && tpot > s.TPOT {
		return false
	}
	return true
}

// Stats are a latency's summary in milliseconds.
type Stats struct {
	Mean   float64 `json:"mean"`
	Median float64 `json:"median"`
	Std    float64 `json:"std"`
	P90    float64 `json:"p90"`
	P95    float64 `json:"p95"`
	P99    float64 `json:"p99"`
}

// statsOf summarises ds (zero for none).
func statsOf(ds []time.Duration) Stats {
	if len(ds) == 0 {
		return Stats{}
	}
	ms := make([]float64, len(ds))
	sum := 0.0
	for i, d := range ds {
		ms[i] = float64(d) / float64(time.Millisecond)
		sum += ms[i]
	}
	slices.Sort(ms)
	mean := sum / float64(len(ms))
	variance := 0.0
	for _, v := range ms {
		variance += (v - mean) * (v - mean)
	}
	return Stats{Mean: mean, Median: percentile(ms, 50), Std: math.Sqrt(variance / float64(len(ms))),
		P90: percentile(ms, 90), P95: percentile(ms, 95), P99: percentile(ms, 99)}
}

// percentile is the p-th percentile of sorted by linear interpolation
// between closest ranks (numpy's default, which vLLM's bench uses).
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 1 {
		return sorted[0]
	}
	pos := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}

// Report is a run's summary, under `vllm bench serve`'s names where it
// has them. RequestGoodput is the rate of requests that completed within
// the SLO (DistServe's goodput, as vLLM's bench computes it);
// SLOAttainment the fraction of all requests sent, failed ones included,
// that did.
type Report struct {
	Duration             float64        `json:"duration"`
	Completed            int            `json:"completed"`
	Failed               int            `json:"failed"`
	Errors               map[string]int `json:"errors"`
	TotalInputTokens     int            `json:"total_input_tokens"`
	TotalOutputTokens    int            `json:"total_output_tokens"`
	RequestThroughput    float64        `json:"request_throughput"`
	RequestGoodput       float64        `json:"request_goodput"`
	SLOAttainment        float64        `json:"slo_attainment"`
	OutputThroughput     float64        `json:"output_throughput"`
	TotalTokenThroughput float64        `json:"total_token_throughput"`
	TTFT                 Stats          `json:"ttft_ms"`
	TPOT                 Stats          `json:"tpot_ms"`
	ITL                  Stats          `json:"itl_ms"`
	E2E                  Stats          `json:"e2el_ms"`
	// Models breaks the run down by the model requests named (each in
	// this shape, over the whole run's duration; absent within itself).
	Models map[string]Report `json:"models,omitempty"`
}

// Summarize reports results of a run that lasted duration, goodput
// against slo, with a breakdown by model when the results name models.
func Summarize(results []Result, duration time.Duration, slo SLO) Report {
	rep := summarize(results, duration, slo)
	byModel := map[string][]Result{}
	for _, r := range results {
		if r.Model != "" {
			byModel[r.Model] = append(byModel[r.Model], r)
		}
	}
	if len(byModel) > 0 {
		rep.Models = make(map[string]Report, len(byModel))
		for m, rs := range byModel {
			rep.Models[m] = summarize(rs, duration, slo)
		}
	}
	return rep
}

// summarize is Summarize without the breakdown.
func summarize(results []Result, duration time.Duration, slo SLO) Report {
	rep := Report{Duration: duration.Seconds(), Errors: map[string]int{}}
	var ttft, tpot, itl, e2e []time.Duration
	good := 0
	for _, r := range results {
		if !r.OK() {
			rep.Failed++
			code := r.Code
			if code == "" {
				code = "status_" + strconv.Itoa(r.Status)
			}
			rep.Errors[code]++
			continue
		}
		rep.Completed++
		rep.TotalInputTokens += r.InputTokens
		rep.TotalOutputTokens += r.OutputTokens
		ttft = append(ttft, r.TTFT())
		e2e = append(e2e, r.E2E())
		if d, ok := r.TPOT(); ok {
			tpot = append(tpot, d)
		}
		itl = append(itl, r.ITLs()...)
		if slo.meets(r) {
			good++
		}
	}
	if n := rep.Completed + rep.Failed; n > 0 {
		rep.SLOAttainment = float64(good) / float64(n)
	}
	if s := duration.Seconds(); s > 0 {
		rep.RequestThroughput = float64(rep.Completed) / s
		rep.RequestGoodput = float64(good) / s
		rep.OutputThroughput = float64(rep.TotalOutputTokens) / s
		rep.TotalTokenThroughput = float64(rep.TotalInputTokens+rep.TotalOutputTokens) / s
	}
	rep.TTFT, rep.TPOT, rep.ITL, rep.E2E = statsOf(ttft), statsOf(tpot), statsOf(itl), statsOf(e2e)
	return rep
}
