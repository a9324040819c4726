package gguf

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/fp8"
	"github.com/stokehq/stoke/weightstore/synth"
)

// sourceFloats decodes a checkpoint tensor (FP8 with its block scales).
func sourceFloats(t *testing.T, ck *checkpoint.Checkpoint, name string) []float32 {
	t.Helper()
	src, ok := ck.Lookup(name)
	if !ok {
		t.Fatalf("source has no %s", name)
	}
	if src.DType == dtype.F8E4M3 {
		s, ok := ck.Lookup(strings.TrimSuffix(name, ".weight") + ".weight_scale_inv")
		if !ok {
			t.Fatalf("no scales for %s", name)
		}
		scales, err := dtype.ToFloat32(s.DType, s.Data)
		if err != nil {
			t.Fatal(err)
		}
		w, err := fp8.DequantizeBlocks(src.Data, scales, src.Shape[0], src.Shape[1], checkpoint.DefaultBlock)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	w, err := dtype.ToFloat32(src.DType, src.Data)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestExportSynthetic(t *testing.T) {
	for _, tc := range []struct {
		name    string
		dt      dtype.DType
		weights string
		permute bool
	}{
		{"f32 to q8_0", dtype.F32, "", true},
		{"bf16 to q8_0", dtype.BF16, "q8_0", true},
		{"fp8 to q8_0", dtype.F8E4M3, "q8_0", true},
		{"f32 to f32", dtype.F32, "f32", true},
		{"f32 to f16", dtype.F32, "f16", true},
		{"f32 to q8_0 keeping the HF rope layout", dtype.F32, "q8_0", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "tiny")
			if err := synth.Write(context.Background(), dir, synth.Options{Preset: "tiny", DType: tc.dt, Seed: 1}); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "out", "tiny.gguf")
			if err := Export(context.Background(), dir, out, ExportOptions{Weights: tc.weights, KeepHFRoPELayout: !tc.permute}); err != nil {
				t.Fatal(err)
			}
			if st, err := os.Stat(out); err != nil || st.Mode().Perm() != 0o644 {
				t.Fatalf("output: %v %v", st, err)
			}
			g, err := Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			ck, err := checkpoint.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			cfg := ck.Config()

			fileType := map[string]uint32{"": FileTypeMostlyQ80, "q8_0": FileTypeMostlyQ80, "f16": FileTypeMostlyF16, "f32": FileTypeAllF32}[tc.weights]
			for key, want := range map[string]any{
				"general.architecture":                   "llama",
				"general.name":                           "tiny",
				"general.file_type":                      fileType,
				"llama.context_length":                   uint32(cfg.MaxPositionEmbeddings),
				"llama.embedding_length":                 uint32(64),
				"llama.block_count":                      uint32(2),
				"llama.feed_forward_length":              uint32(176),
				"llama.attention.head_count":             uint32(4),
				"llama.attention.head_count_kv":          uint32(4),
				"llama.rope.dimension_count":             uint32(16),
				"llama.rope.freq_base":                   float32(10000),
				"llama.attention.layer_norm_rms_epsilon": float32(1e-5),
				"llama.vocab_size":                       uint32(512),
				"tokenizer.ggml.model":                   "gpt2",
				"tokenizer.ggml.pre":                     "llama-bpe",
				"tokenizer.ggml.bos_token_id":            uint32(*cfg.BOSTokenID),
				"tokenizer.ggml.eos_token_id":            uint32(cfg.EOSTokenID[0]),
			} {
				if got, ok := g.Get(key); !ok || !reflectEqual(got, want) {
					t.Errorf("%s = %#v, want %#v", key, got, want)
				}
			}
			toks, _ := g.Get("tokenizer.ggml.tokens")
			types, _ := g.Get("tokenizer.ggml.token_type")
			merges, _ := g.Get("tokenizer.ggml.merges")
			if len(toks.([]string)) != 512 || len(types.([]int32)) != 512 || len(merges.([]string)) == 0 {
				t.Fatalf("vocabulary: %d tokens, %d types, %d merges", len(toks.([]string)), len(types.([]int32)), len(merges.([]string)))
			}
			if tt := types.([]int32); tt[*cfg.BOSTokenID] != TokenControl || tt[100] != TokenNormal {
				t.Errorf("token types: bos %d, 100 %d", tt[*cfg.BOSTokenID], tt[100])
			}

			// Tied embeddings: token_embd only, no output.weight.
			if _, ok := g.Tensor("output.weight"); ok {
				t.Error("tied model has output.weight")
			}
			if n := len(g.Tensors); n != 2+9*cfg.NumLayers {
				t.Errorf("%d tensors, want %d", n, 2+9*cfg.NumLayers)
			}
			for _, ns := range cfg.TensorShapes() {
				gname, _ := TensorName(ns.Name)
				info, data, err := g.TensorData(gname)
				if err != nil {
					t.Fatal(err)
				}
				wantType := TensorF32
				if len(ns.Shape) == 2 {
					wantType = map[string]TensorType{"": TensorQ8_0, "q8_0": TensorQ8_0, "f16": TensorF16, "f32": TensorF32}[tc.weights]
					if wantType == TensorQ8_0 && ns.Shape[1]%QK8_0 != 0 {
						wantType = TensorF32 // down_proj: 176 columns
					}
				}
				if info.Type != wantType {
					t.Errorf("%s: type %v, want %v", gname, info.Type, wantType)
				}
				wantDims := make([]uint64, len(ns.Shape))
				for i, d := range ns.Shape {
					wantDims[len(ns.Shape)-1-i] = uint64(d)
				}
				if !slices.Equal(info.Dims, wantDims) {
					t.Errorf("%s: dims %v, want %v", gname, info.Dims, wantDims)
				}
				got, err := Decode(info.Type, data)
				if err != nil {
					t.Fatal(err)
				}
				want := sourceFloats(t, ck, ns.Name)
				heads := 0
				switch {
				case strings.HasSuffix(ns.Name, ".q_proj.weight"):
					heads = cfg.NumHeads
				case strings.HasSuffix(ns.Name, ".k_proj.weight"):
					heads = cfg.NumKVHeads
				}
				if heads > 0 && tc.permute {
					if want, err = PermuteRoPE(want, heads, ns.Shape[1]); err != nil {
						t.Fatal(err)
					}
				}
				checkClose(t, gname, info.Type, got, want)
			}
		})
	}
}

// reflectEqual compares metadata values, floats by value.
func reflectEqual(a, b any) bool {
	if fa, ok := a.(float32); ok {
		fb, ok := b.(float32)
		return ok && math.Abs(float64(fa-fb)) <= 1e-12
	}
	return a == b
}

// checkClose checks decoded values against the source within the rounding
// of type typ.
func checkClose(t *testing.T, name string, typ TensorType, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
	}
	for b := 0; b < len(want); b += QK8_0 {
		end := min(b+QK8_0, len(want))
		var amax float32
		for _, v := range want[b:end] {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		for i := b; i < end; i++ {
			var bound float32
			switch typ {
			case TensorQ8_0:
				bound = q8Bound(amax)
			case TensorF16:
				bound = float32(math.Abs(float64(want[i])))/2048 + 6e-8
			}
			if e := float32(math.Abs(float64(got[i] - want[i]))); e > bound {
				t.Fatalf("%s value %d: %v, source %v (error %v > %v)", name, i, got[i], want[i], e, bound)
			}
		}
	}
}

func TestExportErrors(t *testing.T) {
	ctx := context.Background()
	good := filepath.Join(t.TempDir(), "tiny")
	if err := synth.Write(ctx, good, synth.Options{Preset: "tiny", DType: dtype.F32, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	// variant copies good with one file replaced (nil content: removed).
	variant := func(name string, content func([]byte) []byte) string {
		dir := t.TempDir()
		entries, err := os.ReadDir(good)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			data, err := os.ReadFile(filepath.Join(good, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			if e.Name() == name {
				if data = content(data); data == nil {
					continue
				}
			}
			if err := os.WriteFile(filepath.Join(dir, e.Name()), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	editJSON := func(f func(m map[string]any)) func([]byte) []byte {
		return func(b []byte) []byte {
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			f(m)
			out, _ := json.Marshal(m)
			return out
		}
	}
	for _, tc := range []struct {
		name string
		dir  string
		opts ExportOptions
		want string
	}{
		{"missing directory", filepath.Join(t.TempDir(), "none"), ExportOptions{}, "export gguf"},
		{"bad weight type", good, ExportOptions{Weights: "q4_k"}, `weight type "q4_k" is not one of`},
		{"no tokenizer", variant(checkpoint.TokenizerFile, func([]byte) []byte { return nil }), ExportOptions{}, "read the vocabulary"},
		{"not llama", variant(checkpoint.ConfigFile, editJSON(func(m map[string]any) { m["model_type"] = "mistral" })), ExportOptions{}, `model_type "mistral" is not supported`},
		{"wordpiece tokenizer", variant(checkpoint.TokenizerFile, editJSON(func(m map[string]any) { m["model"].(map[string]any)["type"] = "WordPiece" })), ExportOptions{}, `tokenizer model "WordPiece" is not supported`},
		{"token outside the vocabulary", variant(checkpoint.TokenizerFile, editJSON(func(m map[string]any) {
			m["model"].(map[string]any)["vocab"].(map[string]any)["zzz"] = 9999
		})), ExportOptions{}, "outside the model's 512 embeddings"},
		{"corrupt tokenizer", variant(checkpoint.TokenizerFile, func([]byte) []byte { return []byte("{") }), ExportOptions{}, "parse tokenizer.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "x.gguf")
			err := Export(ctx, tc.dir, out, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("a failed export left %s (%v)", out, err)
			}
		})
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := Export(cancelled, good, filepath.Join(t.TempDir(), "x.gguf"), ExportOptions{}); err == nil || !strings.Contains(err.Error(), "context canceled") {
		t.Errorf("cancelled: %v", err)
	}
}

func TestVocab(t *testing.T) {
	spm := `{"added_tokens":[{"id":0,"content":"<unk>","special":true},{"id":1,"content":"<s>","special":true},{"id":2,"content":"</s>","special":true}],
	"pre_tokenizer":null,"decoder":{"type":"Sequence","decoders":[{"type":"ByteFallback"}]},
	"model":{"type":"BPE","unk_token":"<unk>","byte_fallback":true,
	"vocab":{"<unk>":0,"<s>":1,"</s>":2,"<0x0A>":3,"▁":4,"t":5,"h":6,"e":7,"▁t":8,"he":9,"▁the":10,"xy":11},
	"merges":[["▁","t"],["h","e"],["▁t","he"]]}}`
	byteLevel := `{"added_tokens":[{"id":5,"content":"<|bos|>","special":true},{"id":6,"content":"<x>","special":false}],
	"pre_tokenizer":{"type":"ByteLevel"},"decoder":{"type":"ByteLevel"},
	"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2,"Ġ":3,"Ġab":4},"merges":["a b","Ġ ab"]}}`
	for _, tc := range []struct {
		name      string
		json      string
		vocabSize int
		bos       int
		eos       []int
		want      map[string]any
		wantErr   string
	}{
		{name: "sentencepiece bpe", json: spm, vocabSize: 13, bos: 1, eos: []int{2}, want: map[string]any{
			"tokenizer.ggml.model":            "llama",
			"tokenizer.ggml.tokens":           []string{"<unk>", "<s>", "</s>", "<0x0A>", "▁", "t", "h", "e", "▁t", "he", "▁the", "xy", "[PAD12]"},
			"tokenizer.ggml.token_type":       []int32{2, 3, 3, 6, 1, 1, 1, 1, 1, 1, 1, 1, 5},
			"tokenizer.ggml.scores":           []float32{0, 0, 0, 0, -1e9, -1e9, -1e9, -1e9, -1, -2, -3, -1e9, 0},
			"tokenizer.ggml.unknown_token_id": uint32(0),
			"tokenizer.ggml.bos_token_id":     uint32(1),
			"tokenizer.ggml.add_bos_token":    true,
			"tokenizer.ggml.eos_token_id":     uint32(2),
		}},
		{name: "byte-level bpe", json: byteLevel, vocabSize: 7, bos: -1, want: map[string]any{
			"tokenizer.ggml.model":      "gpt2",
			"tokenizer.ggml.pre":        "default",
			"tokenizer.ggml.tokens":     []string{"a", "b", "ab", "Ġ", "Ġab", "<|bos|>", "<x>"},
			"tokenizer.ggml.token_type": []int32{1, 1, 1, 1, 1, 3, 4},
			"tokenizer.ggml.merges":     []string{"a b", "Ġ ab"},
		}},
		{name: "bos outside", json: byteLevel, vocabSize: 7, bos: 7, wantErr: "bos id 7 is outside"},
		{name: "eos outside", json: byteLevel, vocabSize: 7, bos: -1, eos: []int{-3}, wantErr: "eos id -3 is outside"},
		{name: "vocab too small", json: byteLevel, vocabSize: 5, bos: -1, wantErr: "id 5 outside the model's 5 embeddings"},
		{name: "bad merge", json: strings.Replace(byteLevel, `"a b"`, `"ab"`, 1), vocabSize: 7, bos: -1, wantErr: `merge 0 "ab" has no space`},
		{name: "neither byte-level nor fallback", json: strings.ReplaceAll(byteLevel, "ByteLevel", "Whitespace"), vocabSize: 7, bos: -1, wantErr: "neither a ByteLevel pre-tokenizer nor byte fallback"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kvs, err := Vocab([]byte(tc.json), tc.vocabSize, tc.bos, tc.eos)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]any{}
			for _, kv := range kvs {
				got[kv.Key] = kv.Value
			}
			for k, want := range tc.want {
				if !deepEqual(got[k], want) {
					t.Errorf("%s = %#v, want %#v", k, got[k], want)
				}
			}
		})
	}
}

func deepEqual(a, b any) bool {
	switch x := a.(type) {
	case []string:
		y, ok := b.([]string)
		return ok && slices.Equal(x, y)
	case []int32:
		y, ok := b.([]int32)
		return ok && slices.Equal(x, y)
	case []float32:
		y, ok := b.([]float32)
		return ok && slices.Equal(x, y)
	}
	return a == b
}

// TestRopeFactors checks llama3 RoPE scaling becomes rope_freqs.weight.
func TestRopeFactors(t *testing.T) {
	cfg, err := synth.PresetConfig("1b")
	if err != nil {
		t.Fatal(err)
	}
	f := ropeFactors(cfg)
	if len(f) != cfg.HeadDim/2 || f[0] != 1 || f[len(f)-1] != float32(cfg.RopeScaling.Factor) {
		t.Fatalf("factors %v", f)
	}
	for i := 1; i < len(f); i++ {
		if f[i] < f[i-1] {
			t.Fatalf("factors decrease at %d: %v", i, f)
		}
	}
	if ropeFactors(model.Config{HeadDim: 8, RopeTheta: 10000}) != nil {
		t.Error("factors without scaling")
	}
}
