// Package model is the Llama-family transformer: config validation against
// the checkpoint's tensors and a batched forward pass that reads and writes
// keys and values through the block tables of a paged KV cache.
package model

import (
	"fmt"
	"math"
	"sync"

	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kvcache"
)

// Model is a loaded Llama model. Forward is not safe for concurrent use:
// one scheduler drives a model.
type Model struct {
	cfg     Config
	w       *Weights
	pool    *kernels.Pool
	invFreq []float64
	buf     buffers
	attn    attentionPlan
	// scratch recycles the attention jobs' working memory.
	scratch sync.Pool
	// lora groups each forward call's tokens by LoRA adapter.
	lora loraPlan
}

// New checks src against cfg and builds a model over its tensors. The model
// keeps references into src's memory, which must outlive it.
func New(cfg Config, src TensorSource, pool *kernels.Pool) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	w, err := loadWeights(&cfg, src)
	if err != nil {
		return nil, err
	}
	return &Model{cfg: cfg, w: w, pool: pool, invFreq: cfg.InverseFrequencies()}, nil
}

// Config returns the model's configuration.
func (m *Model) Config() Config { return m.cfg }

// Weights returns the model's parameters.
func (m *Model) Weights() *Weights { return m.w }

// KVShape is the KV-cache geometry this model needs.
func (m *Model) KVShape() kvcache.Shape {
	return kvcache.Shape{Layers: m.cfg.NumLayers, KVHeads: m.cfg.NumKVHeads, HeadDim: m.cfg.HeadDim}
}

// Batch is one forward call's work: tokens from any number of sequences,
// each at its position in its sequence. A sequence's earlier positions must
// already be in the KV cache, and its tokens in this batch must be in
// position order.
type Batch struct {
	Tokens    []int32
	Positions []int32
	// Seqs gives, for each token, the index of its sequence's block table.
	Seqs        []int32
	BlockTables [][]int32
	// LogitRows lists the tokens (indices into Tokens) whose next-token
	// logits Forward returns, in that order.
	LogitRows []int
	// Adapters, when not empty, gives each sequence (aligned with
	// BlockTables) the LoRA adapter applied to its tokens; nil runs the
	// base model.
	Adapters []*Adapter
}

func (b *Batch) validate(c *Config) error {
	n := len(b.Tokens)
	if len(b.Positions) != n || len(b.Seqs) != n {
		return fmt.Errorf("batch: %d tokens but %d positions and %d sequence ids", n, len(b.Positions), len(b.Seqs))
	}
	for i := range n {
		tok, pos, seq := b.Tokens[i], b.Positions[i], b.Seqs[i]
		switch {
		case tok < 0 || int(tok) >= c.VocabSize:
			return fmt.Errorf("batch: token %d at index %d is outside the vocabulary (%d)", tok, i, c.VocabSize)
		case pos < 0 || int(pos) >= c.MaxPositionEmbeddings:
			return fmt.Errorf("batch: position %d at index %d is outside the context (%d)", pos, i, c.MaxPositionEmbeddings)
		case seq < 0 || int(seq) >= len(b.BlockTables):
			return fmt.Errorf("batch: sequence %d at index %d has no block table", seq, i)
		case int(pos)/kvcache.BlockSize >= len(b.BlockTables[seq]):
			return fmt.Errorf("batch: block table of sequence %d does not cover position %d", seq, pos)
		}
	}
	for _, r := range b.LogitRows {
		if r < 0 || r >= n {
			return fmt.Errorf("batch: logit row %d is outside the batch (%d tokens)", r, n)
		}
	}
	return b.validateAdapters(c)
}

// buffers are the activations of one forward call, grown on demand.
type buffers struct {
	x, h, q, k, v, att, gate, up, rope []float32
	// logits receives ForwardRows' groups of logit rows.
	logits []float32
}

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

func (b *buffers) size(c *Config, n int) {
	d, q, kv, f := c.HiddenSize, c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim, c.IntermediateSize
	b.x, b.h = grow(b.x, n*d), grow(b.h, n*d)
	b.q, b.att = grow(b.q, n*q), grow(b.att, n*q)
	b.k, b.v = grow(b.k, n*kv), grow(b.v, n*kv)
	b.gate, b.up = grow(b.gate, n*f), grow(b.up, n*f)
	b.rope = grow(b.rope, n*c.HeadDim)
}

// Forward runs the batch through the model, storing each token's keys and
// values in kv, and writes the next-token logits of b.LogitRows into
// logits (len(b.LogitRows) × vocab_size).
func (m *Model) Forward(b *Batch, kv *kvcache.Cache, logits []float32) error {
	if err := m.check(b, kv); err != nil {
		return err
	}
	if len(logits) != len(b.LogitRows)*m.cfg.VocabSize {
		return fmt.Errorf("logits buffer has %d values, want %d", len(logits), len(b.LogitRows)*m.cfg.VocabSize)
	}
	if err := m.forwardHidden(b, kv); err != nil {
		return err
	}
	m.logitsOf(b, b.LogitRows, logits)
	return nil
}

// LogitsFunc receives the next-token logits of the logit rows
// b.LogitRows[first : first+len(logits)/vocab_size], one row of vocab_size
// after another. The slice is reused once the function returns.
type LogitsFunc func(first int, logits []float32) error

// ForwardRows is Forward for batches that ask for many logit rows (the
// logprobs of every prompt position): it hands the logits of b.LogitRows to
// each in order, at most maxRows rows at a time, through one buffer of
// maxRows × vocab_size floats that the model reuses, so that the logits of
// a long prompt are never all held at once. The logits are the same bits
// Forward returns. An error of each stops the call and is returned.
func (m *Model) ForwardRows(b *Batch, kv *kvcache.Cache, maxRows int, each LogitsFunc) error {
	if err := m.check(b, kv); err != nil {
		return err
	}
	if maxRows < 1 {
		return fmt.Errorf("forward: maxRows must be positive, got %d", maxRows)
	}
	if err := m.forwardHidden(b, kv); err != nil {
		return err
	}
	vocab := m.cfg.VocabSize
	for first := 0; first < len(b.LogitRows); first += maxRows {
		rows := b.LogitRows[first:min(len(b.LogitRows), first+maxRows)]
		m.buf.logits = grow(m.buf.logits, len(rows)*vocab)
		m.logitsOf(b, rows, m.buf.logits)
		if err := each(first, m.buf.logits); err != nil {
			return err
		}
	}
	return nil
}

// check refuses a batch the model cannot run over kv.
func (m *Model) check(b *Batch, kv *kvcache.Cache) error {
	if err := b.validate(&m.cfg); err != nil {
		return err
	}
	if kv.Shape() != m.KVShape() {
		return fmt.Errorf("kv cache shape %+v does not fit the model (%+v)", kv.Shape(), m.KVShape())
	}
	return nil
}

// forwardHidden runs a checked batch through every layer, storing keys
// and values in kv and leaving the last hidden state of each token in
// m.buf.x.
func (m *Model) forwardHidden(b *Batch, kv *kvcache.Cache) error {
	c := &m.cfg
	n := len(b.Tokens)
	if n == 0 {
		return nil
	}
	buf := &m.buf
	buf.size(c, n)
	d := c.HiddenSize
	for i, tok := range b.Tokens {
		if err := m.w.Embed.DequantizeRow(buf.x[i*d:(i+1)*d], int(tok)); err != nil {
			return fmt.Errorf("embed token %d: %w", tok, err)
		}
	}
	m.ropeTables(b.Positions, buf.rope)
	m.attn.plan(c, b)
	m.lora.plan(b)
	for l := range m.w.Layers {
		m.layer(l, b, kv)
	}
	return nil
}

// logitsOf writes the next-token logits of the batch tokens rows (indices
// into b.Tokens, whose hidden states forwardHidden left in m.buf.x) into
// logits (len(rows) × vocab_size).
func (m *Model) logitsOf(b *Batch, rows []int, logits []float32) {
	if len(rows) == 0 || len(b.Tokens) == 0 {
		return
	}
	c, buf := &m.cfg, &m.buf
	d := c.HiddenSize
	h := buf.h[:len(rows)*d]
	for j, r := range rows {
		rmsNorm(h[j*d:(j+1)*d], buf.x[r*d:(r+1)*d], m.w.Norm, float32(c.RMSNormEps))
	}
	m.pool.MatMul(logits, h, len(rows), m.w.LMHead)
}

func (m *Model) layer(l int, b *Batch, kv *kvcache.Cache) {
	c, buf, w := &m.cfg, &m.buf, &m.w.Layers[l]
	n, d := len(b.Tokens), c.HiddenSize
	h := buf.h[:n*d]
	m.normRows(h, buf.x, w.AttnNorm, n)
	m.pool.MatMul(buf.q, h, n, w.Q)
	m.pool.MatMul(buf.k, h, n, w.K)
	m.pool.MatMul(buf.v, h, n, w.V)
	if len(m.lora.groups) > 0 {
		m.addLoRA(l, stageQKV, h, buf.q, buf.k, buf.v)
	}
	m.applyRope(n)
	tokSize := c.NumKVHeads * c.HeadDim
	if g := tokenGrain(n, 2*tokSize); g > 0 {
		m.pool.Parallel(n, g, func(lo, hi int) { m.writeKV(l, b, kv, lo, hi) })
	} else {
		m.writeKV(l, b, kv, 0, n)
	}
	m.attention(l, b, kv)
	m.pool.MatMul(h, buf.att, n, w.O)
	if len(m.lora.groups) > 0 {
		m.addLoRA(l, stageO, buf.att, h)
	}
	m.pool.AXPY(buf.x[:n*d], 1, h)

	m.normRows(h, buf.x, w.MLPNorm, n)
	m.pool.MatMul(buf.gate, h, n, w.Gate)
	m.pool.MatMul(buf.up, h, n, w.Up)
	if len(m.lora.groups) > 0 {
		m.addLoRA(l, stageGateUp, h, buf.gate, buf.up)
	}
	m.pool.SiLUMul(buf.gate, buf.up)
	m.pool.MatMul(h, buf.gate, n, w.Down)
	if len(m.lora.groups) > 0 {
		m.addLoRA(l, stageDown, buf.gate, h)
	}
	m.pool.AXPY(buf.x[:n*d], 1, h)
}

// ropeTables fills, per token, cos then sin of position × frequency for
// each half-dimension of a head.
func (m *Model) ropeTables(positions []int32, out []float32) {
	half := m.cfg.HeadDim / 2
	for i, pos := range positions {
		row := out[i*2*half : (i+1)*2*half]
		for j, f := range m.invFreq {
			s, c := math.Sincos(float64(pos) * f)
			row[j], row[half+j] = float32(c), float32(s)
		}
	}
}

// writeKV copies the keys and values of batch tokens [lo, hi) into
// their slots of layer l's cache.
func (m *Model) writeKV(l int, b *Batch, kv *kvcache.Cache, lo, hi int) {
	buf := &m.buf
	tokSize := m.cfg.NumKVHeads * m.cfg.HeadDim
	for i := lo; i < hi; i++ {
		pos := int(b.Positions[i])
		block := b.BlockTables[b.Seqs[i]][pos/kvcache.BlockSize]
		copy(kv.Keys(l, block, pos%kvcache.BlockSize), buf.k[i*tokSize:(i+1)*tokSize])
		copy(kv.Values(l, block, pos%kvcache.BlockSize), buf.v[i*tokSize:(i+1)*tokSize])
	}
}

// applyRope rotates the queries and keys of the n batch tokens.
func (m *Model) applyRope(n int) {
	c := &m.cfg
	if g := tokenGrain(n, (c.NumHeads+c.NumKVHeads)*c.HeadDim); g > 0 {
		m.pool.Parallel(n, g, m.rotateTokens)
	} else {
		m.rotateTokens(0, n)
	}
}

// rotateTokens rotates the queries and keys of batch tokens [lo, hi) in
// the half-split (rotate_half) layout.
func (m *Model) rotateTokens(lo, hi int) {
	c, buf := &m.cfg, &m.buf
	hd, half := c.HeadDim, c.HeadDim/2
	rotate := func(v, cos, sin []float32) {
		for j := range half {
			x0, x1 := v[j], v[j+half]
			v[j] = x0*cos[j] - x1*sin[j]
			v[j+half] = x1*cos[j] + x0*sin[j]
		}
	}
	for i := lo; i < hi; i++ {
		table := buf.rope[i*hd : (i+1)*hd]
		cos, sin := table[:half], table[half:]
		for h := range c.NumHeads {
			rotate(buf.q[(i*c.NumHeads+h)*hd:][:hd], cos, sin)
		}
		for h := range c.NumKVHeads {
			rotate(buf.k[(i*c.NumKVHeads+h)*hd:][:hd], cos, sin)
		}
	}
}

// minRowWork is the least number of elements of per-token work (norms,
// rotations, cache writes) worth a thread's share.
const minRowWork = 16 << 10

// tokenGrain is a thread's least share of n tokens of width elements of
// work each, or 0 when there are too few to split (a decode step's one
// or two): the calling thread then does them all, without the closure a
// split allocates.
func tokenGrain(n, width int) int {
	g := max(1, minRowWork/max(1, width))
	if n < 2*g {
		return 0
	}
	return g
}

// normRows writes the RMS norm (with weight) of each of the first n rows
// of x into the rows of dst, the rows split across the pool's threads.
// Each row is normed as rmsNorm does alone, so the split changes no bits.
func (m *Model) normRows(dst, x, weight []float32, n int) {
	d, eps := m.cfg.HiddenSize, float32(m.cfg.RMSNormEps)
	if g := tokenGrain(n, d); g > 0 {
		m.pool.Parallel(n, g, func(lo, hi int) { normRange(dst, x, weight, d, eps, lo, hi) })
	} else {
		normRange(dst, x, weight, d, eps, 0, n)
	}
}

// normRange writes the RMS norms of rows [lo, hi) of x (d wide) into dst.
func normRange(dst, x, weight []float32, d int, eps float32, lo, hi int) {
	for i := lo; i < hi; i++ {
		rmsNorm(dst[i*d:(i+1)*d], x[i*d:(i+1)*d], weight, eps)
	}
}

// rmsNorm writes x / rms(x) * weight into dst.
func rmsNorm(dst, x, weight []float32, eps float32) {
	var ss float32
	for _, v := range x {
		ss += v * v
	}
	inv := float32(1 / math.Sqrt(float64(ss/float32(len(x))+eps)))
	for i, v := range x {
		dst[i] = v * inv * weight[i]
	}
}
