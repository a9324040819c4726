package sample

import (
	"math/rand/v2"
	"testing"
)

// benchVocab is Llama 3's vocabulary size.
const benchVocab = 128256

// llmLogits imitates a language model's output row: a N(0, 2²) bulk and a
// few dozen plausible continuations well above it.
func llmLogits() []float32 {
	l := randLogits(42, benchVocab, 2)
	r := rand.New(rand.NewPCG(43, 44))
	for range 40 {
		l[r.IntN(benchVocab)] = float32(10 + r.Float64()*8)
	}
	return l
}

func BenchmarkSample(b *testing.B) {
	peaked := llmLogits()
	flat := randLogits(45, benchVocab, 0.5)
	r := rand.New(rand.NewPCG(46, 47))
	prompt := make([]int32, 1000)
	output := make([]int32, 500)
	for i := range prompt {
		prompt[i] = int32(r.IntN(benchVocab))
	}
	for i := range output {
		output[i] = int32(r.IntN(benchVocab))
	}
	penalties := Params{PresencePenalty: 0.5, FrequencyPenalty: 0.3, RepetitionPenalty: 1.1}
	for _, bc := range []struct {
		name   string
		logits []float32
		p      Params
		penal  bool
	}{
		{"greedy", peaked, Params{TopP: 1}, false},
		{"temperature", peaked, Params{Temperature: 0.8, TopP: 1}, false},
		{"temperature_top_p0.9", peaked, Params{Temperature: 0.8, TopP: 0.9}, false},
		{"temperature_top_p0.9_flat", flat, Params{Temperature: 1, TopP: 0.9}, false},
		{"top_k50", peaked, Params{Temperature: 0.8, TopK: 50, TopP: 1}, false},
		{"min_p0.05", peaked, Params{Temperature: 0.8, MinP: 0.05, TopP: 1}, false},
		{"penalties_greedy", peaked, penalties, true},
		{"penalties_top_p0.9", peaked, Params{Temperature: 0.8, TopP: 0.9, PresencePenalty: 0.5, FrequencyPenalty: 0.3, RepetitionPenalty: 1.1}, true},
		{"top_p0.9_logprobs5", peaked, Params{Temperature: 0.8, TopP: 0.9, Logprobs: 5}, false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			p := bc.p
			if p.TopP == 0 {
				p.TopP = 1
			}
			if bc.name != "top_p0.9_logprobs5" {
				p.Logprobs = -1
			}
			s := New(p)
			logits := append([]float32(nil), bc.logits...)
			var pr, out []int32
			if bc.penal {
				pr, out = prompt, output
			}
			b.ReportAllocs()
			for b.Loop() {
				if bc.penal {
					// The penalties rewrite logits; undo only what they touched.
					for _, t := range s.touched {
						logits[t] = bc.logits[t]
					}
				}
				s.Sample(logits, pr, out)
			}
		})
	}
}
