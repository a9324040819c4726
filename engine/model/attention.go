package model

import (
	"math"

	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kvcache"
)

// attentionScoreFloats bounds one attention job's score matrix (rows of
// queries × cached positions), so that it stays in L2 with its queries.
const attentionScoreFloats = 64 << 10

// attentionMaxRows bounds the query rows (tokens × query heads of one KV
// head) one attention job multiplies at once.
const attentionMaxRows = 64

// attentionPlan is how one forward call splits attention into jobs: each
// job is one KV head of one sequence and a run of that sequence's tokens in
// the batch, whose query heads sharing the KV head are multiplied with the
// cached keys, and their softmax with the cached values, as small matrix
// products.
type attentionPlan struct {
	// seqTokens lists, per sequence (block table), its tokens' indices in
	// the batch, in position order.
	seqTokens [][]int
	// seqs are the sequences with tokens in the batch.
	seqs []int
	jobs []attentionJob
}

// attentionJob is a run [lo, hi) of sequence seq's tokens in the batch.
type attentionJob struct{ seq, lo, hi int }

// attentionScratch is one job's working memory.
type attentionScratch struct{ queries, scores, out []float32 }

// plan splits b's attention into jobs for every layer of this call.
func (p *attentionPlan) plan(c *Config, b *Batch) {
	for len(p.seqTokens) < len(b.BlockTables) {
		p.seqTokens = append(p.seqTokens, nil)
	}
	for _, s := range p.seqs {
		p.seqTokens[s] = p.seqTokens[s][:0]
	}
	p.seqs, p.jobs = p.seqs[:0], p.jobs[:0]
	for i, s := range b.Seqs {
		if len(p.seqTokens[s]) == 0 {
			p.seqs = append(p.seqs, int(s))
		}
		p.seqTokens[s] = append(p.seqTokens[s], i)
	}
	group := c.NumHeads / c.NumKVHeads
	for _, s := range p.seqs {
		toks := p.seqTokens[s]
		n := int(b.Positions[toks[len(toks)-1]]) + 1
		per := max(1, min(attentionMaxRows, attentionScoreFloats/n)/group)
		runs := (len(toks) + per - 1) / per
		// Later runs attend to more positions. Listing runs from both
		// ends alternately keeps the contiguous ranges that the pool
		// hands each thread about equal in cost.
		for k := range runs {
			r := k / 2
			if k%2 == 1 {
				r = runs - 1 - k/2
			}
			p.jobs = append(p.jobs, attentionJob{seq: s, lo: r * per, hi: min(len(toks), (r+1)*per)})
		}
	}
}

// attention computes, for every token and query head, softmax(q·K/√d)·V
// over the token's sequence up to and including its position.
func (m *Model) attention(l int, b *Batch, kv *kvcache.Cache) {
	p, kvHeads := &m.attn, m.cfg.NumKVHeads
	m.pool.Parallel(len(p.jobs)*kvHeads, 1, func(lo, hi int) {
		sc, _ := m.scratch.Get().(*attentionScratch)
		if sc == nil {
			sc = new(attentionScratch)
		}
		for job := lo; job < hi; job++ {
			m.attend(l, b, kv, p.jobs[job/kvHeads], job%kvHeads, sc)
		}
		m.scratch.Put(sc)
	})
}

// attend computes the attention of KV head kvHead's query heads for one
// job's tokens: scores against every cached key of the sequence, a causal
// softmax per row, then the sum of the cached values so weighted, block by
// block of the cache.
func (m *Model) attend(l int, b *Batch, kv *kvcache.Cache, job attentionJob, kvHead int, sc *attentionScratch) {
	c, p, buf := &m.cfg, &m.attn, &m.buf
	hd, heads, group := c.HeadDim, c.NumHeads, c.NumHeads/c.NumKVHeads
	tokSize := c.NumKVHeads * hd
	toks := p.seqTokens[job.seq][job.lo:job.hi]
	rows := len(toks) * group
	n := int(b.Positions[toks[len(toks)-1]]) + 1
	headsAt := kvHead * group * hd

	q := grow(sc.queries, rows*hd)
	sc.queries = q
	for a, i := range toks {
		copy(q[a*group*hd:(a+1)*group*hd], buf.q[i*heads*hd+headsAt:])
	}
	m.pool.Scale(q, float32(1/math.Sqrt(float64(hd))))

	// Scores are taken against whole blocks, slots past the sequence
	// included (they are cleared below), so that each score is summed the
	// same way whatever n is: greedy output must not depend on how the
	// scheduler chunked a prompt.
	width := (n + kvcache.BlockSize - 1) / kvcache.BlockSize * kvcache.BlockSize
	scores := grow(sc.scores, rows*width)
	sc.scores = scores
	table := b.BlockTables[job.seq]
	for pos0 := 0; pos0 < n; pos0 += kvcache.BlockSize {
		keys := kv.BlockKeys(l, table[pos0/kvcache.BlockSize])[kvHead*hd:]
		m.pool.MulRows(scores[pos0:], width, q, hd, rows, keys, tokSize, kvcache.BlockSize, hd)
	}
	for r := range rows {
		row := scores[r*width : (r+1)*width]
		visible := int(b.Positions[toks[r/group]]) + 1
		softmax(m.pool, row[:visible])
		clear(row[visible:])
	}

	out := grow(sc.out, rows*hd)
	sc.out = out
	clear(out)
	for pos0 := 0; pos0 < n; pos0 += kvcache.BlockSize {
		values := kv.BlockValues(l, table[pos0/kvcache.BlockSize])[kvHead*hd:]
		m.pool.AddWeightedRows(out, hd, scores[pos0:], width, rows, values, tokSize, min(kvcache.BlockSize, n-pos0), hd)
	}
	for a, i := range toks {
		copy(buf.att[i*heads*hd+headsAt:][:group*hd], out[a*group*hd:])
	}
}

// softmax replaces x with exp(x - max) / Σ exp(x - max).
func softmax(p *kernels.Pool, x []float32) {
	p.Scale(x, 1/p.ExpSum(x, p.Max(x)))
}
