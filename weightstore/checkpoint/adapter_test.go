package checkpoint

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/safetensors"
)

func adapterBase() model.Config {
	return model.Config{ModelType: "llama", HiddenSize: 32, IntermediateSize: 48, NumLayers: 2, NumHeads: 4, NumKVHeads: 2,
		HeadDim: 8, VocabSize: 64, MaxPositionEmbeddings: 64, RMSNormEps: 1e-5, RopeTheta: 10000, HiddenAct: "silu"}
}

// writeTestAdapter writes a PEFT adapter directory of rank 4 on q_proj and
// v_proj of base, in dt, after edit changes its tensors or config.
func writeTestAdapter(t *testing.T, base model.Config, dt dtype.DType, edit func(cfg map[string]any, tensors map[string]safetensors.Tensor)) string {
	t.Helper()
	dir := t.TempDir()
	src := model.RandomAdapterSource(base, 4, []string{"q_proj", "v_proj"}, 1, 0.1)
	tensors := map[string]safetensors.Tensor{}
	for _, name := range src.Names() {
		tensor, _ := src.Lookup(name)
		v, err := dtype.ToFloat32(tensor.DType, tensor.Data)
		if err != nil {
			t.Fatal(err)
		}
		data, err := dtype.FromFloat32(dt, v)
		if err != nil {
			t.Fatal(err)
		}
		tensors[name] = safetensors.Tensor{Name: name, DType: dt, Shape: tensor.Shape, Data: data}
	}
	cfg := map[string]any{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": []string{"q_proj", "v_proj"},
		"bias": "none", "fan_in_fan_out": false, "use_dora": false, "modules_to_save": nil}
	if edit != nil {
		edit(cfg, tensors)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, AdapterConfigFile), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	var list []safetensors.Tensor
	for _, tensor := range tensors {
		list = append(list, tensor)
	}
	if err := safetensors.WriteFile(filepath.Join(dir, AdapterWeightsFile), list, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestLoadAdapter(t *testing.T) {
	base := adapterBase()
	qA := model.AdapterTensorName(0, "q_proj", "A")
	for _, tc := range []struct {
		name     string
		dt       dtype.DType
		edit     func(cfg map[string]any, tensors map[string]safetensors.Tensor)
		after    func(dir string) string // changes the directory; returns the path to load
		maxRank  int
		notFound bool
		want     string
	}{
		{name: "f32", dt: dtype.F32, maxRank: 16},
		{name: "bf16", dt: dtype.BF16, maxRank: 16},
		{name: "f16", dt: dtype.F16, maxRank: 16},
		{name: "missing directory", dt: dtype.F32, after: func(dir string) string { return filepath.Join(dir, "nope") }, notFound: true, want: "nope"},
		{name: "not a directory", dt: dtype.F32, after: func(dir string) string { return filepath.Join(dir, AdapterConfigFile) }, want: "not a directory"},
		{name: "missing config", dt: dtype.F32, after: func(dir string) string {
			os.Remove(filepath.Join(dir, AdapterConfigFile))
			return dir
		}, want: AdapterConfigFile + " is missing"},
		{name: "missing weights", dt: dtype.F32, after: func(dir string) string {
			os.Remove(filepath.Join(dir, AdapterWeightsFile))
			return dir
		}, want: AdapterWeightsFile + " is missing"},
		{name: "pickle only", dt: dtype.F32, after: func(dir string) string {
			os.Rename(filepath.Join(dir, AdapterWeightsFile), filepath.Join(dir, "adapter_model.bin"))
			return dir
		}, want: "adapter_model.bin"},
		{name: "corrupt safetensors", dt: dtype.F32, after: func(dir string) string {
			os.WriteFile(filepath.Join(dir, AdapterWeightsFile), []byte("\xff\xff\xff\xff\xff\xff\xff\x7fgarbage"), 0o644)
			return dir
		}, want: "safetensors"},
		{name: "truncated safetensors", dt: dtype.F32, after: func(dir string) string {
			p := filepath.Join(dir, AdapterWeightsFile)
			data, _ := os.ReadFile(p)
			os.WriteFile(p, data[:len(data)-7], 0o644)
			return dir
		}, want: "safetensors"},
		{name: "wrong shape", dt: dtype.F32, edit: func(_ map[string]any, ts map[string]safetensors.Tensor) {
			tensor := ts[qA]
			tensor.Shape, tensor.Data = []int{4, 16}, tensor.Data[:4*16*4]
			ts[qA] = tensor
		}, maxRank: 16, want: "shape [4 16]"},
		{name: "unknown module", dt: dtype.F32, edit: func(cfg map[string]any, _ map[string]safetensors.Tensor) {
			cfg["target_modules"] = []string{"q_proj", "v_proj", "embed_tokens"}
		}, maxRank: 16, want: `"embed_tokens"`},
		{name: "unknown tensor", dt: dtype.F32, edit: func(_ map[string]any, ts map[string]safetensors.Tensor) {
			tensor := ts[qA]
			tensor.Name = "base_model.model.model.embed_tokens.lora_embedding_A"
			ts[tensor.Name] = tensor
		}, maxRank: 16, want: "lora_embedding_A"},
		{name: "rank too big", dt: dtype.F32, maxRank: 2, want: "--max-lora-rank"},
		{name: "dora", dt: dtype.F32, edit: func(cfg map[string]any, _ map[string]safetensors.Tensor) { cfg["use_dora"] = true }, maxRank: 16, want: "DoRA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeTestAdapter(t, base, tc.dt, tc.edit)
			if tc.after != nil {
				dir = tc.after(dir)
			}
			a, err := LoadAdapter(dir, &base, tc.maxRank)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if a.Rank() != 4 || a.Scale() != 2 || !strings.HasPrefix(a.Digest, "sha256:") {
					t.Fatalf("rank %d, scale %v, digest %q", a.Rank(), a.Scale(), a.Digest)
				}
				A, B := a.Weights(1, "v_proj")
				if A == nil || A.DType != dtype.F32 || B.Rows != base.NumKVHeads*base.HeadDim {
					t.Fatalf("v_proj of layer 1: A %+v, B %+v", A, B)
				}
				again, err := LoadAdapter(dir, &base, tc.maxRank)
				if err != nil || again.Digest != a.Digest {
					t.Fatalf("loading again: digest %q, was %q (%v)", again.Digest, a.Digest, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if tc.notFound != errors.Is(err, fs.ErrNotExist) || !tc.notFound && !errors.Is(err, model.ErrInvalidAdapter) {
				t.Fatalf("error %v: want not-found %v, else a bad adapter", err, tc.notFound)
			}
		})
	}
}
