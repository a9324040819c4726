package sample

import (
	"cmp"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// randLogits returns n logits drawn from N(0, scale²), reproducibly.
func randLogits(seed uint64, n int, scale float64) []float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	l := make([]float32, n)
	for i := range l {
		l[i] = float32(r.NormFloat64() * scale)
	}
	return l
}

// refProbs is a float64 softmax of logits/t.
func refProbs(logits []float32, t float64) []float64 {
	m := math.Inf(-1)
	for _, l := range logits {
		m = max(m, float64(l)/t)
	}
	p := make([]float64, len(logits))
	sum := 0.0
	for i, l := range logits {
		p[i] = math.Exp(float64(l)/t - m)
		sum += p[i]
	}
	for i := range p {
		p[i] /= sum
	}
	return p
}

// refSupport is the set of tokens the vLLM pipeline may draw from
// (min-p, then top-k, then top-p over the renormalised rest), computed by
// sorting the whole vocabulary, with each token's probability within it.
func refSupport(logits []float32, p Params) map[int32]float64 {
	probs := refProbs(logits, p.Temperature)
	ids := make([]int32, len(logits))
	for i := range ids {
		ids[i] = int32(i)
	}
	slices.SortFunc(ids, func(a, b int32) int {
		if c := cmp.Compare(logits[b], logits[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	pmax := probs[ids[0]]
	if p.MinP > 0 {
		n := 0
		for n < len(ids) && probs[ids[n]] >= p.MinP*pmax {
			n++
		}
		ids = ids[:n]
	}
	if p.TopK > 0 && p.TopK < len(ids) {
		ids = ids[:p.TopK]
	}
	sum := 0.0
	for _, id := range ids {
		sum += probs[id]
	}
	if p.TopP < 1 {
		cum := 0.0
		for i, id := range ids {
			cum += probs[id] / sum
			if cum >= p.TopP {
				ids = ids[:i+1]
				break
			}
		}
	}
	sum = 0
	for _, id := range ids {
		sum += probs[id]
	}
	out := map[int32]float64{}
	for _, id := range ids {
		out[id] = probs[id] / sum
	}
	return out
}

func TestGreedy(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	for _, tc := range []struct {
		name   string
		logits []float32
		want   int32
	}{
		{"plain", []float32{0, 3, 1}, 1},
		{"tie takes lowest id", []float32{5, 5, 1}, 0},
		{"negative", []float32{-3, -2, -9}, 1},
		{"nan never wins", []float32{nan, 1, 2}, 2},
		{"all -inf", []float32{-inf, -inf}, 0},
		{"+inf", []float32{1, inf, 2}, 1},
	} {
		id, lp := New(Params{TopP: 1, Logprobs: -1}).Sample(slices.Clone(tc.logits), nil, nil)
		if id != tc.want || lp != nil {
			t.Errorf("%s: greedy %v = %d, %v; want %d, nil", tc.name, tc.logits, id, lp, tc.want)
		}
		if got := Argmax(tc.logits); got != tc.want {
			t.Errorf("%s: Argmax %v = %d, want %d", tc.name, tc.logits, got, tc.want)
		}
	}
}

// TestArgmaxMatchesScan checks the blocked Argmax against a plain scan.
func TestArgmaxMatchesScan(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	special := []float32{float32(math.NaN()), float32(math.Inf(-1)), float32(math.Inf(1)), 3}
	for trial := range 2000 {
		l := make([]float32, r.IntN(70))
		for i := range l {
			if r.IntN(8) == 0 {
				l[i] = special[r.IntN(len(special))]
			} else {
				l[i] = float32(r.IntN(4))
			}
		}
		want, wantL := 0, float32(math.Inf(-1))
		for i, x := range l {
			if x > wantL {
				want, wantL = i, x
			}
		}
		if got := Argmax(l); got != int32(want) {
			t.Fatalf("trial %d: Argmax(%v) = %d, want %d", trial, l, got, want)
		}
	}
}

// TestTinyTemperature checks that temperatures below 1e-5 decode greedily
// while small ones above it still sample among tied tokens.
func TestTinyTemperature(t *testing.T) {
	logits := []float32{5, 5, 1}
	for _, tc := range []struct {
		temp float64
		want map[int32]bool // tokens that must each be drawn, and nothing else
	}{
		{1e-6, map[int32]bool{0: true}},
		{1e-3, map[int32]bool{0: true, 1: true}},
	} {
		s := New(Params{Temperature: tc.temp, TopP: 1, Logprobs: -1, Seed: 9})
		seen := map[int32]bool{}
		for range 200 {
			id, _ := s.Sample(logits, nil, nil)
			seen[id] = true
		}
		if len(seen) != len(tc.want) {
			t.Errorf("T=%g drew %v, want exactly %v", tc.temp, seen, tc.want)
		}
		for id := range seen {
			if !tc.want[id] {
				t.Errorf("T=%g drew %d, want only %v", tc.temp, id, tc.want)
			}
		}
	}
}

func TestPenalties(t *testing.T) {
	for _, tc := range []struct {
		name           string
		p              Params
		logits         []float32
		prompt, output []int32
		want           int32     // greedy choice after the penalties
		wantLogits     []float32 // logits after Sample
	}{
		{"presence moves off a seen token", Params{PresencePenalty: 0.5},
			[]float32{2, 1.9, 0}, nil, []int32{0}, 1, []float32{1.5, 1.9, 0}},
		{"negative presence favours a seen token", Params{PresencePenalty: -0.5},
			[]float32{1.9, 2, 0}, nil, []int32{0}, 0, []float32{2.4, 2, 0}},
		{"presence does not scale with count", Params{PresencePenalty: 0.4},
			[]float32{3, 2, 0}, nil, []int32{0, 0, 0}, 0, []float32{2.6, 2, 0}},
		{"frequency scales with count", Params{FrequencyPenalty: 0.4},
			[]float32{3, 2, 0}, nil, []int32{0, 0, 0}, 1, []float32{1.8, 2, 0}},
		{"frequency with one occurrence", Params{FrequencyPenalty: 0.4},
			[]float32{3, 2, 0}, nil, []int32{0}, 0, []float32{2.6, 2, 0}},
		{"presence and frequency add", Params{PresencePenalty: 0.5, FrequencyPenalty: 0.3},
			[]float32{3, 2, 0}, nil, []int32{0, 2, 0}, 1, []float32{1.9, 2, -0.8}},
		{"presence/frequency ignore the prompt", Params{PresencePenalty: 2, FrequencyPenalty: 2},
			[]float32{2, 1.5}, []int32{0, 0}, nil, 0, []float32{2, 1.5}},
		{"repetition divides a positive logit seen in the prompt", Params{RepetitionPenalty: 2},
			[]float32{2, 1.5}, []int32{0, 0}, nil, 1, []float32{1, 1.5}},
		{"repetition multiplies a negative logit", Params{RepetitionPenalty: 2},
			[]float32{-1, -1.5}, []int32{0}, nil, 1, []float32{-2, -1.5}},
		{"mild repetition keeps the lead", Params{RepetitionPenalty: 1.2},
			[]float32{-1, -1.5}, nil, []int32{0}, 0, []float32{-1.2, -1.5}},
		{"repetition once however often repeated", Params{RepetitionPenalty: 2},
			[]float32{4, 1.5}, []int32{0, 0}, []int32{0, 0}, 0, []float32{2, 1.5}},
		{"repetition < 1 encourages", Params{RepetitionPenalty: 0.5},
			[]float32{1, 1.5}, []int32{0}, nil, 0, []float32{2, 1.5}},
		{"repetition then frequency", Params{RepetitionPenalty: 2, FrequencyPenalty: 0.5},
			[]float32{4, 1.6}, nil, []int32{0}, 1, []float32{1.5, 1.6}},
		{"repetition 0 is off", Params{RepetitionPenalty: 0},
			[]float32{2, 1.5}, []int32{0}, []int32{0}, 0, []float32{2, 1.5}},
		{"repetition 1 is off", Params{RepetitionPenalty: 1},
			[]float32{2, 1.5}, []int32{0}, []int32{0}, 0, []float32{2, 1.5}},
		{"ids outside the vocabulary are ignored", Params{RepetitionPenalty: 2, PresencePenalty: 1},
			[]float32{2, 1.5}, []int32{-1, 7}, []int32{2, -5}, 0, []float32{2, 1.5}},
	} {
		tc.p.TopP = 1
		tc.p.Logprobs = -1
		logits := slices.Clone(tc.logits)
		s := New(tc.p)
		got, _ := s.Sample(logits, tc.prompt, tc.output)
		if got != tc.want {
			t.Errorf("%s: chose %d, want %d", tc.name, got, tc.want)
		}
		for i := range logits {
			if math.Abs(float64(logits[i]-tc.wantLogits[i])) > 1e-6 {
				t.Errorf("%s: logits became %v, want %v", tc.name, logits, tc.wantLogits)
				break
			}
		}
		// A second call on fresh logits gives the same answer: no state
		// leaks from one call's counts into the next.
		logits = slices.Clone(tc.logits)
		if again, _ := s.Sample(logits, tc.prompt, tc.output); again != tc.want {
			t.Errorf("%s: second call chose %d, want %d", tc.name, again, tc.want)
		}
	}
}

// TestPenaltyCountsReset checks that a token counted in one call is not
// penalised in the next call when it is no longer in the output.
func TestPenaltyCountsReset(t *testing.T) {
	s := New(Params{TopP: 1, PresencePenalty: 1, RepetitionPenalty: 2, Logprobs: -1})
	if got, _ := s.Sample([]float32{2, 1.5}, nil, []int32{0}); got != 1 {
		t.Fatalf("penalised call chose %d, want 1", got)
	}
	logits := []float32{2, 1.5}
	if got, _ := s.Sample(logits, nil, []int32{1}); got != 0 || logits[0] != 2 {
		t.Fatalf("next call chose %d with logits %v, want 0 with token 0 untouched", got, logits)
	}
}

func TestRestrictSupport(t *testing.T) {
	for _, tc := range []struct {
		name   string
		vocab  int
		scale  float64
		p      Params
		atMost int // the support must be no larger (checks it restricts)
	}{
		{"temperature only", 50, 1, Params{Temperature: 1, TopP: 1}, 50},
		{"top_k 1", 500, 2, Params{Temperature: 1, TopK: 1, TopP: 1}, 1},
		{"top_k 5", 500, 2, Params{Temperature: 1, TopK: 5, TopP: 1}, 5},
		{"top_k 40 hot", 500, 1, Params{Temperature: 2, TopK: 40, TopP: 1}, 40},
		{"top_p 0.5", 500, 2, Params{Temperature: 1, TopP: 0.5}, 60},
		{"top_p 0.9 flat", 3000, 0.3, Params{Temperature: 1, TopP: 0.9}, 2900},
		{"top_p 0.3 cold", 500, 2, Params{Temperature: 0.5, TopP: 0.3}, 10},
		{"min_p 0.1", 500, 2, Params{Temperature: 1, TopP: 1, MinP: 0.1}, 60},
		{"min_p 0.5 hot", 500, 2, Params{Temperature: 3, TopP: 1, MinP: 0.5}, 60},
		{"min_p 1 keeps the max", 500, 2, Params{Temperature: 1, TopP: 1, MinP: 1}, 1},
		{"top_k then top_p", 500, 2, Params{Temperature: 1, TopK: 20, TopP: 0.6}, 20},
		{"min_p then top_p", 500, 1, Params{Temperature: 1, MinP: 0.05, TopP: 0.7}, 200},
		{"all three", 500, 1, Params{Temperature: 0.8, MinP: 0.02, TopK: 30, TopP: 0.8}, 30},
	} {
		logits := randLogits(7, tc.vocab, tc.scale)
		want := refSupport(logits, tc.p)
		if len(want) > tc.atMost {
			t.Fatalf("%s: reference support has %d tokens, test expects at most %d", tc.name, len(want), tc.atMost)
		}
		tc.p.Logprobs = -1
		s := New(tc.p)
		seen := map[int32]int{}
		const draws = 4000
		for range draws {
			id, _ := s.Sample(logits, nil, nil)
			if _, ok := want[id]; !ok {
				t.Fatalf("%s: drew %d (p=%g), outside the %d-token support", tc.name, id, refProbs(logits, tc.p.Temperature)[id], len(want))
			}
			seen[id]++
		}
		for id, p := range want {
			if p >= 0.005 && seen[id] == 0 {
				t.Errorf("%s: token %d (p=%.3f within the support) never drawn", tc.name, id, p)
			}
		}
	}
}

// TestDistribution checks the draws follow the renormalised distribution.
func TestDistribution(t *testing.T) {
	logits := []float32{1, 0.5, 0, -0.5, -3, 2}
	for _, p := range []Params{
		{Temperature: 1, TopP: 1},
		{Temperature: 0.7, TopP: 1},
		{Temperature: 1.5, TopK: 3, TopP: 1},
		{Temperature: 1, TopP: 0.8},
		{Temperature: 1, TopP: 1, MinP: 0.2},
	} {
		want := refSupport(logits, p)
		p.Logprobs = -1
		s := New(p)
		const draws = 40000
		count := make([]int, len(logits))
		for range draws {
			id, _ := s.Sample(logits, nil, nil)
			count[id]++
		}
		for id, c := range count {
			got := float64(c) / draws
			if math.Abs(got-want[int32(id)]) > 0.01 {
				t.Errorf("%+v: token %d drawn %.4f of the time, want %.4f", p, id, got, want[int32(id)])
			}
		}
	}
}

func TestSeed(t *testing.T) {
	logits := randLogits(3, 1000, 1)
	for _, p := range []Params{
		{Temperature: 1, TopP: 1},
		{Temperature: 0.9, TopK: 50, TopP: 1},
		{Temperature: 1, TopP: 0.9},
		{Temperature: 1, TopP: 1, MinP: 0.05},
		{Temperature: 1, TopP: 0.95, PresencePenalty: 0.5, RepetitionPenalty: 1.1},
	} {
		draw := func(seed uint64) []int32 {
			q := p
			q.Seed, q.Logprobs = seed, -1
			s := New(q)
			var out []int32
			for range 64 {
				id, _ := s.Sample(slices.Clone(logits), []int32{1, 2, 3}, out)
				out = append(out, id)
			}
			return out
		}
		a, b, c := draw(1), draw(1), draw(2)
		if !slices.Equal(a, b) {
			t.Errorf("%+v: same seed gave different draws", p)
		}
		if slices.Equal(a, c) {
			t.Errorf("%+v: seeds 1 and 2 gave identical draws", p)
		}
	}
}

func TestLowTemperatureIsGreedy(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Params
	}{
		{"plain", Params{Temperature: 1e-4, TopP: 1}},
		{"top_p", Params{Temperature: 1e-4, TopP: 0.5}},
		{"top_k", Params{Temperature: 1e-4, TopK: 10, TopP: 1}},
		{"min_p", Params{Temperature: 1e-4, TopP: 1, MinP: 0.1}},
		{"penalties", Params{Temperature: 1e-4, TopP: 1, FrequencyPenalty: 1.5, RepetitionPenalty: 1.3}},
	} {
		for seed := range uint64(20) {
			logits := randLogits(seed, 2000, 3)
			prompt, output := []int32{int32(seed), 5, 6}, []int32{Argmax(logits), 9}
			g := slices.Clone(logits)
			wantID, _ := New(Params{TopP: 1, Logprobs: -1, FrequencyPenalty: tc.p.FrequencyPenalty,
				RepetitionPenalty: tc.p.RepetitionPenalty}).Sample(g, prompt, output)
			tc.p.Seed, tc.p.Logprobs = seed, -1
			got, _ := New(tc.p).Sample(logits, prompt, output)
			if got != wantID {
				t.Errorf("%s seed %d: T=1e-4 chose %d, greedy %d", tc.name, seed, got, wantID)
			}
		}
	}
}

func TestLogprobs(t *testing.T) {
	inf := float32(math.Inf(-1))
	for _, tc := range []struct {
		name   string
		vocab  int
		p      Params
		prompt []int32
		output []int32
	}{
		{"greedy 5", 1000, Params{TopP: 1, Logprobs: 5}, nil, nil},
		{"sampled 20", 1000, Params{Temperature: 1, TopP: 0.9, Logprobs: 20}, nil, nil},
		{"chosen only", 1000, Params{Temperature: 0.8, TopK: 10, TopP: 1, Logprobs: 0}, nil, nil},
		{"more than the vocabulary", 7, Params{Temperature: 1, TopP: 1, Logprobs: 20}, nil, nil},
		{"raw despite penalties", 1000, Params{TopP: 1, Logprobs: 3, RepetitionPenalty: 3, PresencePenalty: 2},
			[]int32{0, 1, 2, 3}, []int32{4, 4, 5}},
		{"raw despite a penalty that keeps the token chosen", 1000, Params{TopP: 1, Logprobs: 3, PresencePenalty: -2},
			nil, nil},
	} {
		for seed := range uint64(5) {
			logits := randLogits(seed+100, tc.vocab, 4)
			logits[3] = inf
			// The penalised tokens include the raw argmax, so a penalty that
			// leaked into the logprobs would show.
			output := append(slices.Clone(tc.output), Argmax(logits))
			raw := slices.Clone(logits)
			ref := make([]float64, len(raw))
			m := float64(raw[Argmax(raw)])
			sum := 0.0
			for _, l := range raw {
				sum += math.Exp(float64(l) - m)
			}
			for i, l := range raw {
				ref[i] = float64(l) - m - math.Log(sum)
			}
			q := tc.p
			q.Seed = seed
			id, lp := New(q).Sample(logits, tc.prompt, output)
			if lp == nil {
				t.Fatalf("%s: no logprobs", tc.name)
			}
			if lp.Chosen.ID != id || math.Abs(float64(lp.Chosen.Logprob)-ref[id]) > 1e-5 {
				t.Errorf("%s: chosen %+v for token %d, want logprob %.7f", tc.name, lp.Chosen, id, ref[id])
			}
			wantN := min(tc.p.Logprobs, tc.vocab)
			if len(lp.Top) != wantN {
				t.Fatalf("%s: %d alternatives, want %d", tc.name, len(lp.Top), wantN)
			}
			order := make([]int32, len(raw))
			for i := range order {
				order[i] = int32(i)
			}
			slices.SortStableFunc(order, func(a, b int32) int { return cmp.Compare(ref[b], ref[a]) })
			for i, x := range lp.Top {
				if x.ID != order[i] || math.Abs(float64(x.Logprob)-ref[x.ID]) > 1e-5 {
					t.Errorf("%s: top[%d] = %+v, want {%d %.7f}", tc.name, i, x, order[i], ref[order[i]])
				}
				if i > 0 && x.Logprob > lp.Top[i-1].Logprob {
					t.Errorf("%s: top not sorted at %d: %v", tc.name, i, lp.Top)
				}
			}
		}
	}
	if _, lp := New(Params{TopP: 1, Logprobs: -1}).Sample([]float32{1, 2}, nil, nil); lp != nil {
		t.Errorf("logprobs -1 returned %+v", lp)
	}
}

func TestValidate(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		p     Params
		field string
	}{
		{Params{Temperature: -1, TopP: 1}, "temperature"},
		{Params{Temperature: nan, TopP: 1}, "temperature"},
		{Params{Temperature: 101, TopP: 1}, "temperature"},
		{Params{TopK: -2, TopP: 1}, "top_k"},
		{Params{TopP: 0}, "top_p"},
		{Params{TopP: 1.5}, "top_p"},
		{Params{TopP: nan}, "top_p"},
		{Params{TopP: 1, MinP: -0.1}, "min_p"},
		{Params{TopP: 1, MinP: 1.1}, "min_p"},
		{Params{TopP: 1, PresencePenalty: 2.5}, "presence_penalty"},
		{Params{TopP: 1, PresencePenalty: -2.1}, "presence_penalty"},
		{Params{TopP: 1, FrequencyPenalty: -3}, "frequency_penalty"},
		{Params{TopP: 1, FrequencyPenalty: nan}, "frequency_penalty"},
		{Params{TopP: 1, RepetitionPenalty: -1}, "repetition_penalty"},
		{Params{TopP: 1, RepetitionPenalty: math.Inf(1)}, "repetition_penalty"},
		{Params{TopP: 1, Logprobs: 21}, "logprobs"},
		{Params{TopP: 1, Logprobs: -2}, "logprobs"},
	} {
		err := tc.p.Validate()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.HasPrefix(err.Error(), tc.field+" ") {
			t.Errorf("%+v: error %v, want one naming %s", tc.p, err, tc.field)
		}
	}
	for _, p := range []Params{
		{TopP: 1},
		{Temperature: 0.7, TopK: 40, TopP: 0.9, MinP: 0.05, Logprobs: 20},
		{Temperature: 2, TopK: -1, TopP: 1, PresencePenalty: -2, FrequencyPenalty: 2, RepetitionPenalty: 1.3, Logprobs: -1},
	} {
		if err := p.Validate(); err != nil {
			t.Errorf("%+v rejected: %v", p, err)
		}
	}
}

// TestBadInputDoesNotPanic feeds values Validate would reject and odd logits.
func TestBadInputDoesNotPanic(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	for _, p := range []Params{
		{},
		{Temperature: 1, TopK: -5, TopP: 7, MinP: 3, Logprobs: 99},
		{Temperature: math.Inf(1), TopP: -1, RepetitionPenalty: -2, PresencePenalty: math.NaN()},
		{Temperature: 1, TopK: 1000, TopP: 0.5, MinP: -1, Logprobs: 3},
	} {
		for _, logits := range [][]float32{
			nil,
			{nan, nan},
			{-inf, -inf, -inf},
			{1, inf, nan, -inf},
			{0, 0, 0, 0},
		} {
			id, _ := New(p).Sample(logits, []int32{-1, 0, 99}, []int32{0, 1000})
			if id < 0 || (len(logits) > 0 && int(id) >= len(logits)) {
				t.Errorf("%+v on %v: id %d out of range", p, logits, id)
			}
		}
	}
}

func TestSteadyStateAllocations(t *testing.T) {
	peaked := randLogits(5, 4096, 2)
	flat := randLogits(6, 4096, 0.1) // top-p keeps more than sortMax: the histogram path
	prompt := []int32{1, 2, 3, 4, 5}
	output := []int32{6, 7, 7, 8}
	for _, tc := range []struct {
		logits []float32
		p      Params
		want   float64
	}{
		{peaked, Params{TopP: 1, Logprobs: -1}, 0},
		{peaked, Params{Temperature: 1, TopP: 1, Logprobs: -1}, 0},
		{peaked, Params{Temperature: 1, TopP: 0.9, Logprobs: -1}, 0},
		{flat, Params{Temperature: 1, TopP: 0.9, Logprobs: -1}, 0},
		{peaked, Params{Temperature: 1, TopK: 50, TopP: 0.9, Logprobs: -1}, 0},
		{peaked, Params{Temperature: 1, MinP: 0.1, TopP: 0.9, Logprobs: -1}, 0},
		{peaked, Params{Temperature: 1, TopP: 0.9, Logprobs: -1, PresencePenalty: 0.5, FrequencyPenalty: 0.5, RepetitionPenalty: 1.1}, 0},
		{peaked, Params{Temperature: 1, TopP: 0.9, Logprobs: 5}, 2}, // the Logprobs and its Top
	} {
		s := New(tc.p)
		s.Sample(tc.logits, prompt, output)
		got := testing.AllocsPerRun(20, func() { s.Sample(tc.logits, prompt, output) })
		if got != tc.want {
			t.Errorf("%+v: %v allocations per call, want %v", tc.p, got, tc.want)
		}
	}
}

func TestExpNeg(t *testing.T) {
	for x := -750.0; x <= 0; x += 0.0137 {
		want, got := math.Exp(x), expNeg(x)
		if want < 1e-300 {
			if got > 1e-300 {
				t.Fatalf("expNeg(%v) = %v, want ~0", x, got)
			}
			continue
		}
		if rel := math.Abs(got-want) / want; rel > 1e-10 {
			t.Fatalf("expNeg(%v) = %v, want %v (rel err %g)", x, got, want, rel)
		}
	}
	if got := expNeg(math.NaN()); got != 0 {
		t.Errorf("expNeg(NaN) = %v, want 0", got)
	}
}

// TestNucleusMatchesSort compares the histogram nucleus with a full sort.
func TestNucleusMatchesSort(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	hist := make([]float64, numBuckets)
	var scratch []cand
	for trial := range 200 {
		n := 1 + r.IntN(5000)
		c := make([]cand, n)
		z := 0.0
		for i := range c {
			var w float32
			switch trial % 3 {
			case 0: // spread over many octaves
				w = float32(math.Exp(-r.Float64() * 30))
			case 1: // flat: everything in a few buckets
				w = float32(0.5 + r.Float64()*0.01)
			default: // many exact ties
				w = float32(r.IntN(4)+1) / 4
			}
			c[i] = cand{id: int32(i), key: w}
			z += float64(w)
		}
		target := z * r.Float64()
		sorted := slices.Clone(c)
		slices.SortFunc(sorted, compareCands)
		want, wantZ := nucleusSorted(sorted, target)
		got, gotZ := nucleus(c, hist, &scratch, z, target)
		gotIDs := make([]int32, len(got))
		for i, x := range got {
			gotIDs[i] = x.id
		}
		wantIDs := make([]int32, len(want))
		for i, x := range want {
			wantIDs[i] = x.id
		}
		slices.Sort(gotIDs)
		slices.Sort(wantIDs)
		if !slices.Equal(gotIDs, wantIDs) || math.Abs(gotZ-wantZ) > 1e-9*z {
			t.Fatalf("trial %d (n=%d): nucleus has %d tokens weighing %v, sorting gives %d weighing %v",
				trial, n, len(gotIDs), gotZ, len(wantIDs), wantZ)
		}
	}
}

// TestSelectionMatchesSort checks topK and selectTop against a full sort.
func TestSelectionMatchesSort(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for trial := range 300 {
		n := 1 + r.IntN(3000)
		logits := make([]float32, n)
		for i := range logits {
			switch trial % 3 {
			case 0:
				logits[i] = float32(r.NormFloat64())
			case 1:
				logits[i] = float32(r.IntN(3)) // heavy ties
			default:
				logits[i] = float32(i) // ascending: worst case for a heap
			}
		}
		all := make([]cand, n)
		for i, l := range logits {
			all[i] = cand{id: int32(i), key: l}
		}
		sorted := slices.Clone(all)
		slices.SortFunc(sorted, compareCands)
		k := 1 + r.IntN(n)

		got := topK(make([]cand, 0, n), logits, k, float32(math.Inf(-1)))
		if !slices.Equal(got, sorted[:k]) {
			t.Fatalf("trial %d: topK(%d of %d) differs from the sorted prefix", trial, k, n)
		}
		c := slices.Clone(all)
		selectTop(c, k)
		slices.SortFunc(c[:k], compareCands)
		if !slices.Equal(c[:k], sorted[:k]) {
			t.Fatalf("trial %d: selectTop(%d of %d) differs from the sorted prefix", trial, k, n)
		}
	}
}

// TestSamplersRunConcurrently checks that samplers share no state: the
// engine samples its requests in parallel (run with -race).
func TestSamplersRunConcurrently(t *testing.T) {
	logits := randLogits(8, 5000, 1.5)
	p := Params{Temperature: 0.9, TopP: 0.9, MinP: 0.01, PresencePenalty: 0.3, Logprobs: 2}
	run := func(seed uint64) []int32 {
		q := p
		q.Seed = seed
		s := New(q)
		var out []int32
		for range 50 {
			id, _ := s.Sample(slices.Clone(logits), []int32{1, 2}, out)
			out = append(out, id)
		}
		return out
	}
	want := make([][]int32, 4)
	for i := range want {
		want[i] = run(uint64(i))
	}
	got := make([][]int32, 4)
	done := make(chan int)
	for i := range got {
		go func() {
			got[i] = run(uint64(i))
			done <- i
		}()
	}
	for range got {
		<-done
	}
	for i := range got {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("sampler %d drew differently when run concurrently", i)
		}
	}
}

// TestScorerMatchesSampler checks that scoring a token reports exactly
// what sampling it reports (chosen logprob and alternatives, bit for bit),
// penalties and temperature included (logprobs are of the raw logits),
// and that scoring any other token gives its float64 log-softmax.
func TestScorerMatchesSampler(t *testing.T) {
	var sc Scorer
	for _, tc := range []struct {
		name string
		p    Params
	}{
		{"greedy, no alternatives", Params{TopP: 1, Logprobs: 0}},
		{"greedy, 5 alternatives", Params{TopP: 1, Logprobs: 5}},
		{"sampled with penalties", Params{Temperature: 0.8, TopP: 0.9, Seed: 3, Logprobs: 2, PresencePenalty: 1, RepetitionPenalty: 1.3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(tc.p)
			for seed := range uint64(20) {
				logits := randLogits(seed, 1000, 3)
				raw := slices.Clone(logits)
				id, lp := s.Sample(logits, []int32{1, 2, 3}, []int32{4, 5})
				got := sc.Score(raw, id, tc.p.Logprobs)
				if got.Chosen != lp.Chosen || !slices.Equal(got.Top, lp.Top) {
					t.Fatalf("seed %d: scored %+v, sampled %+v", seed, got, *lp)
				}
				ref := refProbs(raw, 1)
				other := (id + 7) % 1000
				if o := sc.Score(raw, other, 0); o.Chosen.ID != other || len(o.Top) != 0 || math.Abs(float64(o.Chosen.Logprob)-math.Log(ref[other])) > 1e-5 {
					t.Fatalf("seed %d: token %d scored %+v, want logprob %v", seed, other, o, math.Log(ref[other]))
				}
				if !slices.Equal(raw, randLogits(seed, 1000, 3)) {
					t.Fatal("Score changed the logits")
				}
			}
		})
	}
	if got := sc.Score([]float32{0, 0}, 5, 1); !math.IsInf(float64(got.Chosen.Logprob), -1) || len(got.Top) != 1 {
		t.Fatalf("an id outside the row scored %+v, want -Inf with one alternative", got)
	}
}
