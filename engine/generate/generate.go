// Package generate runs one sequence through a model from prompt to
// completion: the engine's simplest driver, used by `stoke generate` until
// the continuous-batching scheduler serves requests.
package generate

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sample"
)

// Options control one generation.
type Options struct {
	MaxTokens int
	Sampling  sample.Params
	// StopIDs end generation when produced (the model's EOS tokens),
	// unless IgnoreEOS is set.
	StopIDs   []int32
	IgnoreEOS bool
	// PrefillChunk bounds how many prompt tokens one forward call takes.
	PrefillChunk int
}

// Result is a finished generation.
type Result struct {
	IDs           []int32 // generated ids only
	PrefillTime   time.Duration
	DecodeTime    time.Duration
	FinishReason  string // "stop" or "length"
	FirstTokenLag time.Duration
}

// DecodeTokensPerSecond is the decode rate after the first token.
func (r Result) DecodeTokensPerSecond() float64 {
	if len(r.IDs) < 2 || r.DecodeTime <= 0 {
		return 0
	}
	return float64(len(r.IDs)-1) / r.DecodeTime.Seconds()
}

// Run generates up to opts.MaxTokens tokens after prompt, calling onToken
// (if not nil) with each new id as it is produced.
func Run(ctx context.Context, m *model.Model, prompt []int32, opts Options, onToken func(int32)) (Result, error) {
	cfg := m.Config()
	if len(prompt) == 0 {
		return Result{}, fmt.Errorf("generate: the prompt is empty")
	}
	if opts.MaxTokens < 1 {
		return Result{}, fmt.Errorf("generate: max tokens must be at least 1, got %d", opts.MaxTokens)
	}
	if err := opts.Sampling.Validate(); err != nil {
		return Result{}, fmt.Errorf("generate: %w", err)
	}
	total := len(prompt) + opts.MaxTokens - 1
	if total > cfg.MaxPositionEmbeddings {
		return Result{}, fmt.Errorf("generate: prompt (%d tokens) plus max tokens (%d) exceeds the context of %d", len(prompt), opts.MaxTokens, cfg.MaxPositionEmbeddings)
	}
	chunk := opts.PrefillChunk
	if chunk <= 0 {
		chunk = 256
	}
	kv, err := kvcache.New(m.KVShape(), (total+kvcache.BlockSize-1)/kvcache.BlockSize)
	if err != nil {
		return Result{}, err
	}
	defer kv.Free()
	mgr := kvcache.NewManager(kv.NumBlocks(), false)
	if !mgr.Allocate(0, prompt, total, nil, "") {
		return Result{}, fmt.Errorf("generate: kv cache of %d blocks cannot hold %d tokens", kv.NumBlocks(), total)
	}
	table := mgr.Table(0)
	sampler := sample.New(opts.Sampling)
	logits := make([]float32, cfg.VocabSize)
	step := func(tokens []int32, start int) error {
		b := &model.Batch{
			Tokens:      tokens,
			Positions:   make([]int32, len(tokens)),
			Seqs:        make([]int32, len(tokens)),
			BlockTables: [][]int32{table},
			LogitRows:   []int{len(tokens) - 1},
		}
		for i := range tokens {
			b.Positions[i] = int32(start + i)
		}
		return m.Forward(b, kv, logits)
	}

	var res Result
	begin := time.Now()
	for start := 0; start < len(prompt); start += chunk {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if err := step(prompt[start:min(start+chunk, len(prompt))], start); err != nil {
			return res, fmt.Errorf("generate: prefill: %w", err)
		}
	}
	res.PrefillTime = time.Since(begin)
	decodeStart := time.Now()
	res.FinishReason = "length"
	for {
		id, _ := sampler.Sample(logits, prompt, res.IDs)
		if len(res.IDs) == 0 {
			res.FirstTokenLag = time.Since(begin)
			decodeStart = time.Now()
		}
		res.IDs = append(res.IDs, id)
		if onToken != nil {
			onToken(id)
		}
		if !opts.IgnoreEOS && slices.Contains(opts.StopIDs, id) {
			res.FinishReason = "stop"
			break
		}
		if len(res.IDs) == opts.MaxTokens {
			break
		}
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if err := step([]int32{id}, len(prompt)+len(res.IDs)-1); err != nil {
			return res, fmt.Errorf("generate: decode: %w", err)
		}
	}
	res.DecodeTime = time.Since(decodeStart)
	return res, nil
}
