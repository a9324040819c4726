package synth

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/checkpoint"
)

// TestWriteCustomConfig writes a model of a shape no preset has and checks
// it loads with that shape, and that a shape the engine cannot run is
// refused before anything is written.
func TestWriteCustomConfig(t *testing.T) {
	cfg := model.Config{HiddenSize: 1152, IntermediateSize: 1280, NumLayers: 1, NumHeads: 18, NumKVHeads: 6, HeadDim: 64,
		VocabSize: 512, MaxPositionEmbeddings: 256, RopeTheta: 10000, TieWordEmbeddings: true}
	dir := filepath.Join(t.TempDir(), "wide")
	if err := Write(context.Background(), dir, Options{Preset: "tiny", Config: &cfg, DType: dtype.BF16, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	pool := kernels.NewPool(1)
	defer pool.Close()
	m, ck, err := checkpoint.LoadModel(dir, pool)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	got := m.Config()
	if got.HiddenSize != 1152 || got.IntermediateSize != 1280 || got.NumHeads != 18 || got.NumKVHeads != 6 || got.HeadDim != 64 ||
		got.NumLayers != 1 || got.VocabSize != 512 || got.MaxPositionEmbeddings != 256 || got.ModelType != "llama" || got.TorchDType != "bfloat16" {
		t.Fatalf("loaded config %+v does not have the shape written", got)
	}
	if m.Weights().Layers[0].Down.DType != dtype.BF16 {
		t.Fatalf("down_proj loaded as %v, want BF16", m.Weights().Layers[0].Down.DType)
	}

	bad := cfg
	bad.NumKVHeads = 4 // 18 query heads do not group over 4
	badDir := filepath.Join(t.TempDir(), "bad")
	err = Write(context.Background(), badDir, Options{Config: &bad, DType: dtype.F32})
	if err == nil || !strings.Contains(err.Error(), "num_key_value_heads") {
		t.Fatalf("error %v, want one about num_key_value_heads", err)
	}
	if _, err := os.Stat(badDir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a refused config left %s behind (%v)", badDir, err)
	}
}
