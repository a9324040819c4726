package load

import (
	"context"
	"fmt"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/weightstore/checkpoint"
)

// adapterLoader returns the loader of LoRA adapters over a model of config
// base: a PEFT directory on this node, or a bucket prefix (IsBucketPath)
// at the spec's revision. Either way the adapter is checked against base
// and its weights are copied into F32, so nothing of the files is kept.
func (o Options) adapterLoader(base model.Config) core.AdapterLoadFunc {
	maxRank := o.Engine.LoRA.WithDefaults().MaxRank
	return func(ctx context.Context, spec core.AdapterSpec) (*model.Adapter, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if IsBucketPath(spec.Path) {
			return o.bucketLoRA(ctx, &base, spec, maxRank)
		}
		return checkpoint.LoadAdapter(spec.Path, &base, maxRank)
	}
}

// bucketLoRA reads an adapter revision from a bucket (adapterFromBucket)
// and checks it against base; the revision digest salts the prefix cache.
func (o Options) bucketLoRA(ctx context.Context, base *model.Config, spec core.AdapterSpec, maxRank int) (*model.Adapter, error) {
	ba, err := o.adapterFromBucket(ctx, spec.Path, spec.Revision)
	if err != nil {
		return nil, err
	}
	defer ba.Release()
	a, err := checkpoint.AdapterFromFiles(spec.Path, ba.Config, ba.Weights, ba.Revision, maxRank)
	if err != nil {
		return nil, err
	}
	m, err := a.Build(base, maxRank)
	if err != nil {
		return nil, fmt.Errorf("revision %s: %w", ba.Revision, err)
	}
	return m, nil
}
