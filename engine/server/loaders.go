package server

import (
	"context"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/sim"
	"github.com/stokehq/stoke/engine/tokenizer"
	"github.com/stokehq/stoke/internal/openai"
)

// EngineOptions size the engines a Loader starts, whatever the model.
type EngineOptions struct {
	// Sched bounds each step; a MaxModelLen of 0 means the model's own
	// context, and a larger one is capped to it.
	Sched         sched.Config
	PrefixCaching bool
	// ServedName is the model's name in the API; "" lets the loader choose.
	ServedName string
	// Speculative turns on speculative decoding (--speculative-config);
	// nil leaves it off. The sim engine never speculates.
	Speculative *SpeculativeConfig
	// LoRA serves LoRA adapters over the model (--enable-lora).
	LoRA LoRAOptions
}

// SchedFor returns the scheduler config for a model whose context is
// maxModelLen.
func (o EngineOptions) SchedFor(maxModelLen int) sched.Config {
	c := o.Sched
	if c.MaxModelLen == 0 || c.MaxModelLen > maxModelLen {
		c.MaxModelLen = maxModelLen
	}
	return c
}

// SimLoader serves latency profiles (an embedded name or a file) instead
// of models: the sim engine, with a synthetic tokenizer of the profile's
// vocabulary. A load by path names the profile; a load of a bucket model
// serves defaultProfile under the model's name, so a platform of sim
// runtimes deploys any pushed model ("" refuses bucket loads).
func SimLoader(o EngineOptions, defaultProfile string) Loader {
	return func(ctx context.Context, req engineapi.LoadRequest, progress func(engineapi.LoadProgress)) (*Loaded, error) {
		profile, served := req.Path, req.ServedModelName
		if profile == "" {
			if defaultProfile == "" || req.Model == "" {
				return nil, openai.InvalidRequest("path", "the sim engine loads latency profiles by path")
			}
			profile = defaultProfile
			if served == "" {
				served = req.Model
			}
		}
		if progress != nil {
			progress(engineapi.LoadProgress{Tier: "sim", Revision: req.Revision})
		}
		p, err := sim.LoadProfile(profile)
		if err != nil {
			return nil, err
		}
		tj, tc, err := tokenizer.Synthesize(p.VocabSize, 1)
		if err != nil {
			return nil, err
		}
		tok, err := tokenizer.New(tj, tc)
		if err != nil {
			return nil, err
		}
		ec := core.Config{Sched: o.SchedFor(p.MaxModelLen), EOS: tok.EOS()}
		ec.Sched.MaxNumSeqs = min(ec.Sched.MaxNumSeqs, p.MaxNumSeqs)
		if served == "" {
			served = o.ServedName
		}
		if served == "" {
			served = p.Model
		}
		blocks := p.KVCapacityTokens / kvcache.BlockSize
		adapters, err := o.AdapterPool(simAdapterLoader(o.LoRA.WithDefaults().MaxRank))
		if err != nil {
			return nil, err
		}
		ec.Adapters = adapters
		return &Loaded{
			Name:        served,
			Tokenizer:   tok,
			MaxModelLen: ec.Sched.MaxModelLen,
			Start: func(metrics *core.Metrics) (*core.Engine, error) {
				return core.New(ec, kvcache.NewManager(blocks, o.PrefixCaching), core.NewSimExecutor(p, tok, nil), tok, metrics)
			},
			Adapters: adapters,
			Close: func() error {
				if adapters != nil {
					adapters.Close()
				}
				return nil
			},
		}, nil
	}
}
