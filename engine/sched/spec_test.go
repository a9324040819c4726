package sched

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"testing"

	"github.com/stokehq/stoke/engine/kvcache"
)

// decodeState returns a running request whose prompt is computed and
// which has generated one token: the next step decodes it.
func decodeState(t *testing.T, s *Scheduler, r *Request, onStep ...func(Step)) {
	t.Helper()
	if err := s.Add(r); err != nil {
		t.Fatal(err)
	}
	for len(r.Output) == 0 {
		step := s.Schedule()
		for _, f := range onStep {
			f(step)
		}
		sampled := make([]int32, len(step.Work))
		for i := range sampled {
			sampled[i] = 7
		}
		s.Commit(step, sampled)
	}
	if !r.Decoding() {
		t.Fatalf("%s is not decoding: %d tokens, %d computed", r.ID, len(r.Tokens()), r.NumComputed)
	}
}

// TestScheduleDrafts checks how many of a decoding request's drafts a step
// takes: as many as the token budget, MaxTokens (a step emits one token
// more than it accepts) and the context leave room for, all within the
// budget, with the KV table covering them.
func TestScheduleDrafts(t *testing.T) {
	for _, tc := range []struct {
		name              string
		drafts, budget    int
		promptLen         int
		maxTokens, maxLen int
		blocks            int
		crowd             bool // a second request takes the pool's last block
		wantDrafts        int
	}{
		{"all", 4, 64, 20, 50, 512, 64, false, 4},
		{"budget", 4, 3, 20, 50, 512, 64, false, 2},
		{"budget of one", 4, 1, 20, 50, 512, 64, false, 0},
		{"max_tokens", 6, 64, 20, 4, 512, 64, false, 2},             // 1 generated, 3 left: 2 drafts + 1
		{"max_tokens: last token", 6, 64, 20, 2, 512, 64, false, 0}, // 1 generated, 1 left
		{"context", 8, 64, 20, 100, 27, 64, false, 5},               // 21 of 27 tokens: 5 drafts + 1
		{"no KV room for drafts", 8, 64, 30, 10, 512, 3, true, 0},   // 32 tokens in 2 blocks, the third taken
		{"none", 0, 64, 20, 50, 512, 64, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, kv := newScheduler(t, Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 4, MaxModelLen: tc.maxLen}, tc.blocks)
			r := &Request{ID: "r", Prompt: prompt(1, tc.promptLen), MaxTokens: min(tc.maxTokens, tc.maxLen-tc.promptLen)}
			decodeState(t, s, r)
			if tc.crowd {
				// A second request fills the rest of the pool, so that r's
				// drafts would need a block no one has.
				other := &Request{ID: "other", Prompt: prompt(2, 11), MaxTokens: 1}
				decodeState(t, s, other)
				if kv.NumFreeBlocks() != 0 {
					t.Fatalf("%d blocks free", kv.NumFreeBlocks())
				}
			}
			s.cfg.MaxNumBatchedTokens = tc.budget
			r.Drafts = make([]int32, tc.drafts)
			for i := range r.Drafts {
				r.Drafts[i] = int32(100 + i)
			}
			step := s.Schedule()
			var w Work
			for _, x := range step.Work {
				if x.Req == r {
					w = x
				}
			}
			if w.Req == nil {
				t.Fatalf("r not scheduled: %+v", step)
			}
			if len(step.Preempted) > 0 {
				t.Fatalf("drafts preempted %v", step.Preempted)
			}
			if len(w.Drafts) != tc.wantDrafts || w.Count != 1+tc.wantDrafts || w.Start != len(r.Tokens())-1 || !w.Sample {
				t.Fatalf("work %+v: want %d drafts from position %d", w, tc.wantDrafts, len(r.Tokens())-1)
			}
			if step.NumTokens > tc.budget {
				t.Fatalf("step of %d tokens over the budget of %d", step.NumTokens, tc.budget)
			}
			if len(w.Table)*kvcache.BlockSize < w.Start+w.Count {
				t.Fatalf("table of %d blocks does not cover %d positions", len(w.Table), w.Start+w.Count)
			}
			for p := w.Start; p < w.Start+w.Count; p++ {
				want := r.Tokens()[min(p, len(r.Tokens())-1)]
				if p > w.Start {
					want = int32(100 + p - w.Start - 1)
				}
				if got := w.Token(p); got != want {
					t.Fatalf("Token(%d) = %d, want %d", p, got, want)
				}
			}
			if r.Drafts != nil {
				t.Fatal("Schedule left the request's drafts set")
			}
		})
	}
}

// TestAcceptPartial checks Commit and Accept on a step that verified four
// drafts: Commit leaves the item to Accept, which records the accepted
// drafts and the model's token one at a time, every token but the last
// computed, and refuses what cannot follow.
func TestAcceptPartial(t *testing.T) {
	drafts := []int32{11, 12, 13, 14}
	for _, tc := range []struct {
		name    string
		tokens  []int32
		wantErr string // of the last Accept
	}{
		{"first rejected", []int32{99}, ""},
		{"two accepted", []int32{11, 12, 99}, ""},
		{"all accepted and one more", []int32{11, 12, 13, 14, 99}, ""},
		{"a stop after one", []int32{11}, ""},
		{"nothing after a replacement", []int32{11, 99, 13}, "replaced draft"},
		{"at most k+1", []int32{11, 12, 13, 14, 15, 16}, "at most 5 tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newScheduler(t, Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 4, MaxModelLen: 512}, 64)
			r := &Request{ID: "r", Prompt: prompt(1, 13), MaxTokens: 50}
			decodeState(t, s, r)
			before := len(r.Tokens())
			r.Drafts = slices.Clone(drafts)
			step := s.Schedule()
			w := step.Work[0]
			s.Commit(step, []int32{42})
			if len(r.Tokens()) != before || r.NumComputed != before-1 {
				t.Fatalf("Commit recorded a drafted item: %d tokens, %d computed", len(r.Tokens()), r.NumComputed)
			}
			var err error
			for i, id := range tc.tokens {
				if err = s.Accept(w, id); err != nil {
					if i != len(tc.tokens)-1 {
						t.Fatalf("token %d: %v", i, err)
					}
					break
				}
				if r.NumComputed != len(r.Tokens())-1 || !r.Decoding() {
					t.Fatalf("after token %d: %d tokens, %d computed", i, len(r.Tokens()), r.NumComputed)
				}
			}
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
			kept := len(tc.tokens)
			if tc.wantErr != "" {
				kept--
			}
			if got := r.Output[1:]; !slices.Equal(got, tc.tokens[:kept]) {
				t.Fatalf("output %v, want %v", got, tc.tokens[:kept])
			}
		})
	}
	t.Run("refusals", func(t *testing.T) {
		s, _ := newScheduler(t, Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 4, MaxModelLen: 512}, 64)
		r := &Request{ID: "r", Prompt: prompt(1, 13), MaxTokens: 3}
		decodeState(t, s, r)
		r.Drafts = []int32{11, 12, 13}
		step := s.Schedule()
		w := step.Work[0]
		if len(w.Drafts) != 1 {
			t.Fatalf("%d drafts with 2 tokens left", len(w.Drafts))
		}
		if err := s.Accept(Work{Req: r, Start: w.Start, Count: 1}, 5); err == nil || !strings.Contains(err.Error(), "no drafts") {
			t.Fatalf("Accept of a plain item: %v", err)
		}
		for _, id := range []int32{11, 12} {
			if err := s.Accept(w, id); err != nil {
				t.Fatal(err)
			}
		}
		s.Finish(r.ID)
		if err := s.Accept(w, 1); err == nil || !strings.Contains(err.Error(), "finished") {
			t.Fatalf("Accept after Finish: %v", err)
		}
	})
}

// proposal strategies: what a proposer guesses after a request's tokens,
// given the true continuation.
type proposal func(r *Request, truth []int32, step int) []int32

func specHash(vals ...int) int {
	h := fnv.New32a()
	for _, v := range vals {
		h.Write([]byte{byte(v), byte(v >> 8), byte(v >> 16)})
	}
	return int(h.Sum32())
}

var proposals = map[string]proposal{
	"none":    func(*Request, []int32, int) []int32 { return nil },
	"correct": func(_ *Request, truth []int32, _ int) []int32 { return truth },
	"wrong": func(_ *Request, truth []int32, _ int) []int32 {
		out := slices.Clone(truth)
		for i := range out {
			out[i]++
		}
		return out
	},
	"partial": func(r *Request, truth []int32, step int) []int32 {
		out := slices.Clone(truth)
		if len(out) == 0 {
			return nil
		}
		m := specHash(step, len(r.Tokens())) % (len(out) + 1)
		for i := m; i < len(out); i++ {
			out[i] += int32(1 + i)
		}
		return out
	},
}

// stopsAt is the simulated stop token: generation ends after a token
// divisible by 97.
func stopsAt(id int32) bool { return id%97 == 0 }

// specHarness drives a scheduler as the engine does with speculation: a
// stand-in model (nextToken), drafts from a proposal, verification by
// exact match, token-by-token Accept with a stop rule, and a record of
// which token each KV slot was computed for.
type specHarness struct {
	t         *testing.T
	s         *Scheduler
	kv        *kvcache.Manager
	k         int
	prop      proposal
	slots     map[int32]*[kvcache.BlockSize]int32 // block -> token computed in each slot
	done      [][]int32                           // finished requests' tokens
	steps     int
	drafts    int
	preempted int
}

func (h *specHarness) run(reqs []*Request) map[string][]int32 {
	t := h.t
	for _, r := range reqs {
		if err := h.s.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	out := map[string][]int32{}
	finish := func(r *Request) {
		out[r.ID] = slices.Clone(r.Output)
		h.done = append(h.done, slices.Clone(r.Tokens()))
		h.s.Finish(r.ID)
	}
	for ; h.s.NumRunning()+h.s.NumWaiting() > 0; h.steps++ {
		if h.steps > 100000 {
			t.Fatal("no progress")
		}
		for _, r := range h.s.Running() {
			if r.Decoding() {
				truth := make([]int32, 0, h.k)
				ctx := slices.Clone(r.Tokens())
				for range h.k {
					next := nextToken(ctx)
					truth = append(truth, next)
					ctx = append(ctx, next)
				}
				r.Drafts = h.prop(r, truth, h.steps)
			}
		}
		step := h.s.Schedule()
		h.preempted += len(step.Preempted)
		if step.NumTokens > h.s.cfg.MaxNumBatchedTokens {
			t.Fatalf("step of %d tokens over the budget of %d", step.NumTokens, h.s.cfg.MaxNumBatchedTokens)
		}
		sampled := make([]int32, len(step.Work))
		for i, w := range step.Work {
			r := w.Req
			if len(w.Table)*kvcache.BlockSize < w.Start+w.Count {
				t.Fatalf("%s: table short of %d positions", r.ID, w.Start+w.Count)
			}
			if len(w.Drafts) > 0 && (w.Start != len(r.Tokens())-1 || len(r.Output)+len(w.Drafts) >= r.MaxTokens || w.Start+w.Count > h.s.cfg.MaxModelLen) {
				t.Fatalf("%s: drafts past the request's bounds: %+v (%d tokens, output %d of %d)", r.ID, w, len(r.Tokens()), len(r.Output), r.MaxTokens)
			}
			for p := w.Start; p < w.Start+w.Count; p++ {
				b := w.Table[p/kvcache.BlockSize]
				if h.slots[b] == nil {
					h.slots[b] = new([kvcache.BlockSize]int32)
				}
				h.slots[b][p%kvcache.BlockSize] = w.Token(p)
			}
			if w.Sample && len(w.Drafts) == 0 {
				sampled[i] = nextToken(r.Tokens()[:w.Start+w.Count])
			}
		}
		h.s.Commit(step, sampled)
		for i, w := range step.Work {
			r := w.Req
			if r.State() != Running || !w.Sample {
				continue
			}
			if len(w.Drafts) == 0 {
				if stopsAt(sampled[i]) || len(r.Output) >= r.MaxTokens {
					finish(r)
				}
				continue
			}
			h.drafts++
			ctx := append(slices.Clone(r.Tokens()), w.Drafts...)
			for j := 0; j <= len(w.Drafts); j++ {
				id := nextToken(ctx[:w.Start+1+j])
				if err := h.s.Accept(w, id); err != nil {
					t.Fatal(err)
				}
				if stopsAt(id) || len(r.Output) >= r.MaxTokens {
					finish(r)
					break
				}
				if j == len(w.Drafts) || id != w.Drafts[j] {
					break
				}
			}
		}
		h.check()
	}
	return out
}

// check asserts that every computed position of a running request holds
// its token, and that every block the prefix cache hands out for a
// running, waiting or finished request's tokens holds them.
func (h *specHarness) check() {
	t := h.t
	cached := func(tokens []int32, who string) {
		tokens = append(slices.Clone(tokens), 0) // as a later prompt that starts with them
		blocks, _ := h.kv.LookupPrefix(tokens, "")
		for i, b := range blocks {
			want := tokens[i*kvcache.BlockSize : (i+1)*kvcache.BlockSize]
			if got := h.slots[b]; got == nil || !slices.Equal(got[:], want) {
				t.Fatalf("step %d: %s: cached block %d (#%d of the prefix) holds %v, its hash says %v", h.steps, who, b, i, got, want)
			}
		}
	}
	for _, r := range h.s.Running() {
		table := h.kv.Table(r.seq)
		for p := range r.NumComputed {
			if got := h.slots[table[p/kvcache.BlockSize]][p%kvcache.BlockSize]; got != r.Tokens()[p] {
				t.Fatalf("step %d: %s: position %d computed for %d, holds %d", h.steps, r.ID, p, got, r.Tokens()[p])
			}
		}
		cached(r.Tokens(), r.ID)
	}
	for _, r := range h.s.waiting {
		cached(r.Tokens(), r.ID)
	}
	for i, tokens := range h.done {
		cached(tokens, fmt.Sprint("finished #", i))
	}
}

// TestSpeculativeSchedulingKeepsOutputs runs the same requests with every
// proposal strategy, in roomy and tight KV pools (preemption), small and
// large budgets, mixed priorities and max_tokens edges, and checks that
// the outputs are those of plain decoding, that drafts were verified, and
// that no step leaves a computed position or a cached block holding the
// keys and values of a token other than its own (a rejected draft's).
func TestSpeculativeSchedulingKeepsOutputs(t *testing.T) {
	mk := func() []*Request {
		var reqs []*Request
		for i := range 12 {
			reqs = append(reqs, &Request{ID: fmt.Sprint("r", i), Prompt: prompt(i%5, 14+i*3), MaxTokens: []int{1, 2, 3, 5, 40, 60}[i%6], Priority: i % 3})
		}
		return reqs
	}
	baseCfg := Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 16, MaxModelLen: 256}
	plain, _ := newScheduler(t, baseCfg, 1024)
	want := (&specHarness{t: t, s: plain, kv: plain.kv, k: 4, prop: proposals["none"], slots: map[int32]*[kvcache.BlockSize]int32{}}).run(mk())
	for _, tc := range []struct {
		name   string
		prop   string
		k      int
		budget int
		blocks int
	}{
		{"correct", "correct", 4, 64, 1024},
		{"wrong", "wrong", 4, 64, 1024},
		{"partial", "partial", 4, 64, 1024},
		{"partial, long drafts, small budget", "partial", 9, 12, 1024},
		{"partial, tight pool", "partial", 4, 64, 14},
		{"correct, tight pool", "correct", 6, 32, 12},
		{"wrong, tight pool, small budget", "wrong", 3, 8, 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseCfg
			cfg.MaxNumBatchedTokens = tc.budget
			s, kv := newScheduler(t, cfg, tc.blocks)
			h := &specHarness{t: t, s: s, kv: kv, k: tc.k, prop: proposals[tc.prop], slots: map[int32]*[kvcache.BlockSize]int32{}}
			got := h.run(mk())
			for _, r := range mk() {
				if !slices.Equal(got[r.ID], want[r.ID]) {
					t.Fatalf("%s: %v with drafts, %v without", r.ID, got[r.ID], want[r.ID])
				}
			}
			if h.drafts == 0 {
				t.Fatal("no step verified drafts")
			}
			if kv.Usage() != 0 {
				t.Fatalf("usage %v after every request finished", kv.Usage())
			}
			if tight := tc.blocks < 100; tight != (h.preempted > 0) {
				t.Fatalf("%d preemptions with a pool of %d blocks", h.preempted, tc.blocks)
			}
		})
	}
}

// TestRejectedDraftNeverCached builds the case where a rejected draft's
// keys and values could reach the prefix cache: request a replaces the
// draft in its block's last slot, so that its tokens fill the block while
// the slot still holds the draft's keys and values; in its next step,
// before the slot is computed again, higher-priority h needs a block and
// preempts it. Schedule registers only computed positions, so the block
// never enters the cache under a's tokens and no later request (nor a's
// recompute) can take the stale slot from it.
func TestRejectedDraftNeverCached(t *testing.T) {
	s, kv := newScheduler(t, Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 4, MaxModelLen: 512}, 4)
	slots := map[int32]*[kvcache.BlockSize]int32{}
	compute := func(step Step) {
		for _, w := range step.Work {
			for p := w.Start; p < w.Start+w.Count; p++ {
				b := w.Table[p/kvcache.BlockSize]
				if slots[b] == nil {
					slots[b] = new([kvcache.BlockSize]int32)
				}
				slots[b][p%kvcache.BlockSize] = w.Token(p)
			}
		}
	}
	a := &Request{ID: "a", Prompt: prompt(1, 29), MaxTokens: 20}
	decodeState(t, s, a, compute) // 30 tokens, 29 computed, in 2 blocks
	h := &Request{ID: "h", Prompt: prompt(2, 16), MaxTokens: 8, Priority: 1}
	if err := s.Add(h); err != nil {
		t.Fatal(err)
	}
	// a verifies drafts at 30, 31 and 32 (a third block), keeping the
	// first and replacing the second; h takes the pool's last block.
	a.Drafts = []int32{500, 501, 502}
	step := s.Schedule()
	compute(step)
	s.Commit(step, make([]int32, len(step.Work)))
	for _, id := range []int32{500, 999} {
		if err := s.Accept(step.Work[0], id); err != nil {
			t.Fatal(err)
		}
	}
	if len(a.Tokens()) != 32 || a.NumComputed != 31 || slots[kv.Table(a.seq)[1]][15] != 501 || kv.NumFreeBlocks() != 0 || !h.Decoding() {
		t.Fatalf("set-up: a has %d tokens, %d computed; %d free blocks; h decoding %v", len(a.Tokens()), a.NumComputed, kv.NumFreeBlocks(), h.Decoding())
	}
	// a decodes position 31 first, then h needs a second block: a goes.
	step = s.Schedule()
	if len(step.Preempted) != 1 || step.Preempted[0] != a {
		t.Fatalf("preempted %v, want a", step.Preempted)
	}
	compute(step)
	s.Commit(step, make([]int32, len(step.Work)))
	probe := append(slices.Clone(a.Tokens()), 0) // a later prompt that starts with a's tokens
	blocks, n := kv.LookupPrefix(probe, "")
	for i, b := range blocks {
		want := probe[i*kvcache.BlockSize : (i+1)*kvcache.BlockSize]
		if got := slots[b]; !slices.Equal(got[:], want) {
			t.Fatalf("cached block %d (#%d) holds %v, its hash says %v", b, i, got, want)
		}
	}
	if n != kvcache.BlockSize {
		t.Fatalf("the cache holds %d of a's tokens, want its prompt's first block", n)
	}
}
