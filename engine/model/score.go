package model

import "github.com/stokehq/stoke/engine/kvcache"

// Score runs one sequence through the model in a single forward call with a
// KV cache of its own and returns the next-token logits after every
// position (len(tokens) × vocab_size): teacher-forced evaluation, as for
// prompt log-probabilities or comparing two checkpoints of one model.
func (m *Model) Score(tokens []int32) ([]float32, error) {
	kv, err := kvcache.New(m.KVShape(), max(1, (len(tokens)+kvcache.BlockSize-1)/kvcache.BlockSize))
	if err != nil {
		return nil, err
	}
	table, err := kv.Grow(nil, len(tokens))
	if err != nil {
		return nil, err
	}
	b := &Batch{
		Tokens:      tokens,
		Positions:   make([]int32, len(tokens)),
		Seqs:        make([]int32, len(tokens)),
		BlockTables: [][]int32{table},
		LogitRows:   make([]int, len(tokens)),
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
