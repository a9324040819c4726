package model

import (
	"fmt"

	"github.com/stokehq/stoke/engine/kvcache"
)

// Score runs one sequence through the model in a single forward call with a
// KV cache of its own and returns the next-token logits after every
// position (len(tokens) × vocab_size): teacher-forced evaluation, as for
// prompt log-probabilities or comparing two checkpoints of one model.
func (m *Model) Score(tokens []int32) ([]float32, error) { return m.ScoreAdapter(nil, tokens) }

// ScoreAdapter is Score with adapter a applied to the sequence (nil: the
// base model).
func (m *Model) ScoreAdapter(a *Adapter, tokens []int32) ([]float32, error) {
	kv, err := kvcache.New(m.KVShape(), max(1, (len(tokens)+kvcache.BlockSize-1)/kvcache.BlockSize))
	if err != nil {
		return nil, err
	}
	defer kv.Free()
	mgr := kvcache.NewManager(kv.NumBlocks(), false)
	if !mgr.Allocate(0, tokens, len(tokens), nil, "") {
		return nil, fmt.Errorf("score %d tokens: kv cache of %d blocks is too small", len(tokens), kv.NumBlocks())
	}
	b := &Batch{
		Tokens:      tokens,
		Positions:   make([]int32, len(tokens)),
		Seqs:        make([]int32, len(tokens)),
		BlockTables: [][]int32{mgr.Table(0)},
		LogitRows:   make([]int, len(tokens)),
	}
	if a != nil {
		b.Adapters = []*Adapter{a}
	}
	for i := range tokens {
		b.Positions[i] = int32(i)
		b.LogitRows[i] = i
	}
	logits := make([]float32, len(tokens)*m.cfg.VocabSize)
	if err := m.Forward(b, kv, logits); err != nil {
		return nil, err
	}
	return logits, nil
}
