package gguf

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/fp8"
)

// ExportOptions tune Export.
type ExportOptions struct {
	// Name is general.name; empty means the source directory's base name.
	Name string
	// Weights is the type of the 2-D weights: "q8_0" (also when empty),
	// "f16" or "f32". A matrix whose rows are not a whole number of Q8_0
	// blocks is written as F32. Norms are always F32.
	Weights string
	// KeepHFRoPELayout leaves query and key rows in Hugging Face's
	// rotate-half order instead of permuting them (PermuteRoPE). The
	// result computes the wrong attention in llama.cpp; it exists only to
	// show that the permutation matters.
	KeepHFRoPELayout bool
}

// hfToGGUF maps the per-layer Hugging Face tensor suffixes to llama.cpp's
// names.
var hfToGGUF = map[string]string{
	"input_layernorm.weight":          "attn_norm.weight",
	"self_attn.q_proj.weight":         "attn_q.weight",
	"self_attn.k_proj.weight":         "attn_k.weight",
	"self_attn.v_proj.weight":         "attn_v.weight",
	"self_attn.o_proj.weight":         "attn_output.weight",
	"post_attention_layernorm.weight": "ffn_norm.weight",
	"mlp.gate_proj.weight":            "ffn_gate.weight",
	"mlp.up_proj.weight":              "ffn_up.weight",
	"mlp.down_proj.weight":            "ffn_down.weight",
}

// TensorName is the GGUF name of a Hugging Face Llama tensor name; ok is
// false for a name the llama architecture has no place for.
func TensorName(hf string) (string, bool) {
	switch hf {
	case "model.embed_tokens.weight":
		return "token_embd.weight", true
	case "model.norm.weight":
		return "output_norm.weight", true
	case "lm_head.weight":
		return "output.weight", true
	}
	rest, ok := strings.CutPrefix(hf, "model.layers.")
	if !ok {
		return "", false
	}
	layer, suffix, ok := strings.Cut(rest, ".")
	if !ok || layer == "" || strings.Trim(layer, "0123456789") != "" {
		return "", false
	}
	g, ok := hfToGGUF[suffix]
	if !ok {
		return "", false
	}
	return "blk." + layer + "." + g, true
}

// Export writes the Llama checkpoint in srcDir (config.json, safetensors
// in F32, BF16, F16 or block-scaled FP8, and tokenizer.json) to a GGUF
// file at outPath that llama.cpp loads as the llama architecture. The file
// appears whole or not at all. With tied embeddings there is no
// output.weight: llama.cpp then uses token_embd.weight as the output head.
func Export(ctx context.Context, srcDir, outPath string, opts ExportOptions) error {
	var (
		fileType   uint32
		weightType TensorType
	)
	switch strings.ToLower(opts.Weights) {
	case "", "q8_0":
		fileType, weightType = FileTypeMostlyQ80, TensorQ8_0
	case "f16":
		fileType, weightType = FileTypeMostlyF16, TensorF16
	case "f32":
		fileType, weightType = FileTypeAllF32, TensorF32
	default:
		return fmt.Errorf("export gguf: weight type %q is not one of q8_0, f16, f32", opts.Weights)
	}
	ck, err := checkpoint.Open(srcDir)
	if err != nil {
		return fmt.Errorf("export gguf: %w", err)
	}
	defer ck.Close()
	cfg := ck.Config()
	if cfg.ModelType != "llama" {
		return fmt.Errorf("export gguf: model_type %q is not llama", cfg.ModelType)
	}
	tokData, err := os.ReadFile(filepath.Join(srcDir, checkpoint.TokenizerFile))
	if err != nil {
		return fmt.Errorf("export gguf: read the vocabulary: %w", err)
	}
	bos := -1
	if cfg.BOSTokenID != nil {
		bos = *cfg.BOSTokenID
	}
	vocab, err := Vocab(tokData, cfg.VocabSize, bos, cfg.EOSTokenID)
	if err != nil {
		return fmt.Errorf("export gguf: %w", err)
	}
	name := opts.Name
	if name == "" {
		name = filepath.Base(filepath.Clean(srcDir))
	}
	kvs := append(Metadata(cfg, name, fileType), vocab...)

	var tensors []Tensor
	for _, ns := range cfg.TensorShapes() {
		gname, ok := TensorName(ns.Name)
		if !ok {
			return fmt.Errorf("export gguf: tensor %s has no llama.cpp name", ns.Name)
		}
		t, err := exportTensor(ctx, ck, cfg, ns, gname, weightType, opts.KeepHFRoPELayout)
		if err != nil {
			return fmt.Errorf("export gguf: %w", err)
		}
		tensors = append(tensors, t)
	}
	if factors := ropeFactors(cfg); factors != nil {
		tensors = append(tensors, Tensor{Name: "rope_freqs.weight", Type: TensorF32, Dims: []uint64{uint64(len(factors))},
			Data: func() ([]byte, error) { return dtype.FromFloat32(dtype.F32, factors) }})
	}

	if err := os.MkdirAll(filepath.Dir(outPath), 0o755); err != nil {
		return fmt.Errorf("export gguf: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(outPath), "."+filepath.Base(outPath)+".tmp*")
	if err != nil {
		return fmt.Errorf("export gguf: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := Write(tmp, kvs, tensors, DefaultAlignment); err != nil {
		tmp.Close()
		return fmt.Errorf("export gguf %s: %w", outPath, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("export gguf %s: %w", outPath, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("export gguf: %w", err)
	}
	if err := os.Rename(tmp.Name(), outPath); err != nil {
		return fmt.Errorf("export gguf: %w", err)
	}
	return nil
}

// Metadata is the general.* and llama.* metadata of a Llama config.
func Metadata(cfg model.Config, name string, fileType uint32) []KV {
	return []KV{
		{"general.architecture", "llama"},
		{"general.name", name},
		{"general.file_type", fileType},
		{"general.quantization_version", uint32(2)},
		{"general.alignment", uint32(DefaultAlignment)},
		{"llama.context_length", uint32(cfg.MaxPositionEmbeddings)},
		{"llama.embedding_length", uint32(cfg.HiddenSize)},
		{"llama.block_count", uint32(cfg.NumLayers)},
		{"llama.feed_forward_length", uint32(cfg.IntermediateSize)},
		{"llama.attention.head_count", uint32(cfg.NumHeads)},
		{"llama.attention.head_count_kv", uint32(cfg.NumKVHeads)},
		{"llama.attention.key_length", uint32(cfg.HeadDim)},
		{"llama.attention.value_length", uint32(cfg.HeadDim)},
		{"llama.attention.layer_norm_rms_epsilon", float32(cfg.RMSNormEps)},
		{"llama.rope.dimension_count", uint32(cfg.HeadDim)},
		{"llama.rope.freq_base", float32(cfg.RopeTheta)},
		{"llama.vocab_size", uint32(cfg.VocabSize)},
	}
}

// exportTensor describes one tensor of the output, converted when written.
func exportTensor(ctx context.Context, ck *checkpoint.Checkpoint, cfg model.Config, ns model.NamedShape, gname string, weightType TensorType, keepHF bool) (Tensor, error) {
	src, ok := ck.Lookup(ns.Name)
	if !ok {
		return Tensor{}, fmt.Errorf("tensor %s is missing", ns.Name)
	}
	if !slices.Equal(src.Shape, ns.Shape) {
		return Tensor{}, fmt.Errorf("tensor %s has shape %v, the config implies %v", ns.Name, src.Shape, ns.Shape)
	}
	dims := make([]uint64, len(ns.Shape))
	for i, d := range ns.Shape {
		dims[len(dims)-1-i] = uint64(d)
	}
	typ := TensorF32
	if len(dims) == 2 {
		typ = weightType
		if typ == TensorQ8_0 && dims[0]%QK8_0 != 0 {
			typ = TensorF32
		}
	}
	heads := 0
	if !keepHF {
		switch {
		case strings.HasSuffix(ns.Name, ".q_proj.weight"):
			heads = cfg.NumHeads
		case strings.HasSuffix(ns.Name, ".k_proj.weight"):
			heads = cfg.NumKVHeads
		}
	}
	return Tensor{Name: gname, Type: typ, Dims: dims, Data: func() ([]byte, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		w, err := float32Tensor(ck, cfg, ns.Name, src)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", ns.Name, err)
		}
		if heads > 0 {
			if w, err = PermuteRoPE(w, heads, ns.Shape[1]); err != nil {
				return nil, fmt.Errorf("%s: %w", ns.Name, err)
			}
		}
		switch typ {
		case TensorQ8_0:
			return QuantizeQ8_0(w)
		case TensorF16:
			return dtype.FromFloat32(dtype.F16, w)
		default:
			return dtype.FromFloat32(dtype.F32, w)
		}
	}}, nil
}

// float32Tensor decodes a checkpoint tensor, dequantising FP8 with its
// scales.
func float32Tensor(ck *checkpoint.Checkpoint, cfg model.Config, name string, t model.Tensor) ([]float32, error) {
	if t.DType != dtype.F8E4M3 {
		return dtype.ToFloat32(t.DType, t.Data)
	}
	if len(t.Shape) != 2 {
		return nil, fmt.Errorf("FP8 tensor has shape %v, want a matrix", t.Shape)
	}
	rows, cols := t.Shape[0], t.Shape[1]
	base := strings.TrimSuffix(name, ".weight")
	if s, ok := ck.Lookup(base + ".weight_scale_inv"); ok {
		scales, err := dtype.ToFloat32(s.DType, s.Data)
		if err != nil {
			return nil, fmt.Errorf("scales: %w", err)
		}
		block := checkpoint.DefaultBlock
		if q := cfg.Quantization; q != nil && len(q.WeightBlockSize) == 2 {
			if q.WeightBlockSize[0] != q.WeightBlockSize[1] {
				return nil, fmt.Errorf("FP8 blocks of %v are not square", q.WeightBlockSize)
			}
			block = q.WeightBlockSize[0]
		}
		return fp8.DequantizeBlocks(t.Data, scales, rows, cols, block)
	}
	if s, ok := ck.Lookup(base + ".weight_scale"); ok {
		scales, err := dtype.ToFloat32(s.DType, s.Data)
		if err != nil {
			return nil, fmt.Errorf("scales: %w", err)
		}
		return fp8.DequantizeScaled(t.Data, scales, rows, cols)
	}
	return nil, fmt.Errorf("FP8 tensor has neither %s.weight_scale_inv nor %s.weight_scale", base, base)
}

// ropeFactors is llama.cpp's rope_freqs tensor for llama3 RoPE scaling:
// per rotary half-dimension, the divisor of its base frequency. Nil
// without such scaling.
func ropeFactors(cfg model.Config) []float32 {
	r := cfg.RopeScaling
	if r == nil || r.Kind() != "llama3" {
		return nil
	}
	oldCtx := float64(r.OriginalMaxPositionEmbeddings)
	lowWavelen, highWavelen := oldCtx/r.LowFreqFactor, oldCtx/r.HighFreqFactor
	out := make([]float32, cfg.HeadDim/2)
	for i := range out {
		f := 1 / math.Pow(cfg.RopeTheta, float64(2*i)/float64(cfg.HeadDim))
		wavelen := 2 * math.Pi / f
		switch {
		case wavelen < highWavelen:
			out[i] = 1
		case wavelen > lowWavelen:
			out[i] = float32(r.Factor)
		default:
			smooth := (oldCtx/wavelen - r.LowFreqFactor) / (r.HighFreqFactor - r.LowFreqFactor)
			out[i] = float32(1 / ((1-smooth)/r.Factor + smooth))
		}
	}
	return out
}
