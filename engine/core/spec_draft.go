package core

import (
	"fmt"
	"slices"

	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
)

// draftProposer proposes with a draft model (vLLM's "draft_model"
// method): a smaller model of the same vocabulary, run greedily for k
// steps per round over its own KV pool, batched across the requests that
// speculate. Each round first catches the draft up on the tokens the
// request gained since (the accepted drafts and the model's own token, or
// at first the whole prompt, a bounded number of tokens per round), then
// feeds it its own guesses.
type draftProposer struct {
	m   *model.Model
	kv  *kvcache.Cache
	mgr *kvcache.Manager
	// catchUp bounds the tokens a round feeds to catch requests up.
	catchUp int
	seqs    map[*sched.Request]*draftSeq
	nextSeq uint64

	batch  model.Batch
	logits []float32
	round  []*draftSeq // the requests a forward call of the round serves
}

// draftSeq is one request's state in the draft model's KV pool.
type draftSeq struct {
	seq uint64
	// computed counts the request's tokens whose keys and values the draft
	// pool holds.
	computed int
	// fed are the drafts the last round fed after them (positions
	// computed, computed+1, …): those the model accepted hold good keys
	// and values.
	fed []int32

	// A round's work: the request, its tokens, how many it catches up on
	// and the drafts it proposes (k of them).
	req    *sched.Request
	tokens []int32
	feed   int
	k      int
	drafts []int32
}

// newDraftProposer runs m over a KV pool of blocks blocks; a round feeds at
// most catchUp tokens (at least one block's worth) to catch requests up.
func newDraftProposer(m *model.Model, blocks, catchUp int) (*draftProposer, error) {
	if blocks < 1 {
		return nil, fmt.Errorf("draft model: its KV pool needs at least one block, got %d", blocks)
	}
	kv, err := kvcache.New(m.KVShape(), blocks)
	if err != nil {
		return nil, fmt.Errorf("draft model: %w", err)
	}
	return &draftProposer{m: m, kv: kv, mgr: kvcache.NewManager(blocks, false), catchUp: max(catchUp, kvcache.BlockSize),
		seqs: map[*sched.Request]*draftSeq{}}, nil
}

func (p *draftProposer) close() error {
	if err := p.kv.Free(); err != nil {
		return fmt.Errorf("draft model: %w", err)
	}
	return nil
}

// sweep forgets the requests that finished, freeing their draft blocks.
func (p *draftProposer) sweep() {
	for r, st := range p.seqs {
		if r.State() == sched.Finished {
			p.drop(r, st)
		}
	}
}

func (p *draftProposer) drop(r *sched.Request, st *draftSeq) {
	p.mgr.Free(st.seq)
	delete(p.seqs, r)
}

// propose runs the round for reqs. A request the draft pool has no room
// for, or whose catching up takes more than this round's share, gets no
// drafts this time.
func (p *draftProposer) propose(reqs []*sched.Request, ks []int) {
	maxPos := p.m.Config().MaxPositionEmbeddings
	budget := p.catchUp
	work := p.round[:0]
	for i, r := range reqs {
		st := p.seqs[r]
		if st == nil {
			p.nextSeq++
			st = &draftSeq{seq: p.nextSeq}
			p.seqs[r] = st
		}
		tokens := r.Tokens()
		st.reconcile(tokens)
		// Drafts are fed at positions len(tokens) .. len(tokens)+k-2, and
		// none past the draft model's context.
		k := min(ks[i], maxPos-len(tokens)+1)
		feed := len(tokens) - st.computed // at least the last token
		if k < 1 || budget < 1 {
			continue
		}
		if feed > budget {
			feed, k = budget, 0 // catch up in part; propose in a later round
		}
		if !p.allocate(st, st.computed+feed+max(k-1, 0)) {
			continue
		}
		st.req, st.tokens, st.feed, st.k, st.drafts = r, tokens, feed, k, st.drafts[:0]
		budget -= st.feed
		work = append(work, st)
	}
	p.round = work
	if len(work) == 0 {
		return
	}
	if err := p.run(work); err != nil {
		// A draft forward that fails costs the drafts, never the
		// requests: forget what the pool may hold for them.
		for _, st := range work {
			p.drop(st.req, st)
			st.req.Drafts = nil
		}
	}
	for _, st := range work {
		st.req, st.tokens = nil, nil
	}
	clear(p.round)
}

// allocate makes st's table cover n positions, freeing the draft blocks
// of requests that are not running (preempted: they catch up again when
// they return) when the pool is short.
func (p *draftProposer) allocate(st *draftSeq, n int) bool {
	if p.mgr.Allocate(st.seq, nil, n, nil, "") {
		return true
	}
	for r, other := range p.seqs {
		if r.State() != sched.Running {
			p.drop(r, other)
		}
	}
	return p.mgr.Allocate(st.seq, nil, n, nil, "")
}

// reconcile advances computed over the drafts the last round fed that the
// request's tokens now hold: their keys and values are the right ones. The
// last token is always fed again, for the logits the first draft comes from.
func (st *draftSeq) reconcile(tokens []int32) {
	for _, t := range st.fed {
		if st.computed >= len(tokens)-1 || tokens[st.computed] != t {
			break
		}
		st.computed++
	}
	st.fed = st.fed[:0]
	st.computed = min(st.computed, len(tokens)-1)
}

// run computes the round: one forward call that catches every request up
// and guesses its first draft, then one per further draft, each over the
// requests that still want one.
func (p *draftProposer) run(work []*draftSeq) error {
	b := &p.batch
	reset := func() {
		b.Tokens, b.Positions, b.Seqs = b.Tokens[:0], b.Positions[:0], b.Seqs[:0]
		b.BlockTables, b.LogitRows = b.BlockTables[:0], b.LogitRows[:0]
	}
	reset()
	var rows []*draftSeq
	for _, st := range work {
		seq := int32(len(b.BlockTables))
		b.BlockTables = append(b.BlockTables, p.mgr.Table(st.seq))
		for pos := st.computed; pos < st.computed+st.feed; pos++ {
			b.Tokens = append(b.Tokens, st.tokens[pos])
			b.Positions = append(b.Positions, int32(pos))
			b.Seqs = append(b.Seqs, seq)
		}
		st.computed += st.feed
		if st.k > 0 {
			b.LogitRows = append(b.LogitRows, len(b.Tokens)-1)
			rows = append(rows, st)
		}
	}
	for len(rows) > 0 {
		if err := p.forward(); err != nil {
			return err
		}
		vocab := p.m.Config().VocabSize
		next := rows[:0]
		reset()
		for j, st := range rows {
			d := sample.Argmax(p.logits[j*vocab : (j+1)*vocab])
			st.drafts = append(st.drafts, d)
			if len(st.drafts) == st.k {
				st.req.Drafts = slices.Clone(st.drafts)
				continue
			}
			// Feed the draft for the next one.
			seq := int32(len(b.BlockTables))
			b.BlockTables = append(b.BlockTables, p.mgr.Table(st.seq))
			b.Tokens = append(b.Tokens, d)
			b.Positions = append(b.Positions, int32(st.computed+len(st.fed)))
			b.Seqs = append(b.Seqs, seq)
			b.LogitRows = append(b.LogitRows, len(b.Tokens)-1)
			st.fed = append(st.fed, d)
			next = append(next, st)
		}
		rows = next
	}
	return nil
}

// forward runs the batch through the draft model into p.logits.
func (p *draftProposer) forward() error {
	n := len(p.batch.LogitRows) * p.m.Config().VocabSize
	if cap(p.logits) < n {
		p.logits = make([]float32, n)
	}
	p.logits = p.logits[:n]
	if err := p.m.Forward(&p.batch, p.kv, p.logits); err != nil {
		return fmt.Errorf("draft model forward: %w", err)
	}
	return nil
}
