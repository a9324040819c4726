package sample

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// drawFrom draws an index from probabilities q with r.
func drawFrom(r *rand.Rand, q []float32) int32 {
	u := r.Float64()
	for i, p := range q {
		u -= float64(p)
		if u < 0 {
			return int32(i)
		}
	}
	return int32(len(q) - 1)
}

// TestVerifyKeepsTheDistribution checks rejection sampling empirically on
// a 12-token vocabulary: whatever the proposal q (one-hot on a likely, an
// unlikely or an impossible token, a spread-out q, q equal to p, q on
// tokens p never draws), the tokens Verify returns follow the
// distribution Sample draws from (Distribution), with the penalties,
// temperature, top-k, top-p and min-p applied: a chi-square test at a
// fixed seed, and a total-variation bound.
func TestVerifyKeepsTheDistribution(t *testing.T) {
	const vocab, draws = 12, 200_000
	logits := []float32{2.1, 0.3, -1.2, 1.7, 0.9, -0.4, 3.0, -2.5, 0.0, 1.1, -0.8, 0.5}
	prompt := []int32{3, 3, 9}
	output := []int32{6, 0, 6}
	for _, pc := range []struct {
		name string
		p    Params
	}{
		{"temperature 1", Params{Temperature: 1, TopP: 1, Logprobs: -1}},
		{"temperature 0.7, top-k 6, top-p 0.9", Params{Temperature: 0.7, TopK: 6, TopP: 0.9, Logprobs: 0}},
		{"min-p 0.05, penalties", Params{Temperature: 1.3, TopP: 1, MinP: 0.05, PresencePenalty: 0.5, FrequencyPenalty: 0.3, RepetitionPenalty: 1.2, Logprobs: 2}},
	} {
		ref := New(pc.p)
		dist := ref.Distribution(slices.Clone(logits), prompt, output)
		p := make([]float64, vocab)
		for _, tp := range dist {
			p[tp.ID] = tp.P
		}
		likely, unlikely, impossible := int32(0), int32(0), int32(-1)
		for i := range p {
			if p[i] > p[likely] {
				likely = int32(i)
			}
			if p[i] > 0 && (p[unlikely] == 0 || p[i] < p[unlikely]) {
				unlikely = int32(i)
			}
			if p[i] == 0 && impossible < 0 {
				impossible = int32(i)
			}
		}
		oneHot := func(id int32) []float32 {
			q := make([]float32, vocab)
			if id >= 0 {
				q[id] = 1
			}
			return q
		}
		spread := make([]float32, vocab)
		for i := range spread {
			spread[i] = float32(i+1) / float32(vocab*(vocab+1)/2)
		}
		same := make([]float32, vocab)
		for i := range same {
			same[i] = float32(p[i])
		}
		outside := make([]float32, vocab) // q where p is 0, and on the unlikely token
		for i := range outside {
			if p[i] == 0 {
				outside[i] = 1
			}
		}
		outside[unlikely] = 1
		normalise(outside)
		for _, qc := range []struct {
			name string
			q    []float32
			nilQ bool // deterministic proposer: q one-hot, passed as nil
		}{
			{"one-hot on the likeliest (nil q)", oneHot(likely), true},
			{"one-hot on the unlikeliest (nil q)", oneHot(unlikely), true},
			{"one-hot on an impossible token (nil q)", oneHot(impossible), true},
			{"one-hot on the unlikeliest (dense q)", oneHot(unlikely), false},
			{"spread", spread, false},
			{"q = p", same, false},
			{"q mostly off p", outside, false},
		} {
			if qc.nilQ && qc.q == nil {
				continue
			}
			t.Run(pc.name+"/"+qc.name, func(t *testing.T) {
				if impossible < 0 && qc.name == "one-hot on an impossible token (nil q)" {
					t.Skip("every token is possible")
				}
				s := New(Params{Seed: 7, Temperature: pc.p.Temperature, TopK: pc.p.TopK, TopP: pc.p.TopP, MinP: pc.p.MinP,
					PresencePenalty: pc.p.PresencePenalty, FrequencyPenalty: pc.p.FrequencyPenalty,
					RepetitionPenalty: pc.p.RepetitionPenalty, Logprobs: pc.p.Logprobs})
				proposer := rand.New(rand.NewPCG(11, 13))
				counts := make([]float64, vocab)
				accepted := 0
				row := make([]float32, vocab)
				for range draws {
					d := drawFrom(proposer, qc.q)
					q := qc.q
					if qc.nilQ {
						q = nil
					}
					copy(row, logits)
					id, ok, lp := s.Verify(row, prompt, output, d, q)
					if ok {
						accepted++
						if id != d {
							t.Fatalf("accepted %d for draft %d", id, d)
						}
					}
					if (lp == nil) != (pc.p.Logprobs < 0) || lp != nil && lp.Chosen.ID != id {
						t.Fatalf("logprobs %+v for token %d", lp, id)
					}
					counts[id]++
				}
				chi2, tv, dof := 0.0, 0.0, -1
				for i := range p {
					got := counts[i] / draws
					tv += math.Abs(got-p[i]) / 2
					if p[i] == 0 {
						if counts[i] > 0 {
							t.Fatalf("token %d drawn %v times, its probability is 0", i, counts[i])
						}
						continue
					}
					e := p[i] * draws
					chi2 += (counts[i] - e) * (counts[i] - e) / e
					dof++
				}
				// The 99.9th percentile of chi-square with up to 11 degrees
				// of freedom is below 32.
				if chi2 > 32 || tv > 0.01 {
					t.Fatalf("emitted distribution off p: chi-square %.1f with %d degrees of freedom, total variation %.4f\\np %v\\ngot %v",
						chi2, dof, tv, p, counts)
				}
				// The acceptance rate is Σ min(p, q).
				want := 0.0
				for i := range p {
					want += min(p[i], float64(qc.q[i]))
				}
				if rate := float64(accepted) / draws; math.Abs(rate-want) > 0.01 {
					t.Fatalf("acceptance rate %.4f, want Σ min(p, q) = %.4f", rate, want)
				}
			})
		}
	}
}

func normalise(q []float32) {
	var z float32
	for _, v := range q {
		z += v
	}
	for i := range q {
		q[i] /= z
	}
}

// TestVerifyGreedyIsSample checks that where Sample decides without a
// draw (temperature 0, top-k 1, also with penalties), Verify returns
// Sample's very token and logprobs and accepts exactly the drafts equal
// to it, consuming no randomness: greedy speculative decoding emits what
// greedy decoding does.
func TestVerifyGreedyIsSample(t *testing.T) {
	for _, p := range []Params{
		{Temperature: 0, TopP: 1, Logprobs: 3},
		{Temperature: 0, TopP: 1, Logprobs: -1, RepetitionPenalty: 1.3, FrequencyPenalty: 0.7, PresencePenalty: -0.4},
		{Temperature: 0.9, TopK: 1, TopP: 1, Logprobs: 0},
	} {
		plain, spec := New(p), New(p)
		output := []int32{}
		for i := range 200 {
			logits := randLogits(uint64(i), 300, 2)
			want, wantLP := plain.Sample(slices.Clone(logits), []int32{5, 6}, output)
			draft := want
			if i%3 == 0 {
				draft = (want + 1) % 300
			}
			got, ok, lp := spec.Verify(slices.Clone(logits), []int32{5, 6}, output, draft, nil)
			if got != want || ok != (draft == want) {
				t.Fatalf("%+v step %d: Verify %d (accepted %v) for draft %d, Sample %d", p, i, got, ok, draft, want)
			}
			if (lp == nil) != (wantLP == nil) || lp != nil && (lp.Chosen != wantLP.Chosen || !slices.Equal(lp.Top, wantLP.Top)) {
				t.Fatalf("%+v step %d: logprobs %+v, Sample's %+v", p, i, lp, wantLP)
			}
			output = append(output, want)
		}
		// Neither consumed randomness: their generators are in step.
		if plain.rng.Uint64() != spec.rng.Uint64() {
			t.Fatalf("%+v: Verify drew random numbers", p)
		}
	}
}

// TestDistributionMatchesSample checks Distribution against Sample's own
// draws, and that the refactored Sample still draws what it did (the same
// seed gives the same tokens as a sampler drawing from Distribution's
// candidates in Sample's order).
func TestDistributionMatchesSample(t *testing.T) {
	p := Params{Temperature: 0.8, TopK: 50, TopP: 0.95, MinP: 0.01, Seed: 3, Logprobs: -1}
	logits := randLogits(9, 1000, 3)
	s := New(p)
	dist := s.Distribution(slices.Clone(logits), nil, nil)
	total := 0.0
	probs := map[int32]float64{}
	for _, tp := range dist {
		total += tp.P
		probs[tp.ID] = tp.P
	}
	if math.Abs(total-1) > 1e-9 {
		t.Fatalf("probabilities sum to %v", total)
	}
	const n = 100_000
	counts := map[int32]float64{}
	for range n {
		id, _ := s.Sample(slices.Clone(logits), nil, nil)
		if probs[id] == 0 {
			t.Fatalf("Sample drew %d, outside the distribution", id)
		}
		counts[id]++
	}
	tv := 0.0
	for id, pr := range probs {
		tv += math.Abs(counts[id]/n-pr) / 2
	}
	if tv > 0.015 {
		t.Fatalf("Sample's draws are %.4f (total variation) off Distribution", tv)
	}
	if d := New(Params{TopP: 1}).Distribution(slices.Clone(logits), nil, nil); len(d) != 1 || d[0].ID != Argmax(logits) || d[0].P != 1 {
		t.Fatalf("greedy distribution %v", d)
	}
}
