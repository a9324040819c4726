package plan

import (
	"fmt"
	"math"
	"time"

	"github.com/stokehq/stoke/bench/load"
)

// StepModel is a replica's step-time model, as a sim profile gives it
// (engine/sim.Profile): a step costs Overhead + P·PrefillPerToken +
// D·DecodePerSeq + C·DecodePerContextToken for P prompt tokens, D decoding
// sequences and C KV tokens read.
type StepModel struct {
	Name, Hardware        string
	Overhead              time.Duration
	PrefillPerToken       time.Duration
	DecodePerSeq          time.Duration
	DecodePerContextToken time.Duration
	MaxNumSeqs            int
	KVCapacityTokens      int
}

// SimGoodput estimates, from a sim profile's step-time model, the request
// rate λ one replica sustains within slo at mean lengths in and out: the
// steady state of continuous batching, mean values throughout.
//
// At λ, prefill takes the fraction f = λ·in·prefill_per_token of the
// replica's time; D = λ·out·TPOT sequences decode at once (Little's law),
// each reading in + out/2 KV tokens, so a step takes overhead + D·k with
// k = decode_per_seq + (in + out/2)·decode_per_context_token, and
// TPOT = overhead / (1 − f − λ·out·k). A prompt waits about one step and is
// computed in the next: TTFT = TPOT + overhead + in·prefill_per_token. The
// rate is the largest λ at which both are within the SLO and D fits the
// profile's max_num_seqs and KV capacity (a zero bound of slo is none). It returns the rate and the
// arithmetic; a load sweep against real engines measures the same thing
// and is the figure to trust.
func SimGoodput(p StepModel, in, out float64, slo load.SLO) (float64, []string, error) {
	if in < 0 || !(out >= 1) {
		return 0, nil, fmt.Errorf("sim goodput: want at least one output token and no negative lengths, got %v in, %v out", in, out)
	}
	o := p.Overhead.Seconds()
	pp := p.PrefillPerToken.Seconds()
	k := p.DecodePerSeq.Seconds() + (in+out/2)*p.DecodePerContextToken.Seconds()
	tpot := func(rate float64) float64 {
		den := 1 - rate*in*pp - rate*out*k
		if den <= 0 {
			return math.Inf(1)
		}
		return o / den
	}
	bound := func(d time.Duration) float64 { // zero: no bound
		if d <= 0 {
			return math.Inf(1)
		}
		return d.Seconds()
	}
	fits := func(rate float64) bool {
		t := tpot(rate)
		d := rate * out * t
		return t <= bound(slo.TPOT) && t+o+in*pp <= bound(slo.TTFT) &&
			d <= float64(p.MaxNumSeqs) && d*(in+out) <= float64(p.KVCapacityTokens)
	}
	steps := []string{
		fmt.Sprintf("sim profile %s (%s): step = %v + P·%v + D·%v + C·%v", p.Name, p.Hardware, p.Overhead, p.PrefillPerToken, p.DecodePerSeq, p.DecodePerContextToken),
		fmt.Sprintf("k = %v + (%s + %s/2) × %v = %.4g ms per decoding sequence per step", p.DecodePerSeq, num(in), num(out), p.DecodePerContextToken, k*1e3),
	}
	if !fits(0) {
		steps = append(steps, fmt.Sprintf("even one request alone misses the SLO: TTFT %.4g ms, TPOT %.4g ms", (2*o+in*pp)*1e3, o*1e3))
		return 0, steps, fmt.Errorf("sim goodput: profile %s cannot meet TTFT %v and TPOT %v at %v input tokens even unloaded", p.Name, slo.TTFT, slo.TPOT, in)
	}
	lo, hi := 0.0, 1/(in*pp+out*k) // past hi the replica never keeps up
	for range 100 {
		mid := (lo + hi) / 2
		if fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	t := tpot(lo)
	steps = append(steps,
		fmt.Sprintf("TPOT(λ) = %v ÷ (1 − λ·%s·%v − λ·%s·k); TTFT(λ) = TPOT + %v + %s·%v", p.Overhead, num(in), p.PrefillPerToken, num(out), p.Overhead, num(in), p.PrefillPerToken),
		fmt.Sprintf("largest λ within TTFT %v and TPOT %v (and %d sequences, %d KV tokens): %.4g req/s, at TPOT %.4g ms, TTFT %.4g ms, %.4g sequences decoding",
			slo.TTFT, slo.TPOT, p.MaxNumSeqs, p.KVCapacityTokens, lo, t*1e3, (t+o+in*pp)*1e3, lo*out*t))
	return lo, steps, nil
}
