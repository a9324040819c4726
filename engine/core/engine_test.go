package core

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/engine/generate"
	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kernels/kernelstest"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/tokenizer"
)

type fixture struct {
	model  *model.Model
	tok    *tokenizer.Tokenizer
	engine *Engine
	kv     *kvcache.Manager
}

// newFixture runs an engine over a random-weight model with a synthetic
// tokenizer until the test ends.
func newFixture(t *testing.T, blocks int, cfg sched.Config) *fixture {
	t.Helper()
	return newFixtureOn(t, nil, blocks, cfg)
}

// newFixtureOn is newFixture with a model that computes with the kernel
// set set (nil: the default).
func newFixtureOn(t *testing.T, set *kernels.Set, blocks int, cfg sched.Config) *fixture {
	t.Helper()
	tj, tc, err := tokenizer.Synthesize(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.New(tj, tc)
	if err != nil {
		t.Fatal(err)
	}
	mc := model.Config{ModelType: "llama", HiddenSize: 64, IntermediateSize: 128, NumLayers: 2, NumHeads: 4, NumKVHeads: 2,
		HeadDim: 16, VocabSize: 512, MaxPositionEmbeddings: 2048, RMSNormEps: 1e-5, RopeTheta: 10000, HiddenAct: "silu", TieWordEmbeddings: true}
	pool := set.NewPool(2)
	t.Cleanup(pool.Close)
	m, err := model.New(mc, model.RandomSource(mc, 3, 0.3), pool)
	if err != nil {
		t.Fatal(err)
	}
	storage, err := kvcache.New(m.KVShape(), blocks)
	if err != nil {
		t.Fatal(err)
	}
	kv := kvcache.NewManager(blocks, true)
	if cfg.MaxModelLen == 0 {
		cfg.MaxModelLen = mc.MaxPositionEmbeddings
	}
	e, err := New(Config{Sched: cfg}, kv, NewModelExecutor(m, storage), tok, NewMetrics(prometheus.NewRegistry(), "test"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return &fixture{model: m, tok: tok, engine: e, kv: kv}
}

// collect reads a stream to its end.
func collect(t *testing.T, s *Stream) (text string, ids []int32, last Delta) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		d, ok := s.Next(ctx)
		if !ok {
			if last.Finish == "" {
				t.Fatal("stream ended without a finish reason")
			}
			return text, ids, last
		}
		text += d.Text
		ids = append(ids, d.IDs...)
		last = d
	}
}

func greedy() sample.Params { return sample.Params{TopP: 1, Logprobs: -1} }

func testPrompt(seed, n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((seed*131 + i*17) % 500)
	}
	return p
}

func TestConcurrentRequestsMatchAlone(t *testing.T) {
	kernelstest.ForEachSet(t, checkConcurrentRequestsMatchAlone)
}

func checkConcurrentRequestsMatchAlone(t *testing.T, set *kernels.Set) {
	f := newFixtureOn(t, set, 512, sched.Config{MaxNumBatchedTokens: 128, MaxNumSeqs: 32})
	var wg sync.WaitGroup
	got := make([][]int32, 32)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := f.engine.Submit(Params{Prompt: testPrompt(i, 5+i%17), MaxTokens: 16, Sampling: greedy(), IgnoreEOS: true})
			if err != nil {
				t.Error(err)
				return
			}
			_, got[i], _ = collect(t, s)
		}()
	}
	wg.Wait()
	for i := range got {
		alone, err := generate.Run(context.Background(), f.model, testPrompt(i, 5+i%17),
			generate.Options{MaxTokens: 16, Sampling: greedy(), IgnoreEOS: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got[i], alone.IDs) {
			t.Fatalf("request %d: batched %v, alone %v", i, got[i], alone.IDs)
		}
	}
}

func TestSharedPrefixIsNotRecomputed(t *testing.T) {
	f := newFixture(t, 256, sched.Config{MaxNumBatchedTokens: 512, MaxNumSeqs: 8})
	shared := testPrompt(7, 1000)
	run := func(suffix ...int32) ([]int32, Usage) {
		s, err := f.engine.Submit(Params{Prompt: append(slices.Clone(shared), suffix...), MaxTokens: 8, Sampling: greedy(), IgnoreEOS: true})
		if err != nil {
			t.Fatal(err)
		}
		_, ids, last := collect(t, s)
		return ids, last.Usage
	}
	first, _ := run(3, 4)
	before := f.engine.Stats()
	second, usage := run(3, 4)
	after := f.engine.Stats()
	if !slices.Equal(first, second) {
		t.Fatalf("outputs differ: %v vs %v", first, second)
	}
	queried, hit := after.PrefixQueries-before.PrefixQueries, after.PrefixHits-before.PrefixHits
	computed := queried - hit
	if computed*10 > 1002 || usage.CachedTokens < 992 {
		t.Fatalf("second request computed %d of %d prompt tokens (cached %d)", computed, queried, usage.CachedTokens)
	}
}

func TestCancelFreesBlocks(t *testing.T) {
	f := newFixture(t, 256, sched.Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 16})
	base := f.engine.Stats().KVUsage
	var streams []*Stream
	for i := range 8 {
		s, err := f.engine.Submit(Params{Prompt: testPrompt(i, 40), MaxTokens: 500, Sampling: greedy(), IgnoreEOS: true})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, s := range streams {
		if _, ok := s.Next(ctx); !ok {
			t.Fatal("no output before cancelling")
		}
	}
	if f.engine.Stats().KVUsage <= base {
		t.Fatal("running requests hold no KV blocks")
	}
	for _, s := range streams {
		f.engine.Abort(s.ID)
	}
	for _, s := range streams {
		if _, _, last := collect(t, s); last.Finish != FinishAbort {
			t.Fatalf("cancelled stream finished with %q", last.Finish)
		}
	}
	waitFor(t, func() bool { return f.engine.Stats().KVUsage == base && f.engine.Stats().Running == 0 })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition never held")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestStopConditions(t *testing.T) {
	f := newFixture(t, 256, sched.Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 8})
	prompt := f.tok.Encode("Once upon a time there was", true)
	s, err := f.engine.Submit(Params{Prompt: prompt, MaxTokens: 40, Sampling: greedy(), IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	full, ids, last := collect(t, s)
	if last.Finish != FinishLength || len(ids) != 40 || last.Usage.CompletionTokens != 40 || last.Usage.PromptTokens != len(prompt) {
		t.Fatalf("length finish: %q, %d ids, usage %+v", last.Finish, len(ids), last.Usage)
	}
	if full != f.tok.Decode(ids, false) {
		t.Fatalf("streamed text %q differs from decoding %q", full, f.tok.Decode(ids, false))
	}
	// A stop string taken from the middle of the free-running text.
	if len(full) < 12 {
		t.Skipf("generated text too short to pick a stop string: %q", full)
	}
	stop := full[len(full)/2 : len(full)/2+3]
	s, _ = f.engine.Submit(Params{Prompt: prompt, MaxTokens: 40, Sampling: greedy(), IgnoreEOS: true, Stop: []string{stop}})
	text, _, last := collect(t, s)
	if last.Finish != FinishStop || text != full[:strings.Index(full, stop)] {
		t.Fatalf("stop %q: finish %q, text %q, want %q", stop, last.Finish, text, full[:strings.Index(full, stop)])
	}
	// A stop token: the fifth generated id.
	s, _ = f.engine.Submit(Params{Prompt: prompt, MaxTokens: 40, Sampling: greedy(), StopIDs: []int32{ids[4]}})
	_, got, last := collect(t, s)
	if last.Finish != FinishStop || !slices.Equal(got, ids[:slices.Index(ids, ids[4])+1]) {
		t.Fatalf("stop id: finish %q, ids %v", last.Finish, got)
	}
}

func TestSubmitRejects(t *testing.T) {
	f := newFixture(t, 8, sched.Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 8, MaxModelLen: 100})
	for _, tc := range []struct {
		p    Params
		want string
	}{
		{Params{MaxTokens: 1, Sampling: greedy()}, "prompt is empty"},
		{Params{Prompt: testPrompt(1, 90), MaxTokens: 20, Sampling: greedy()}, "context of 100"},
		{Params{Prompt: testPrompt(1, 10), MaxTokens: 1, Sampling: sample.Params{TopP: 3}}, "top_p"},
	} {
		if _, err := f.engine.Submit(tc.p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want %q", err, tc.want)
		}
	}
}

func TestDrain(t *testing.T) {
	f := newFixture(t, 64, sched.Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 8})
	s, err := f.engine.Submit(Params{Prompt: testPrompt(1, 10), MaxTokens: 30, Sampling: greedy(), IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	drained := make(chan error, 1)
	go func() { drained <- f.engine.Drain(ctx) }()
	waitFor(t, func() bool {
		_, err := f.engine.Submit(Params{Prompt: testPrompt(2, 10), MaxTokens: 3, Sampling: greedy()})
		return err == ErrDraining
	})
	if _, ids, last := collect(t, s); last.Finish != FinishLength || len(ids) != 30 {
		t.Fatalf("in-flight request during drain: %q after %d tokens", last.Finish, len(ids))
	}
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
}

func TestPreemptionUnderKVPressureKeepsOutputs(t *testing.T) {
	kernelstest.ForEachSet(t, checkPreemptionKeepsOutputs)
}

func checkPreemptionKeepsOutputs(t *testing.T, set *kernels.Set) {
	roomy := newFixtureOn(t, set, 512, sched.Config{MaxNumBatchedTokens: 256, MaxNumSeqs: 16})
	tight := newFixtureOn(t, set, 12, sched.Config{MaxNumBatchedTokens: 256, MaxNumSeqs: 16}) // 192 tokens for 10 requests of ~60
	// All ten are submitted before any is read, so that they overlap in
	// the engine however fast it runs them (goroutines that each submit
	// could arrive one after another and never press on the KV cache).
	run := func(f *fixture) [][]int32 {
		streams := make([]*Stream, 10)
		for i := range streams {
			s, err := f.engine.Submit(Params{Prompt: testPrompt(i, 20+i), MaxTokens: 30, Sampling: greedy(), IgnoreEOS: true})
			if err != nil {
				t.Fatal(err)
			}
			streams[i] = s
		}
		var wg sync.WaitGroup
		out := make([][]int32, len(streams))
		for i, s := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, out[i], _ = collect(t, s)
			}()
		}
		wg.Wait()
		return out
	}
	want, got := run(roomy), run(tight)
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Fatalf("request %d under KV pressure %v, unpressured %v", i, got[i], want[i])
		}
	}
	// A stream's last delta can reach its reader before the engine loop
	// has freed the sequence (seen on a slow, emulated CPU), so the stats
	// are waited for, not read once.
	idle := func() bool { s := tight.engine.Stats(); return s.KVUsage == 0 && s.Running+s.Waiting == 0 }
	waitFor(t, idle)
	if s := tight.engine.Stats(); s.Preemptions == 0 {
		t.Fatalf("after all finished (want preemptions): %+v", s)
	}
}
