package sample

// Speculative decoding: a proposer guesses the next tokens (draft tokens),
// the model scores them all in one forward pass, and each position's draft
// is kept or replaced so that the tokens come out distributed exactly as
// Sample would draw them (rejection sampling, Leviathan et al. 2023, Chen
// et al. 2023). At temperature 0 the rule reduces to "keep the draft while
// it is the model's greedy pick", which gives the very tokens Sample does.

// TokenProb is one token and its probability under a Sampler's
// distribution.
type TokenProb struct {
	ID int32
	P  float64
}

// Distribution returns the distribution Sample draws its next token from
// (penalties, temperature, top-k, min-p and top-p applied, in Sample's
// order), as the tokens it may draw with their probabilities, in no
// particular order. A pick Sample decides without a draw (temperature 0,
// top-k 1) is the one token with probability 1. Like Sample it rewrites the
// penalised logits in place; it consumes no randomness.
func (s *Sampler) Distribution(logits []float32, prompt, output []int32) []TokenProb {
	if len(logits) == 0 {
		return nil
	}
	s.penalize(logits, prompt, output)
	c, z, best, random := s.candidates(logits)
	if !random {
		return []TokenProb{{ID: best, P: 1}}
	}
	out := make([]TokenProb, len(c))
	for i, x := range c {
		out[i] = TokenProb{ID: x.id, P: float64(x.key) / z}
	}
	return out
}

// Verify decides a draft token for the position logits belong to, as
// speculative decoding's rejection sampling does: with p the distribution
// Sample draws from here (prompt and output are the request's tokens
// before this position, the drafts accepted before it included) and q the
// distribution the draft was drawn from, the draft is accepted with
// probability min(1, p(draft)/q(draft)); when it is not, the token is drawn
// from max(0, p−q), normalised. The token returned is then distributed as p
// whatever q is. q holds a probability per vocabulary id; nil means the
// draft was chosen deterministically (q is one-hot on it: a prompt-lookup
// proposer, a greedy draft model), so it is accepted with probability
// p(draft) and a rejection draws from p without it.
//
// When Sample would decide without a draw (temperature 0, top-k 1), Verify
// returns exactly Sample's token, accepted when it equals the draft, and
// uses no randomness: greedy speculative decoding reproduces greedy
// decoding token for token. Logprobs are Sample's for the token returned.
// Like Sample, Verify rewrites the penalised logits in place.
func (s *Sampler) Verify(logits []float32, prompt, output []int32, draft int32, q []float32) (id int32, accepted bool, lp *Logprobs) {
	if len(logits) == 0 {
		return 0, false, nil
	}
	var lse float64
	if s.p.Logprobs >= 0 {
		lp, lse = s.rawLogprobs(logits)
	}
	s.penalize(logits, prompt, output)
	c, z, best, random := s.candidates(logits)
	if random {
		id, accepted = s.acceptOrResample(c, z, best, draft, q)
	} else {
		id, accepted = best, best == draft
	}
	if lp != nil {
		lp.Chosen = s.chosen(logits, id, lse)
	}
	return id, accepted, lp
}

// acceptOrResample is Verify's draw over the weighted candidates c (total
// weight z) of p.
func (s *Sampler) acceptOrResample(c []cand, z float64, best, draft int32, q []float32) (int32, bool) {
	pd := 0.0
	for _, x := range c {
		if x.id == draft {
			pd = float64(x.key) / z
			break
		}
	}
	qd := 1.0
	if q != nil {
		qd = qOf(q, draft)
	}
	// Accept with probability min(1, pd/qd): u·qd < pd, with u in [0, 1).
	// A draft q gave no mass (qd 0) is accepted whenever p allows it.
	if s.rng.Float64()*qd < pd {
		return draft, true
	}
	residual := func(x cand) float64 {
		qx := 0.0
		switch {
		case q != nil:
			qx = qOf(q, x.id)
		case x.id == draft:
			qx = 1
		}
		return max(0, float64(x.key)/z-qx)
	}
	total := 0.0
	for _, x := range c {
		total += residual(x)
	}
	if !(total > 0) {
		// Only reachable through rounding (p ≤ q everywhere means p = q,
		// and then the draft is always accepted): draw from p itself.
		return s.draw(c, z, best), false
	}
	r := s.rng.Float64() * total
	last := best
	for _, x := range c {
		w := residual(x)
		if w <= 0 {
			continue
		}
		r -= w
		last = x.id
		if r < 0 {
			return x.id, false
		}
	}
	return last, false // rounding left r at or above the last weight
}

// qOf is q's probability of id, 0 outside it or where it is not a
// probability.
func qOf(q []float32, id int32) float64 {
	if id < 0 || int(id) >= len(q) {
		return 0
	}
	v := float64(q[id])
	if !(v > 0) {
		return 0
	}
	return min(v, 1)
}
