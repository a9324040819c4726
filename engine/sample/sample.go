// Package sample picks the next token from a row of logits.
package sample

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Params are a request's sampling settings, with OpenAI/vLLM meanings.
type Params struct {
	// Temperature 0 means greedy decoding.
	Temperature float64
	// TopK keeps the K most likely tokens; 0 keeps all.
	TopK int
	// TopP keeps the smallest set of tokens whose probability reaches P; 1 keeps all.
	TopP float64
	// Seed makes sampling reproducible.
	Seed uint64
}

// Validate names the first out-of-range parameter.
func (p Params) Validate() error {
	switch {
	case p.Temperature < 0 || math.IsNaN(p.Temperature) || p.Temperature > 100:
		return fmt.Errorf("temperature must be in [0, 100], got %v", p.Temperature)
	case p.TopK < 0:
		return fmt.Errorf("top_k must be >= 0, got %d", p.TopK)
	case !(p.TopP > 0 && p.TopP <= 1):
		return fmt.Errorf("top_p must be in (0, 1], got %v", p.TopP)
	}
	return nil
}

// Sampler draws tokens for one sequence. It is not safe for concurrent use.
type Sampler struct {
	p     Params
	rng   *rand.Rand
	cands []candidate
}

type candidate struct {
	id int32
	p  float64
}

// New returns a sampler seeded from p.Seed.
func New(p Params) *Sampler {
	return &Sampler{p: p, rng: rand.New(rand.NewPCG(p.Seed, 0x5704e))}
}

// Sample returns the next token id.
func (s *Sampler) Sample(logits []float32) int32 {
	if s.p.Temperature == 0 {
		return Argmax(logits)
	}
	c := s.cands[:0]
	for i, l := range logits {
		c = append(c, candidate{int32(i), float64(l) / s.p.Temperature})
	}
	slices.SortFunc(c, func(a, b candidate) int {
		switch {
		case a.p > b.p:
			return -1
		case a.p < b.p:
			return 1
		}
		return int(a.id - b.id)
	})
	if s.p.TopK > 0 && s.p.TopK < len(c) {
		c = c[:s.p.TopK]
	}
	top, sum := c[0].p, 0.0
	for i := range c {
		c[i].p = math.Exp(c[i].p - top)
		sum += c[i].p
	}
	cum := 0.0
	for i := range c {
		c[i].p /= sum
		cum += c[i].p
		if cum >= s.p.TopP {
			c = c[:i+1]
			break
		}
	}
	s.cands = c
	r := s.rng.Float64() * min(cum, 1)
	for _, cand := range c {
		r -= cand.p
		if r <= 0 {
			return cand.id
		}
	}
	return c[len(c)-1].id
}

// Argmax returns the index of the largest logit, the lowest on ties.
func Argmax(logits []float32) int32 {
	best := 0
	for i, l := range logits {
		if l > logits[best] {
			best = i
		}
	}
	return int32(best)
}
