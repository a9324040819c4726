package cudaexec

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/internal/dtype"
)

func planConfig() model.Config {
	return model.Config{ModelType: "llama", HiddenSize: 64, IntermediateSize: 96, NumLayers: 1, NumHeads: 4, NumKVHeads: 2,
		HeadDim: 16, VocabSize: 100, MaxPositionEmbeddings: 64, RMSNormEps: 1e-5, RopeTheta: 10000, HiddenAct: "silu"}
}

func TestPlanSlotsTablesAndPack(t *testing.T) {
	cfg := planConfig()
	b := &model.Batch{
		Tokens:      []int32{5, 6, 7, 8},
		Positions:   []int32{15, 16, 17, 0},
		Seqs:        []int32{0, 0, 0, 1},
		BlockTables: [][]int32{{4, 9}, {2}},
		LogitRows:   []int{2, 3},
	}
	p, err := NewPlan(&cfg, cfg.InverseFrequencies(), 10, b)
	if err != nil {
		t.Fatal(err)
	}
	wantSlots := []int32{4*16 + 15, 9 * 16, 9*16 + 1, 2 * 16}
	for i, s := range wantSlots {
		if p.Slots[i] != s {
			t.Errorf("slot of token %d: %d, want %d", i, p.Slots[i], s)
		}
	}
	if got := p.TableOff; got[0] != 0 || got[2] != 0 || got[3] != 2 || len(p.Tables) != 3 {
		t.Errorf("table offsets %v over tables %v", got, p.Tables)
	}
	if p.MaxLen != 18 {
		t.Errorf("max len %d, want 18", p.MaxLen)
	}
	// The rope row of position 0 is cos 1, sin 0.
	row := p.Rope[3*cfg.HeadDim:]
	for j := range cfg.HeadDim / 2 {
		if row[j] != 1 || row[cfg.HeadDim/2+j] != 0 {
			t.Fatalf("rope row of position 0: %v", row[:cfg.HeadDim])
		}
	}
	pk := p.Pack(nil)
	for _, off := range []int64{pk.Tokens, pk.Positions, pk.Slots, pk.TableOff, pk.Tables, pk.Rope, pk.Logit} {
		if off%packAlign != 0 || off > int64(len(pk.Bytes)) {
			t.Errorf("packed array at %d of %d bytes", off, len(pk.Bytes))
		}
	}
	at := func(off int64, i int) uint32 { return binary.LittleEndian.Uint32(pk.Bytes[off+int64(4*i):]) }
	if at(pk.Slots, 1) != uint32(9*16) || at(pk.Tables, 1) != 9 || at(pk.Logit, 1) != 3 || at(pk.Tokens, 2) != 7 {
		t.Error("packed values differ from the plan's")
	}
	if math.Float32frombits(at(pk.Rope, 3*cfg.HeadDim)) != 1 {
		t.Error("packed rope table differs from the plan's")
	}
}

func TestPlanRefusesBadBatches(t *testing.T) {
	cfg := planConfig()
	for _, tc := range []struct {
		name string
		b    model.Batch
		want string
	}{
		{"token", model.Batch{Tokens: []int32{100}, Positions: []int32{0}, Seqs: []int32{0}, BlockTables: [][]int32{{0}}}, "vocabulary"},
		{"position", model.Batch{Tokens: []int32{1}, Positions: []int32{64}, Seqs: []int32{0}, BlockTables: [][]int32{{0, 1, 2, 3, 4}}}, "context"},
		{"table", model.Batch{Tokens: []int32{1}, Positions: []int32{16}, Seqs: []int32{0}, BlockTables: [][]int32{{0}}}, "does not cover"},
		{"block", model.Batch{Tokens: []int32{1}, Positions: []int32{0}, Seqs: []int32{0}, BlockTables: [][]int32{{10}}}, "outside the KV pool"},
		{"seq", model.Batch{Tokens: []int32{1}, Positions: []int32{0}, Seqs: []int32{1}, BlockTables: [][]int32{{0}}}, "no block table"},
		{"row", model.Batch{Tokens: []int32{1}, Positions: []int32{0}, Seqs: []int32{0}, BlockTables: [][]int32{{0}}, LogitRows: []int{1}}, "logit row"},
	} {
		if _, err := NewPlan(&cfg, cfg.InverseFrequencies(), 10, &tc.b); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestLaunchGeometry(t *testing.T) {
	if _, err := AttentionLaunch(1, 1, MaxContext+1); err == nil {
		t.Error("attention past MaxContext launched")
	}
	l, err := AttentionLaunch(3, 8, 100)
	if err != nil || l.Grid != [3]int{3, 8, 1} || l.Shared != 400 || l.Block[0]%32 != 0 {
		t.Errorf("attention launch %+v, %v", l, err)
	}
	if 4*MaxContext+33*4 > 48<<10 {
		t.Error("MaxContext scores and the reduction scratch exceed 48 KiB of shared memory")
	}
	if g := GEMVLaunch(17); g.Grid[0] != 3 || g.Block[0] != 32*GEMVWarps {
		t.Errorf("gemv launch %+v", g)
	}
	if s := SGEMMLaunch(33, 16); s.Grid != [3]int{1, 3, 1} {
		t.Errorf("sgemm launch %+v", s)
	}
	if e := ElementwiseLaunch(1 << 30); e.Grid[0] != 4096 {
		t.Errorf("elementwise launch %+v", e)
	}
	if r := DequantChunkRows(128256, 2048); r*2048 > DequantScratchFloats || r < 1 {
		t.Errorf("dequant chunk of %d rows", r)
	}
}

func TestResolveWeightsScales(t *testing.T) {
	cfg := planConfig()
	src := convertSource(t, cfg, dtype.F8E4M3, 32)
	cfg.Quantization = &model.QuantizationConfig{QuantMethod: "fp8", WeightBlockSize: []int{32, 32}}
	w, err := ResolveWeights(&cfg, hostTensors(src, 8))
	if err != nil {
		t.Fatal(err)
	}
	q := w.Layers[0].Q
	if q.Kind != WeightFP8 || q.BR != 32 || q.BC != 32 || q.SCols != 2 || len(q.Scales) != 4 {
		t.Errorf("block-scaled q: %+v", q)
	}
	if w.Embed.Kind != WeightBF16 || w.LMHead.Name != "lm_head.weight" {
		t.Errorf("embed %v, lm head %s", w.Embed.Kind, w.LMHead.Name)
	}
	// Per-row and per-tensor weight_scale.
	name := model.LayerPrefix(0) + "self_attn.k_proj"
	delete(src, name+".weight_scale_inv")
	rows := cfg.NumKVHeads * cfg.HeadDim
	src[name+".weight_scale"] = model.Tensor{DType: dtype.F32, Shape: []int{rows}, Data: make([]byte, 4*rows)}
	if w, err = ResolveWeights(&cfg, hostTensors(src, 8)); err != nil {
		t.Fatal(err)
	}
	if k := w.Layers[0].K; k.BR != 1 || k.BC != cfg.HiddenSize || k.SCols != 1 {
		t.Errorf("per-row k: %+v", k)
	}
	src[name+".weight_scale"] = model.Tensor{DType: dtype.F32, Shape: []int{1}, Data: make([]byte, 4)}
	if w, err = ResolveWeights(&cfg, hostTensors(src, 8)); err != nil {
		t.Fatal(err)
	}
	if k := w.Layers[0].K; k.BR != rows || k.BC != cfg.HiddenSize {
		t.Errorf("per-tensor k: %+v", k)
	}
	delete(src, name+".weight_scale")
	if _, err := ResolveWeights(&cfg, hostTensors(src, 8)); err == nil || !strings.Contains(err.Error(), "weight_scale") {
		t.Errorf("missing scales: %v", err)
	}
	// FP8 outside the projections is refused.
	bad := convertSource(t, cfg, dtype.F8E4M3, 32)
	good := bad["model.embed_tokens.weight"]
	e := good
	e.DType, e.Data = dtype.F8E4M3, make([]byte, cfg.VocabSize*cfg.HiddenSize)
	bad["model.embed_tokens.weight"] = e
	if _, err := ResolveWeights(&cfg, hostTensors(bad, 8)); err == nil || !strings.Contains(err.Error(), "only projection") {
		t.Errorf("fp8 embeddings: %v", err)
	}
	bad["model.embed_tokens.weight"] = good
	delete(bad, model.LayerPrefix(0)+"mlp.up_proj.weight")
	if _, err := ResolveWeights(&cfg, hostTensors(bad, 8)); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing tensor: %v", err)
	}
}

func TestRopeFrequenciesLlama3(t *testing.T) {
	cfg := planConfig()
	plain := cfg.InverseFrequencies()
	cfg.RopeScaling = &model.RopeScaling{RopeType: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 64}
	scaled := cfg.InverseFrequencies()
	if scaled[0] != plain[0] {
		t.Errorf("the highest frequency changed: %v → %v", plain[0], scaled[0])
	}
	last := len(plain) - 1
	if math.Abs(scaled[last]-plain[last]/8) > 1e-15 {
		t.Errorf("the lowest frequency %v, want %v/8", scaled[last], plain[last])
	}
}
