// Package sample turns a row of logits into the next token the way
// OpenAI/vLLM clients expect (greedy, temperature, top-k, top-p, min-p,
// seeds, presence/frequency/repetition penalties, logprobs) and watches the
// streamed text for stop strings.
package sample

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// MaxLogprobs is the largest number of alternatives Params.Logprobs may ask for.
const MaxLogprobs = 20

// Params are a request's sampling settings, with OpenAI/vLLM meanings.
type Params struct {
	// Temperature divides the logits before the softmax; 0 (or anything
	// below 1e-5, as in vLLM) means greedy.
	Temperature float64
	// TopK keeps the K most likely tokens; 0 (or -1, as vLLM clients send) keeps all.
	TopK int
	// TopP keeps the smallest set of most likely tokens whose probability
	// reaches P, after top-k and min-p; 1 keeps all.
	TopP float64
	// MinP keeps tokens whose probability is at least MinP times the most
	// likely token's (after temperature); 0 turns it off.
	MinP float64
	// Seed makes the draws reproducible: same seed, same logits, same tokens.
	Seed uint64
	// PresencePenalty is subtracted from the logit of every token that
	// already appears in the output (OpenAI semantics), in [-2, 2].
	PresencePenalty float64
	// FrequencyPenalty is subtracted once per earlier occurrence of the token
	// in the output (OpenAI semantics), in [-2, 2].
	FrequencyPenalty float64
	// RepetitionPenalty (vLLM/Hugging Face semantics) applies to every token
	// seen in the prompt or output: positive logits are divided by it,
	// negative ones multiplied. Above 1 discourages repeats; 0 or 1 is off.
	RepetitionPenalty float64
	// Logprobs is how many most likely alternatives to report with each
	// token (0..MaxLogprobs); 0 reports only the chosen token's logprob and
	// -1 reports nothing.
	Logprobs int
}

// FieldError is the error Validate returns: which OpenAI request field is
// out of range and why, so a server can fill the error's "param".
type FieldError struct {
	Field  string // OpenAI/vLLM request field name, e.g. "top_p"
	Reason string // e.g. "must be in (0, 1], got 2"
}

// Error reads like "top_p must be in (0, 1], got 2".
func (e *FieldError) Error() string { return e.Field + " " + e.Reason }

// Validate reports the first out-of-range parameter as a *FieldError naming
// its OpenAI field.
func (p Params) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case !(p.Temperature >= 0 && p.Temperature <= 100):
		return bad("temperature", "must be in [0, 100], got %v", p.Temperature)
	case p.TopK < -1:
		return bad("top_k", "must be >= 0 (0 or -1 keeps all tokens), got %d", p.TopK)
	case !(p.TopP > 0 && p.TopP <= 1):
		return bad("top_p", "must be in (0, 1], got %v", p.TopP)
	case !(p.MinP >= 0 && p.MinP <= 1):
		return bad("min_p", "must be in [0, 1], got %v", p.MinP)
	case !(p.PresencePenalty >= -2 && p.PresencePenalty <= 2):
		return bad("presence_penalty", "must be in [-2, 2], got %v", p.PresencePenalty)
	case !(p.FrequencyPenalty >= -2 && p.FrequencyPenalty <= 2):
		return bad("frequency_penalty", "must be in [-2, 2], got %v", p.FrequencyPenalty)
	case !(p.RepetitionPenalty >= 0 && p.RepetitionPenalty <= math.MaxFloat64):
		return bad("repetition_penalty", "must be > 0 (0 or 1 turns it off), got %v", p.RepetitionPenalty)
	case p.Logprobs < -1 || p.Logprobs > MaxLogprobs:
		return bad("logprobs", "must be in [0, %d], got %d", MaxLogprobs, p.Logprobs)
	}
	return nil
}

// TokenLogprob is one token and its log-probability under the model.
type TokenLogprob struct {
	ID      int32
	Logprob float32
}

// Logprobs describe one sampled position. Both come from the model's raw
// distribution (log-softmax of the logits before penalties, temperature or
// truncation), as vLLM and OpenAI report them.
type Logprobs struct {
	// Chosen is the sampled token.
	Chosen TokenLogprob
	// Top holds the Params.Logprobs most likely tokens, most likely first
	// (lowest id first on ties).
	Top []TokenLogprob
}

// Sampler draws the tokens of one request. It keeps reusable buffers, so
// steady-state calls allocate nothing but the Logprobs they return. It is
// not safe for concurrent use.
type Sampler struct {
	p   Params
	rng *rand.Rand

	// Penalty bookkeeping: slots[t] is valid for this call when
	// slots[t].gen == gen, which spares clearing a vocabulary-sized slice.
	slots   []slot
	gen     uint32
	touched []int32   // tokens whose logit the penalties rewrote
	orig    []float32 // their logits before that, for Logprobs.Chosen

	cands []cand    // candidate tokens of the current draw
	hist  []float64 // top-p probability mass per weight bucket
	edge  []cand    // top-p candidates being ranked
	top   []cand    // logprob alternatives being collected
}

type slot struct {
	gen uint32
	cnt int32 // occurrences in the output
}

// New returns a sampler for one request, seeded from p.Seed. p should have
// passed Validate; out-of-range values do not make Sample fail, they mostly
// turn their setting off.
func New(p Params) *Sampler {
	return &Sampler{p: p, rng: rand.New(rand.NewPCG(p.Seed, 0x5704e))}
}

// Params returns the settings the sampler was made with.
func (s *Sampler) Params() Params { return s.p }

// Sample picks the next token from logits, the model's output row for this
// request. prompt and output are the request's tokens so far, used by the
// penalties; ids outside the vocabulary are ignored.
//
// Sample modifies logits in place: the penalties rewrite the logits of the
// tokens they apply to (temperature and truncation leave logits alone).
// With Temperature 0 the result is Argmax of the penalised logits. When
// sampling, tokens less likely than e^-30 times the most likely one are
// never drawn. The returned Logprobs is nil when Params.Logprobs < 0 or
// logits is empty.
func (s *Sampler) Sample(logits []float32, prompt, output []int32) (int32, *Logprobs) {
	if len(logits) == 0 {
		return 0, nil
	}
	var lp *Logprobs
	var lse float64
	if s.p.Logprobs >= 0 {
		lp, lse = s.rawLogprobs(logits)
	}
	s.penalize(logits, prompt, output)
	id := s.pick(logits)
	if lp != nil {
		lp.Chosen = s.chosen(logits, id, lse)
	}
	return id, lp
}

// chosen is the raw logprob of token id, whose logit in logits the
// penalties may have rewritten, given the raw logits' log-sum-exp.
func (s *Sampler) chosen(logits []float32, id int32, lse float64) TokenLogprob {
	raw := logits[id]
	for i, t := range s.touched {
		if t == id {
			raw = s.orig[i]
			break
		}
	}
	return TokenLogprob{ID: id, Logprob: float32(float64(raw) - lse)}
}

// rawLogprobs returns the top alternatives of the unmodified logits and
// their log-sum-exp, from which any token's logprob follows.
func (s *Sampler) rawLogprobs(logits []float32) (*Logprobs, float64) {
	return rawLogprobs(&s.top, logits, s.p.Logprobs)
}

// rawLogprobs returns the k most likely tokens of logits (at most
// MaxLogprobs) with their logprobs, and the logits' log-sum-exp, from which
// any token's logprob follows as float32(float64(logit) - lse). top is a
// reusable buffer. The Sampler and the Scorer share it, so that a token
// reports the same logprob whether it was sampled or scored.
func rawLogprobs(top *[]cand, logits []float32, k int) (*Logprobs, float64) {
	n := min(k, MaxLogprobs, len(logits))
	m := float64(logits[Argmax(logits)])
	best := (*top)[:0]
	if n > 0 {
		best = topK(best, logits, n, float32(math.Inf(-1)))
		// Only -Inf and NaN logits are left out; report -Inf ones too.
		for i := 0; len(best) < n && i < len(logits); i++ {
			if l := logits[i]; math.IsInf(float64(l), -1) {
				best = append(best, cand{id: int32(i), key: l})
			}
		}
		*top = best
	}
	lse := m + math.Log(sumExp(logits, m))
	lp := &Logprobs{Top: make([]TokenLogprob, len(best))}
	for i, c := range best {
		lp.Top[i] = TokenLogprob{ID: c.id, Logprob: float32(float64(c.key) - lse)}
	}
	return lp, lse
}

// Scorer reports the logprob of a given token, with the most likely
// alternatives, from a row of logits: teacher-forced scoring, as for the
// tokens of a prompt. Its numbers are the ones Sampler reports for a token
// it samples from the same row (the log-softmax of the raw logits, summed
// in float64). The zero Scorer is ready; it keeps a reusable buffer and is
// not safe for concurrent use.
type Scorer struct {
	top []cand
}

// Score returns the logprob of token id under logits as Logprobs.Chosen and
// the k most likely tokens (0..MaxLogprobs) as Logprobs.Top. logits is
// left as it is. An id outside logits scores -Inf.
func (s *Scorer) Score(logits []float32, id int32, k int) Logprobs {
	if len(logits) == 0 {
		return Logprobs{Chosen: TokenLogprob{ID: id, Logprob: float32(math.Inf(-1))}, Top: []TokenLogprob{}}
	}
	lp, lse := rawLogprobs(&s.top, logits, k)
	chosen := float32(math.Inf(-1))
	if id >= 0 && int(id) < len(logits) {
		chosen = float32(float64(logits[id]) - lse)
	}
	lp.Chosen = TokenLogprob{ID: id, Logprob: chosen}
	return *lp
}

// sumExp is the sum of e^(l-m) over logits, m their maximum, with four
// chains of additions so they overlap.
func sumExp(logits []float32, m float64) float64 {
	if math.IsInf(m, 0) || math.IsNaN(m) {
		return 0
	}
	e := func(l float32) float64 {
		if x := float64(l) - m; x >= -708 {
			return expInRange(x)
		}
		return 0
	}
	var z0, z1, z2, z3 float64
	i := 0
	for ; i+4 <= len(logits); i += 4 {
		b := logits[i : i+4 : i+4]
		z0 += e(b[0])
		z1 += e(b[1])
		z2 += e(b[2])
		z3 += e(b[3])
	}
	for ; i < len(logits); i++ {
		z0 += e(logits[i])
	}
	return (z0 + z1) + (z2 + z3)
}

// penalize applies the repetition, frequency and presence penalties, in
// vLLM's order, to the logits of tokens seen before, in
// O(len(prompt)+len(output)).
func (s *Sampler) penalize(logits []float32, prompt, output []int32) {
	s.touched, s.orig = s.touched[:0], s.orig[:0]
	rep := s.p.RepetitionPenalty
	useRep := rep > 0 && rep != 1 && rep <= math.MaxFloat64
	freq, pres := finite(s.p.FrequencyPenalty), finite(s.p.PresencePenalty)
	if !useRep && freq == 0 && pres == 0 {
		return
	}
	if !useRep {
		prompt = nil // only the output's tokens are penalised
	}
	vocab := len(logits)
	if len(s.slots) < vocab {
		s.slots = make([]slot, vocab)
		s.gen = 0
	}
	s.gen++
	if s.gen == 0 {
		clear(s.slots)
		s.gen = 1
	}
	for _, t := range output {
		if t < 0 || int(t) >= vocab {
			continue
		}
		sl := &s.slots[t]
		if sl.gen != s.gen {
			*sl = slot{gen: s.gen}
			s.touched = append(s.touched, t)
		}
		sl.cnt++
	}
	for _, t := range prompt {
		if t < 0 || int(t) >= vocab {
			continue
		}
		if sl := &s.slots[t]; sl.gen != s.gen {
			*sl = slot{gen: s.gen}
			s.touched = append(s.touched, t)
		}
	}
	for _, t := range s.touched {
		l := logits[t]
		s.orig = append(s.orig, l)
		x := float64(l)
		if useRep {
			if x > 0 {
				x /= rep
			} else {
				x *= rep
			}
		}
		if c := s.slots[t].cnt; c > 0 {
			x -= freq*float64(c) + pres
		}
		logits[t] = float32(x)
	}
}

func finite(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return 0
	}
	return x
}

// tailLog drops tokens whose probability is below e^tailLog of the most
// likely one's before drawing: at most 128k·e^-30 ≈ 1e-8 of the mass, and it
// bounds the weights to normal float32 values and the top-p histogram.
const tailLog = -30

// minTemperature is the smallest temperature that samples; below it (as
// in vLLM) decoding is greedy, which also keeps 1/T finite.
const minTemperature = 1e-5

// pick chooses a token from the penalised logits.
func (s *Sampler) pick(logits []float32) int32 {
	c, z, best, random := s.candidates(logits)
	if !random {
		return best
	}
	return s.draw(c, z, best)
}

// draw picks one of the weighted candidates c (total weight z) at random;
// best is the answer when rounding leaves the draw past the last weight.
func (s *Sampler) draw(c []cand, z float64, best int32) int32 {
	r := s.rng.Float64() * z
	for _, x := range c {
		r -= float64(x.key)
		if r < 0 {
			return x.id
		}
	}
	return best // rounding left r at or above the last weight
}

// candidates is the distribution pick draws from, the penalised logits
// given: the tokens c it may draw, each with its weight (its probability
// times z). When random is false the pick is decided without a draw (greedy,
// top-k 1, no finite logit) and it is best, the most likely token, whatever
// c holds. The candidates live in a buffer of the Sampler that the next
// call reuses.
func (s *Sampler) candidates(logits []float32) (c []cand, z float64, best int32, random bool) {
	t := s.p.Temperature
	if !(t >= minTemperature) || math.IsInf(t, 0) {
		return nil, 0, Argmax(logits), false
	}
	best = Argmax(logits)
	m := float64(logits[best])
	if math.IsInf(m, 0) || math.IsNaN(m) {
		return nil, 0, best, false
	}
	k := s.p.TopK
	if k < 0 || k >= len(logits) {
		k = 0
	}
	if k == 1 {
		return nil, 0, best, false
	}
	thr := m + tailLog*t
	if mp := s.p.MinP; mp > 0 {
		thr = max(thr, m+t*math.Log(min(mp, 1)))
	}
	topP := s.p.TopP
	useTopP := topP > 0 && topP < 1
	if cap(s.cands) < len(logits) {
		s.cands = make([]cand, 0, len(logits))
	}

	// Tokens are kept when logit >= thr, that is logit > floor in float32.
	floor := float32(thr)
	if float64(floor) >= thr {
		floor = math.Nextafter32(floor, float32(math.Inf(-1)))
	}
	sorted := false
	if k > 0 {
		c = topK(s.cands[:0], logits, k, floor)
		z = weigh(c, m, 1/t)
		sorted = true
	} else {
		c, z = gather(s.cands[:0], logits, floor, m, 1/t)
	}
	if useTopP {
		if sorted {
			c, z = nucleusSorted(c, topP*z)
		} else {
			if s.hist == nil {
				s.hist = make([]float64, numBuckets)
			}
			c, z = nucleus(c, s.hist, &s.edge, z, topP*z)
		}
	}
	return c, z, best, true
}

// gather appends every token whose logit is above floor with its weight
// exp((logit-m)·invT) and returns them with the weights' sum. m is the
// largest logit and floor is about m + tailLog/invT or higher, so the
// exponents lie in [tailLog, 0] up to rounding.
func gather(c []cand, logits []float32, floor float32, m, invT float64) ([]cand, float64) {
	start := len(c)
	i := 0
	for ; i+8 <= len(logits); i += 8 {
		b := logits[i : i+8 : i+8]
		if !(b[0] > floor || b[1] > floor || b[2] > floor || b[3] > floor ||
			b[4] > floor || b[5] > floor || b[6] > floor || b[7] > floor) {
			continue // a restrictive floor skips most blocks whole
		}
		for j, l := range b {
			if l > floor {
				c = append(c, cand{id: int32(i + j), key: float32(expInRange((float64(l) - m) * invT))})
			}
		}
	}
	for ; i < len(logits); i++ {
		if l := logits[i]; l > floor {
			c = append(c, cand{id: int32(i), key: float32(expInRange((float64(l) - m) * invT))})
		}
	}
	return c, sumKeys(c[start:])
}

// weigh turns the logits in c into weights exp((logit-m)·invT) and returns
// their sum; the logits lie in [m + tailLog/invT, m] as for gather, up to
// rounding.
func weigh(c []cand, m, invT float64) float64 {
	for i := range c {
		c[i].key = float32(expInRange((float64(c[i].key) - m) * invT))
	}
	return sumKeys(c)
}

// sumKeys adds up the keys of c in float64, four chains at a time so the
// additions overlap.
func sumKeys(c []cand) float64 {
	var z0, z1, z2, z3 float64
	i := 0
	for ; i+4 <= len(c); i += 4 {
		q := c[i : i+4 : i+4]
		z0 += float64(q[0].key)
		z1 += float64(q[1].key)
		z2 += float64(q[2].key)
		z3 += float64(q[3].key)
	}
	for ; i < len(c); i++ {
		z0 += float64(c[i].key)
	}
	return (z0 + z1) + (z2 + z3)
}

// Argmax returns the index of the largest logit, the lowest on ties; NaNs
// never win, and 0 is returned when nothing compares (empty or all NaN).
func Argmax(logits []float32) int32 {
	best, bestL := 0, float32(math.Inf(-1))
	i := 0
	// Eight at a time: a block rarely holds a new maximum, and then one
	// well-predicted branch per element is all it costs.
	for ; i+8 <= len(logits); i += 8 {
		c := logits[i : i+8 : i+8]
		if c[0] > bestL || c[1] > bestL || c[2] > bestL || c[3] > bestL ||
			c[4] > bestL || c[5] > bestL || c[6] > bestL || c[7] > bestL {
			for j, l := range c {
				if l > bestL {
					best, bestL = i+j, l
				}
			}
		}
	}
	for ; i < len(logits); i++ {
		if logits[i] > bestL {
			best, bestL = i, logits[i]
		}
	}
	return int32(best)
}
