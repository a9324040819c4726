package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stokehq/stoke/internal/dtype"
)

// weightKind is one way of storing weights that the kernels must handle.
type weightKind struct {
	name     string
	dt       dtype.DType
	scales   string // FP8: "tensor", "row" or "block"
	blockRow int
	blockCol int
}

var weightKinds = []weightKind{
	{name: "f32", dt: dtype.F32},
	{name: "bf16", dt: dtype.BF16},
	{name: "fp8-tensor", dt: dtype.F8E4M3, scales: "tensor"},
	{name: "fp8-row", dt: dtype.F8E4M3, scales: "row"},
	{name: "fp8-block128", dt: dtype.F8E4M3, scales: "block", blockRow: 128, blockCol: 128},
	{name: "fp8-block32", dt: dtype.F8E4M3, scales: "block", blockRow: 32, blockCol: 32},
	{name: "fp8-block3x5", dt: dtype.F8E4M3, scales: "block", blockRow: 3, blockCol: 5},
}

// randomFP8 returns a random E4M3FN code that is not NaN.
func randomFP8(rng *rand.Rand) uint8 {
	for {
		if b := uint8(rng.UintN(256)); b&0x7f != 0x7f {
			return b
		}
	}
}

func newMatrix(rng *rand.Rand, k weightKind, rows, cols int) *Matrix {
	m := &Matrix{Rows: rows, Cols: cols, DType: k.dt}
	size := rows * cols
	switch k.dt {
	case dtype.F32:
		m.F32 = make([]float32, size)
		for i := range m.F32 {
			m.F32[i] = rng.Float32()*2 - 1
		}
	case dtype.BF16:
		m.BF16 = make([]uint16, size)
		for i := range m.BF16 {
			m.BF16[i] = dtype.F32ToBF16(rng.Float32()*2 - 1)
		}
	case dtype.F8E4M3:
		m.FP8 = make([]uint8, size)
		for i := range m.FP8 {
			m.FP8[i] = randomFP8(rng)
		}
		ns := 1
		switch k.scales {
		case "row":
			ns = rows
		case "block":
			m.BlockRows, m.BlockCols = k.blockRow, k.blockCol
			ns = ceilDiv(rows, k.blockRow) * ceilDiv(cols, k.blockCol)
		}
		m.Scales = make([]float32, ns)
		for i := range m.Scales {
			m.Scales[i] = (0.5 + 1.5*rng.Float32()) / 256
		}
	}
	return m
}

func randomVector(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = rng.Float32()*2 - 1
	}
	return v
}

// magnitudes returns Σ_j |x[t][j] * W[i][j]| for every output, the scale
// against which rounding differences are judged.
func magnitudes(x []float32, n int, w *Matrix) []float64 {
	row := make([]float32, w.Cols)
	mag := make([]float64, n*w.Rows)
	for i := 0; i < w.Rows; i++ {
		if err := w.DequantizeRow(row, i); err != nil {
			panic(err)
		}
		for t := 0; t < n; t++ {
			xt := x[t*w.Cols : (t+1)*w.Cols]
			var s float64
			for j, v := range row {
				s += math.Abs(float64(xt[j]) * float64(v))
			}
			mag[t*w.Rows+i] = s
		}
	}
	return mag
}

// closeTo reports the first output where got and want differ by more than
// 1e-4 of the output's magnitude.
func closeTo(got, want []float32, mag []float64) error {
	for i := range want {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if !(d <= 1e-4*mag[i]+1e-30) {
			return fmt.Errorf("out[%d] = %g, want %g (diff %.3g, magnitude %.3g)", i, got[i], want[i], d, mag[i])
		}
	}
	return nil
}

// kernelSets lists the implementations this build can run.
func kernelSets() []*Set {
	sets := []*Set{&genericKernels}
	for _, ks := range []*Set{avx2Kernels, avx512Kernels} {
		if ks != nil {
			sets = append(sets, ks)
		}
	}
	return sets
}

func TestMatMulMatchesNaive(t *testing.T) {
	ns := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 17}
	rowsList := []int{1, 4, 7, 130, 257}
	colsList := []int{1, 8, 15, 16, 172, 300, 1024}
	type testCase struct {
		w        *Matrix
		n        int
		x, want  []float32
		mag      []float64
		firstGot []float32 // from the first kernel set, to compare the others with
	}
	for ki, k := range weightKinds {
		t.Run(k.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(ki), 1))
			var cases []*testCase
			for _, rows := range rowsList {
				for _, cols := range colsList {
					w := newMatrix(rng, k, rows, cols)
					for _, n := range ns {
						c := &testCase{w: w, n: n, x: randomVector(rng, n*cols), want: make([]float32, n*rows)}
						MatMulNaive(c.want, c.x, n, w)
						c.mag = magnitudes(c.x, n, w)
						cases = append(cases, c)
					}
				}
			}
			failures := 0
			for si, ks := range kernelSets() {
				for _, threads := range []int{1, 2} {
					p := newPool(threads, ks) // one at a time: idle workers poll
					for _, c := range cases {
						got := make([]float32, len(c.want))
						for i := range got {
							got[i] = float32(math.NaN()) // must be overwritten
						}
						p.MatMul(got, c.x, c.n, c.w)
						where := fmt.Sprintf("%s threads=%d n=%d %dx%d", ks.name, threads, c.n, c.w.Rows, c.w.Cols)
						if err := closeTo(got, c.want, c.mag); err != nil {
							t.Errorf("%s: %v", where, err)
							failures++
						}
						// The assembly and the portable kernels agree.
						if si == 0 && threads == 1 {
							c.firstGot = got
						} else if err := closeTo(got, c.firstGot, c.mag); err != nil {
							t.Errorf("%s vs %s: %v", where, kernelSets()[0].name, err)
							failures++
						}
						if failures > 10 {
							p.Close()
							t.Fatal("too many failures")
						}
					}
					p.Close()
				}
			}
		})
	}
}

// TestGemmKernels checks the small-batch kernels of every set that has
// them against the single-row dot kernels of the portable set, with x, W
// and out strides longer than the rows and every x row count they take.
func TestGemmKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for _, ks := range kernelSets() {
		if ks.fp8Gemm == nil {
			continue
		}
		for _, k := range []weightKind{weightKinds[0], weightKinds[1], weightKinds[2]} {
			for _, rows := range []int{1, 4, 7, 13} {
				for _, cols := range []int{1, 15, 16, 17, 172, 300} {
					for nx := 1; nx <= 4; nx++ {
						xs, ws, os := cols+3, cols+2, rows+5
						w := newMatrix(rng, k, rows, ws)
						x := randomVector(rng, nx*xs)
						got := make([]float32, nx*os)
						want := make([]float32, nx*os)
						for i := range got {
							got[i], want[i] = 42, 42 // outside the products: must stay
						}
						mag := make([]float64, nx*os)
						for r := 0; r < rows; r++ {
							for c := 0; c < nx; c++ {
								xt := x[c*xs : c*xs+cols]
								switch k.dt {
								case dtype.F32:
									want[c*os+r] = dotGo(xt, w.F32[r*ws:r*ws+cols])
								case dtype.BF16:
									want[c*os+r] = bf16DotGo(xt, w.BF16[r*ws:r*ws+cols])
								default:
									want[c*os+r] = fp8DotGo(xt, w.FP8[r*ws:r*ws+cols])
								}
								for j, v := range xt {
									var wv float32
									switch k.dt {
									case dtype.F32:
										wv = w.F32[r*ws+j]
									case dtype.BF16:
										wv = dtype.BF16ToF32(w.BF16[r*ws+j])
									default:
										wv = fp8Raw[w.FP8[r*ws+j]]
									}
									mag[c*os+r] += math.Abs(float64(v) * float64(wv))
								}
							}
						}
						switch k.dt {
						case dtype.F32:
							ks.f32Gemm(x, xs, nx, w.F32, ws, cols, rows, got, os)
						case dtype.BF16:
							ks.bf16Gemm(x, xs, nx, w.BF16, ws, cols, rows, got, os)
						default:
							// Raw products, at 1/fp8Unit, as the want above.
							ks.fp8Gemm(x, xs, nx, w.FP8, ws, cols, rows, got, os)
						}
						if err := closeTo(got, want, mag); err != nil {
							t.Fatalf("%s %s nx=%d %dx%d: %v", ks.name, k.name, nx, rows, cols, err)
						}
					}
				}
			}
		}
	}
}

// TestMatMulBatchInvariant checks that each x row's products are bit for
// bit the same whether it is multiplied alone or in a batch, on every
// kernel set (the continuous batching engine relies on it for greedy
// decoding to not depend on load).
func TestMatMulBatchInvariant(t *testing.T) {
	for _, ks := range kernelSets() {
		t.Run(ks.name, func(t *testing.T) { testBatchInvariant(t, ks) })
	}
}

func testBatchInvariant(t *testing.T, ks *Set) {
	rng := rand.New(rand.NewPCG(6, 6))
	{
		for _, k := range weightKinds {
			for _, shape := range [][2]int{{7, 172}, {130, 300}, {257, 64}, {9, 1031}, {5, 2900}} {
				rows, cols := shape[0], shape[1]
				w := newMatrix(rng, k, rows, cols)
				for _, n := range []int{2, 3, 4, 5, 6, 7, 8, 9, 17, 70} {
					for _, threads := range []int{1, 2} {
						p := newPool(threads, ks)
						x := randomVector(rng, n*cols)
						batch := make([]float32, n*rows)
						p.MatMul(batch, x, n, w)
						alone := make([]float32, rows)
						for r := 0; r < n; r++ {
							p.MatMul(alone, x[r*cols:(r+1)*cols], 1, w)
							for i, v := range alone {
								if got := batch[r*rows+i]; math.Float32bits(got) != math.Float32bits(v) {
									p.Close()
									t.Fatalf("%s %s %dx%d n=%d threads=%d: row %d out[%d] = %g batched, %g alone",
										ks.name, k.name, rows, cols, n, threads, r, i, got, v)
								}
							}
						}
						p.Close()
					}
				}
			}
		}
	}
}

func TestMatMulBlocking(t *testing.T) {
	// Enough x to exceed xBlockBytes: it is split into several x blocks
	// (on sets with xStationary, only at 2900 columns, too many for a group
	// of W rows). Rows = 9 leaves a row after the 4-row tiles, n = 133 an x
	// row after the 4x4 tiles.
	const n, rows = 133, 9
	for _, cols := range []int{2085, 2900} {
		if n*cols*4 <= xBlockBytes {
			t.Fatal("shape does not exercise blocking")
		}
	}
	if wGroupRows(&Set{xStationary: true}, 2900) != 0 {
		t.Fatal("2900 columns fit a group of W rows")
	}
	for ki, k := range []weightKind{weightKinds[0], weightKinds[1], weightKinds[2], weightKinds[5]} {
		for _, ks := range kernelSets() {
			for _, cols := range []int{2085, 2900} {
				t.Run(fmt.Sprintf("%s/%s/cols=%d", k.name, ks.name, cols), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(ki), 2))
					w := newMatrix(rng, k, rows, cols)
					x := randomVector(rng, n*cols)
					want := make([]float32, n*rows)
					MatMulNaive(want, x, n, w)
					got := make([]float32, n*rows)
					p := newPool(2, ks)
					defer p.Close()
					p.MatMul(got, x, n, w)
					if err := closeTo(got, want, magnitudes(x, n, w)); err != nil {
						t.Error(err)
					}
				})
			}
		}
	}
}

func TestDequantizeRow(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, k := range weightKinds {
		w := newMatrix(rng, k, 5, 300)
		dst := make([]float32, 301)
		for i := 0; i < w.Rows; i++ {
			dst[300] = 99
			if err := w.DequantizeRow(dst, i); err != nil {
				t.Fatalf("%s: DequantizeRow(%d) = %v", k.name, i, err)
			}
			for j := 0; j < w.Cols; j++ {
				if dst[j] != w.At(i, j) {
					t.Fatalf("%s: row %d col %d = %g, want %g", k.name, i, j, dst[j], w.At(i, j))
				}
			}
			if dst[300] != 99 {
				t.Fatalf("%s: DequantizeRow wrote past Cols", k.name)
			}
		}
	}
	w := newMatrix(rng, weightKinds[0], 5, 3)
	for _, tc := range []struct {
		dst  []float32
		row  int
		want string
	}{
		{make([]float32, 3), 5, "row out of range"},
		{make([]float32, 3), -1, "row out of range"},
		{make([]float32, 2), 0, "dst has 2 elements"},
	} {
		if err := w.DequantizeRow(tc.dst, tc.row); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("DequantizeRow(len %d, %d) = %v, want an error containing %q", len(tc.dst), tc.row, err, tc.want)
		}
	}
	if err := (&Matrix{Rows: 1, Cols: 1, DType: dtype.F16}).DequantizeRow(make([]float32, 1), 0); err == nil {
		t.Error("DequantizeRow on an F16 matrix succeeded")
	}
}

func TestMatMulLeavesRestOfOut(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	w := newMatrix(rng, weightKinds[0], 5, 7)
	x := randomVector(rng, 2*7)
	out := make([]float32, 2*5+3)
	for i := range out {
		out[i] = 42
	}
	NewPool(1).MatMul(out, x, 2, w)
	for i := 10; i < len(out); i++ {
		if out[i] != 42 {
			t.Errorf("out[%d] = %g, MatMul wrote past n*Rows", i, out[i])
		}
	}
}

func TestMatMulZeroRows(t *testing.T) {
	w := &Matrix{Rows: 2, Cols: 3, DType: dtype.F32, F32: make([]float32, 6)}
	var p *Pool // a nil pool runs on the caller
	p.MatMul(nil, nil, 0, w)
	if p.Threads() != 1 {
		t.Errorf("nil pool Threads() = %d, want 1", p.Threads())
	}
}

func TestMatMulPanicsOnBadArguments(t *testing.T) {
	w := &Matrix{Rows: 2, Cols: 3, DType: dtype.F32, F32: make([]float32, 6)}
	tests := []struct {
		name   string
		out, x []float32
		n      int
		w      *Matrix
		want   string
	}{
		{"short x", make([]float32, 4), make([]float32, 5), 2, w, "x has 5 elements"},
		{"short out", make([]float32, 3), make([]float32, 6), 2, w, "out has 3 elements"},
		{"negative n", nil, nil, -1, w, "negative"},
		{"invalid matrix", make([]float32, 2), make([]float32, 3), 1, &Matrix{Rows: 2, Cols: 3, DType: dtype.F32}, "F32 has 0 elements"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckMatMul(tc.out, tc.x, tc.n, tc.w)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("CheckMatMul error = %v, want one containing %q", err, tc.want)
			}
			for name, f := range map[string]func(){
				"MatMul":      func() { NewPool(1).MatMul(tc.out, tc.x, tc.n, tc.w) },
				"MatMulNaive": func() { MatMulNaive(tc.out, tc.x, tc.n, tc.w) },
			} {
				func() {
					defer func() {
						r := recover()
						if r == nil || !strings.Contains(fmt.Sprint(r), tc.want) {
							t.Errorf("%s panic = %v, want one containing %q", name, r, tc.want)
						}
					}()
					f()
				}()
			}
		})
	}
}

func TestValidate(t *testing.T) {
	fp8 := func(rows, cols, br, bc, nscales int) *Matrix {
		return &Matrix{Rows: rows, Cols: cols, DType: dtype.F8E4M3, FP8: make([]uint8, rows*cols),
			Scales: make([]float32, nscales), BlockRows: br, BlockCols: bc}
	}
	tests := []struct {
		name string
		m    *Matrix
		want string // "" means valid
	}{
		{"f32", &Matrix{Rows: 2, Cols: 3, DType: dtype.F32, F32: make([]float32, 6)}, ""},
		{"bf16 longer slice", &Matrix{Rows: 2, Cols: 3, DType: dtype.BF16, BF16: make([]uint16, 7)}, ""},
		{"fp8 per tensor", fp8(4, 5, 0, 0, 1), ""},
		{"fp8 per row", fp8(4, 5, 0, 0, 4), ""},
		{"fp8 blocks", fp8(300, 130, 128, 128, 3*2), ""},
		{"nil", nil, "nil"},
		{"zero rows", &Matrix{Rows: 0, Cols: 3, DType: dtype.F32}, "must be positive"},
		{"negative cols", &Matrix{Rows: 1, Cols: -3, DType: dtype.F32}, "must be positive"},
		{"huge", &Matrix{Rows: 1 << 31, Cols: 1 << 31, DType: dtype.F32}, "too many"},
		{"unsupported dtype", &Matrix{Rows: 1, Cols: 1, DType: dtype.F16}, "not supported"},
		{"short f32", &Matrix{Rows: 2, Cols: 3, DType: dtype.F32, F32: make([]float32, 5)}, "F32 has 5 elements, want at least 6"},
		{"short bf16", &Matrix{Rows: 2, Cols: 3, DType: dtype.BF16, F32: make([]float32, 6)}, "BF16 has 0 elements"},
		{"short fp8", &Matrix{Rows: 2, Cols: 3, DType: dtype.F8E4M3, FP8: make([]uint8, 5), Scales: []float32{1}}, "FP8 has 5 elements"},
		{"no scales", fp8(4, 5, 0, 0, 0), "want 1 (per tensor) or 4 (per row)"},
		{"wrong scale count", fp8(4, 5, 0, 0, 3), "Scales has 3 elements"},
		{"negative block", fp8(4, 5, -1, 2, 1), "must not be negative"},
		{"half a block size", fp8(4, 5, 2, 0, 1), "must be set together"},
		{"wrong block scale count", fp8(300, 130, 128, 128, 4), "Scales has 4 elements, want 6"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.m.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestAtDequantises(t *testing.T) {
	m := &Matrix{Rows: 3, Cols: 4, DType: dtype.F8E4M3, FP8: make([]uint8, 12),
		BlockRows: 2, BlockCols: 3, Scales: []float32{1, 2, 3, 4}}
	for i := range m.FP8 {
		m.FP8[i] = 0x38 // 1.0
	}
	want := [3][4]float32{{1, 1, 1, 2}, {1, 1, 1, 2}, {3, 3, 3, 4}}
	for i := range 3 {
		for j := range 4 {
			if got := m.At(i, j); got != want[i][j] {
				t.Errorf("At(%d, %d) = %g, want %g", i, j, got, want[i][j])
			}
		}
	}
	if got := m.WeightBytes(); got != 12 {
		t.Errorf("WeightBytes() = %d, want 12", got)
	}
}

// TestMatMulSplitInvariant checks that a product's rows come out bit for bit
// the same whether x is multiplied in one call or split into calls of any
// size, on every kernel set: the engine's greedy output must not depend on
// how continuous batching grouped tokens into steps. The sizes cross every
// path (one row, small batches, 4x4 tiles, x blocks, rows past the last
// quad, columns past the last vector).
func TestMatMulSplitInvariant(t *testing.T) {
	if testing.Short() {
		t.Skip("a few seconds of products; slow under the race detector")
	}
	for _, ks := range kernelSets() {
		t.Run(ks.name, func(t *testing.T) { testSplitInvariant(t, ks) })
	}
}

func testSplitInvariant(t *testing.T, ks *Set) {
	rng := rand.New(rand.NewPCG(3, 4))
	{
		p := newPool(2, ks)
		for _, k := range weightKinds {
			for _, shape := range [][2]int{{64, 172}, {132, 768}, {36, 2048}, {20, 3000}, {7, 1037}} {
				rows, cols := shape[0], shape[1]
				w := newMatrix(rng, k, rows, cols)
				const n = 200
				x := randomVector(rng, n*cols)
				all := make([]float32, n*rows)
				p.MatMul(all, x, n, w)
			chunks:
				for _, chunk := range []int{1, 3, 40, 65, 171, 199} {
					for t0 := 0; t0 < n; t0 += chunk {
						m := min(chunk, n-t0)
						out := make([]float32, m*rows)
						p.MatMul(out, x[t0*cols:], m, w)
						for i, v := range out {
							if v != all[t0*rows+i] {
								t.Errorf("%s %s %dx%d: row %d output %d is %v in a call of %d rows, %v in one of %d",
									ks.name, k.name, rows, cols, t0+i/rows, i%rows, v, m, all[t0*rows+i], n)
								break chunks
							}
						}
					}
				}
			}
		}
		p.Close()
	}
}

// TestWidenedTilesMatchDecodedTiles checks what Set.widenTiles relies on:
// widening BF16 and FP8 rows into F32 and running the F32 tiles gives the
// same bits as the set's tiles that decode W in registers.
func TestWidenedTilesMatchDecodedTiles(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	for _, ks := range kernelSets() {
		if !ks.widenTiles {
			continue
		}
		decoded := *ks
		decoded.widenTiles = false
		for _, k := range weightKinds[1:] {
			for _, shape := range [][3]int{{70, 130, 300}, {133, 9, 1031}} {
				n, rows, cols := shape[0], shape[1], shape[2]
				w := newMatrix(rng, k, rows, cols)
				x := randomVector(rng, n*cols)
				got, want := make([]float32, n*rows), make([]float32, n*rows)
				p, q := newPool(2, ks), newPool(2, &decoded)
				p.MatMul(got, x, n, w)
				q.MatMul(want, x, n, w)
				p.Close()
				q.Close()
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%s %s n=%d %dx%d: out[%d] = %v widened, %v decoded in registers", ks.name, k.name, n, rows, cols, i, got[i], want[i])
					}
				}
			}
		}
	}
}
