package core

import (
	"context"
	"fmt"

	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
)

// scoreRowsPerGroup bounds the logit rows a step that scores prompts
// holds at once: the logits of its rows go through a buffer of this many
// rows × vocab_size floats (64 × 128k floats is 32 MiB), however long the
// prompts or large the step.
const scoreRowsPerGroup = 64

// ModelExecutor computes steps with a real model over its KV storage.
type ModelExecutor struct {
	model  *model.Model
	kv     *kvcache.Cache
	batch  model.Batch
	rows   []int
	logits []float32
	// uses says, for each logit row of a step that scores prompts, what
	// it is for; scorer computes the scored rows' logprobs.
	uses   []rowUse
	scorer sample.Scorer
	// spec verifies the drafts of work items that carry them.
	spec verifier
	// adapters are the LoRA adapters bound to requests (BindAdapter).
	adapters map[*sched.Request]*model.Adapter
}

// rowUse is what one logit row of a step is for: sampling work item
// work's next token (target < 0; row -1-target of its rows when it has
// drafts), or scoring prompt token target of it.
type rowUse struct {
	work   int
	target int
}

// NewModelExecutor returns an executor for m whose keys and values live in
// kv (sized like the scheduler's kvcache.Manager).
func NewModelExecutor(m *model.Model, kv *kvcache.Cache) *ModelExecutor {
	return &ModelExecutor{model: m, kv: kv}
}

// Close frees the KV pool; the engine calls it when its loop ends.
func (x *ModelExecutor) Close() error { return x.kv.Free() }

// ScoresPrompts is true: the executor fills Sampled.PromptLogprobs from
// the model's logits (PromptScorer).
func (x *ModelExecutor) ScoresPrompts() bool { return true }

// Execute runs the step as one batched forward pass and samples the
// requests that reached their last known token. For requests that score
// their prompt, every prompt position the step computes (but the last)
// gets a logit row too, from which the logprob of the prompt token after
// it is taken.
func (x *ModelExecutor) Execute(ctx context.Context, step sched.Step, samplers []*sample.Sampler) ([]Sampled, error) {
	b := &x.batch
	b.Tokens, b.Positions, b.Seqs = b.Tokens[:0], b.Positions[:0], b.Seqs[:0]
	b.BlockTables, b.LogitRows, x.rows = b.BlockTables[:0], b.LogitRows[:0], x.rows[:0]
	scoring := false
	for i, w := range step.Work {
		b.BlockTables = append(b.BlockTables, w.Table)
		for p := w.Start; p < w.Start+w.Count; p++ {
			b.Tokens = append(b.Tokens, w.Token(p))
			b.Positions = append(b.Positions, int32(p))
			b.Seqs = append(b.Seqs, int32(i))
		}
		if w.Sample {
			for j := len(w.Drafts); j >= 0; j-- { // every draft's position, then the last
				b.LogitRows = append(b.LogitRows, len(b.Tokens)-1-j)
			}
			x.rows = append(x.rows, i)
		}
		scoring = scoring || scoresIn(w) > 0
	}
	b.Adapters = x.stepAdapters(step, b.Adapters)
	if scoring {
		return x.executeScoring(step, samplers)
	}
	vocab := x.model.Config().VocabSize
	if need := len(b.LogitRows) * vocab; cap(x.logits) < need {
		x.logits = make([]float32, need)
	}
	logits := x.logits[:len(b.LogitRows)*vocab]
	if err := x.model.Forward(b, x.kv, logits); err != nil {
		return nil, err
	}
	out := make([]Sampled, len(step.Work))
	row := 0
	for _, i := range x.rows {
		n := 1 + len(step.Work[i].Drafts)
		out[i] = x.spec.sample(step.Work[i], samplers[i], logits[row*vocab:(row+n)*vocab], vocab)
		row += n
	}
	return out, nil
}

// scoresIn is how many prompt tokens work item w scores: one per
// position it computes that has a prompt token after it.
func scoresIn(w sched.Work) int {
	if !w.Req.ScorePrompt {
		return 0
	}
	return max(0, min(w.Start+w.Count, len(w.Req.Prompt)-1)-w.Start)
}

// executeScoring finishes Execute for a step with prompts to score, the
// batch built: after the sampling rows, it asks for the logits of every
// scored position and reduces them a group of rows at a time (a sampled
// token, or a prompt token's logprob and top alternatives), never holding
// the logits of the whole step.
func (x *ModelExecutor) executeScoring(step sched.Step, samplers []*sample.Sampler) ([]Sampled, error) {
	b := &x.batch
	out := make([]Sampled, len(step.Work))
	x.uses = x.uses[:0]
	for _, i := range x.rows {
		for j := range 1 + len(step.Work[i].Drafts) {
			x.uses = append(x.uses, rowUse{work: i, target: -1 - j})
		}
	}
	first := 0 // the batch index of the work item's first token
	for i, w := range step.Work {
		if n := scoresIn(w); n > 0 {
			out[i].PromptFirst = w.Start + 1
			out[i].PromptLogprobs = make([]sample.Logprobs, 0, n)
			for p := w.Start; p < w.Start+n; p++ {
				b.LogitRows = append(b.LogitRows, first+p-w.Start)
				x.uses = append(x.uses, rowUse{work: i, target: p + 1})
			}
		}
		first += w.Count
	}
	vocab := x.model.Config().VocabSize
	err := x.model.ForwardRows(b, x.kv, scoreRowsPerGroup, func(firstRow int, logits []float32) error {
		for j := range len(logits) / vocab {
			row := logits[j*vocab : (j+1)*vocab]
			use := x.uses[firstRow+j]
			w := step.Work[use.work]
			if use.target < 0 {
				x.spec.sampleRow(&out[use.work], w, samplers[use.work], -1-use.target, row)
				continue
			}
			lp := x.scorer.Score(row, w.Req.Prompt[use.target], w.Req.PromptTopLogprobs)
			out[use.work].PromptLogprobs = append(out[use.work].PromptLogprobs, lp)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("forward a step that scores prompts: %w", err)
	}
	return out, nil
}
