package core

import (
	"context"

	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
)

// ModelExecutor computes steps with a real model over its KV storage.
type ModelExecutor struct {
	model  *model.Model
	kv     *kvcache.Cache
	batch  model.Batch
	rows   []int
	logits []float32
}

// NewModelExecutor returns an executor for m whose keys and values live in
// kv (sized like the scheduler's kvcache.Manager).
func NewModelExecutor(m *model.Model, kv *kvcache.Cache) *ModelExecutor {
	return &ModelExecutor{model: m, kv: kv}
}

// Close frees the KV pool; the engine calls it when its loop ends.
func (x *ModelExecutor) Close() error { return x.kv.Free() }

// Execute runs the step as one batched forward pass and samples the
// requests that reached their last known token.
func (x *ModelExecutor) Execute(ctx context.Context, step sched.Step, samplers []*sample.Sampler) ([]Sampled, error) {
	b := &x.batch
	b.Tokens, b.Positions, b.Seqs = b.Tokens[:0], b.Positions[:0], b.Seqs[:0]
	b.BlockTables, b.LogitRows, x.rows = b.BlockTables[:0], b.LogitRows[:0], x.rows[:0]
	for i, w := range step.Work {
		b.BlockTables = append(b.BlockTables, w.Table)
		tokens := w.Req.Tokens()
		for p := w.Start; p < w.Start+w.Count; p++ {
			b.Tokens = append(b.Tokens, tokens[p])
			b.Positions = append(b.Positions, int32(p))
			b.Seqs = append(b.Seqs, int32(i))
		}
		if w.Sample {
			b.LogitRows = append(b.LogitRows, len(b.Tokens)-1)
			x.rows = append(x.rows, i)
		}
	}
	vocab := x.model.Config().VocabSize
	if need := len(x.rows) * vocab; cap(x.logits) < need {
		x.logits = make([]float32, need)
	}
	logits := x.logits[:len(x.rows)*vocab]
	if err := x.model.Forward(b, x.kv, logits); err != nil {
		return nil, err
	}
	out := make([]Sampled, len(step.Work))
	for j, i := range x.rows {
		w := step.Work[i]
		id, lp := samplers[i].Sample(logits[j*vocab:(j+1)*vocab], w.Req.Prompt, w.Req.Output)
		out[i] = Sampled{ID: id, Logprobs: lp}
	}
	return out, nil
}
