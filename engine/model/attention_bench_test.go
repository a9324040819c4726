package model

import (
	"fmt"
	"testing"

	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kvcache"
)

// BenchmarkAttention times forward calls whose cost is mostly attention: a
// one-layer model of 100m's attention geometry (12 query heads, 4 KV
// heads of 64) at long contexts, for one decoding sequence, eight
// decoding sequences, and a 256-token prefill chunk at the end of the
// context.
func BenchmarkAttention(b *testing.B) {
	cfg := Config{ModelType: "llama", HiddenSize: 768, IntermediateSize: 64, NumLayers: 1, NumHeads: 12, NumKVHeads: 4,
		HeadDim: 64, VocabSize: 16, MaxPositionEmbeddings: 4096, RMSNormEps: 1e-5, RopeTheta: 10000, HiddenAct: "silu",
		TieWordEmbeddings: true}
	pool := kernels.NewPool(0)
	defer pool.Close()
	m, err := New(cfg, RandomSource(cfg, 1, 0.02), pool)
	if err != nil {
		b.Fatal(err)
	}
	for _, ctx := range []int{512, 2048} {
		for _, shape := range []struct {
			name       string
			seqs, toks int
		}{{"decode", 1, 1}, {"decode8", 8, 1}, {"prefill256", 1, 256}} {
			b.Run(fmt.Sprintf("%s/ctx=%d", shape.name, ctx), func(b *testing.B) {
				blocksPerSeq := ctx / kvcache.BlockSize
				kv, err := kvcache.New(m.KVShape(), shape.seqs*blocksPerSeq)
				if err != nil {
					b.Fatal(err)
				}
				defer kv.Free()
				batch := &Batch{}
				for s := range shape.seqs {
					table := make([]int32, blocksPerSeq)
					for i := range table {
						table[i] = int32(s*blocksPerSeq + i)
					}
					batch.BlockTables = append(batch.BlockTables, table)
					for p := ctx - shape.toks; p < ctx; p++ {
						batch.Tokens = append(batch.Tokens, int32(p%cfg.VocabSize))
						batch.Positions = append(batch.Positions, int32(p))
						batch.Seqs = append(batch.Seqs, int32(s))
					}
					batch.LogitRows = append(batch.LogitRows, len(batch.Tokens)-1)
				}
				logits := make([]float32, len(batch.LogitRows)*cfg.VocabSize)
				for b.Loop() {
					if err := m.Forward(batch, kv, logits); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
