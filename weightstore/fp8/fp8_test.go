package fp8

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/internal/testmodel"
)

// gaussian is a rows×cols matrix of N(0, 1) values whose magnitude varies
// across rows and columns, so different blocks get different scales.
func gaussian(rows, cols int, seed uint64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 1))
	w := make([]float32, rows*cols)
	for i := range w {
		r, c := i/cols, i%cols
		w[i] = float32(rng.NormFloat64() * math.Exp2(float64(r%7-c%5)))
	}
	return w
}

// refBlockScale is the scale of block (bi, bj) computed the slow way.
func refBlockScale(w []float32, rows, cols, block, bi, bj int) float32 {
	var amax float32
	for r := bi * block; r < min((bi+1)*block, rows); r++ {
		for c := bj * block; c < min((bj+1)*block, cols); c++ {
			if a := float32(math.Abs(float64(w[r*cols+c]))); !math.IsInf(float64(a), 0) && a > amax {
				amax = a
			}
		}
	}
	if amax == 0 {
		return 1
	}
	return amax / 448
}

// withinE4M3 reports whether deq is within E4M3 rounding of w at scale s:
// half an ulp of a 3-bit mantissa (1/16 relative) for normals, half the
// subnormal step (2^-10 of the scale) near zero.
func withinE4M3(w, deq, s float32) bool {
	bound := math.Abs(float64(w))/16 + float64(s)*math.Exp2(-10)
	return math.Abs(float64(w-deq)) <= bound*(1+1e-6)
}

func TestQuantizeBlocksRoundTrip(t *testing.T) {
	cases := []struct{ rows, cols, block int }{
		{4, 4, 2},
		{5, 7, 3},   // ragged in both directions
		{1, 1, 128}, // one partial block
		{130, 257, 128},
		{300, 500, 128}, // large enough to run in parallel
		{8, 8, 1},
		{0, 5, 4},
		{3, 0, 2},
	}
	for _, tc := range cases {
		w := gaussian(tc.rows, tc.cols, uint64(tc.rows*1000+tc.cols))
		q, s, err := QuantizeBlocks(w, tc.rows, tc.cols, tc.block)
		if err != nil {
			t.Fatalf("%v: %v", tc, err)
		}
		br, bc := ceilDiv(tc.rows, tc.block), ceilDiv(tc.cols, tc.block)
		if len(q) != len(w) || len(s) != br*bc {
			t.Fatalf("%v: len(q)=%d len(scaleInv)=%d, want %d and %d", tc, len(q), len(s), len(w), br*bc)
		}
		for bi := range br {
			for bj := range bc {
				if want := refBlockScale(w, tc.rows, tc.cols, tc.block, bi, bj); s[bi*bc+bj] != want {
					t.Fatalf("%v: scaleInv[%d][%d] = %g, want %g", tc, bi, bj, s[bi*bc+bj], want)
				}
			}
		}
		deq, err := DequantizeBlocks(q, s, tc.rows, tc.cols, tc.block)
		if err != nil {
			t.Fatalf("%v: %v", tc, err)
		}
		for i := range w {
			si := s[(i/tc.cols/tc.block)*bc+(i%tc.cols)/tc.block]
			if want := dtype.F32ToE4M3(w[i] / si); q[i] != want {
				t.Fatalf("%v: q[%d] = %#x, want %#x", tc, i, q[i], want)
			}
			if !withinE4M3(w[i], deq[i], si) {
				t.Fatalf("%v: element %d: %g dequantised to %g (scale %g)", tc, i, w[i], deq[i], si)
			}
		}
	}
}

func TestQuantizeBlocksSpecialBlocks(t *testing.T) {
	// A 4×4 matrix in 2×2 blocks: top-left ordinary, top-right all zero,
	// bottom-left holds NaN and ±Inf, bottom-right a tiny subnormal.
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	tiny := float32(math.SmallestNonzeroFloat32)
	w := []float32{
		1, -2, 0, 0,
		3, 4, 0, 0,
		nan, inf, 0, tiny,
		-inf, 2, 0, 0,
	}
	q, s, err := QuantizeBlocks(w, 4, 4, 2)
	if err != nil {
		t.Fatal(err)
	}
	wantScale := []float32{4.0 / 448, 1, 2.0 / 448, math.SmallestNonzeroFloat32}
	for i, want := range wantScale {
		if s[i] != want {
			t.Errorf("scaleInv[%d] = %g, want %g", i, s[i], want)
		}
	}
	deq, err := DequantizeBlocks(q, s, 4, 4, 2)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		i    int
		q    uint8
		deq  float32
	}{
		{"amax maps to 448", 5, 0x7e, 4},
		{"zero block stays zero", 2, 0, 0},
		{"zero block stays zero", 7, 0, 0},
		{"+Inf saturates", 9, 0x7e, 2},
		{"-Inf saturates", 12, 0xfe, -2},
		{"finite neighbour of Inf keeps its value", 13, 0x7e, 2},
		{"tiny subnormal is exact", 11, 0x38, math.SmallestNonzeroFloat32},
	}
	for _, tc := range cases {
		if q[tc.i] != tc.q || deq[tc.i] != tc.deq {
			t.Errorf("%s: element %d: q=%#x deq=%g, want q=%#x deq=%g", tc.name, tc.i, q[tc.i], deq[tc.i], tc.q, tc.deq)
		}
	}
	if !math.IsNaN(float64(deq[8])) {
		t.Errorf("NaN dequantised to %g (q=%#x)", deq[8], q[8])
	}
}

func TestShapeErrors(t *testing.T) {
	four := make([]float32, 4)
	q4 := make([]uint8, 4)
	cases := []struct {
		name string
		run  func() error
		want string
	}{
		{"blocks len mismatch", func() error { _, _, err := QuantizeBlocks(four, 2, 3, 2); return err }, "4 elements"},
		{"blocks zero block", func() error { _, _, err := QuantizeBlocks(four, 2, 2, 0); return err }, "block size 0"},
		{"blocks negative block", func() error { _, _, err := QuantizeBlocks(four, 2, 2, -1); return err }, "block size -1"},
		{"blocks negative rows", func() error { _, _, err := QuantizeBlocks(four, -2, -2, 2); return err }, "negative"},
		{"blocks overflow", func() error { _, _, err := QuantizeBlocks(four, math.MaxInt/2, 4, 2); return err }, "overflows"},
		{"dequant blocks len mismatch", func() error { _, err := DequantizeBlocks(q4, []float32{1}, 1, 3, 2); return err }, "4 elements"},
		{"dequant blocks scale mismatch", func() error { _, err := DequantizeBlocks(q4, []float32{1}, 2, 2, 1); return err }, "scale_inv has 1"},
		{"dequant blocks zero block", func() error { _, err := DequantizeBlocks(q4, []float32{1}, 2, 2, 0); return err }, "block size 0"},
		{"per row len mismatch", func() error { _, _, err := QuantizePerRow(four, 3, 3); return err }, "4 elements"},
		{"per row negative", func() error { _, _, err := QuantizePerRow(four, -1, -4); return err }, "negative"},
		{"scaled len mismatch", func() error { _, err := DequantizeScaled(q4, []float32{1}, 1, 5); return err }, "4 elements"},
		{"scaled scale mismatch", func() error { _, err := DequantizeScaled(q4, []float32{1, 2, 3}, 2, 2); return err }, "3 values"},
		{"scaled empty scale", func() error { _, err := DequantizeScaled(q4, nil, 2, 2); return err }, "0 values"},
	}
	for _, tc := range cases {
		err := tc.run()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one mentioning %q", tc.name, err, tc.want)
		}
	}
}

func TestQuantizePerRow(t *testing.T) {
	cases := []struct{ rows, cols int }{{1, 1}, {3, 5}, {300, 500}, {0, 3}, {2, 0}}
	for _, tc := range cases {
		w := gaussian(tc.rows, tc.cols, 7)
		if tc.rows > 1 && tc.cols > 0 {
			for c := range tc.cols {
				w[tc.cols+c] = 0 // an all-zero row
			}
		}
		q, s, err := QuantizePerRow(w, tc.rows, tc.cols)
		if err != nil {
			t.Fatalf("%v: %v", tc, err)
		}
		if len(s) != tc.rows || len(q) != len(w) {
			t.Fatalf("%v: len(scale)=%d len(q)=%d", tc, len(s), len(q))
		}
		for r := range tc.rows {
			if want := refBlockScale(w[r*tc.cols:(r+1)*tc.cols], 1, tc.cols, max(tc.cols, 1), 0, 0); s[r] != want {
				t.Fatalf("%v: scale[%d] = %g, want %g", tc, r, s[r], want)
			}
		}
		deq, err := DequantizeScaled(q, s, tc.rows, tc.cols)
		if err != nil {
			t.Fatal(err)
		}
		for i := range w {
			if !withinE4M3(w[i], deq[i], s[i/tc.cols]) {
				t.Fatalf("%v: element %d: %g dequantised to %g", tc, i, w[i], deq[i])
			}
		}
	}
}

func TestQuantizePerTensor(t *testing.T) {
	cases := []struct {
		name      string
		w         []float32
		wantScale float32
	}{
		{"empty", nil, 1},
		{"zeros", make([]float32, 10), 1},
		{"simple", []float32{-896, 1, 2.5}, 2},
		{"large parallel", gaussian(300, 500, 3), refBlockScale(gaussian(300, 500, 3), 1, 150000, 150000, 0, 0)},
		{"inf ignored", []float32{float32(math.Inf(-1)), 44.8}, 0.1},
	}
	for _, tc := range cases {
		q, s := QuantizePerTensor(tc.w)
		if s != tc.wantScale || len(q) != len(tc.w) {
			t.Fatalf("%s: scale %g len %d, want %g and %d", tc.name, s, len(q), tc.wantScale, len(tc.w))
		}
		deq, err := DequantizeScaled(q, []float32{s}, 1, len(tc.w))
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range tc.w {
			if math.IsInf(float64(v), 0) {
				if deq[i] != float32(math.Copysign(448, float64(v)))*s {
					t.Errorf("%s: %g dequantised to %g, want saturation", tc.name, v, deq[i])
				}
				continue
			}
			if !withinE4M3(v, deq[i], s) {
				t.Fatalf("%s: element %d: %g dequantised to %g", tc.name, i, v, deq[i])
			}
		}
	}
}

func TestCosineSimilarity(t *testing.T) {
	const rows, cols = 300, 500
	rng := rand.New(rand.NewPCG(42, 42))
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = float32(rng.NormFloat64() * 0.02)
	}
	cases := []struct {
		name  string
		quant func() ([]float32, error)
	}{
		{"blocks 128", func() ([]float32, error) {
			q, s, err := QuantizeBlocks(w, rows, cols, 128)
			if err != nil {
				return nil, err
			}
			return DequantizeBlocks(q, s, rows, cols, 128)
		}},
		{"per row", func() ([]float32, error) {
			q, s, err := QuantizePerRow(w, rows, cols)
			if err != nil {
				return nil, err
			}
			return DequantizeScaled(q, s, rows, cols)
		}},
		{"per tensor", func() ([]float32, error) {
			q, s := QuantizePerTensor(w)
			return DequantizeScaled(q, []float32{s}, rows, cols)
		}},
	}
	for _, tc := range cases {
		deq, err := tc.quant()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if c := testmodel.Cosine(w, deq); c <= 0.999 {
			t.Errorf("%s: cosine similarity %.6f, want > 0.999", tc.name, c)
		}
	}
}

func BenchmarkQuantizeBlocks(b *testing.B) {
	const rows, cols = 2048, 2048
	w := gaussian(rows, cols, 1)
	b.SetBytes(int64(4 * len(w)))
	for b.Loop() {
		if _, _, err := QuantizeBlocks(w, rows, cols, 128); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDequantizeBlocks(b *testing.B) {
	const rows, cols = 2048, 2048
	q, s, err := QuantizeBlocks(gaussian(rows, cols, 1), rows, cols, 128)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(q)))
	for b.Loop() {
		if _, err := DequantizeBlocks(q, s, rows, cols, 128); err != nil {
			b.Fatal(err)
		}
	}
}
