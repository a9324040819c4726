package checkpoint

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/safetensors"
)

// File names of a PEFT LoRA adapter directory.
const (
	AdapterConfigFile  = "adapter_config.json"
	AdapterWeightsFile = "adapter_model.safetensors"
)

// CheckAdapter checks a PEFT LoRA adapter, its adapter_config.json and the
// header of its adapter_model.safetensors, against the config.json of the
// base model it is to apply to, and returns the adapter's dtype. It reads
// metadata only, so a watcher can check an adapter in a bucket with two
// ranged reads.
func CheckAdapter(baseConfig, adapterConfig []byte, h *safetensors.Header) (dtype.DType, error) {
	cfg, err := model.ParseConfig(baseConfig)
	if err != nil {
		return dtype.Invalid, fmt.Errorf("base model: %w", err)
	}
	var ac struct {
		R int `json:"r"`
	}
	if err := json.Unmarshal(adapterConfig, &ac); err != nil {
		return dtype.Invalid, fmt.Errorf("parse %s: %w", AdapterConfigFile, err)
	}
	if ac.R < 1 {
		return dtype.Invalid, fmt.Errorf("%s: r must be positive, got %d", AdapterConfigFile, ac.R)
	}
	want := map[string][]int{}
	for _, ns := range cfg.TensorShapes() {
		if model.IsProjection(ns.Name) {
			want[strings.TrimSuffix(ns.Name, ".weight")] = ns.Shape
		}
	}
	dt := dtype.Invalid
	for _, t := range h.Tensors {
		name, ok := strings.CutPrefix(t.Name, "base_model.model.")
		if !ok {
			return dtype.Invalid, fmt.Errorf("tensor %s is not a PEFT LoRA tensor (base_model.model.…)", t.Name)
		}
		proj, side := "", ""
		for _, s := range []string{".lora_A.weight", ".lora_B.weight"} {
			if p, ok := strings.CutSuffix(name, s); ok {
				proj, side = p, s
			}
		}
		shape, known := want[proj]
		if side == "" || !known {
			return dtype.Invalid, fmt.Errorf("tensor %s is not the lora_A or lora_B of a projection of the base model", t.Name)
		}
		exp := []int{ac.R, shape[1]}
		if side == ".lora_B.weight" {
			exp = []int{shape[0], ac.R}
		}
		if !slices.Equal(t.Shape, exp) {
			return dtype.Invalid, fmt.Errorf("tensor %s has shape %v, the base model and r=%d imply %v", t.Name, t.Shape, ac.R, exp)
		}
		dt = t.DType
	}
	if dt == dtype.Invalid {
		return dtype.Invalid, fmt.Errorf("%s holds no LoRA tensors", AdapterWeightsFile)
	}
	return dt, nil
}
