package model

import (
	"math/rand/v2"

	"github.com/stokehq/stoke/internal/dtype"
)

// RandomSource returns in-memory F32 weights for cfg, deterministic for
// seed: projections and embeddings drawn from N(0, std²), norm weights
// around 1. It gives tests and benchmarks a model without a checkpoint.
func RandomSource(cfg Config, seed uint64, std float64) TensorSource {
	rng := rand.New(rand.NewPCG(seed, 1))
	src := memorySource{}
	for _, ns := range cfg.TensorShapes() {
		n := int(numel(ns.Shape))
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * std)
			if len(ns.Shape) == 1 {
				v[i] += 1
			}
		}
		b, _ := dtype.FromFloat32(dtype.F32, v)
		src[ns.Name] = Tensor{DType: dtype.F32, Shape: ns.Shape, Data: b, Source: "memory"}
	}
	return src
}

// memorySource is a TensorSource held in a map.
type memorySource map[string]Tensor

func (m memorySource) Lookup(name string) (Tensor, bool) {
	t, ok := m[name]
	return t, ok
}
