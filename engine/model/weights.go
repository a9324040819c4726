package model

import (
	"fmt"
	"slices"
	"strings"
	"unsafe"

	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/internal/dtype"
)

// Tensor is one named array of a checkpoint as the model sees it: raw
// little-endian bytes, usually a view into a mapped file.
type Tensor struct {
	DType dtype.DType
	Shape []int
	Data  []byte
	// Source names where the tensor came from (a file), for error messages.
	Source string
}

// TensorSource hands out a checkpoint's tensors by their Hugging Face name.
type TensorSource interface {
	Lookup(name string) (Tensor, bool)
}

// Layer holds one transformer block's weights.
type Layer struct {
	AttnNorm, MLPNorm []float32
	Q, K, V, O        *kernels.Matrix
	Gate, Up, Down    *kernels.Matrix
}

// Weights are a model's parameters in the layout the kernels compute on.
type Weights struct {
	Embed  *kernels.Matrix // [vocab][hidden]
	Layers []Layer
	Norm   []float32
	LMHead *kernels.Matrix // the embedding matrix itself when tied
}

// Tensor names of the Llama architecture in Hugging Face layout.
const (
	embedName  = "model.embed_tokens.weight"
	normName   = "model.norm.weight"
	lmHeadName = "lm_head.weight"
)

// projections are the linear layers of a block, relative to
// "model.layers.N.", in the order Layer lists them.
var projections = [...]string{
	"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
	"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
}

// IsProjection reports whether a tensor name is the weight of one of a
// block's linear projections: the tensors FP8 quantisation converts, while
// norms, embeddings and the output head keep their dtype.
func IsProjection(name string) bool {
	if !strings.HasPrefix(name, "model.layers.") || !strings.HasSuffix(name, ".weight") {
		return false
	}
	for _, p := range projections {
		if strings.HasSuffix(name, "."+p+".weight") {
			return true
		}
	}
	return false
}

// LayerPrefix is the tensor-name prefix of block i.
func LayerPrefix(i int) string { return fmt.Sprintf("model.layers.%d.", i) }

// TensorShapes lists every tensor a checkpoint of this config holds before
// quantisation, with its shape, in a stable order.
func (c *Config) TensorShapes() []NamedShape {
	d, f := c.HiddenSize, c.IntermediateSize
	q, kv := c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim
	out := []NamedShape{{embedName, []int{c.VocabSize, d}}}
	for i := 0; i < c.NumLayers; i++ {
		p := LayerPrefix(i)
		out = append(out,
			NamedShape{p + "input_layernorm.weight", []int{d}},
			NamedShape{p + "self_attn.q_proj.weight", []int{q, d}},
			NamedShape{p + "self_attn.k_proj.weight", []int{kv, d}},
			NamedShape{p + "self_attn.v_proj.weight", []int{kv, d}},
			NamedShape{p + "self_attn.o_proj.weight", []int{d, q}},
			NamedShape{p + "post_attention_layernorm.weight", []int{d}},
			NamedShape{p + "mlp.gate_proj.weight", []int{f, d}},
			NamedShape{p + "mlp.up_proj.weight", []int{f, d}},
			NamedShape{p + "mlp.down_proj.weight", []int{d, f}},
		)
	}
	out = append(out, NamedShape{normName, []int{d}})
	if !c.TieWordEmbeddings {
		out = append(out, NamedShape{lmHeadName, []int{c.VocabSize, d}})
	}
	return out
}

// NamedShape is a tensor name with its expected shape.
type NamedShape struct {
	Name  string
	Shape []int
}

// loadWeights checks every tensor the config implies against src and builds
// kernel matrices over the tensors' bytes, without copying where the bytes
// are aligned for their dtype.
func loadWeights(c *Config, src TensorSource) (*Weights, error) {
	want := map[string][]int{}
	for _, ns := range c.TensorShapes() {
		want[ns.Name] = ns.Shape
	}
	l := loader{cfg: c, src: src, want: want}
	w := &Weights{Layers: make([]Layer, c.NumLayers)}
	var err error
	if w.Embed, err = l.matrix(embedName, false); err != nil {
		return nil, err
	}
	if w.Norm, err = l.vector(normName); err != nil {
		return nil, err
	}
	w.LMHead = w.Embed
	if !c.TieWordEmbeddings {
		if w.LMHead, err = l.matrix(lmHeadName, false); err != nil {
			return nil, err
		}
	}
	for i := range w.Layers {
		p := LayerPrefix(i)
		layer := &w.Layers[i]
		if layer.AttnNorm, err = l.vector(p + "input_layernorm.weight"); err != nil {
			return nil, err
		}
		if layer.MLPNorm, err = l.vector(p + "post_attention_layernorm.weight"); err != nil {
			return nil, err
		}
		dst := []**kernels.Matrix{&layer.Q, &layer.K, &layer.V, &layer.O, &layer.Gate, &layer.Up, &layer.Down}
		for j, name := range projections {
			if *dst[j], err = l.matrix(p+name+".weight", true); err != nil {
				return nil, err
			}
		}
	}
	return w, nil
}

type loader struct {
	cfg  *Config
	src  TensorSource
	want map[string][]int
}

func (l *loader) lookup(name string) (Tensor, error) {
	t, ok := l.src.Lookup(name)
	if !ok {
		return Tensor{}, fmt.Errorf("tensor %s is missing from the checkpoint", name)
	}
	if n := numel(t.Shape) * int64(t.DType.Size()); n != int64(len(t.Data)) {
		return Tensor{}, fmt.Errorf("%s: tensor %s has %d bytes, shape %v of %v needs %d", t.Source, name, len(t.Data), t.Shape, t.DType, n)
	}
	return t, nil
}

func (l *loader) checkShape(name string, t Tensor) error {
	if want := l.want[name]; !slices.Equal(t.Shape, want) {
		return fmt.Errorf("%s: tensor %s has shape %v, config.json implies %v", t.Source, name, t.Shape, want)
	}
	return nil
}

// vector reads a 1-D float tensor (norm weights) into float32.
func (l *loader) vector(name string) ([]float32, error) {
	t, err := l.lookup(name)
	if err != nil {
		return nil, err
	}
	if err := l.checkShape(name, t); err != nil {
		return nil, err
	}
	v, err := toFloat32(t)
	if err != nil {
		return nil, fmt.Errorf("%s: tensor %s: %w", t.Source, name, err)
	}
	return v, nil
}

// matrix reads a 2-D weight. FP8 is accepted only for projections.
func (l *loader) matrix(name string, quantizable bool) (*kernels.Matrix, error) {
	t, err := l.lookup(name)
	if err != nil {
		return nil, err
	}
	if err := l.checkShape(name, t); err != nil {
		return nil, err
	}
	m := &kernels.Matrix{Rows: t.Shape[0], Cols: t.Shape[1], DType: t.DType}
	switch t.DType {
	case dtype.F32:
		m.F32 = viewOrConvert(t)
	case dtype.F16:
		f, _ := toFloat32(t)
		m.DType, m.F32 = dtype.F32, f
	case dtype.BF16:
		m.BF16 = viewUint16(t.Data)
	case dtype.F8E4M3:
		if !quantizable {
			return nil, fmt.Errorf("%s: tensor %s is FP8, but only projection weights may be", t.Source, name)
		}
		m.FP8 = t.Data
		if err := l.scales(name, m); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("%s: tensor %s has dtype %v, want F32, BF16, F16 or F8_E4M3", t.Source, name, t.DType)
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("%s: tensor %s: %w", t.Source, name, err)
	}
	return m, nil
}

// scales attaches an FP8 weight's scales: a block-wise weight_scale_inv
// (HF fine-grained FP8) or a per-tensor / per-row weight_scale.
func (l *loader) scales(name string, m *kernels.Matrix) error {
	base := strings.TrimSuffix(name, ".weight")
	if t, ok := l.src.Lookup(base + ".weight_scale_inv"); ok {
		s, err := toFloat32(t)
		if err != nil {
			return fmt.Errorf("%s: tensor %s.weight_scale_inv: %w", t.Source, base, err)
		}
		br, bc := 128, 128
		if q := l.cfg.Quantization; q != nil && len(q.WeightBlockSize) == 2 {
			br, bc = q.WeightBlockSize[0], q.WeightBlockSize[1]
		}
		want := []int{ceilDiv(m.Rows, br), ceilDiv(m.Cols, bc)}
		if !slices.Equal(t.Shape, want) {
			return fmt.Errorf("%s: tensor %s.weight_scale_inv has shape %v, want %v for %dx%d blocks", t.Source, base, t.Shape, want, br, bc)
		}
		m.Scales, m.BlockRows, m.BlockCols = s, br, bc
		return nil
	}
	t, ok := l.src.Lookup(base + ".weight_scale")
	if !ok {
		return fmt.Errorf("FP8 tensor %s has neither %s.weight_scale_inv nor %s.weight_scale", name, base, base)
	}
	s, err := toFloat32(t)
	if err != nil {
		return fmt.Errorf("%s: tensor %s.weight_scale: %w", t.Source, base, err)
	}
	if len(s) != 1 && len(s) != m.Rows {
		return fmt.Errorf("%s: tensor %s.weight_scale has %d values, want 1 (per tensor) or %d (per row)", t.Source, base, len(s), m.Rows)
	}
	m.Scales = s
	return nil
}

// toFloat32 converts a float tensor of any supported dtype to float32.
func toFloat32(t Tensor) ([]float32, error) {
	if n := numel(t.Shape) * int64(t.DType.Size()); n != int64(len(t.Data)) {
		return nil, fmt.Errorf("shape %v of %v needs %d bytes, has %d", t.Shape, t.DType, n, len(t.Data))
	}
	if t.DType == dtype.F8E4M3 {
		return nil, fmt.Errorf("dtype %v is not expected here", t.DType)
	}
	return dtype.ToFloat32(t.DType, t.Data)
}

// viewOrConvert returns F32 bytes as []float32, sharing memory when aligned.
func viewOrConvert(t Tensor) []float32 {
	if len(t.Data) == 0 {
		return nil
	}
	if uintptr(unsafe.Pointer(&t.Data[0]))%4 == 0 {
		return unsafe.Slice((*float32)(unsafe.Pointer(&t.Data[0])), len(t.Data)/4)
	}
	f, _ := toFloat32(t)
	return f
}

// viewUint16 returns BF16 bytes as []uint16, sharing memory when aligned.
func viewUint16(b []byte) []uint16 {
	if len(b) == 0 {
		return nil
	}
	if uintptr(unsafe.Pointer(&b[0]))%2 == 0 {
		return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), len(b)/2)
	}
	out := make([]uint16, len(b)/2)
	for i := range out {
		out[i] = le16(b[2*i:])
	}
	return out
}

func le16(b []byte) uint16 { return uint16(b[0]) | uint16(b[1])<<8 }

func numel(shape []int) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= int64(d)
	}
	return n
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
