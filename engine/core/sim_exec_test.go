package core

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/sim"
	"github.com/stokehq/stoke/engine/tokenizer"
)

func TestSimEngineWritesWordsDeterministically(t *testing.T) {
	p, err := sim.LoadProfile("llama-3.1-8b-fp8-h100")
	if err != nil {
		t.Fatal(err)
	}
	tj, tc, err := tokenizer.Synthesize(p.VocabSize, 1)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.New(tj, tc)
	if err != nil {
		t.Fatal(err)
	}
	var virtual atomic.Int64
	exec := NewSimExecutor(p, tok, func(_ context.Context, d time.Duration) error {
		virtual.Add(int64(d))
		return nil
	})
	e, err := New(Config{Sched: sched.Config{MaxNumBatchedTokens: 8192, MaxNumSeqs: p.MaxNumSeqs, MaxModelLen: p.MaxModelLen}},
		kvcache.NewManager(p.KVCapacityTokens/kvcache.BlockSize, true), exec, tok, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	gen := func(seed uint64) string {
		s, err := e.Submit(Params{Prompt: tok.Encode("Tell me a story", true), MaxTokens: 40,
			Sampling: sample.Params{Temperature: 1, TopP: 1, Seed: seed, Logprobs: -1}, IgnoreEOS: true})
		if err != nil {
			t.Fatal(err)
		}
		text, ids, last := collect(t, s)
		if len(ids) != 40 || last.Finish != FinishLength {
			t.Fatalf("%d ids, finish %q", len(ids), last.Finish)
		}
		return text
	}
	a, b, c := gen(1), gen(1), gen(2)
	if a != b {
		t.Fatalf("same seed, different text:\n%q\n%q", a, b)
	}
	if a == c {
		t.Fatal("different seeds gave the same text")
	}
	words := strings.Fields(a)
	if len(words) < 8 {
		t.Fatalf("sim text %q has too few words", a)
	}
	for _, w := range words {
		if strings.Trim(w, ".,?abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'-") != "" {
			t.Fatalf("sim text %q has a non-word %q", a, w)
		}
	}
	// Each request decodes 40 tokens, one step each, at no less than the
	// profile's step overhead.
	if d := time.Duration(virtual.Load()); d < 3*40*p.StepOverhead {
		t.Fatalf("simulated only %v for three 40-token requests", d)
	}
}

// BenchmarkSimShortRequests measures how many short requests per second
// the engine loop itself sustains when the sim's step time costs nothing:
// the CPU ceiling of one sim engine on this machine.
func BenchmarkSimShortRequests(b *testing.B) {
	p, err := sim.LoadProfile("llama-3.1-8b-fp8-h100")
	if err != nil {
		b.Fatal(err)
	}
	tj, tc, _ := tokenizer.Synthesize(p.VocabSize, 1)
	tok, _ := tokenizer.New(tj, tc)
	exec := NewSimExecutor(p, tok, func(context.Context, time.Duration) error { return nil })
	e, err := New(Config{Sched: sched.Config{MaxNumBatchedTokens: 8192, MaxNumSeqs: p.MaxNumSeqs, MaxModelLen: p.MaxModelLen}},
		kvcache.NewManager(p.KVCapacityTokens/kvcache.BlockSize, true), exec, tok, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.Run(ctx)
	prompt := tok.Encode("Summarise the following note in one short sentence, please.", true)
	const concurrency = 64
	b.ResetTimer()
	sem := make(chan struct{}, concurrency)
	errs := make(chan error, concurrency)
	for i := 0; i < b.N; i++ {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			s, err := e.Submit(Params{Prompt: prompt, MaxTokens: 16, Sampling: sample.Params{TopP: 1, Logprobs: -1}, IgnoreEOS: true})
			if err != nil {
				errs <- err
				return
			}
			for {
				if _, ok := s.Next(ctx); !ok {
					return
				}
			}
		}()
	}
	for range concurrency {
		sem <- struct{}{}
	}
	b.StopTimer()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
}
