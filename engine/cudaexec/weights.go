package cudaexec

import (
	"fmt"
	"slices"
	"strings"

	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/internal/dtype"
)

// Memory is device memory a checkpoint's bytes sit in: a loaded
// safetensors file, or a buffer a host tensor was uploaded into.
type Memory interface {
	// DeviceAddr is the address of the memory's first byte on the device.
	DeviceAddr() uint64
	// CopyOut copies len(dst) bytes at off to the host.
	CopyOut(dst []byte, off int64) error
}

// DeviceTensor is one checkpoint tensor in device memory.
type DeviceTensor struct {
	DType dtype.DType
	Shape []int
	Mem   Memory
	// Off is the tensor's first byte in Mem.
	Off int64
	// Source names where the tensor came from, for errors.
	Source string
}

// Size is the tensor's length in bytes.
func (t DeviceTensor) Size() int64 { return numel(t.Shape) * int64(t.DType.Size()) }

// DeviceSource hands out a checkpoint's tensors in device memory by their
// Hugging Face name.
type DeviceSource interface {
	Lookup(name string) (DeviceTensor, bool)
}

// DeviceTensors is a DeviceSource held in a map.
type DeviceTensors map[string]DeviceTensor

// Lookup implements DeviceSource.
func (m DeviceTensors) Lookup(name string) (DeviceTensor, bool) {
	t, ok := m[name]
	return t, ok
}

// Matrix is a weight matrix as the kernels read it: Rows×Cols row-major
// elements of Kind at Mem+Off, or (Host set) bytes the model uploads into
// a buffer of its own first (a dtype the kernels do not read, converted to
// float32, or a tensor misaligned for its dtype). FP8 weights carry
// float32 scales: element (r, c) is multiplied by
// Scales[(r/BR)*SCols + c/BC], which covers block-wise weight_scale_inv
// (BR×BC blocks), per-row weight_scale (BR 1, BC Cols) and per-tensor
// (BR Rows, BC Cols) alike. For the other kinds BR, BC are Rows, Cols.
type Matrix struct {
	Name          string
	Kind          WeightKind
	Rows, Cols    int
	Mem           Memory
	Off           int64
	Host          []byte
	BR, BC, SCols int
	Scales        []float32
}

// ElemSize is the bytes one element of the matrix takes on the device.
func (m *Matrix) ElemSize() int {
	switch m.Kind {
	case WeightBF16:
		return 2
	case WeightFP8:
		return 1
	}
	return 4
}

// Bytes is the matrix's size on the device, scales included.
func (m *Matrix) Bytes() int64 {
	return int64(m.Rows)*int64(m.Cols)*int64(m.ElemSize()) + 4*int64(len(m.Scales))
}

// Layer is one transformer block's weights.
type Layer struct {
	AttnNorm, MLPNorm          []float32
	Q, K, V, O, Gate, Up, Down Matrix
}

// Weights are a model's parameters as the GPU forward pass reads them:
// matrices in device memory, norm weights on the host (small; the model
// uploads them as float32).
type Weights struct {
	Embed, LMHead Matrix
	Norm          []float32
	Layers        []Layer
}

// Tensor names of the Llama architecture in Hugging Face layout.
const (
	embedName  = "model.embed_tokens.weight"
	normName   = "model.norm.weight"
	lmHeadName = "lm_head.weight"
)

var projections = [...]string{
	"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
	"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
}

// ResolveWeights finds every tensor cfg implies in src, checks its shape
// and dtype as the CPU model does, and describes it for the kernels: FP8
// (E4M3) only for projections, with their scales read to the host;
// embeddings and the output head in F32 or BF16 (F16 converted).
func ResolveWeights(cfg *model.Config, src DeviceSource) (*Weights, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	want := map[string][]int{}
	for _, ns := range cfg.TensorShapes() {
		want[ns.Name] = ns.Shape
	}
	r := resolver{cfg: cfg, src: src, want: want}
	w := &Weights{Layers: make([]Layer, cfg.NumLayers)}
	var err error
	if w.Embed, err = r.matrix(embedName, false); err != nil {
		return nil, err
	}
	if w.Norm, err = r.vector(normName); err != nil {
		return nil, err
	}
	w.LMHead = w.Embed
	if !cfg.TieWordEmbeddings {
		if w.LMHead, err = r.matrix(lmHeadName, false); err != nil {
			return nil, err
		}
	}
	for i := range w.Layers {
		p := model.LayerPrefix(i)
		l := &w.Layers[i]
		if l.AttnNorm, err = r.vector(p + "input_layernorm.weight"); err != nil {
			return nil, err
		}
		if l.MLPNorm, err = r.vector(p + "post_attention_layernorm.weight"); err != nil {
			return nil, err
		}
		dst := []*Matrix{&l.Q, &l.K, &l.V, &l.O, &l.Gate, &l.Up, &l.Down}
		for j, name := range projections {
			if *dst[j], err = r.matrix(p+name+".weight", true); err != nil {
				return nil, err
			}
		}
	}
	return w, nil
}

type resolver struct {
	cfg  *model.Config
	src  DeviceSource
	want map[string][]int
}

func (r *resolver) lookup(name string) (DeviceTensor, error) {
	t, ok := r.src.Lookup(name)
	if !ok {
		return DeviceTensor{}, fmt.Errorf("tensor %s is missing from the checkpoint", name)
	}
	if want, ok := r.want[name]; ok && !slices.Equal(t.Shape, want) {
		return DeviceTensor{}, fmt.Errorf("%s: tensor %s has shape %v, config.json implies %v", t.Source, name, t.Shape, want)
	}
	return t, nil
}

// download copies a tensor's bytes to the host.
func download(t DeviceTensor) ([]byte, error) {
	b := make([]byte, t.Size())
	if err := t.Mem.CopyOut(b, t.Off); err != nil {
		return nil, fmt.Errorf("%s: read a tensor from the device: %w", t.Source, err)
	}
	return b, nil
}

// floats reads a float tensor of any non-FP8 dtype to the host as float32.
func floats(t DeviceTensor, name string) ([]float32, error) {
	if t.DType == dtype.F8E4M3 {
		return nil, fmt.Errorf("%s: tensor %s is FP8, which is not expected here", t.Source, name)
	}
	b, err := download(t)
	if err != nil {
		return nil, err
	}
	v, err := dtype.ToFloat32(t.DType, b)
	if err != nil {
		return nil, fmt.Errorf("%s: tensor %s: %w", t.Source, name, err)
	}
	return v, nil
}

func (r *resolver) vector(name string) ([]float32, error) {
	t, err := r.lookup(name)
	if err != nil {
		return nil, err
	}
	return floats(t, name)
}

func (r *resolver) matrix(name string, quantizable bool) (Matrix, error) {
	t, err := r.lookup(name)
	if err != nil {
		return Matrix{}, err
	}
	if len(t.Shape) != 2 {
		return Matrix{}, fmt.Errorf("%s: tensor %s has shape %v, want a matrix", t.Source, name, t.Shape)
	}
	m := Matrix{Name: name, Rows: t.Shape[0], Cols: t.Shape[1], Mem: t.Mem, Off: t.Off}
	m.BR, m.BC, m.SCols = m.Rows, m.Cols, 1
	switch t.DType {
	case dtype.F32:
		m.Kind = WeightF32
	case dtype.BF16:
		m.Kind = WeightBF16
	case dtype.F16:
		f, err := floats(t, name)
		if err != nil {
			return Matrix{}, err
		}
		m.Kind, m.Host = WeightF32, f32Bytes(f)
	case dtype.F8E4M3:
		if !quantizable {
			return Matrix{}, fmt.Errorf("%s: tensor %s is FP8, but only projection weights may be", t.Source, name)
		}
		m.Kind = WeightFP8
		if err := r.scales(name, &m); err != nil {
			return Matrix{}, err
		}
	default:
		return Matrix{}, fmt.Errorf("%s: tensor %s has dtype %v, want F32, BF16, F16 or F8_E4M3", t.Source, name, t.DType)
	}
	if m.Host == nil && m.Off%int64(m.ElemSize()) != 0 {
		// Misaligned for its dtype: the model gives it a buffer of its own.
		if m.Host, err = download(t); err != nil {
			return Matrix{}, err
		}
	}
	return m, nil
}

// scales attaches an FP8 weight's scales: block-wise weight_scale_inv (HF
// fine-grained FP8) or per-tensor / per-row weight_scale.
func (r *resolver) scales(name string, m *Matrix) error {
	base := strings.TrimSuffix(name, ".weight")
	if t, ok := r.src.Lookup(base + ".weight_scale_inv"); ok {
		s, err := floats(t, base+".weight_scale_inv")
		if err != nil {
			return err
		}
		br, bc := 128, 128
		if q := r.cfg.Quantization; q != nil && len(q.WeightBlockSize) == 2 {
			br, bc = q.WeightBlockSize[0], q.WeightBlockSize[1]
		}
		want := []int{ceilDiv(m.Rows, br), ceilDiv(m.Cols, bc)}
		if !slices.Equal(t.Shape, want) {
			return fmt.Errorf("%s: tensor %s.weight_scale_inv has shape %v, want %v for %dx%d blocks", t.Source, base, t.Shape, want, br, bc)
		}
		m.Scales, m.BR, m.BC, m.SCols = s, br, bc, want[1]
		return nil
	}
	t, ok := r.src.Lookup(base + ".weight_scale")
	if !ok {
		return fmt.Errorf("FP8 tensor %s has neither %s.weight_scale_inv nor %s.weight_scale", name, base, base)
	}
	s, err := floats(t, base+".weight_scale")
	if err != nil {
		return err
	}
	switch len(s) {
	case 1:
		m.BR, m.BC = m.Rows, m.Cols
	case m.Rows:
		m.BR, m.BC = 1, m.Cols
	default:
		return fmt.Errorf("%s: tensor %s.weight_scale has %d values, want 1 (per tensor) or %d (per row)", t.Source, base, len(s), m.Rows)
	}
	m.Scales, m.SCols = s, 1
	return nil
}

func f32Bytes(v []float32) []byte {
	b, _ := dtype.FromFloat32(dtype.F32, v)
	return b
}

func numel(shape []int) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= int64(d)
	}
	return n
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
