package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kernels/kernelstest"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/internal/dtype"
)

func TestParseAdapterConfig(t *testing.T) {
	for _, tc := range []struct {
		name, json string
		maxRank    int
		scale      float32 // when the config is valid
		want       string  // a part of the error; "" for a valid config
	}{
		{"plain", `{"peft_type":"LORA","r":8,"lora_alpha":16,"target_modules":["q_proj","v_proj"],"bias":"none"}`, 16, 2, ""},
		{"rslora", `{"r":16,"lora_alpha":8,"target_modules":["q_proj"],"use_rslora":true}`, 16, 2, ""},
		{"all-linear", `{"r":4,"lora_alpha":4,"target_modules":"all-linear"}`, 0, 1, ""},
		{"regex", `{"r":4,"lora_alpha":2,"target_modules":".*\\.(q|v)_proj"}`, 0, 0.5, ""},
		{"full module names", `{"r":4,"lora_alpha":4,"target_modules":["self_attn.q_proj","mlp.down_proj"]}`, 0, 1, ""},
		{"default alpha", `{"r":4,"target_modules":["q_proj"]}`, 0, 2, ""},
		{"nulls PEFT writes", `{"r":4,"lora_alpha":4,"target_modules":["q_proj"],"modules_to_save":null,"rank_pattern":{},"alpha_pattern":{},"layer_replication":null,"layers_to_transform":null}`, 0, 1, ""},
		{"dora", `{"r":8,"lora_alpha":16,"target_modules":["q_proj"],"use_dora":true}`, 16, 0, "DoRA"},
		{"modules to save", `{"r":8,"lora_alpha":16,"target_modules":["q_proj"],"modules_to_save":["lm_head"]}`, 16, 0, "modules_to_save"},
		{"bias", `{"r":8,"lora_alpha":16,"target_modules":["q_proj"],"bias":"lora_only"}`, 16, 0, "bias"},
		{"fan in fan out", `{"r":8,"lora_alpha":16,"target_modules":["q_proj"],"fan_in_fan_out":true}`, 16, 0, "fan_in_fan_out"},
		{"rank too big", `{"r":32,"lora_alpha":16,"target_modules":["q_proj"]}`, 16, 0, "--max-lora-rank"},
		{"zero rank", `{"r":0,"lora_alpha":16,"target_modules":["q_proj"]}`, 16, 0, "r must be positive"},
		{"unknown module", `{"r":8,"lora_alpha":16,"target_modules":["q_proj","lm_head"]}`, 16, 0, `"lm_head"`},
		{"no modules", `{"r":8,"lora_alpha":16,"target_modules":[]}`, 16, 0, "target_modules"},
		{"bad regex", `{"r":8,"lora_alpha":16,"target_modules":"(q"}`, 16, 0, "regular expression"},
		{"rank pattern", `{"r":8,"lora_alpha":16,"target_modules":["q_proj"],"rank_pattern":{"q_proj":4}}`, 16, 0, "rank_pattern"},
		{"not lora", `{"peft_type":"IA3","r":8,"lora_alpha":16,"target_modules":["q_proj"]}`, 16, 0, "peft_type"},
		{"not json", `{"r":`, 16, 0, "parse adapter_config.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseAdapterConfig([]byte(tc.json), tc.maxRank)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrInvalidAdapter) {
					t.Fatalf("error %v, want one wrapping ErrInvalidAdapter that mentions %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Scale(); math.Abs(float64(got-tc.scale)) > 1e-6 {
				t.Fatalf("scale %v, want %v", got, tc.scale)
			}
		})
	}
}

func TestTargetModules(t *testing.T) {
	cfg := testConfig()
	for _, tc := range []struct {
		name, json string
		want       [numProjections]bool // of every layer but those layers_to_transform leaves out
		layers     []int
	}{
		{"names", `{"r":2,"target_modules":["q_proj","down_proj"]}`, [numProjections]bool{projQ: true, projDown: true}, nil},
		{"all-linear", `{"r":2,"target_modules":"all-linear"}`, [numProjections]bool{true, true, true, true, true, true, true}, nil},
		{"regex", `{"r":2,"target_modules":"model\\.layers\\.\\d+\\.mlp\\..*"}`, [numProjections]bool{projGate: true, projUp: true, projDown: true}, nil},
		{"layers", `{"r":2,"target_modules":["v_proj"],"layers_to_transform":1}`, [numProjections]bool{projV: true}, []int{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseAdapterConfig([]byte(tc.json), 0)
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.targets(cfg.NumLayers)
			if err != nil {
				t.Fatal(err)
			}
			for l := range cfg.NumLayers {
				want := tc.want
				if tc.layers != nil && l != tc.layers[0] {
					want = [numProjections]bool{}
				}
				if got[l] != want {
					t.Fatalf("layer %d: targets %v, want %v", l, got[l], want)
				}
			}
		})
	}
}

// testAdapterConfig is a rank-4 adapter of every projection.
func testAdapterConfig() AdapterConfig {
	return AdapterConfig{PeftType: "LORA", R: 4, LoraAlpha: 8, TargetModules: TargetModules{AllLinear: true}, Bias: "none"}
}

// testAdapter is a random adapter of cfg whose update is large enough to
// change the model's outputs visibly.
func testAdapter(t *testing.T, cfg Config, seed uint64) *Adapter {
	t.Helper()
	ac := testAdapterConfig()
	a, err := NewAdapter(&cfg, ac, RandomAdapterSource(cfg, ac.R, nil, seed, AdapterStd(ac, 0.05)), 16)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// merged returns src with a's update folded into its projection weights:
// W' = W + scale·B·A, summed in float64.
func merged(t *testing.T, cfg Config, src memorySource, a *Adapter) memorySource {
	t.Helper()
	out := memorySource{}
	for name, tensor := range src {
		out[name] = tensor
	}
	for l := range cfg.NumLayers {
		for _, module := range ProjectionModules() {
			A, B := a.Weights(l, module)
			if A == nil {
				continue
			}
			name := LayerPrefix(l) + projections[indexOf(module)] + ".weight"
			w, err := toFloat32(src[name])
			if err != nil {
				t.Fatal(err)
			}
			rows, cols, r := B.Rows, A.Cols, A.Rows
			for i := range rows {
				for j := range cols {
					var s float64
					for k := range r {
						s += float64(B.F32[i*r+k]) * float64(A.F32[k*cols+j])
					}
					w[i*cols+j] = float32(float64(w[i*cols+j]) + float64(a.Scale())*s)
				}
			}
			b, _ := dtype.FromFloat32(dtype.F32, w)
			out[name] = Tensor{DType: dtype.F32, Shape: src[name].Shape, Data: b, Source: "merged"}
		}
	}
	return out
}

func indexOf(module string) int {
	for i, m := range ProjectionModules() {
		if m == module {
			return i
		}
	}
	return -1
}

func maxDiff(a, b []float32) float64 {
	var d float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

// TestAdapterMatchesMergedWeights checks that an adapter applied at run
// time gives the logits of the base with the adapter merged into its
// weights, within float rounding, and that it changes them.
func TestAdapterMatchesMergedWeights(t *testing.T) {
	for _, c := range invarianceConfigs {
		t.Run(c.name, func(t *testing.T) {
			cfg := c.cfg()
			src := randomSource(t, cfg, 7)
			a := testAdapter(t, cfg, 5)
			m := newTestModel(t, cfg, src)
			ref := newTestModel(t, cfg, merged(t, cfg, src, a))
			tokens := []int32{1, 5, 9, 33, 2, 17, 80, 3, 3, 41, 11, 60, 7, 7, 1, 90, 42}
			got, err := m.ScoreAdapter(a, tokens)
			if err != nil {
				t.Fatal(err)
			}
			want := runAlone(t, ref, tokens)
			base := runAlone(t, m, tokens)
			// Random weights of std 0.2 make logits in the tens (hundreds
			// for the wide shape): the bound is 1e-4 relative to them.
			var scale float64
			for _, v := range want {
				scale = max(scale, math.Abs(float64(v)))
			}
			if d := maxDiff(got, want); d > 1e-4*max(1, scale) {
				t.Fatalf("run-time adapter differs from the merged weights by %g (logits up to %g)", d, scale)
			}
			if d := maxDiff(got, base); d < 1e-2 {
				t.Fatalf("the adapter changes the logits by only %g", d)
			}
		})
	}
}

// TestAdaptersInOneBatchMatchAlone runs sequences of the base and of two
// adapters interleaved in one batch (so each adapter's rows are gathered)
// and checks every sequence gets the same logit bits as alone, on every
// kernel set; a batch whose Adapters are all nil is the base's bits too.
func TestAdaptersInOneBatchMatchAlone(t *testing.T) {
	for _, c := range invarianceConfigs {
		t.Run(c.name, func(t *testing.T) {
			kernelstest.ForEachSet(t, func(t *testing.T, set *kernels.Set) {
				skipSlow(t, c.name, set)
				checkAdaptersInOneBatch(t, set, c.cfg())
			})
		})
	}
}

func checkAdaptersInOneBatch(t *testing.T, set *kernels.Set, cfg Config) {
	m := newSetModel(t, set, 2, cfg, randomSource(t, cfg, 7))
	alone := newSetModel(t, set, 1, cfg, randomSource(t, cfg, 7))
	a1, a2 := testAdapter(t, cfg, 1), testAdapter(t, cfg, 2)
	rng := rand.New(rand.NewPCG(4, 4))
	lengths := []int{1, 3, 16, 17, 5, 33, 2, 9}
	adapters := []*Adapter{nil, a1, a2, a1, nil, a2, a1, a1}
	seqs := make([][]int32, len(lengths))
	for i, n := range lengths {
		for range n {
			seqs[i] = append(seqs[i], int32(rng.IntN(cfg.VocabSize)))
		}
	}
	for _, withAdapters := range []bool{true, false} {
		kv, err := kvcache.New(m.KVShape(), 64)
		if err != nil {
			t.Fatal(err)
		}
		mgr := kvcache.NewManager(kv.NumBlocks(), false)
		b := &Batch{}
		if withAdapters {
			b.Adapters = adapters
		} else {
			b.Adapters = make([]*Adapter, len(seqs))
		}
		var owners []int
		for i, s := range seqs {
			if !mgr.Allocate(uint64(i), s, len(s), nil, "") {
				t.Fatalf("no kv blocks for sequence %d", i)
			}
			b.BlockTables = append(b.BlockTables, mgr.Table(uint64(i)))
		}
		for pos := 0; pos < 40; pos++ {
			for i, s := range seqs {
				if pos < len(s) {
					b.Tokens = append(b.Tokens, s[pos])
					b.Positions = append(b.Positions, int32(pos))
					b.Seqs = append(b.Seqs, int32(i))
					b.LogitRows = append(b.LogitRows, len(b.Tokens)-1)
					owners = append(owners, i)
				}
			}
		}
		logits := make([]float32, len(b.LogitRows)*cfg.VocabSize)
		if err := m.Forward(b, kv, logits); err != nil {
			t.Fatal(err)
		}
		kv.Free()
		got := make([][]float32, len(seqs))
		for j, owner := range owners {
			got[owner] = append(got[owner], logits[j*cfg.VocabSize:(j+1)*cfg.VocabSize]...)
		}
		for i, s := range seqs {
			var a *Adapter
			if withAdapters {
				a = adapters[i]
			}
			want, err := alone.ScoreAdapter(a, s)
			if err != nil {
				t.Fatal(err)
			}
			for j := range want {
				if got[i][j] != want[j] {
					t.Fatalf("adapters %v: sequence %d (len %d) position %d logit %d: batched %v, alone %v",
						withAdapters, i, len(s), j/cfg.VocabSize, j%cfg.VocabSize, got[i][j], want[j])
				}
			}
			if !withAdapters {
				if base := runAlone(t, alone, s); maxDiff(base, want) != 0 {
					t.Fatalf("sequence %d: nil adapters change the base model's logits", i)
				}
			}
		}
	}
}

func TestNewAdapterRejects(t *testing.T) {
	cfg := testConfig()
	good := func() memorySource {
		return RandomAdapterSource(cfg, 4, []string{"q_proj", "v_proj"}, 1, 0.1).(memorySource)
	}
	qa := AdapterTensorName(0, "q_proj", "A")
	for _, tc := range []struct {
		name   string
		cfg    func(*AdapterConfig)
		edit   func(memorySource)
		maxRnk int
		want   string
	}{
		{"valid", nil, nil, 16, ""},
		{"default infix", nil, func(s memorySource) {
			s[strings.Replace(qa, "lora_A.", "lora_A.default.", 1)] = s[qa]
			delete(s, qa)
		}, 16, ""},
		{"unknown tensor", nil, func(s memorySource) { s["base_model.model.lm_head.lora_A.weight"] = s[qa] }, 16, "lm_head"},
		{"not targeted", func(c *AdapterConfig) { c.TargetModules = TargetModules{Names: []string{"q_proj"}} }, nil, 16, "target_modules"},
		{"wrong shape", nil, func(s memorySource) {
			t := s[qa]
			t.Shape = []int{4, cfg.HiddenSize - 8}
			t.Data = t.Data[:4*(cfg.HiddenSize-8)*4]
			s[qa] = t
		}, 16, "shape"},
		{"rank differs from r", func(c *AdapterConfig) { c.R = 8 }, nil, 16, "r = 8"},
		{"rank too big", nil, nil, 2, "--max-lora-rank"},
		{"missing B", nil, func(s memorySource) { delete(s, AdapterTensorName(1, "v_proj", "B")) }, 16, AdapterTensorName(1, "v_proj", "B")},
		{"layer past the base", nil, func(s memorySource) {
			s[AdapterTensorName(5, "q_proj", "A")] = s[qa]
		}, 16, "layer 5"},
		{"twice", nil, func(s memorySource) {
			s[strings.Replace(qa, "lora_A.", "lora_A.default.", 1)] = s[qa]
		}, 16, "twice"},
		{"bad dtype", nil, func(s memorySource) {
			t := s[qa]
			t.DType, t.Data = dtype.F8E4M3, t.Data[:len(t.Data)/4]
			s[qa] = t
		}, 16, "dtype"},
		{"no weights", nil, func(s memorySource) { clear(s) }, 16, "no lora_A"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ac := AdapterConfig{R: 4, LoraAlpha: 8, TargetModules: TargetModules{Names: []string{"q_proj", "v_proj"}}}
			if tc.cfg != nil {
				tc.cfg(&ac)
			}
			src := good()
			if tc.edit != nil {
				tc.edit(src)
			}
			a, err := NewAdapter(&cfg, ac, src, tc.maxRnk)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if A, B := a.Weights(1, "v_proj"); A == nil || B == nil || A.Rows != 4 || B.Cols != 4 {
					t.Fatalf("v_proj of layer 1: A %v, B %v", A, B)
				}
				if A, _ := a.Weights(0, "k_proj"); A != nil {
					t.Fatal("k_proj has weights the adapter does not hold")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrInvalidAdapter) {
				t.Fatalf("error %v, want one wrapping ErrInvalidAdapter that mentions %q", err, tc.want)
			}
		})
	}
}

func TestForwardRejectsBadAdapters(t *testing.T) {
	cfg := testConfig()
	m := newTestModel(t, cfg, randomSource(t, cfg, 1))
	other := cfg
	other.IntermediateSize = 96
	weightless, err := AdapterFromConfig(testAdapterConfig(), 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		adapters []*Adapter
		want     string
	}{
		{"misaligned", []*Adapter{nil, nil}, "2 adapters for 1 sequences"},
		{"another base", []*Adapter{testAdapter(t, other, 1)}, "another base"},
		{"no weights", []*Adapter{weightless}, "no weights"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kv, err := kvcache.New(m.KVShape(), 1)
			if err != nil {
				t.Fatal(err)
			}
			defer kv.Free()
			b := &Batch{Tokens: []int32{1}, Positions: []int32{0}, Seqs: []int32{0}, BlockTables: [][]int32{{0}}, LogitRows: []int{0}, Adapters: tc.adapters}
			err = m.Forward(b, kv, make([]float32, cfg.VocabSize))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// BenchmarkLoRADecode measures one decode step of 16 sequences (64
// positions of context each) on a 256-wide, 4-layer model (the synthetic
// "small" shape): on the base, with one adapter shared by all, and with 16
// distinct adapters (16 segments of one row each), for rank-8 q/v and
// rank-16 all-linear adapters.
func BenchmarkLoRADecode(b *testing.B) {
	cfg := Config{ModelType: "llama", HiddenSize: 256, IntermediateSize: 704, NumLayers: 4, NumHeads: 8, NumKVHeads: 2,
		HeadDim: 32, VocabSize: 4096, MaxPositionEmbeddings: 2048, RMSNormEps: 1e-5, RopeTheta: 10000, HiddenAct: "silu", TieWordEmbeddings: true}
	for _, kind := range []struct {
		name    string
		rank    int
		modules []string
	}{{"q_proj,v_proj/r=8", 8, []string{"q_proj", "v_proj"}}, {"all-linear/r=16", 16, nil}} {
		ac := AdapterConfig{R: kind.rank, LoraAlpha: 16, TargetModules: TargetModules{AllLinear: kind.modules == nil, Names: kind.modules}}
		var adapters []*Adapter
		for i := range 16 {
			a, err := NewAdapter(&cfg, ac, RandomAdapterSource(cfg, kind.rank, kind.modules, uint64(i), 0.02), 64)
			if err != nil {
				b.Fatal(err)
			}
			adapters = append(adapters, a)
		}
		for _, mode := range []string{"base", "shared", "distinct"} {
			b.Run(fmt.Sprintf("%s/%s", kind.name, mode), func(b *testing.B) {
				pool := kernels.NewPool(2)
				defer pool.Close()
				m, err := New(cfg, RandomSource(cfg, 1, 0.02), pool)
				if err != nil {
					b.Fatal(err)
				}
				benchDecodeStep(b, m, mode, adapters)
			})
		}
	}
}

func benchDecodeStep(b *testing.B, m *Model, mode string, adapters []*Adapter) {
	const seqs, ctx = 16, 64
	kv, err := kvcache.New(m.KVShape(), seqs*ctx/kvcache.BlockSize)
	if err != nil {
		b.Fatal(err)
	}
	defer kv.Free()
	mgr := kvcache.NewManager(kv.NumBlocks(), false)
	batch := &Batch{}
	for s := range seqs {
		if !mgr.Allocate(uint64(s), nil, ctx, nil, "") {
			b.Fatal("no blocks")
		}
		batch.BlockTables = append(batch.BlockTables, mgr.Table(uint64(s)))
		batch.Tokens = append(batch.Tokens, int32(s))
		batch.Positions = append(batch.Positions, ctx-1)
		batch.Seqs = append(batch.Seqs, int32(s))
		batch.LogitRows = append(batch.LogitRows, s)
		switch mode {
		case "shared":
			batch.Adapters = append(batch.Adapters, adapters[0])
		case "distinct":
			batch.Adapters = append(batch.Adapters, adapters[s])
		}
	}
	logits := make([]float32, seqs*m.cfg.VocabSize)
	b.ResetTimer()
	for range b.N {
		if err := m.Forward(batch, kv, logits); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(seqs*b.N)/b.Elapsed().Seconds(), "tok/s")
}
