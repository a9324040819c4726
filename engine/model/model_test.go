package model

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kernels/kernelstest"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/internal/dtype"
)

func testConfig() Config {
	return Config{ModelType: "llama", HiddenSize: 48, IntermediateSize: 80, NumLayers: 2, NumHeads: 6, NumKVHeads: 2,
		HeadDim: 8, VocabSize: 97, MaxPositionEmbeddings: 128, RMSNormEps: 1e-5, RopeTheta: 10000, HiddenAct: "silu",
		TieWordEmbeddings: true}
}

// randomSource builds random F32 weights for cfg that a test may edit.
func randomSource(t *testing.T, cfg Config, seed uint64) memorySource {
	t.Helper()
	return RandomSource(cfg, seed, 0.2).(memorySource)
}

// wideConfig is testConfig with layers wider than 1,024 inputs: the
// hidden size (the input of the Q/K/V, gate/up and LM-head products) and
// the intermediate size (the input of down_proj). The invariance tests so
// also cover wide F32 products, and prefills whose down_proj input (120 ×
// 1,096 floats) is larger than the block of x a product keeps in L2.
func wideConfig() Config {
	c := testConfig()
	c.HiddenSize, c.IntermediateSize = 1040, 1096
	return c
}

// invarianceConfigs are the model shapes the invariance tests run on.
var invarianceConfigs = []struct {
	name string
	cfg  func() Config
}{{"narrow", testConfig}, {"wide", wideConfig}}

// skipSlow skips the wide shape on the portable set under -short: pure Go
// under the race detector takes half a minute on it, and the full run
// covers it.
func skipSlow(t *testing.T, shape string, set *kernels.Set) {
	if testing.Short() && shape == "wide" && set.Name() == "generic" {
		t.Skip("-short: the portable set runs the wide shape in the full run only")
	}
}

func newTestModel(t *testing.T, cfg Config, src TensorSource) *Model {
	t.Helper()
	return newSetModel(t, nil, 2, cfg, src)
}

// newSetModel builds a model that computes with set (nil: the default) on
// threads threads.
func newSetModel(t *testing.T, set *kernels.Set, threads int, cfg Config, src TensorSource) *Model {
	t.Helper()
	pool := set.NewPool(threads)
	t.Cleanup(pool.Close)
	m, err := New(cfg, src, pool)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// runAlone scores one sequence in a forward call of its own.
func runAlone(t *testing.T, m *Model, tokens []int32) []float32 {
	t.Helper()
	logits, err := m.Score(tokens)
	if err != nil {
		t.Fatal(err)
	}
	return logits
}

// TestBatchMatchesSequencesAlone checks, on every kernel set, that a
// sequence's logits are the same bits whether it is scored alone or
// batched with others, its prompt split across two calls: greedy output
// must not depend on what else the engine runs.
func TestBatchMatchesSequencesAlone(t *testing.T) {
	for _, c := range invarianceConfigs {
		t.Run(c.name, func(t *testing.T) {
			kernelstest.ForEachSet(t, func(t *testing.T, set *kernels.Set) {
				skipSlow(t, c.name, set)
				checkBatchMatchesAlone(t, set, c.cfg())
			})
		})
	}
}

func checkBatchMatchesAlone(t *testing.T, set *kernels.Set, cfg Config) {
	m := newSetModel(t, set, 2, cfg, randomSource(t, cfg, 7))
	// The sequences alone, on one thread: the split across threads must not
	// matter either.
	alone := newSetModel(t, set, 1, cfg, randomSource(t, cfg, 7))
	rng := rand.New(rand.NewPCG(3, 3))
	lengths := []int{1, 3, 16, 17, 5, 33, 2, 9}
	seqs := make([][]int32, len(lengths))
	for i, n := range lengths {
		for range n {
			seqs[i] = append(seqs[i], int32(rng.IntN(cfg.VocabSize)))
		}
	}

	// Every sequence in one call: the first half of each prompt, then the
	// rest in a second call, interleaved across sequences.
	kv, err := kvcache.New(m.KVShape(), 64)
	if err != nil {
		t.Fatal(err)
	}
	mgr := kvcache.NewManager(kv.NumBlocks(), false)
	tables := make([][]int32, len(seqs))
	for i, s := range seqs {
		if !mgr.Allocate(uint64(i), s, len(s), nil, "") {
			t.Fatalf("no kv blocks for sequence %d", i)
		}
		tables[i] = mgr.Table(uint64(i))
	}
	got := make([][]float32, len(seqs))
	for _, part := range []struct{ from, to func(n int) int }{
		{func(int) int { return 0 }, func(n int) int { return n / 2 }},
		{func(n int) int { return n / 2 }, func(n int) int { return n }},
	} {
		b := &Batch{BlockTables: tables}
		var owners []int
		for pos := 0; pos < 40; pos++ {
			for i, s := range seqs {
				if pos >= part.from(len(s)) && pos < part.to(len(s)) {
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
		for j, owner := range owners {
			got[owner] = append(got[owner], logits[j*cfg.VocabSize:(j+1)*cfg.VocabSize]...)
		}
	}
	for i, s := range seqs {
		want := runAlone(t, alone, s)
		if len(got[i]) != len(want) {
			t.Fatalf("sequence %d: %d logits, want %d", i, len(got[i]), len(want))
		}
		for j := range want {
			if got[i][j] != want[j] {
				t.Fatalf("sequence %d (len %d) position %d logit %d: batched %v, alone %v",
					i, len(s), j/cfg.VocabSize, j%cfg.VocabSize, got[i][j], want[j])
			}
		}
	}
}

func TestGQAEqualsRepeatedHeads(t *testing.T) {
	// A GQA model equals the multi-head model whose K/V projections repeat
	// each KV head for its group of query heads.
	cfg := testConfig()
	src := randomSource(t, cfg, 11)
	mha := cfg
	mha.NumKVHeads = cfg.NumHeads
	group := cfg.NumHeads / cfg.NumKVHeads
	mhaSrc := memorySource{}
	for name, tensor := range src {
		mhaSrc[name] = tensor
		if strings.HasSuffix(name, "k_proj.weight") || strings.HasSuffix(name, "v_proj.weight") {
			rowBytes := cfg.HiddenSize * 4
			var data []byte
			for h := 0; h < cfg.NumKVHeads; h++ {
				head := tensor.Data[h*cfg.HeadDim*rowBytes : (h+1)*cfg.HeadDim*rowBytes]
				for range group {
					data = append(data, head...)
				}
			}
			mhaSrc[name] = Tensor{DType: dtype.F32, Shape: []int{cfg.NumHeads * cfg.HeadDim, cfg.HiddenSize}, Data: data}
		}
	}
	tokens := []int32{5, 9, 13, 2, 77, 31}
	a := runAlone(t, newTestModel(t, cfg, src), tokens)
	b := runAlone(t, newTestModel(t, mha, mhaSrc), tokens)
	for i := range a {
		if d := math.Abs(float64(a[i] - b[i])); d > 1e-5 {
			t.Fatalf("logit %d: gqa %v, mha %v", i, a[i], b[i])
		}
	}
}

func TestLoadRejectsBadCheckpoints(t *testing.T) {
	cfg := testConfig()
	for _, tc := range []struct {
		name   string
		mutate func(src memorySource, cfg *Config)
		want   string
	}{
		{"missing tensor", func(s memorySource, _ *Config) { delete(s, "model.layers.1.mlp.up_proj.weight") },
			"tensor model.layers.1.mlp.up_proj.weight is missing"},
		{"config disagrees", func(_ memorySource, c *Config) { c.IntermediateSize = 96 },
			"model.layers.0.mlp.gate_proj.weight has shape [80 48], config.json implies [96 48]"},
		{"short data", func(s memorySource, _ *Config) {
			t := s["model.norm.weight"]
			t.Data = t.Data[:8]
			s["model.norm.weight"] = t
		}, "tensor model.norm.weight has 8 bytes"},
		{"integer dtype", func(s memorySource, _ *Config) {
			t := s["model.embed_tokens.weight"]
			t.DType = dtype.I32
			s["model.embed_tokens.weight"] = t
		}, "has dtype I32"},
		{"fp8 embedding", func(s memorySource, _ *Config) {
			t := s["model.embed_tokens.weight"]
			t.DType, t.Data = dtype.F8E4M3, t.Data[:len(t.Data)/4]
			s["model.embed_tokens.weight"] = t
		}, "only projection weights may be"},
		{"fp8 without scale", func(s memorySource, _ *Config) {
			t := s["model.layers.0.self_attn.q_proj.weight"]
			t.DType, t.Data = dtype.F8E4M3, t.Data[:len(t.Data)/4]
			s["model.layers.0.self_attn.q_proj.weight"] = t
		}, "has neither model.layers.0.self_attn.q_proj.weight_scale_inv"},
		{"untied head missing", func(_ memorySource, c *Config) { c.TieWordEmbeddings = false }, "tensor lm_head.weight is missing"},
		{"bad heads", func(_ memorySource, c *Config) { c.NumKVHeads = 4 }, "not a multiple of num_key_value_heads"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, c := randomSource(t, cfg, 1), cfg
			tc.mutate(src, &c)
			_, err := New(c, src, kernels.NewPool(1))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestParseConfig(t *testing.T) {
	for _, tc := range []struct {
		name, json, want string
	}{
		{"not json", `{`, "parse config.json"},
		{"zero layers", `{"hidden_size":8,"intermediate_size":8,"num_hidden_layers":0,"num_attention_heads":2,"vocab_size":4,"max_position_embeddings":8}`, "num_hidden_layers must be positive"},
		{"other arch", `{"model_type":"gpt2","hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":4,"max_position_embeddings":8}`, `model_type "gpt2"`},
		{"bad act", `{"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":4,"max_position_embeddings":8,"hidden_act":"gelu"}`, `hidden_act "gelu"`},
		{"eos outside", `{"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":4,"max_position_embeddings":8,"eos_token_id":[2,9]}`, "eos_token_id 9"},
		{"bad quant", `{"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":4,"max_position_embeddings":8,"quantization_config":{"quant_method":"awq"}}`, `quant_method "awq"`},
		{"bad rope", `{"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":4,"max_position_embeddings":8,"rope_scaling":{"rope_type":"llama3","factor":8}}`, "rope_scaling"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.json))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
	c, err := ParseConfig([]byte(`{"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":4,"max_position_embeddings":8,"eos_token_id":3}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.NumKVHeads != 2 || c.HeadDim != 4 || !slices.Equal(c.EOSTokenID, TokenIDs{3}) {
		t.Fatalf("defaults not applied: %+v", c)
	}
}

func TestLlama3RopeScaling(t *testing.T) {
	c := Config{HeadDim: 128, RopeTheta: 500000, RopeScaling: &RopeScaling{RopeType: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}}
	plain := Config{HeadDim: 128, RopeTheta: 500000}
	scaled, base := c.InverseFrequencies(), plain.InverseFrequencies()
	if scaled[0] != base[0] {
		t.Errorf("high frequency changed: %v vs %v", scaled[0], base[0])
	}
	last := len(base) - 1
	if math.Abs(scaled[last]-base[last]/8) > 1e-15 {
		t.Errorf("low frequency %v, want %v", scaled[last], base[last]/8)
	}
	for i := range base {
		if scaled[i] > base[i] || scaled[i] < base[i]/8 {
			t.Fatalf("frequency %d = %v outside [%v, %v]", i, scaled[i], base[i]/8, base[i])
		}
	}
}

func TestForwardRejectsBadBatches(t *testing.T) {
	cfg := testConfig()
	m := newTestModel(t, cfg, randomSource(t, cfg, 2))
	kv, _ := kvcache.New(m.KVShape(), 8)
	mgr := kvcache.NewManager(kv.NumBlocks(), false)
	if !mgr.Allocate(0, nil, 16, nil, "") {
		t.Fatal("no kv blocks for 16 tokens")
	}
	table := mgr.Table(0)
	for _, tc := range []struct {
		name string
		b    Batch
		want string
	}{
		{"token outside vocab", Batch{Tokens: []int32{97}, Positions: []int32{0}, Seqs: []int32{0}, BlockTables: [][]int32{table}}, "outside the vocabulary"},
		{"uncovered position", Batch{Tokens: []int32{1}, Positions: []int32{16}, Seqs: []int32{0}, BlockTables: [][]int32{table}}, "does not cover position 16"},
		{"unknown sequence", Batch{Tokens: []int32{1}, Positions: []int32{0}, Seqs: []int32{1}, BlockTables: [][]int32{table}}, "has no block table"},
		{"ragged", Batch{Tokens: []int32{1, 2}, Positions: []int32{0}, Seqs: []int32{0, 0}, BlockTables: [][]int32{table}}, "2 tokens but 1 positions"},
		{"bad logit row", Batch{Tokens: []int32{1}, Positions: []int32{0}, Seqs: []int32{0}, BlockTables: [][]int32{table}, LogitRows: []int{1}}, "logit row 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := m.Forward(&tc.b, kv, make([]float32, len(tc.b.LogitRows)*cfg.VocabSize))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// quantizeScaled replaces every projection of src by FP8 with a
// weight_scale of one value per row (perRow) or per tensor, and returns the
// F32 source of the dequantised weights the FP8 model must reproduce.
func quantizeScaled(t *testing.T, src memorySource, perRow bool) (fp8, reference memorySource) {
	t.Helper()
	fp8, reference = memorySource{}, memorySource{}
	for name, tensor := range src {
		fp8[name], reference[name] = tensor, tensor
		if !IsProjection(name) {
			continue
		}
		rows, cols := tensor.Shape[0], tensor.Shape[1]
		w, _ := dtype.ToFloat32(dtype.F32, tensor.Data)
		// One scale per row, or the same one repeated, stored as BF16.
		scales := make([]float32, rows)
		for i := range rows {
			span := w
			if perRow {
				span = w[i*cols : (i+1)*cols]
			}
			var amax float32
			for _, v := range span {
				amax = max(amax, float32(math.Abs(float64(v))))
			}
			scales[i] = dtype.BF16ToF32(dtype.F32ToBF16(amax / dtype.E4M3Max))
		}
		q := make([]byte, len(w))
		deq := make([]float32, len(w))
		for i, v := range w {
			q[i] = dtype.F32ToE4M3(v / scales[i/cols])
			deq[i] = dtype.E4M3ToF32(q[i]) * scales[i/cols]
		}
		scaleShape, scaleValues := []int{rows, 1}, scales
		if !perRow {
			scaleShape, scaleValues = []int{}, scales[:1]
		}
		sb, _ := dtype.FromFloat32(dtype.BF16, scaleValues)
		base := strings.TrimSuffix(name, ".weight")
		fp8[name] = Tensor{DType: dtype.F8E4M3, Shape: tensor.Shape, Data: q}
		fp8[base+".weight_scale"] = Tensor{DType: dtype.BF16, Shape: scaleShape, Data: sb}
		db, _ := dtype.FromFloat32(dtype.F32, deq)
		reference[name] = Tensor{DType: dtype.F32, Shape: tensor.Shape, Data: db}
	}
	return fp8, reference
}

func TestFP8WeightScaleCheckpoints(t *testing.T) {
	cfg := testConfig()
	tokens := []int32{3, 14, 15, 92, 65, 35, 89, 79, 32, 38}
	for _, perRow := range []bool{true, false} {
		fp8, reference := quantizeScaled(t, randomSource(t, cfg, 4), perRow)
		m := newTestModel(t, cfg, fp8)
		if m.Weights().Layers[1].Down.DType != dtype.F8E4M3 {
			t.Fatal("projection did not load as FP8")
		}
		got, want := runAlone(t, m, tokens), runAlone(t, newTestModel(t, cfg, reference), tokens)
		for i := range want {
			if d := math.Abs(float64(got[i] - want[i])); d > 1e-4 {
				t.Fatalf("perRow=%v logit %d: FP8 %v, dequantised %v", perRow, i, got[i], want[i])
			}
		}
	}
	fp8, _ := quantizeScaled(t, randomSource(t, cfg, 4), true)
	bad := fp8["model.layers.0.mlp.up_proj.weight_scale"]
	bad.Shape, bad.Data = []int{3}, bad.Data[:6]
	fp8["model.layers.0.mlp.up_proj.weight_scale"] = bad
	_, err := New(cfg, fp8, kernels.NewPool(1))
	if err == nil || !strings.Contains(err.Error(), "model.layers.0.mlp.up_proj.weight_scale has 3 values") {
		t.Fatalf("error %v", err)
	}
}

// TestChunkedPrefillIsBitwiseStable feeds one sequence in chunks of several
// sizes and checks every logit equals, bit for bit, what a single forward
// call over the whole sequence gives: greedy decoding under continuous
// batching must not depend on how the scheduler split a prompt.
func TestChunkedPrefillIsBitwiseStable(t *testing.T) {
	for _, c := range invarianceConfigs {
		t.Run(c.name, func(t *testing.T) {
			kernelstest.ForEachSet(t, func(t *testing.T, set *kernels.Set) {
				skipSlow(t, c.name, set)
				checkChunkedPrefill(t, set, c.cfg())
			})
		})
	}
}

func checkChunkedPrefill(t *testing.T, set *kernels.Set, cfg Config) {
	m := newSetModel(t, set, 2, cfg, randomSource(t, cfg, 11))
	rng := rand.New(rand.NewPCG(5, 5))
	tokens := make([]int32, 120)
	for i := range tokens {
		tokens[i] = int32(rng.IntN(cfg.VocabSize))
	}
	want := runAlone(t, m, tokens)
	for _, chunks := range [][]int{{5, 3, 9, 1, 7, 12, 8, 75}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 75}, {17, 11, 17, 75}} {
		kv, err := kvcache.New(m.KVShape(), 8)
		if err != nil {
			t.Fatal(err)
		}
		mgr := kvcache.NewManager(kv.NumBlocks(), false)
		if !mgr.Allocate(0, tokens, len(tokens), nil, "") {
			t.Fatal("no kv blocks")
		}
		pos := 0
		for _, size := range chunks {
			b := &Batch{BlockTables: [][]int32{mgr.Table(0)}}
			for i := pos; i < pos+size; i++ {
				b.Tokens = append(b.Tokens, tokens[i])
				b.Positions = append(b.Positions, int32(i))
				b.Seqs = append(b.Seqs, 0)
				b.LogitRows = append(b.LogitRows, i-pos)
			}
			logits := make([]float32, size*cfg.VocabSize)
			if err := m.Forward(b, kv, logits); err != nil {
				t.Fatal(err)
			}
			for j, got := range logits {
				if w := want[pos*cfg.VocabSize+j]; got != w {
					t.Fatalf("chunks %v: position %d logit %d is %v in chunks, %v in one call", chunks, pos+j/cfg.VocabSize, j%cfg.VocabSize, got, w)
				}
			}
			pos += size
		}
		kv.Free()
	}
}

// TestForwardRowsMatchesForward checks, on every kernel set, that
// ForwardRows hands out the very logits Forward writes, in groups of at
// most maxRows rows in order, and that an error of the callback ends it.
func TestForwardRowsMatchesForward(t *testing.T) {
	kernelstest.ForEachSet(t, func(t *testing.T, set *kernels.Set) {
		cfg := testConfig()
		m := newSetModel(t, set, 2, cfg, randomSource(t, cfg, 13))
		rng := rand.New(rand.NewPCG(9, 9))
		tokens := make([]int32, 37)
		for i := range tokens {
			tokens[i] = int32(rng.IntN(cfg.VocabSize))
		}
		want := runAlone(t, m, tokens)
		for _, maxRows := range []int{1, 3, 16, 37, 100} {
			kv, err := kvcache.New(m.KVShape(), 4)
			if err != nil {
				t.Fatal(err)
			}
			mgr := kvcache.NewManager(kv.NumBlocks(), false)
			if !mgr.Allocate(0, tokens, len(tokens), nil, "") {
				t.Fatal("no kv blocks")
			}
			b := &Batch{Tokens: tokens, BlockTables: [][]int32{mgr.Table(0)}}
			for i := range tokens {
				b.Positions = append(b.Positions, int32(i))
				b.Seqs = append(b.Seqs, 0)
				b.LogitRows = append(b.LogitRows, i)
			}
			var got []float32
			err = m.ForwardRows(b, kv, maxRows, func(first int, logits []float32) error {
				rows := len(logits) / cfg.VocabSize
				if first != len(got)/cfg.VocabSize || rows < 1 || rows > maxRows || len(logits)%cfg.VocabSize != 0 {
					t.Fatalf("maxRows %d: a group of %d values from row %d after %d rows", maxRows, len(logits), first, len(got)/cfg.VocabSize)
				}
				got = append(got, logits...)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("maxRows %d: ForwardRows' logits differ from Forward's", maxRows)
			}
			stop := errors.New("stop")
			calls := 0
			if err := m.ForwardRows(b, kv, maxRows, func(int, []float32) error { calls++; return stop }); !errors.Is(err, stop) || calls != 1 {
				t.Fatalf("maxRows %d: a failing callback gave %v after %d calls", maxRows, err, calls)
			}
			kv.Free()
		}
	})
}

// TestForwardRowsRejectsNoRows checks that groups of no rows are refused.
func TestForwardRowsRejectsNoRows(t *testing.T) {
	cfg := testConfig()
	m := newTestModel(t, cfg, randomSource(t, cfg, 1))
	kv, err := kvcache.New(m.KVShape(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Free()
	b := &Batch{Tokens: []int32{1}, Positions: []int32{0}, Seqs: []int32{0}, BlockTables: [][]int32{{0}}, LogitRows: []int{0}}
	if err := m.ForwardRows(b, kv, 0, func(int, []float32) error { return nil }); err == nil || !strings.Contains(err.Error(), "maxRows") {
		t.Fatalf("maxRows 0: %v, want an error naming maxRows", err)
	}
}
