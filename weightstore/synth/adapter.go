package synth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/safetensors"
)

// AdapterOptions describe a synthetic PEFT LoRA adapter.
type AdapterOptions struct {
	// Rank is r; 0 means 8.
	Rank int
	// Alpha is lora_alpha; 0 means twice the rank.
	Alpha float64
	// TargetModules are the projections it changes (model.ProjectionModules
	// names); nil means all of them, written as "all-linear".
	TargetModules []string
	RSLoRA        bool
	// DType of the weights: F32 (the zero value means it), F16 or BF16.
	DType dtype.DType
	Seed  uint64
	// Delta is the standard deviation of the entries of scale·B·A, the
	// update of each weight; 0 means 0.01, half that of the synthetic
	// base models' weights.
	Delta float64
}

// adapterConfig is the adapter_config.json opts describe.
func (opts AdapterOptions) adapterConfig() model.AdapterConfig {
	r := opts.Rank
	if r == 0 {
		r = 8
	}
	alpha := opts.Alpha
	if alpha == 0 {
		alpha = float64(2 * r)
	}
	tm := model.TargetModules{Names: opts.TargetModules}
	if opts.TargetModules == nil {
		tm = model.TargetModules{AllLinear: true}
	}
	return model.AdapterConfig{PeftType: "LORA", TaskType: "CAUSAL_LM", R: r, LoraAlpha: alpha, TargetModules: tm,
		UseRSLoRA: opts.RSLoRA, Bias: "none"}
}

// WriteAdapter writes a random PEFT LoRA adapter for base into dir
// (created; existing files are replaced): adapter_config.json and
// adapter_model.safetensors under PEFT's tensor names, deterministic for
// opts.Seed. Unlike a freshly initialised PEFT adapter (B = 0), both
// matrices are random, so the adapter changes what the model computes.
func WriteAdapter(dir string, base model.Config, opts AdapterOptions) error {
	cfg := opts.adapterConfig()
	if err := cfg.Validate(0); err != nil {
		return fmt.Errorf("synthesize adapter: %w", err)
	}
	dt := opts.DType
	switch dt {
	case dtype.Invalid, dtype.F32:
		dt = dtype.F32
	case dtype.F16, dtype.BF16:
	default:
		return fmt.Errorf("synthesize adapter: dtype %v is not one of F32, F16, BF16", dt)
	}
	delta := opts.Delta
	if delta == 0 {
		delta = initStd / 2
	}
	src := model.RandomAdapterSource(base, cfg.R, opts.TargetModules, opts.Seed, model.AdapterStd(cfg, delta))
	var tensors []safetensors.Tensor
	for _, name := range src.Names() {
		t, _ := src.Lookup(name)
		v, err := dtype.ToFloat32(t.DType, t.Data)
		if err != nil {
			return fmt.Errorf("synthesize adapter: %w", err)
		}
		data, err := dtype.FromFloat32(dt, v)
		if err != nil {
			return fmt.Errorf("synthesize adapter: %w", err)
		}
		tensors = append(tensors, safetensors.Tensor{Name: name, DType: dt, Shape: t.Shape, Data: data})
	}
	raw, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return fmt.Errorf("synthesize adapter: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("synthesize adapter: %w", err)
	}
	if err := safetensors.WriteFile(filepath.Join(dir, checkpoint.AdapterWeightsFile), tensors, map[string]string{"format": "pt"}); err != nil {
		return fmt.Errorf("synthesize adapter %s: %w", dir, err)
	}
	if err := os.WriteFile(filepath.Join(dir, checkpoint.AdapterConfigFile), raw, 0o644); err != nil {
		return fmt.Errorf("synthesize adapter %s: %w", dir, err)
	}
	return nil
}

// MergeAdapter writes to outDir the checkpoint in baseDir with the adapter
// in adapterDir merged into its weights, W' = W + scale·B·A, every tensor
// in F32: an FP8 or BF16 base is dequantised first (its config.json loses
// quantization_config). Served alone, it computes what the base serves with
// the adapter, within float rounding: the reference of the adapter tests.
// The tokenizer files are copied.
func MergeAdapter(ctx context.Context, baseDir, adapterDir, outDir string) error {
	ck, err := checkpoint.Open(baseDir)
	if err != nil {
		return fmt.Errorf("merge adapter: %w", err)
	}
	defer ck.Close()
	cfg := ck.Config()
	m, err := model.New(cfg, ck, nil)
	if err != nil {
		return fmt.Errorf("merge adapter: %w", err)
	}
	a, err := checkpoint.LoadAdapter(adapterDir, &cfg, 0)
	if err != nil {
		return fmt.Errorf("merge adapter: %w", err)
	}
	w := m.Weights()
	var entries []checkpoint.Entry
	for _, ns := range cfg.TensorShapes() {
		entries = append(entries, checkpoint.Entry{Name: ns.Name, DType: dtype.F32, Shape: ns.Shape, Bytes: func() ([]byte, error) {
			v, err := mergedTensor(ck, w, a, ns)
			if err != nil {
				return nil, err
			}
			return dtype.FromFloat32(dtype.F32, v)
		}})
	}
	cfg.Quantization, cfg.TorchDType = nil, "float32"
	cfgJSON, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return fmt.Errorf("merge adapter: %w", err)
	}
	files := map[string][]byte{checkpoint.ConfigFile: cfgJSON}
	for _, name := range []string{checkpoint.TokenizerFile, checkpoint.TokenizerConfig, "generation_config.json"} {
		data, err := os.ReadFile(filepath.Join(baseDir, name))
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return fmt.Errorf("merge adapter: %w", err)
		default:
			files[name] = data
		}
	}
	if err := checkpoint.Write(ctx, outDir, entries, checkpoint.WriteOptions{Files: files}); err != nil {
		return fmt.Errorf("merge adapter: %w", err)
	}
	return nil
}

// mergedTensor is one tensor of the merged checkpoint in F32: a projection
// dequantised with the adapter's update added, anything else converted.
func mergedTensor(ck *checkpoint.Checkpoint, w *model.Weights, a *model.Adapter, ns model.NamedShape) ([]float32, error) {
	for l := range w.Layers {
		layer := &w.Layers[l]
		mats := []struct {
			module string
			m      interface {
				At(i, j int) float32
			}
		}{{"q_proj", layer.Q}, {"k_proj", layer.K}, {"v_proj", layer.V}, {"o_proj", layer.O},
			{"gate_proj", layer.Gate}, {"up_proj", layer.Up}, {"down_proj", layer.Down}}
		for _, pm := range mats {
			if ns.Name != projectionName(l, pm.module) {
				continue
			}
			rows, cols := ns.Shape[0], ns.Shape[1]
			out := make([]float32, rows*cols)
			A, B := a.Weights(l, pm.module)
			scale := float64(a.Scale())
			for i := range rows {
				for j := range cols {
					v := float64(pm.m.At(i, j))
					if A != nil {
						var s float64
						for k := range A.Rows {
							s += float64(B.F32[i*A.Rows+k]) * float64(A.F32[k*cols+j])
						}
						v += scale * s
					}
					out[i*cols+j] = float32(v)
				}
			}
			return out, nil
		}
	}
	t, ok := ck.Lookup(ns.Name)
	if !ok {
		return nil, fmt.Errorf("tensor %s is missing from the base", ns.Name)
	}
	return dtype.ToFloat32(t.DType, t.Data)
}

// projectionName is the base checkpoint's name of a projection weight.
func projectionName(layer int, module string) string {
	name := model.AdapterTensorName(layer, module, "A")
	name = name[len("base_model.model."):]
	return name[:len(name)-len(".lora_A.weight")] + ".weight"
}
