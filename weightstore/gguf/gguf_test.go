package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stokehq/stoke/internal/dtype"
)

// q8Bound is the largest error Q8_0 may make on a block whose largest
// magnitude is amax: half a step of amax/127, plus the fp16 rounding of
// the scale (relative 2^-11) times the largest code.
func q8Bound(amax float32) float32 {
	d := amax / 127
	return d*0.5 + 127*d/2048 + 1e-12
}

func TestQ8_0RoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	gauss := make([]float32, 4*QK8_0)
	for i := range gauss {
		gauss[i] = float32(rng.NormFloat64() * 0.02)
	}
	ramp := make([]float32, QK8_0)
	for i := range ramp {
		ramp[i] = float32(i-16) / 3
	}
	mixed := slices.Concat(make([]float32, QK8_0), ramp) // an all-zero block, then a ramp
	big := make([]float32, QK8_0)
	for i := range big {
		big[i] = float32(i) * 1000
	}
	for _, tc := range []struct {
		name string
		x    []float32
	}{
		{"zeros", make([]float32, QK8_0)},
		{"ramp", ramp},
		{"gaussian", gauss},
		{"zero block then ramp", mixed},
		{"large", big},
		{"one spike", func() []float32 { v := make([]float32, QK8_0); v[7] = -3; return v }()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := QuantizeQ8_0(tc.x)
			if err != nil {
				t.Fatal(err)
			}
			if want := len(tc.x) / QK8_0 * 34; len(q) != want {
				t.Fatalf("%d bytes, want %d", len(q), want)
			}
			got, err := DequantizeQ8_0(q)
			if err != nil {
				t.Fatal(err)
			}
			for b := 0; b < len(tc.x)/QK8_0; b++ {
				blk := tc.x[b*QK8_0 : (b+1)*QK8_0]
				var amax float32
				for _, v := range blk {
					amax = max(amax, float32(math.Abs(float64(v))))
				}
				for i, v := range blk {
					if e := float32(math.Abs(float64(got[b*QK8_0+i] - v))); e > q8Bound(amax) {
						t.Fatalf("value %d: %v came back as %v (error %v > %v)", b*QK8_0+i, v, got[b*QK8_0+i], e, q8Bound(amax))
					}
				}
				// The largest magnitude maps to ±127 exactly.
				if amax > 0 {
					maxCode := 0
					for i := 0; i < QK8_0; i++ {
						maxCode = max(maxCode, int(math.Abs(float64(int8(q[b*34+2+i])))))
					}
					if maxCode != 127 {
						t.Fatalf("block %d: largest code %d, want 127", b, maxCode)
					}
				}
			}
		})
	}
}

func TestQ8_0Errors(t *testing.T) {
	if _, err := QuantizeQ8_0(make([]float32, 33)); err == nil || !strings.Contains(err.Error(), "not a multiple of 32") {
		t.Errorf("33 values: %v", err)
	}
	if _, err := DequantizeQ8_0(make([]byte, 35)); err == nil || !strings.Contains(err.Error(), "34-byte blocks") {
		t.Errorf("35 bytes: %v", err)
	}
	if _, err := Decode(TensorType(99), nil); err == nil || !strings.Contains(err.Error(), "not supported") {
		t.Errorf("unknown type: %v", err)
	}
}

func TestPermuteRoPE(t *testing.T) {
	// Two heads of head_dim 4, one column: HF rows per head are
	// [x0 x1 | y0 y1] (pairs (x_i, y_i)); GGUF rows are x0 y0 x1 y1.
	w := []float32{0, 1, 2, 3, 10, 11, 12, 13}
	got, err := PermuteRoPE(w, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := []float32{0, 2, 1, 3, 10, 12, 11, 13}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// Whole rows move: two columns.
	got, err = PermuteRoPE([]float32{0, 0, 1, 1, 2, 2, 3, 3}, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if want := []float32{0, 0, 2, 2, 1, 1, 3, 3}; !slices.Equal(got, want) {
		t.Fatalf("two columns: got %v, want %v", got, want)
	}

	// The point of the permutation: rotate-half RoPE on the HF rows gives
	// the same vector as interleaved RoPE on the permuted rows, reordered.
	const hd, pos = 8, 5
	q := []float32{0.3, -1, 2, 0.5, 1.5, -0.2, 0.7, 1}
	p, err := PermuteRoPE(q, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	half := make([]float32, hd)
	inter := make([]float32, hd)
	for i := 0; i < hd/2; i++ {
		theta := pos / math.Pow(10000, float64(2*i)/hd)
		c, s := float32(math.Cos(theta)), float32(math.Sin(theta))
		half[i] = q[i]*c - q[i+hd/2]*s
		half[i+hd/2] = q[i]*s + q[i+hd/2]*c
		inter[2*i] = p[2*i]*c - p[2*i+1]*s
		inter[2*i+1] = p[2*i]*s + p[2*i+1]*c
	}
	back, err := PermuteRoPE(half, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range back {
		if math.Abs(float64(back[i]-inter[i])) > 1e-6 {
			t.Fatalf("rotate-half then permute %v != permute then interleaved %v", back, inter)
		}
	}

	for _, tc := range []struct {
		name        string
		n, h, c     int
		wantMessage string
	}{
		{"not whole heads", 7, 2, 1, "not 2 heads"},
		{"odd head dim", 6, 2, 1, "odd"},
		{"zero heads", 8, 0, 1, "not 0 heads"},
	} {
		if _, err := PermuteRoPE(make([]float32, tc.n), tc.h, tc.c); err == nil || !strings.Contains(err.Error(), tc.wantMessage) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.wantMessage)
		}
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	f32 := []float32{1, -2.5, 3.25, 0}
	f16 := []float32{0.5, -1, 2, 65504}
	q8src := make([]float32, 2*QK8_0)
	for i := range q8src {
		q8src[i] = float32(math.Sin(float64(i))) * 0.1
	}
	q8, err := QuantizeQ8_0(q8src)
	if err != nil {
		t.Fatal(err)
	}
	kvs := []KV{
		{"u8", uint8(7)}, {"i8", int8(-7)}, {"u16", uint16(700)}, {"i16", int16(-700)},
		{"u32", uint32(70000)}, {"i32", int32(-70000)}, {"f32", float32(1.5)}, {"bool", true},
		{"str", "héllo"}, {"u64", uint64(1) << 40}, {"i64", int64(-1) << 40}, {"f64", 2.25},
		{"strs", []string{"a", "", "b c"}}, {"i32s", []int32{1, -2, 3}}, {"f32s", []float32{0.5, -0.25}},
		{"empty", []string{}}, {"bools", []bool{true, false}},
	}
	mk := func(t TensorType, dims []uint64, data []byte) Tensor {
		return Tensor{Name: "", Type: t, Dims: dims, Data: func() ([]byte, error) { return data, nil }}
	}
	f32b, _ := dtype.FromFloat32(dtype.F32, f32)
	f16b, _ := dtype.FromFloat32(dtype.F16, f16)
	tensors := []Tensor{mk(TensorF32, []uint64{4}, f32b), mk(TensorF16, []uint64{2, 2}, f16b), mk(TensorQ8_0, []uint64{32, 2}, q8)}
	for i, n := range []string{"a.weight", "b.weight", "c.weight"} {
		tensors[i].Name = n
	}
	for _, alignment := range []int{0, 32, 64, 256} {
		var buf bytes.Buffer
		if err := Write(&buf, kvs, tensors, alignment); err != nil {
			t.Fatalf("alignment %d: %v", alignment, err)
		}
		g, err := Read(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
		if err != nil {
			t.Fatalf("alignment %d: %v", alignment, err)
		}
		if g.Version != Version {
			t.Errorf("version %d", g.Version)
		}
		wantKV := kvs
		if alignment != 0 && alignment != DefaultAlignment {
			wantKV = append(slices.Clone(kvs), KV{"general.alignment", uint32(alignment)})
		}
		if !reflect.DeepEqual(g.KV, wantKV) {
			t.Errorf("alignment %d: metadata\n got %#v\nwant %#v", alignment, g.KV, wantKV)
		}
		a := uint64(max(alignment, DefaultAlignment))
		if uint64(g.DataOffset)%a != 0 {
			t.Errorf("alignment %d: data at %d", alignment, g.DataOffset)
		}
		for i, want := range [][]float32{f32, f16, nil} {
			info, data, err := g.TensorData(tensors[i].Name)
			if err != nil {
				t.Fatal(err)
			}
			if info.Type != tensors[i].Type || !slices.Equal(info.Dims, tensors[i].Dims) || info.Offset%a != 0 {
				t.Errorf("alignment %d: tensor %s info %+v", alignment, tensors[i].Name, info)
			}
			got, err := Decode(info.Type, data)
			if err != nil {
				t.Fatal(err)
			}
			if want == nil {
				want = q8src
				for j := range want {
					if math.Abs(float64(got[j]-want[j])) > float64(q8Bound(0.1)) {
						t.Fatalf("q8 value %d: %v vs %v", j, got[j], want[j])
					}
				}
				continue
			}
			if !slices.Equal(got, want) {
				t.Errorf("alignment %d: tensor %s = %v, want %v", alignment, tensors[i].Name, got, want)
			}
		}
		if _, _, err := g.TensorData("missing"); err == nil || !strings.Contains(err.Error(), `no tensor "missing"`) {
			t.Errorf("missing tensor: %v", err)
		}
	}
}

func TestWriteErrors(t *testing.T) {
	data := func(n int) func() ([]byte, error) { return func() ([]byte, error) { return make([]byte, n), nil } }
	for _, tc := range []struct {
		name      string
		kvs       []KV
		tensors   []Tensor
		alignment int
		want      string
	}{
		{"duplicate key", []KV{{"a", uint32(1)}, {"a", uint32(2)}}, nil, 0, `key "a" appears twice`},
		{"unsupported value", []KV{{"a", 3}}, nil, 0, "Go type int has no GGUF type"},
		{"alignment", nil, nil, 48, "not a power of two"},
		{"short data", nil, []Tensor{{"t", TensorF32, []uint64{4}, data(12)}}, 0, "has 12 bytes"},
		{"q8 row", nil, []Tensor{{"t", TensorQ8_0, []uint64{48, 2}, data(0)}}, 0, "not a multiple of the Q8_0 block size"},
		{"zero dim", nil, []Tensor{{"t", TensorF32, []uint64{4, 0}, data(0)}}, 0, "include zero"},
		{"unknown type", nil, []Tensor{{"t", TensorType(2), []uint64{4}, data(0)}}, 0, "not supported"},
		{"duplicate tensor", nil, []Tensor{{"t", TensorF32, []uint64{1}, data(4)}, {"t", TensorF32, []uint64{1}, data(4)}}, 0, `tensor "t" appears twice`},
		{"data error", nil, []Tensor{{"t", TensorF32, []uint64{1}, func() ([]byte, error) { return nil, errors.New("boom") }}}, 0, "tensor t: boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Write(&bytes.Buffer{}, tc.kvs, tc.tensors, tc.alignment)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestReadErrors(t *testing.T) {
	var good bytes.Buffer
	f32b, _ := dtype.FromFloat32(dtype.F32, []float32{1, 2})
	if err := Write(&good, []KV{{"k", true}, {"general.alignment", uint32(32)}},
		[]Tensor{{"t", TensorF32, []uint64{2}, func() ([]byte, error) { return f32b, nil }}}, 0); err != nil {
		t.Fatal(err)
	}
	g := good.Bytes()
	// Offsets into g: magic 0, version 4, tensor count 8, kv count 16,
	// first key at 24 ("k": 8-byte length + 1 byte), its type at 33, its
	// bool at 37.
	edit := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(g)) }
	tensorInfo := bytes.Index(g, []byte{1, 0, 0, 0, 0, 0, 0, 0, 't'}) // name length 1, "t"
	if tensorInfo < 0 {
		t.Fatal("no tensor info")
	}
	for _, tc := range []struct {
		name string
		file []byte
		want string
	}{
		{"empty", nil, "truncated in header"},
		{"bad magic", edit(func(b []byte) []byte { copy(b, "GGML"); return b }), `magic is "GGML"`},
		{"version 1", edit(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[4:], 1); return b }), "version 1 is not supported"},
		{"huge tensor count", edit(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[8:], 1<<40); return b }), "declares"},
		{"truncated metadata", g[:30], "truncated in metadata pair 0"},
		{"huge string", edit(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[24:], 1<<40); return b }), "longer than"},
		{"unknown value type", edit(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[33:], 77); return b }), "value type 77 is not supported"},
		{"bad bool", edit(func(b []byte) []byte { b[37] = 2; return b }), "bool byte is 2"},
		{"bad dims", edit(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[tensorInfo+9:], 9); return b }), "has 9 dimensions"},
		{"misaligned", edit(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[tensorInfo+9+4+8+4:], 4); return b }), "not aligned"},
		{"past end", g[:len(g)-32], "runs past the end"},
		{"truncated tensor info", g[:tensorInfo+5], "truncated in tensor info 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Read(bytes.NewReader(tc.file), int64(len(tc.file)))
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrInvalid containing %q", err, tc.want)
			}
		})
	}
	if _, err := Open("/nonexistent/x.gguf"); err == nil || !strings.Contains(err.Error(), "open gguf") {
		t.Errorf("missing file: %v", err)
	}
}

func TestTensorName(t *testing.T) {
	for hf, want := range map[string]string{
		"model.embed_tokens.weight":                      "token_embd.weight",
		"model.norm.weight":                              "output_norm.weight",
		"lm_head.weight":                                 "output.weight",
		"model.layers.0.input_layernorm.weight":          "blk.0.attn_norm.weight",
		"model.layers.11.self_attn.q_proj.weight":        "blk.11.attn_q.weight",
		"model.layers.3.self_attn.k_proj.weight":         "blk.3.attn_k.weight",
		"model.layers.3.self_attn.v_proj.weight":         "blk.3.attn_v.weight",
		"model.layers.3.self_attn.o_proj.weight":         "blk.3.attn_output.weight",
		"model.layers.3.post_attention_layernorm.weight": "blk.3.ffn_norm.weight",
		"model.layers.3.mlp.gate_proj.weight":            "blk.3.ffn_gate.weight",
		"model.layers.3.mlp.up_proj.weight":              "blk.3.ffn_up.weight",
		"model.layers.3.mlp.down_proj.weight":            "blk.3.ffn_down.weight",
		"model.layers.x.mlp.down_proj.weight":            "",
		"model.layers.3.mlp.down_proj.weight_scale_inv":  "",
		"model.rotary_emb.inv_freq":                      "",
	} {
		got, ok := TensorName(hf)
		if ok != (want != "") || got != want {
			t.Errorf("TensorName(%q) = %q, %v; want %q", hf, got, ok, want)
		}
	}
}
