// Package load is `stoke bench load`: a load generator for any
// OpenAI-compatible server (stoke serve, a stoke engine, vLLM). It sends
// streamed completions with open-loop arrivals (Poisson, or gamma with a
// burstiness factor, as vLLM's bench does) or from a closed loop of
// concurrent clients, with input and output lengths drawn from
// distributions, and reports TTFT, TPOT, ITL and end-to-end latency,
// throughput and goodput under the names and definitions of
// `vllm bench serve`, so the numbers compare.
package load

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Dist is a distribution of lengths in tokens: fixed:N, uniform:A-B,
// normal:MEAN,SD or lognormal:MEDIAN,SIGMA. Draws are at least 1.
type Dist struct {
	kind string
	a, b float64
}

// ParseDist reads a Dist; a bare number is fixed.
func ParseDist(s string) (Dist, error) {
	kind, args, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok {
		kind, args = "fixed", kind
	}
	num := func(v string) (float64, error) {
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
			return 0, fmt.Errorf("length distribution %q: %q is not a number ≥ 0", s, v)
		}
		return f, nil
	}
	two := func(sep string) (float64, float64, error) {
		x, y, ok := strings.Cut(args, sep)
		if !ok {
			return 0, 0, fmt.Errorf("length distribution %q: want %s:A%sB", s, kind, sep)
		}
		a, err := num(x)
		if err != nil {
			return 0, 0, err
		}
		b, err := num(y)
		return a, b, err
	}
	d := Dist{kind: kind}
	var err error
	switch kind {
	case "fixed":
		d.a, err = num(args)
		if err == nil && d.a < 1 {
			err = fmt.Errorf("length distribution %q: a length is at least 1", s)
		}
	case "uniform":
		d.a, d.b, err = two("-")
		if err == nil && (d.a < 1 || d.b < d.a) {
			err = fmt.Errorf("length distribution %q: want 1 ≤ A ≤ B", s)
		}
	case "normal":
		d.a, d.b, err = two(",")
	case "lognormal":
		d.a, d.b, err = two(",")
		if err == nil && d.a <= 0 {
			err = fmt.Errorf("length distribution %q: the median must be positive", s)
		}
	default:
		err = fmt.Errorf("length distribution %q: want fixed:N, uniform:A-B, normal:MEAN,SD or lognormal:MEDIAN,SIGMA", s)
	}
	return d, err
}

// Draw returns one length.
func (d Dist) Draw(rng *rand.Rand) int {
	var v float64
	switch d.kind {
	case "uniform":
		v = d.a + rng.Float64()*(d.b-d.a+1)
	case "normal":
		v = d.a + rng.NormFloat64()*d.b
	case "lognormal":
		v = d.a * math.Exp(rng.NormFloat64()*d.b)
	default:
		v = d.a
	}
	return max(1, int(v))
}

// Mean is the distribution's mean (for reports and planning).
func (d Dist) Mean() float64 {
	switch d.kind {
	case "uniform":
		return (d.a + d.b) / 2
	case "lognormal":
		return d.a * math.Exp(d.b*d.b/2)
	}
	return d.a
}

// String is the distribution as ParseDist reads it.
func (d Dist) String() string {
	switch d.kind {
	case "uniform":
		return fmt.Sprintf("uniform:%g-%g", d.a, d.b)
	case "normal", "lognormal":
		return fmt.Sprintf("%s:%g,%g", d.kind, d.a, d.b)
	}
	return fmt.Sprintf("fixed:%g", d.a)
}

// interarrival draws the gap before the next request of an open loop at
// rate requests a second: exponential (Poisson arrivals) when burstiness
// is 1, else gamma with shape burstiness and the same mean, as vLLM's
// bench draws them (below 1 burstier, above 1 steadier).
func interarrival(rng *rand.Rand, rate, burstiness float64) float64 {
	if burstiness == 1 {
		return rng.ExpFloat64() / rate
	}
	return gamma(rng, burstiness) / (burstiness * rate)
}

// gamma draws Gamma(shape, 1) by Marsaglia and Tsang's method.
func gamma(rng *rand.Rand, shape float64) float64 {
	if shape < 1 {
		return gamma(rng, shape+1) * math.Pow(rng.Float64(), 1/shape)
	}
	d := shape - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := rng.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := rng.Float64()
		if u < 1-0.0331*x*x*x*x || math.Log(u) < 0.5*x*x+d*(1-v+math.Log(v)) {
			return d * v
		}
	}
}
