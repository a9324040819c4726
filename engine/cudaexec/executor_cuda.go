//go:build cuda

package cudaexec

import (
	"context"
	"errors"
	"fmt"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
)

// Executor computes the engine's scheduler steps on the GPU (a
// core.Executor): the same scheduler, KV manager and server as the CPU
// engine, with the KV blocks the manager hands out living in device
// memory. Tokens are sampled on the host from the logits of the rows
// that sample. It does not score prompts, verify drafts or apply LoRA
// adapters: the engine refuses those requests for it.
type Executor struct {
	m      *Model
	kv     *KV
	act    activations
	batch  model.Batch
	rows   []int
	logits []float32
}

// NewExecutor returns an executor over a fresh KV pool of numBlocks
// blocks (sized like the scheduler's kvcache.Manager).
func (m *Model) NewExecutor(ctx context.Context, numBlocks int) (*Executor, error) {
	kv, err := m.NewKV(ctx, numBlocks)
	if err != nil {
		return nil, err
	}
	return &Executor{m: m, kv: kv}, nil
}

// Model is the model the executor runs.
func (x *Executor) Model() *Model { return x.m }

// Close frees the KV pool and the activations; the engine calls it when
// its loop ends.
func (x *Executor) Close() error {
	return errors.Join(x.act.free(), x.kv.Free())
}

// Forward runs one batch (see Model.Forward) over the executor's pool.
func (x *Executor) Forward(ctx context.Context, b *model.Batch, logits []float32) error {
	return x.m.Forward(ctx, b, x.kv, &x.act, logits)
}

// Execute implements core.Executor: one forward pass over every work
// item's tokens, then a token sampled for each item that asks for one.
func (x *Executor) Execute(ctx context.Context, step sched.Step, samplers []*sample.Sampler) ([]core.Sampled, error) {
	b := &x.batch
	b.Tokens, b.Positions, b.Seqs = b.Tokens[:0], b.Positions[:0], b.Seqs[:0]
	b.BlockTables, b.LogitRows, x.rows = b.BlockTables[:0], b.LogitRows[:0], x.rows[:0]
	for i, w := range step.Work {
		if len(w.Drafts) > 0 {
			return nil, fmt.Errorf("execute on %s: work item %d carries drafts, which the GPU executor does not verify", x.m.dev.Name(), i)
		}
		b.BlockTables = append(b.BlockTables, w.Table)
		for p := w.Start; p < w.Start+w.Count; p++ {
			b.Tokens = append(b.Tokens, w.Token(p))
			b.Positions = append(b.Positions, int32(p))
			b.Seqs = append(b.Seqs, int32(i))
		}
		if w.Sample {
			b.LogitRows = append(b.LogitRows, len(b.Tokens)-1)
			x.rows = append(x.rows, i)
		}
	}
	vocab := x.m.cfg.VocabSize
	if need := len(b.LogitRows) * vocab; cap(x.logits) < need {
		x.logits = make([]float32, need)
	}
	logits := x.logits[:len(b.LogitRows)*vocab]
	if err := x.Forward(ctx, b, logits); err != nil {
		return nil, fmt.Errorf("execute a step of %d tokens on %s: %w", len(b.Tokens), x.m.dev.Name(), err)
	}
	out := make([]core.Sampled, len(step.Work))
	for j, i := range x.rows {
		w := step.Work[i]
		id, lp := samplers[i].Sample(logits[j*vocab:(j+1)*vocab], w.Req.Prompt, w.Req.Output)
		out[i] = core.Sampled{ID: id, Logprobs: lp}
	}
	return out, nil
}

var _ core.Executor = (*Executor)(nil)
