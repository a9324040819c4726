package load

import (
	"fmt"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/weightstore/checkpoint"
)

// speculation returns the speculative decoding settings of engines over
// target: none without Options.Engine.Speculative; with method
// draft_model, the draft checkpoint loaded from its directory onto pool,
// refused unless it shares target's vocabulary. release frees the draft's
// weights (nil when there are none).
func (o Options) speculation(target *model.Model, pool *kernels.Pool) (spec core.SpecConfig, release func() error, err error) {
	sc := o.Engine.Speculative
	spec = sc.Core()
	if sc == nil || spec.Method != core.SpecDraftModel {
		return spec, nil, nil
	}
	draft, ck, err := checkpoint.LoadModel(sc.Model, pool)
	if err != nil {
		return spec, nil, fmt.Errorf("speculative config: draft model: %w", err)
	}
	if got, want := draft.Config().VocabSize, target.Config().VocabSize; got != want {
		ck.Close()
		return spec, nil, fmt.Errorf("speculative config: draft model %s has a vocabulary of %d tokens, the model's has %d: they must be the same",
			sc.Model, got, want)
	}
	spec.Draft = draft
	return spec, ck.Close, nil
}
