package kernels

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/internal/testmodel"
)

// loadF32Matrices reads every 2-D F32 tensor of a safetensors file.
func loadF32Matrices(path string) (map[string]*Matrix, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(data) < 8 {
		return nil, fmt.Errorf("read header of %s: file too short", path)
	}
	n := binary.LittleEndian.Uint64(data)
	if n > uint64(len(data)-8) {
		return nil, fmt.Errorf("read header of %s: header length %d exceeds file", path, n)
	}
	var header map[string]json.RawMessage
	if err := json.Unmarshal(data[8:8+n], &header); err != nil {
		return nil, fmt.Errorf("read header of %s: %w", path, err)
	}
	body := data[8+n:]
	out := map[string]*Matrix{}
	for name, raw := range header {
		if name == "__metadata__" {
			continue
		}
		var t struct {
			DType   string   `json:"dtype"`
			Shape   []int    `json:"shape"`
			Offsets [2]int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(raw, &t); err != nil {
			return nil, fmt.Errorf("read tensor %s of %s: %w", name, path, err)
		}
		if t.DType != "F32" || len(t.Shape) != 2 {
			continue
		}
		rows, cols := t.Shape[0], t.Shape[1]
		if t.Offsets[0] < 0 || t.Offsets[1] > int64(len(body)) || t.Offsets[1]-t.Offsets[0] != int64(4*rows*cols) {
			return nil, fmt.Errorf("read tensor %s of %s: bad data_offsets %v", name, path, t.Offsets)
		}
		m := &Matrix{Rows: rows, Cols: cols, DType: dtype.F32, F32: make([]float32, rows*cols)}
		for i := range m.F32 {
			m.F32[i] = math.Float32frombits(binary.LittleEndian.Uint32(body[t.Offsets[0]+int64(4*i):]))
		}
		out[name] = m
	}
	return out, nil
}

// quantize returns m in BF16, or in FP8 with per-row or block scales
// chosen so that each row or block's largest weight maps to ±448.
func quantize(m *Matrix, dt dtype.DType, block int) *Matrix {
	q := &Matrix{Rows: m.Rows, Cols: m.Cols, DType: dt}
	if dt == dtype.BF16 {
		q.BF16 = make([]uint16, len(m.F32))
		for i, v := range m.F32 {
			q.BF16[i] = dtype.F32ToBF16(v)
		}
		return q
	}
	br, bc := 1, m.Cols // per row
	if block > 0 {
		br, bc = block, block
		q.BlockRows, q.BlockCols = block, block
	}
	nbc := ceilDiv(m.Cols, bc)
	q.Scales = make([]float32, ceilDiv(m.Rows, br)*nbc)
	for i := 0; i < m.Rows; i++ {
		for j := 0; j < m.Cols; j++ {
			s := &q.Scales[i/br*nbc+j/bc]
			*s = max(*s, float32(math.Abs(float64(m.F32[i*m.Cols+j])))/dtype.E4M3Max)
		}
	}
	for i := range q.Scales {
		if q.Scales[i] == 0 {
			q.Scales[i] = 1
		}
	}
	q.FP8 = make([]uint8, len(m.F32))
	for i := 0; i < m.Rows; i++ {
		for j := 0; j < m.Cols; j++ {
			q.FP8[i*m.Cols+j] = dtype.F32ToE4M3(m.F32[i*m.Cols+j] / q.Scales[i/br*nbc+j/bc])
		}
	}
	return q
}

func TestStories260KWeights(t *testing.T) {
	mats, err := loadF32Matrices(filepath.Join(testmodel.Dir(t), "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if len(mats) == 0 {
		t.Fatal("no 2-D F32 tensors found")
	}
	names := make([]string, 0, len(mats))
	for name := range mats {
		names = append(names, name)
	}
	sort.Strings(names)
	p := NewPool(2)
	defer p.Close()
	rng := rand.New(rand.NewPCG(260, 0))
	sawCols172 := false
	for _, name := range names {
		m := mats[name]
		sawCols172 = sawCols172 || m.Cols == 172
		for _, v := range []struct {
			kind string
			w    *Matrix
		}{
			{"f32", m},
			{"bf16", quantize(m, dtype.BF16, 0)},
			{"fp8-row", quantize(m, dtype.F8E4M3, 0)},
			{"fp8-block32", quantize(m, dtype.F8E4M3, 32)},
		} {
			for _, n := range []int{1, 7} {
				x := randomVector(rng, n*m.Cols)
				want := make([]float32, n*m.Rows)
				MatMulNaive(want, x, n, v.w)
				got := make([]float32, n*m.Rows)
				p.MatMul(got, x, n, v.w)
				if err := closeTo(got, want, magnitudes(x, n, v.w)); err != nil {
					t.Errorf("%s %s n=%d: %v", name, v.kind, n, err)
				}
			}
		}
	}
	if !sawCols172 {
		t.Error("expected the MLP down projection with Cols = 172")
	}
}
