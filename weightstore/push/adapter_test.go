package push

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/manifest"
	"github.com/stokehq/stoke/weightstore/safetensors"
)

// writePEFT writes a PEFT LoRA adapter of rank r over q_proj and v_proj of
// every layer of the base checkpoint in baseDir; edit, when set, may
// change its tensors before they are written.
func writePEFT(t *testing.T, baseDir string, r int, edit func([]safetensors.Tensor) []safetensors.Tensor) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(baseDir, checkpoint.ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := model.ParseConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	f32 := func(n int) []byte {
		b := make([]byte, 4*n)
		for i := range n {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(i%7)*0.01))
		}
		return b
	}
	var ts []safetensors.Tensor
	for l := range cfg.NumLayers {
		for _, p := range []struct {
			name    string
			in, out int
		}{{"q_proj", cfg.HiddenSize, cfg.NumHeads * cfg.HeadDim}, {"v_proj", cfg.HiddenSize, cfg.NumKVHeads * cfg.HeadDim}} {
			pre := fmt.Sprintf("base_model.model.model.layers.%d.self_attn.%s.", l, p.name)
			ts = append(ts,
				safetensors.Tensor{Name: pre + "lora_A.weight", DType: dtype.F32, Shape: []int{r, p.in}, Data: f32(r * p.in)},
				safetensors.Tensor{Name: pre + "lora_B.weight", DType: dtype.F32, Shape: []int{p.out, r}, Data: f32(p.out * r)})
		}
	}
	if edit != nil {
		ts = edit(ts)
	}
	dir := filepath.Join(t.TempDir(), "adapter")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := safetensors.WriteFile(filepath.Join(dir, checkpoint.AdapterWeightsFile), ts, nil); err != nil {
		t.Fatal(err)
	}
	acfg, _ := json.Marshal(map[string]any{"r": r, "lora_alpha": 2 * r, "target_modules": []string{"q_proj", "v_proj"}, "bias": "none", "peft_type": "LORA"})
	if err := os.WriteFile(filepath.Join(dir, checkpoint.AdapterConfigFile), acfg, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestAdapterBase(t *testing.T) {
	cases := []struct {
		url, baseURL, base string
		ok                 bool
	}{
		{"s3://b/llama/adapters/sql", "s3://b/llama", "llama", true},
		{"s3://b/p/llama/adapters/sql/", "s3://b/p/llama", "llama", true},
		{"file:///data/llama/adapters/sql", "file:///data/llama", "llama", true},
		{"s3://b/llama/sql", "", "", false},
		{"s3://b/adapters/sql", "", "", false},
		{"sql", "", "", false},
	}
	for _, tc := range cases {
		baseURL, base, ok := AdapterBase(tc.url)
		if ok != tc.ok || baseURL != tc.baseURL || base != tc.base {
			t.Errorf("AdapterBase(%q) = %q, %q, %v; want %q, %q, %v", tc.url, baseURL, base, ok, tc.baseURL, tc.base, tc.ok)
		}
	}
}

// TestPushAdapter pushes a base model, then adapters under it: a good one
// is committed with its base named in the manifest; a bad one, or one
// without its base, is refused before anything is uploaded.
func TestPushAdapter(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	open := func(t *testing.T, prefix string) bucket.Bucket {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, prefix)), 0o755); err != nil {
			t.Fatal(err)
		}
		b, err := bucket.Open(ctx, "file://"+filepath.Join(root, prefix), bucket.S3Options{})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	baseDir := writeTiny(t, 1)
	base := open(t, "tiny")
	bm, err := Push(ctx, baseDir, base, Options{})
	if err != nil {
		t.Fatal(err)
	}

	good := writePEFT(t, baseDir, 4, nil)
	m, err := Push(ctx, good, open(t, "tiny/adapters/sql"), Options{Base: base})
	if err != nil {
		t.Fatal(err)
	}
	if m.Model != "sql" || m.Base != "tiny" || m.BaseRevision != bm.Revision || m.DType != "F32" {
		t.Fatalf("manifest %+v: want model sql, base tiny@%s, dtype F32", m, bm.Revision)
	}
	if _, err := os.Stat(filepath.Join(root, "tiny/adapters/sql", manifest.FileName)); err != nil {
		t.Fatalf("no manifest committed: %v", err)
	}

	bad := []struct {
		name string
		dir  string
		opts Options
		want string
	}{
		{"wrong shape", writePEFT(t, baseDir, 4, func(ts []safetensors.Tensor) []safetensors.Tensor {
			ts[0].Shape = []int{4, ts[0].Shape[1] / 2}
			ts[0].Data = ts[0].Data[:len(ts[0].Data)/2]
			return ts
		}), Options{Base: base}, "has shape"},
		{"unknown module", writePEFT(t, baseDir, 4, func(ts []safetensors.Tensor) []safetensors.Tensor {
			ts[0].Name = strings.Replace(ts[0].Name, "q_proj", "w_proj", 1)
			return ts
		}), Options{Base: base}, "not the lora_A or lora_B"},
		{"no base", good, Options{Base: open(t, "missing")}, "push it first"},
		{"not under a base", good, Options{}, "goes under its base model"},
		{"quantize", good, Options{Base: base, Quantize: true}, "--quantize"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			dest := open(t, "tiny/adapters/"+strings.ReplaceAll(tc.name, " ", "-"))
			_, err := Push(ctx, tc.dir, dest, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("push: %v, want an error with %q", err, tc.want)
			}
			if objs, err := dest.List(ctx, ""); err != nil || len(objs) > 0 {
				t.Fatalf("a refused push left %d objects (%v)", len(objs), err)
			}
		})
	}
}
