package sched

import (
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"testing"

	"github.com/stokehq/stoke/engine/kvcache"
)

// nextToken stands in for the model: the next token is a function of every
// token before it, so recomputation after preemption must reproduce it.
func nextToken(tokens []int32) int32 {
	h := fnv.New32a()
	for _, t := range tokens {
		h.Write([]byte{byte(t), byte(t >> 8)})
	}
	return int32(h.Sum32() % 1000)
}

// run drives s until every request finishes, calling onStep after each
// step, and returns each request's output.
func run(t *testing.T, s *Scheduler, reqs []*Request, onStep func(Step)) map[string][]int32 {
	t.Helper()
	for _, r := range reqs {
		if err := s.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	out := map[string][]int32{}
	for steps := 0; s.NumRunning()+s.NumWaiting() > 0; steps++ {
		if steps > 100000 {
			t.Fatal("scheduler does not make progress")
		}
		step := s.Schedule()
		if step.NumTokens > s.cfg.MaxNumBatchedTokens || s.NumRunning() > s.cfg.MaxNumSeqs {
			t.Fatalf("step of %d tokens with %d running breaks the budget", step.NumTokens, s.NumRunning())
		}
		sampled := make([]int32, len(step.Work))
		for i, w := range step.Work {
			if w.Sample {
				sampled[i] = nextToken(w.Req.Tokens()[:w.Start+w.Count])
			}
		}
		s.Commit(step, sampled)
		if onStep != nil {
			onStep(step)
		}
		for _, w := range step.Work {
			if w.Sample && len(w.Req.Output) >= w.Req.MaxTokens {
				out[w.Req.ID] = slices.Clone(w.Req.Output)
				s.Finish(w.Req.ID)
			}
		}
	}
	return out
}

func prompt(seed, n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((seed*7919 + i*31) % 1000)
	}
	return p
}

func newScheduler(t *testing.T, cfg Config, blocks int) (*Scheduler, *kvcache.Manager) {
	t.Helper()
	kv := kvcache.NewManager(blocks, true)
	s, err := New(cfg, kv)
	if err != nil {
		t.Fatal(err)
	}
	return s, kv
}

func requests(n, promptLen, maxTokens int) []*Request {
	var reqs []*Request
	for i := range n {
		reqs = append(reqs, &Request{ID: fmt.Sprint("r", i), Prompt: prompt(i, promptLen+i%5), MaxTokens: maxTokens})
	}
	return reqs
}

func TestBatchedEqualsAlone(t *testing.T) {
	cfg := Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 32, MaxModelLen: 512}
	s, kv := newScheduler(t, cfg, 1024)
	together := run(t, s, requests(32, 40, 20), nil)
	for _, r := range requests(32, 40, 20) {
		alone, _ := newScheduler(t, cfg, 1024)
		want := run(t, alone, []*Request{r}, nil)[r.ID]
		if !slices.Equal(together[r.ID], want) {
			t.Fatalf("%s: batched %v, alone %v", r.ID, together[r.ID], want)
		}
	}
	if kv.Usage() != 0 {
		t.Fatalf("usage %v after every request finished", kv.Usage())
	}
}

func TestDecodesNeverWaitForALongPrefill(t *testing.T) {
	cfg := Config{MaxNumBatchedTokens: 32, MaxNumSeqs: 16, MaxModelLen: 2048}
	s, _ := newScheduler(t, cfg, 512)
	streams := requests(8, 10, 60)
	for _, r := range streams {
		if err := s.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	// Let all eight reach decoding.
	for s.NumWaiting() > 0 || slices.ContainsFunc(streams, func(r *Request) bool { return len(r.Output) == 0 }) {
		step := s.Schedule()
		sampled := make([]int32, len(step.Work))
		s.Commit(step, sampled)
	}
	long := &Request{ID: "long", Prompt: prompt(99, 1000), MaxTokens: 4}
	if err := s.Add(long); err != nil {
		t.Fatal(err)
	}
	chunks := 0
	for long.NumComputed < len(long.Prompt) {
		step := s.Schedule()
		seen := map[string]bool{}
		for _, w := range step.Work {
			seen[w.Req.ID] = true
			if w.Req == long {
				chunks++
			}
		}
		for _, r := range streams {
			if r.State() == Running && !seen[r.ID] {
				t.Fatalf("stream %s skipped a step while the long prompt prefilled", r.ID)
			}
		}
		s.Commit(step, make([]int32, len(step.Work)))
	}
	if chunks < 1000/cfg.MaxNumBatchedTokens {
		t.Fatalf("the long prompt took %d chunks", chunks)
	}
}

func TestPrefixReuse(t *testing.T) {
	cfg := Config{MaxNumBatchedTokens: 2048, MaxNumSeqs: 8, MaxModelLen: 2048}
	s, kv := newScheduler(t, cfg, 256)
	shared := prompt(5, 1000)
	first := &Request{ID: "first", Prompt: append(slices.Clone(shared), 1, 2, 3), MaxTokens: 8}
	second := &Request{ID: "second", Prompt: append(slices.Clone(shared), 1, 2, 3), MaxTokens: 8}
	var computed []int
	count := func(step Step) {
		for _, w := range step.Work {
			if w.Req == second {
				computed = append(computed, w.Count)
			}
		}
	}
	a := run(t, s, []*Request{first}, nil)
	b := run(t, s, []*Request{second}, count)
	prefill := computed[0]
	if prefill > len(second.Prompt)/10 {
		t.Fatalf("second request computed %d of %d prompt tokens", prefill, len(second.Prompt))
	}
	if second.NumCachedTokens < 992 {
		t.Fatalf("prefix cache supplied %d tokens", second.NumCachedTokens)
	}
	if !slices.Equal(a["first"], b["second"]) {
		t.Fatalf("outputs differ: %v vs %v", a["first"], b["second"])
	}
	if q, h := kv.PrefixStats(); h < 992 || q < 2*int64(len(shared)) {
		t.Fatalf("prefix stats queries %d hits %d", q, h)
	}
}

func TestPreemptionRecomputes(t *testing.T) {
	cfg := Config{MaxNumBatchedTokens: 128, MaxNumSeqs: 16, MaxModelLen: 256}
	free, _ := newScheduler(t, cfg, 1024)
	want := run(t, free, requests(12, 30, 40), nil)

	tight, kv := newScheduler(t, cfg, 24) // 384 tokens for 12 requests of ~75
	preempted := 0
	got := run(t, tight, requests(12, 30, 40), func(step Step) { preempted += len(step.Preempted) })
	if preempted == 0 {
		t.Fatal("a pool of 24 blocks preempted nothing")
	}
	for id, w := range want {
		if !slices.Equal(got[id], w) {
			t.Fatalf("%s: under pressure %v, unpressured %v", id, got[id], w)
		}
	}
	if kv.Usage() != 0 {
		t.Fatalf("usage %v after every request finished", kv.Usage())
	}
}

func TestPriorityAndVictims(t *testing.T) {
	cfg := Config{MaxNumBatchedTokens: 1000, MaxNumSeqs: 1, MaxModelLen: 100}
	s, _ := newScheduler(t, cfg, 64)
	for i, p := range []int{0, 5, 1, 5} {
		if err := s.Add(&Request{ID: fmt.Sprint(i), Prompt: prompt(i, 8), MaxTokens: 2, Priority: p}); err != nil {
			t.Fatal(err)
		}
	}
	var order []string
	for s.NumRunning()+s.NumWaiting() > 0 {
		step := s.Schedule()
		for _, w := range step.Work {
			if w.Start == 0 {
				order = append(order, w.Req.ID)
			}
		}
		s.Commit(step, make([]int32, len(step.Work)))
		for _, w := range step.Work {
			if len(w.Req.Output) >= w.Req.MaxTokens {
				s.Finish(w.Req.ID)
			}
		}
	}
	if want := []string{"1", "3", "2", "0"}; !slices.Equal(order, want) {
		t.Fatalf("admission order %v, want %v", order, want)
	}

	// The victim is the lowest-priority, newest running request.
	s, _ = newScheduler(t, Config{MaxNumBatchedTokens: 1000, MaxNumSeqs: 8, MaxModelLen: 100}, 6)
	for i, p := range []int{1, 0, 0} {
		s.Add(&Request{ID: fmt.Sprint(i), Prompt: prompt(i, 32), MaxTokens: 3, Priority: p})
	}
	step := s.Schedule()
	s.Commit(step, make([]int32, len(step.Work)))
	step = s.Schedule()
	if len(step.Preempted) == 0 || step.Preempted[0].ID != "2" {
		t.Fatalf("preempted %v, want request 2 first", step.Preempted)
	}
}

func TestFinishFreesBlocks(t *testing.T) {
	s, kv := newScheduler(t, Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 8, MaxModelLen: 256}, 64)
	reqs := requests(6, 40, 50)
	for _, r := range reqs {
		s.Add(r)
	}
	for range 5 {
		step := s.Schedule()
		s.Commit(step, make([]int32, len(step.Work)))
	}
	if kv.Usage() == 0 {
		t.Fatal("no blocks in use mid-run")
	}
	for _, r := range reqs {
		if !s.Finish(r.ID) {
			t.Fatalf("%s was not tracked", r.ID)
		}
	}
	if kv.Usage() != 0 || s.NumRunning() != 0 || s.NumWaiting() != 0 {
		t.Fatalf("usage %v, %d running, %d waiting after cancelling all", kv.Usage(), s.NumRunning(), s.NumWaiting())
	}
	if s.Finish("r0") {
		t.Fatal("finished an unknown request")
	}
}

func TestAddRejects(t *testing.T) {
	s, _ := newScheduler(t, Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 8, MaxModelLen: 100}, 4)
	for _, tc := range []struct {
		name string
		r    *Request
		want string
	}{
		{"empty", &Request{ID: "a", MaxTokens: 1}, "prompt is empty"},
		{"negative max tokens", &Request{ID: "b", Prompt: []int32{1}, MaxTokens: -1}, "max_tokens must not be negative"},
		{"past context", &Request{ID: "c", Prompt: prompt(1, 90), MaxTokens: 11}, "exceed the context of 100"},
		{"past pool", &Request{ID: "d", Prompt: prompt(1, 60), MaxTokens: 10}, "exceed the KV cache of 64 tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.Add(tc.r)
			if !errors.Is(err, ErrTooLong) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
	s.Add(&Request{ID: "x", Prompt: []int32{1}, MaxTokens: 1})
	if err := s.Add(&Request{ID: "x", Prompt: []int32{1}, MaxTokens: 1}); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("duplicate id: %v", err)
	}
}

// TestLowerPriorityPrefillIsCapped: beside a higher-priority request, a
// step computes at most LowerPriorityPrefill prompt tokens of the lower
// ones (their decodes are not capped), the higher one's prefill is never
// held back, alone the lower ones run at the full budget, and every output
// is the same as without the cap.
func TestLowerPriorityPrefillIsCapped(t *testing.T) {
	const capTokens = 16
	mk := func() []*Request {
		var reqs []*Request
		for i := range 6 {
			reqs = append(reqs, &Request{ID: fmt.Sprint("batch", i), Prompt: prompt(i, 50), MaxTokens: 8, Priority: -1000})
		}
		return append(reqs, &Request{ID: "interactive", Prompt: prompt(99, 40), MaxTokens: 8})
	}
	cfg := Config{MaxNumBatchedTokens: 256, MaxNumSeqs: 16, MaxModelLen: 512}
	plain, _ := newScheduler(t, cfg, 1024)
	want := run(t, plain, mk(), nil)

	cfg.LowerPriorityPrefill = capTokens
	s, _ := newScheduler(t, cfg, 1024)
	interactiveDone := false
	got := run(t, s, mk(), func(step Step) {
		lower := 0
		for _, w := range step.Work {
			switch {
			case w.Req.ID == "interactive" && w.Start == 0 && w.Count != 40:
				t.Errorf("the top-priority prefill got %d of its 40 tokens", w.Count)
			case w.Req.Priority < 0 && w.Count > 1:
				lower += w.Count
			}
			if w.Req.ID == "interactive" && len(w.Req.Output) >= w.Req.MaxTokens {
				interactiveDone = true
			}
		}
		if !interactiveDone && lower > capTokens {
			t.Errorf("a step beside the interactive request computed %d lower-priority prompt tokens, cap %d", lower, capTokens)
		}
	})
	for id, out := range want {
		if !slices.Equal(got[id], out) {
			t.Fatalf("%s: %v with the cap, %v without", id, got[id], out)
		}
	}

	// Alone, batch work is not capped: its first step fills the budget.
	s, _ = newScheduler(t, cfg, 1024)
	first := true
	run(t, s, mk()[:6], func(step Step) {
		if first && step.NumTokens != cfg.MaxNumBatchedTokens {
			t.Errorf("first step of batch work alone computed %d tokens, want the budget of %d", step.NumTokens, cfg.MaxNumBatchedTokens)
		}
		first = false
	})
}

// TestScorePromptComputesEveryPosition checks that a request scoring its
// prompt takes nothing from the prefix cache (a plain request with the
// same prompt does), still registers its blocks for later ones, and that
// a prefill-only request (MaxTokens 0) is never sampled.
func TestScorePromptComputesEveryPosition(t *testing.T) {
	s, kv := newScheduler(t, Config{MaxNumBatchedTokens: 16, MaxNumSeqs: 4, MaxModelLen: 200}, 32)
	p := prompt(4, 40)
	// prefill runs r alone to the end of its prompt and returns its work.
	prefill := func(t *testing.T, r *Request) []Work {
		t.Helper()
		if err := s.Add(r); err != nil {
			t.Fatal(err)
		}
		var work []Work
		for r.NumComputed < len(r.Prompt) {
			step := s.Schedule()
			if len(step.Work) != 1 || step.Work[0].Req != r {
				t.Fatalf("step %+v, want %s alone", step, r.ID)
			}
			work = append(work, step.Work[0])
			s.Commit(step, []int32{7})
		}
		return work
	}
	for _, tc := range []struct {
		name      string
		score     bool
		maxTokens int
		start     int // of the first work item
		sampled   bool
	}{
		{"scoring, first", true, 0, 0, false},
		{"plain, cache filled by the scoring request", false, 1, 32, true},
		{"scoring, cache full", true, 2, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			queries, _ := kv.PrefixStats()
			r := &Request{ID: tc.name, Prompt: p, MaxTokens: tc.maxTokens, ScorePrompt: tc.score, PromptTopLogprobs: 1}
			defer s.Finish(r.ID) // its blocks stay in the cache for the next case
			work := prefill(t, r)
			last := work[len(work)-1]
			if work[0].Start != tc.start || r.NumCachedTokens != tc.start || last.Sample != tc.sampled || !last.CompletesPrompt() {
				t.Fatalf("first work starts at %d (cached %d), last samples %v (completes the prompt %v): want %d, %v",
					work[0].Start, r.NumCachedTokens, last.Sample, last.CompletesPrompt(), tc.start, tc.sampled)
			}
			for _, w := range work[:len(work)-1] {
				if w.Sample || w.CompletesPrompt() {
					t.Fatalf("a prefill chunk %+v samples or ends the prompt", w)
				}
			}
			if after, _ := kv.PrefixStats(); tc.score && after != queries {
				t.Fatalf("a scoring request looked up the prefix cache (%d tokens queried)", after-queries)
			}
		})
	}
}
