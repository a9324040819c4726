// Package synth writes synthetic Llama checkpoints of any size, with random
// weights and a generated tokenizer, for tests and benchmarks.
package synth

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/tokenizer"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/checkpoint"
)

// presets are the model shapes `stoke model synth` offers. Every preset
// above tiny uses grouped-query attention.
var presets = map[string]model.Config{
	"tiny": {HiddenSize: 64, IntermediateSize: 176, NumLayers: 2, NumHeads: 4, NumKVHeads: 4, HeadDim: 16,
		VocabSize: 512, MaxPositionEmbeddings: 512, RopeTheta: 10000, TieWordEmbeddings: true},
	"small": {HiddenSize: 256, IntermediateSize: 704, NumLayers: 4, NumHeads: 8, NumKVHeads: 2, HeadDim: 32,
		VocabSize: 4096, MaxPositionEmbeddings: 2048, RopeTheta: 10000, TieWordEmbeddings: true},
	"100m": {HiddenSize: 768, IntermediateSize: 2048, NumLayers: 12, NumHeads: 12, NumKVHeads: 4, HeadDim: 64,
		VocabSize: 32000, MaxPositionEmbeddings: 4096, RopeTheta: 10000, TieWordEmbeddings: true},
	"1b": {HiddenSize: 2048, IntermediateSize: 8192, NumLayers: 16, NumHeads: 32, NumKVHeads: 8, HeadDim: 64,
		VocabSize: 128256, MaxPositionEmbeddings: 131072, RopeTheta: 500000, TieWordEmbeddings: true,
		RopeScaling: &model.RopeScaling{RopeType: "llama3", Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}},
}

// Presets lists the preset names, smallest first.
func Presets() []string { return []string{"tiny", "small", "100m", "1b"} }

// PresetConfig returns the complete config.json content of a preset.
func PresetConfig(name string) (model.Config, error) {
	c, ok := presets[name]
	if !ok {
		return model.Config{}, fmt.Errorf("unknown preset %q (have %s)", name, strings.Join(Presets(), ", "))
	}
	return complete(c), nil
}

// complete fills in the config.json fields every synthetic model shares.
func complete(c model.Config) model.Config {
	c.Architectures = []string{"LlamaForCausalLM"}
	c.ModelType = "llama"
	if c.RMSNormEps == 0 {
		c.RMSNormEps = 1e-5
	}
	c.HiddenAct = "silu"
	c.TorchDType = "float32"
	return c
}

// Options describe a synthetic checkpoint.
type Options struct {
	Preset string
	// Config, when not nil, gives the model's shape instead of Preset:
	// sizes, heads, vocabulary, context and RoPE settings. The fields
	// every synthetic model shares (architecture, model type, activation,
	// dtype, token ids; the norm epsilon when zero) are filled in as for a
	// preset.
	Config *model.Config
	// DType of the weights: F32, BF16, or F8E4M3 (projections in FP8 with
	// 128×128 block scales, embeddings and norms in BF16, the layout of
	// published FP8 checkpoints).
	DType     dtype.DType
	ShardSize int64
	Seed      uint64
}

// config is the complete config.json content of the model opts describe.
func (opts Options) config() (model.Config, error) {
	if opts.Config == nil {
		return PresetConfig(opts.Preset)
	}
	c := complete(*opts.Config)
	c.BOSTokenID, c.EOSTokenID, c.Quantization = nil, nil, nil
	raw, err := json.Marshal(c)
	if err != nil {
		return model.Config{}, err
	}
	if _, err := model.ParseConfig(raw); err != nil {
		return model.Config{}, fmt.Errorf("synthesize: %w", err)
	}
	return c, nil
}

// initStd is the standard deviation of the random weights, as Hugging
// Face initialises Llama.
const initStd = 0.02

// Write creates a complete checkpoint directory at dir, deterministic for
// opts.Seed.
func Write(ctx context.Context, dir string, opts Options) error {
	cfg, err := opts.config()
	if err != nil {
		return err
	}
	tokJSON, tokCfgJSON, err := tokenizer.Synthesize(cfg.VocabSize, int64(opts.Seed))
	if err != nil {
		return fmt.Errorf("synthesize tokenizer: %w", err)
	}
	tok, err := tokenizer.New(tokJSON, tokCfgJSON)
	if err != nil {
		return fmt.Errorf("synthesize tokenizer: %w", err)
	}
	if bos, ok := tok.BOS(); ok {
		id := int(bos)
		cfg.BOSTokenID = &id
	}
	for _, id := range tok.EOS() {
		cfg.EOSTokenID = append(cfg.EOSTokenID, int(id))
	}
	switch opts.DType {
	case dtype.F32:
	case dtype.BF16:
		cfg.TorchDType = "bfloat16"
	case dtype.F8E4M3:
		cfg.TorchDType = "bfloat16"
		cfg.Quantization = &model.QuantizationConfig{QuantMethod: "fp8", Fmt: "e4m3", ActivationScheme: "dynamic",
			WeightBlockSize: []int{checkpoint.DefaultBlock, checkpoint.DefaultBlock}}
	default:
		return fmt.Errorf("synthesize: dtype %v is not one of F32, BF16, F8_E4M3", opts.DType)
	}
	cfgJSON, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}

	var entries []checkpoint.Entry
	for _, ns := range cfg.TensorShapes() {
		weights := randomTensor(ns, opts.Seed)
		switch {
		case opts.DType == dtype.F8E4M3 && model.IsProjection(ns.Name):
			entries = append(entries, checkpoint.FP8Entries(ns.Name, ns.Shape, checkpoint.DefaultBlock, weights)...)
		default:
			dt := opts.DType
			if dt == dtype.F8E4M3 {
				dt = dtype.BF16 // as in published FP8 checkpoints
			}
			entries = append(entries, checkpoint.Entry{Name: ns.Name, DType: dt, Shape: ns.Shape, Bytes: func() ([]byte, error) {
				w, err := weights()
				if err != nil {
					return nil, err
				}
				return dtype.FromFloat32(dt, w)
			}})
		}
	}
	return checkpoint.Write(ctx, dir, entries, checkpoint.WriteOptions{
		ShardSize: opts.ShardSize,
		Files: map[string][]byte{
			checkpoint.ConfigFile:      cfgJSON,
			checkpoint.TokenizerFile:   tokJSON,
			checkpoint.TokenizerConfig: tokCfgJSON,
		},
	})
}

// chunk is the number of values drawn from one random stream, fixed so the
// weights do not depend on how many goroutines draw them.
const chunk = 1 << 16

// randomTensor returns a producer of a tensor's float32 values: ones for
// norm weights, N(0, initStd²) for everything else, seeded by the tensor's
// name.
func randomTensor(ns model.NamedShape, seed uint64) func() ([]float32, error) {
	return func() ([]float32, error) {
		n := 1
		for _, d := range ns.Shape {
			n *= d
		}
		w := make([]float32, n)
		if len(ns.Shape) == 1 && strings.HasSuffix(ns.Name, "norm.weight") {
			for i := range w {
				w[i] = 1
			}
			return w, nil
		}
		h := fnv.New64a()
		h.Write([]byte(ns.Name))
		base := h.Sum64() ^ seed
		var g errgroup.Group
		g.SetLimit(8)
		for start := 0; start < n; start += chunk {
			g.Go(func() error {
				rng := rand.New(rand.NewPCG(base, uint64(start)))
				for i := range w[start:min(start+chunk, n)] {
					w[start+i] = float32(rng.NormFloat64() * initStd)
				}
				return nil
			})
		}
		return w, g.Wait()
	}
}

// ParseDType maps the CLI's dtype names to element types.
func ParseDType(name string) (dtype.DType, error) {
	names := map[string]dtype.DType{"f32": dtype.F32, "bf16": dtype.BF16, "fp8": dtype.F8E4M3}
	if d, ok := names[strings.ToLower(name)]; ok {
		return d, nil
	}
	return dtype.Invalid, fmt.Errorf("unknown dtype %q (have f32, bf16, fp8)", name)
}
