package load

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Mix is the models a load's requests name: in turn (round-robin) when
// no weight was given, else drawn at random in proportion to the weights.
type Mix struct {
	// Names are the models, in the order given.
	Names []string
	// Weights, when set, are one per name (> 0): a request names Names[i]
	// with probability Weights[i] / sum(Weights). Nil means round-robin.
	Weights []float64
}

// OneModel is the mix of a single model.
func OneModel(name string) Mix { return Mix{Names: []string{name}} }

// ParseMix reads a,b,c (round-robin) or a=3,b=1 (weighted; a name without
// a weight in a weighted list weighs 1).
func ParseMix(s string) (Mix, error) {
	var m Mix
	weighted := false
	var weights []float64
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, w, hasWeight := strings.Cut(part, "=")
		name = strings.TrimSpace(name)
		weight := 1.0
		if hasWeight {
			weighted = true
			f, err := strconv.ParseFloat(strings.TrimSpace(w), 64)
			if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f <= 0 {
				return Mix{}, fmt.Errorf("model mix %q: the weight of %q is %q, want a number > 0", s, name, w)
			}
			weight = f
		}
		if name == "" {
			return Mix{}, fmt.Errorf("model mix %q: %q names no model", s, part)
		}
		if seen[name] {
			return Mix{}, fmt.Errorf("model mix %q: %q is named twice", s, name)
		}
		seen[name] = true
		m.Names = append(m.Names, name)
		weights = append(weights, weight)
	}
	if len(m.Names) == 0 {
		return Mix{}, fmt.Errorf("model mix %q: name at least one model", s)
	}
	if weighted {
		m.Weights = weights
	}
	return m, nil
}

// Shares are each model's expected fraction of the requests (they add up
// to 1).
func (m Mix) Shares() []float64 {
	out := make([]float64, len(m.Names))
	if m.Weights == nil {
		for i := range out {
			out[i] = 1 / float64(len(out))
		}
		return out
	}
	sum := 0.0
	for _, w := range m.Weights {
		sum += w
	}
	for i, w := range m.Weights {
		out[i] = w / sum
	}
	return out
}

// String is the mix as ParseMix reads it.
func (m Mix) String() string {
	parts := make([]string, len(m.Names))
	for i, n := range m.Names {
		parts[i] = n
		if m.Weights != nil {
			parts[i] += "=" + strconv.FormatFloat(m.Weights[i], 'g', -1, 64)
		}
	}
	return strings.Join(parts, ",")
}

// pick is the model of request i: round-robin, or drawn from rng by
// weight.
func (m Mix) pick(i int, rng *rand.Rand) string {
	switch {
	case len(m.Names) == 0:
		return ""
	case m.Weights == nil || len(m.Names) == 1:
		return m.Names[i%len(m.Names)]
	}
	sum := 0.0
	for _, w := range m.Weights {
		sum += w
	}
	x := rng.Float64() * sum
	for j, w := range m.Weights {
		if x < w {
			return m.Names[j]
		}
		x -= w
	}
	return m.Names[len(m.Names)-1]
}
