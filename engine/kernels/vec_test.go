package kernels

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stokehq/stoke/internal/dtype"
)

var vectorLengths = []int{0, 1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 64, 65, 100, 127, 129, 1000, 1023}

func TestDot(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	for _, n := range vectorLengths {
		a, b := randomVector(rng, n), randomVector(rng, n+3)
		var want, mag float64
		for i := range n {
			want += float64(a[i]) * float64(b[i])
			mag += math.Abs(float64(a[i]) * float64(b[i]))
		}
		if got := NewPool(1).Dot(a, b); math.Abs(float64(got)-want) > 1e-5*mag+1e-30 {
			t.Errorf("Dot(len %d) = %g, want %g", n, got, want)
		}
		for _, ks := range kernelSets() {
			if n == 0 {
				continue
			}
			if got := ks.dot(a, b[:n]); math.Abs(float64(got)-want) > 1e-5*mag+1e-30 {
				t.Errorf("%s dot(len %d) = %g, want %g", ks.name, n, got, want)
			}
		}
	}
}

func TestAXPYAndScale(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	for _, n := range vectorLengths {
		x, y := randomVector(rng, n), randomVector(rng, n+5)
		const alpha = float32(-1.75)
		want := make([]float32, len(y))
		for i := range y {
			want[i] = y[i]
			if i < n {
				want[i] = y[i] + alpha*x[i]
			}
		}
		got := append([]float32(nil), y...)
		NewPool(1).AXPY(got, alpha, x)
		for i := range got {
			if math.Abs(float64(got[i]-want[i])) > 1e-6 {
				t.Fatalf("AXPY(len %d): y[%d] = %g, want %g", n, i, got[i], want[i])
			}
		}
		got = append([]float32(nil), y[:n]...)
		NewPool(1).Scale(got, alpha)
		for i := range got {
			if got[i] != alpha*y[i] {
				t.Fatalf("Scale(len %d): y[%d] = %g, want %g", n, i, got[i], alpha*y[i])
			}
		}
		if n == 0 {
			continue
		}
		for _, ks := range kernelSets() {
			got = append([]float32(nil), y[:n]...)
			ks.axpy(got, alpha, x)
			for i := range got {
				if math.Abs(float64(got[i]-want[i])) > 1e-6 {
					t.Fatalf("%s axpy(len %d): y[%d] = %g, want %g", ks.name, n, i, got[i], want[i])
				}
			}
			got = append([]float32(nil), y[:n]...)
			ks.scale(got, alpha)
			for i := range got {
				if got[i] != alpha*y[i] {
					t.Fatalf("%s scale(len %d): y[%d] = %g, want %g", ks.name, n, i, got[i], alpha*y[i])
				}
			}
			got = make([]float32, n+1)
			got[n] = 42
			ks.scaleTo(got[:n], y[:n], alpha)
			for i := range n {
				if got[i] != alpha*y[i] {
					t.Fatalf("%s scaleTo(len %d): dst[%d] = %g, want %g", ks.name, n, i, got[i], alpha*y[i])
				}
			}
			if got[n] != 42 {
				t.Fatalf("%s scaleTo(len %d) wrote past dst", ks.name, n)
			}
		}
	}
}

func TestFP8DecodeIsExact(t *testing.T) {
	// Every byte at every position of a whole step of the assembly's
	// loops, and lengths that end in its shorter loops and the Go tail.
	for _, n := range []int{256, 8, 40, 283} {
		src := make([]uint8, n)
		for i := range src {
			src[i] = uint8(i*37 + n)
		}
		for _, ks := range kernelSets() {
			for _, mul := range []float32{fp8Unit, fp8Unit * 0.37} {
				dst := make([]float32, n+1)
				dst[n] = 42
				ks.fp8ToF32(dst[:n], src, mul)
				for i, got := range dst[:n] {
					if src[i]&0x7f == 0x7f {
						continue // NaN codes: not used by quantised weights
					}
					if want := dtype.E4M3ToF32(src[i]) * (mul / fp8Unit); got != want {
						t.Errorf("%s fp8ToF32(%#02x at %d of %d, mul %g) = %g, want %g", ks.name, src[i], i, n, mul, got, want)
					}
				}
				if dst[n] != 42 {
					t.Errorf("%s fp8ToF32(len %d) wrote past dst", ks.name, n)
				}
			}
		}
	}
	for _, ks := range []*Set{avx512Kernels, avx2Kernels} {
		if ks == nil {
			continue
		}
		nan := []uint8{0x7f, 0xff, 0x7f, 0xff, 0x7f, 0xff, 0x7f, 0xff} // a whole AVX2 vector
		dst := make([]float32, len(nan))
		ks.fp8ToF32(dst, nan, fp8Unit)
		if dst[0] != 480 || dst[1] != -480 {
			t.Errorf("%s decodes NaN codes as %g, %g; the documented value is ±480", ks.name, dst[0], dst[1])
		}
	}
}

// TestFP8KernelsDecodeToNormals checks that every FP8 kernel multiplies x
// by the weight at 1/fp8Unit of its value, and that no such value is a
// float32 subnormal: an FMA with a subnormal operand takes a microcode
// assist on Intel cores, which made decoding random bytes (5% of them
// subnormal) 14 times slower when the kernels decoded at 2^-120.
func TestFP8KernelsDecodeToNormals(t *testing.T) {
	for b := range 256 {
		if v := fp8Raw[b]; v != 0 && math.Abs(float64(v)) < 0x1p-126 {
			t.Fatalf("E4M3 %#02x decodes to %g, a float32 subnormal", b, v)
		}
	}
	// Four rows holding every byte (37 is odd) but the NaN codes, at
	// whole vectors of both assembly sets and a tail; a one-hot x picks
	// column j of each.
	const k = 264
	w := make([]uint8, 4*k)
	for i := range w {
		if w[i] = uint8(i*37 + 5); w[i]&0x7f == 0x7f {
			w[i] = 0x81 // a subnormal too: -2^-9
		}
	}
	for _, ks := range kernelSets() {
		kernels := map[string]func(x, out []float32){
			"dot1x4": func(x, out []float32) { ks.fp8Dot1x4(x, w, k, k, out) },
		}
		if ks.fp8Dot4x4 != nil {
			kernels["dot4x4"] = func(x, out []float32) {
				var x4 [4 * k]float32
				copy(x4[:], x)
				var o [16]float32
				ks.fp8Dot4x4(x4[:], k, w, k, k, o[:], 4)
				copy(out, o[:4])
			}
		}
		if ks.fp8Gemv != nil {
			kernels["gemv"] = func(x, out []float32) { ks.fp8Gemv(x, w, k, k, 4, out) }
		}
		if ks.fp8Gemm != nil {
			kernels["gemm"] = func(x, out []float32) { ks.fp8Gemm(x, k, 1, w, k, k, 4, out, 4) }
		}
		for name, kern := range kernels {
			for j := range k {
				x := make([]float32, k)
				x[j] = 1
				out := make([]float32, 4)
				kern(x, out)
				for r := range 4 {
					if want := fp8Raw[w[r*k+j]]; out[r] != want {
						t.Fatalf("%s fp8 %s: column %d of row %d (%#02x) gives %g, want %g", ks.name, name, j, r, w[r*k+j], out[r], want)
					}
				}
			}
		}
	}
}

func TestBF16DecodeIsExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	for _, n := range vectorLengths {
		src := make([]uint16, n)
		for i := range src {
			src[i] = uint16(rng.UintN(1 << 16))
		}
		for _, ks := range kernelSets() {
			dst := make([]float32, n+1)
			dst[n] = 7
			ks.bf16ToF32(dst[:n], src)
			for i, b := range src {
				if math.Float32bits(dst[i]) != math.Float32bits(dtype.BF16ToF32(b)) {
					t.Fatalf("%s bf16ToF32(%#04x) = %g, want %g", ks.name, b, dst[i], dtype.BF16ToF32(b))
				}
			}
			if dst[n] != 7 {
				t.Fatalf("%s bf16ToF32(len %d) wrote past the end", ks.name, n)
			}
		}
	}
}

// TestOneRowQuads checks what rows past the last quad rely on: a 1x4
// tile of one row repeated (stride 0) sums that row exactly as a quad that
// holds it does, in every position of the quad, for every weight type.
func TestOneRowQuads(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for _, n := range vectorLengths[1:] {
		x := randomVector(rng, n)
		for _, k := range []weightKind{weightKinds[0], weightKinds[1], weightKinds[2]} {
			w := newMatrix(rng, k, 4, n)
			for _, ks := range kernelSets() {
				var quad [4]float32
				one := func(r int) (got [4]float32) {
					switch k.dt {
					case dtype.F32:
						ks.f32Dot1x4(x, w.F32[r*n:], 0, n, got[:])
					case dtype.BF16:
						ks.bf16Dot1x4(x, w.BF16[r*n:], 0, n, got[:])
					default:
						ks.fp8Dot1x4(x, w.FP8[r*n:], 0, n, got[:])
					}
					return got
				}
				switch k.dt {
				case dtype.F32:
					ks.f32Dot1x4(x, w.F32, n, n, quad[:])
				case dtype.BF16:
					ks.bf16Dot1x4(x, w.BF16, n, n, quad[:])
				default:
					ks.fp8Dot1x4(x, w.FP8, n, n, quad[:])
				}
				for r := range 4 {
					got := one(r)
					for c, v := range got {
						if math.Float32bits(v) != math.Float32bits(quad[r]) {
							t.Fatalf("%s %s len %d: row %d alone gives %v in lane %d, %v in its quad", ks.name, k.name, n, r, v, c, quad[r])
						}
					}
				}
			}
		}
	}
}

func TestMulRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	cases := []struct{ nx, nw, k int }{
		{1, 1, 1}, {1, 16, 64}, {3, 16, 8}, {4, 5, 64}, {5, 16, 17}, {9, 64, 300}, {21, 3, 1000}, {2, 7, 0},
	}
	for _, c := range cases {
		// Rows of x, w and out sit at strides wider than they are, as
		// queries, cached keys and score rows do.
		xs, ws, os := c.k+3, c.k+5, c.nw+2
		x := randomVector(rng, c.nx*xs)
		w := randomVector(rng, c.nw*ws)
		for _, ks := range kernelSets() {
			out := make([]float32, c.nx*os)
			for i := range out {
				out[i] = 42
			}
			mulRows(ks, out, os, x, xs, c.nx, w, ws, c.nw, c.k)
			for tr := range c.nx {
				for r := range os {
					got := out[tr*os+r]
					if r >= c.nw {
						if got != 42 {
							t.Fatalf("%s %+v: out[%d][%d] = %g, outside the product but written", ks.name, c, tr, r, got)
						}
						continue
					}
					var want, mag float64
					for j := range c.k {
						p := float64(x[tr*xs+j]) * float64(w[r*ws+j])
						want += p
						mag += math.Abs(p)
					}
					if math.Abs(float64(got)-want) > 1e-5*mag+1e-30 {
						t.Fatalf("%s %+v: out[%d][%d] = %g, want %g", ks.name, c, tr, r, got, want)
					}
				}
			}
		}
	}
}

// TestMax checks every set's max against a plain loop, with the largest
// element in every position of the vector, its vector-wide blocks and its
// tail, among negatives and infinities.
func TestMax(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for _, n := range vectorLengths[1:] {
		x := make([]float32, n)
		for i := range x {
			x[i] = -rng.Float32()*100 - 1
		}
		if n > 3 {
			x[1] = float32(math.Inf(-1))
		}
		for at := range n {
			y := append([]float32(nil), x...)
			y[at] = -0.5
			for _, ks := range kernelSets() {
				if got := ks.max(y); got != -0.5 {
					t.Fatalf("%s max(len %d, largest at %d) = %g, want -0.5", ks.name, n, at, got)
				}
			}
		}
	}
	p := newPool(1, kernelSets()[0])
	defer p.Close()
	if got := p.Max(nil); !math.IsInf(float64(got), -1) {
		t.Fatalf("Max(nil) = %g, want -Inf", got)
	}
}

func TestExpSumAndSiLUMul(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	special := []float32{0, -0, 1, -1, 88, -87, -100, -1000, 90, 1e-8, -1e-8, 0.5, -0.5}
	for _, n := range vectorLengths {
		if n == 0 {
			continue
		}
		x := make([]float32, n)
		for i := range x {
			x[i] = (rng.Float32()*2 - 1) * 30
			if i < len(special) && n > 20 {
				x[i] = special[i]
			}
		}
		up := randomVector(rng, n)
		const shift = float32(2.5)
		for _, ks := range kernelSets() {
			got := append([]float32(nil), x...)
			sum := ks.expSum(got, shift)
			var wantSum float64
			for i, v := range x {
				want := math.Exp(float64(v - shift))
				wantSum += want
				if math.Abs(float64(got[i])-want) > 1e-6*want+1e-37 {
					t.Fatalf("%s expSum(len %d): exp(%g) = %g, want %g", ks.name, n, v-shift, got[i], want)
				}
			}
			if math.Abs(float64(sum)-wantSum) > 1e-5*wantSum {
				t.Fatalf("%s expSum(len %d) sum = %g, want %g", ks.name, n, sum, wantSum)
			}

			gate := append([]float32(nil), x...)
			ks.siluMul(gate, up)
			for i, g := range x {
				want := float64(g) / (1 + math.Exp(-float64(g))) * float64(up[i])
				if math.Abs(float64(gate[i])-want) > 1e-6*math.Abs(want)+1e-30 {
					t.Fatalf("%s siluMul(len %d): silu(%g)*%g = %g, want %g", ks.name, n, g, up[i], gate[i], want)
				}
			}
		}
	}
}

func TestAddWeightedRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for _, nr := range []int{1, 3, 4, 5, 9} {
		for _, n := range []int{1, 2, 16, 17} {
			for _, d := range []int{1, 8, 16, 17, 64, 80, 128, 130} {
				// Rows sit at strides wider than they are, as score
				// rows and cached values do.
				ps, vs, os := n+2, d+3, d+5
				p := randomVector(rng, nr*ps)
				v := randomVector(rng, n*vs)
				start := randomVector(rng, nr*os)
				for _, ks := range kernelSets() {
					out := append([]float32(nil), start...)
					ks.addWeighted(out, os, p, ps, nr, v, vs, n, d)
					// The same bits as one axpy per weight over the whole
					// row: whatever tiling a set uses, each output is the
					// same fused sum, whatever nr is.
					ref := append([]float32(nil), start...)
					addWeightedAXPY(ks.axpy, ref, os, p, ps, nr, v, vs, n, d)
					for i := range out {
						if math.Float32bits(out[i]) != math.Float32bits(ref[i]) {
							t.Fatalf("%s nr=%d n=%d d=%d: out[%d] = %v, one axpy per weight gives %v", ks.name, nr, n, d, i, out[i], ref[i])
						}
					}
					for r := range nr {
						for j := range os {
							got := out[r*os+j]
							if j >= d {
								if got != start[r*os+j] {
									t.Fatalf("%s nr=%d n=%d d=%d: out[%d][%d] outside the sum was written", ks.name, nr, n, d, r, j)
								}
								continue
							}
							want, mag := float64(start[r*os+j]), math.Abs(float64(start[r*os+j]))
							for q := range n {
								x := float64(p[r*ps+q]) * float64(v[q*vs+j])
								want += x
								mag += math.Abs(x)
							}
							if math.Abs(float64(got)-want) > 1e-5*mag+1e-30 {
								t.Fatalf("%s nr=%d n=%d d=%d: out[%d][%d] = %g, want %g", ks.name, nr, n, d, r, j, got, want)
							}
						}
					}
				}
			}
		}
	}
}

// TestMulRowsSplitInvariant checks the contract attention relies on: a
// product comes out bit for bit the same however the x rows are grouped
// into calls, and for every full quad of w rows however many follow.
func TestMulRowsSplitInvariant(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	for _, k := range []int{8, 16, 17, 64, 100} {
		x := randomVector(rng, 7*k)
		w := randomVector(rng, 16*k)
		for _, ks := range kernelSets() {
			all := make([]float32, 7*16)
			mulRows(ks, all, 16, x, k, 7, w, k, 16, k)
			for nx := 1; nx <= 7; nx++ {
				for start := 0; start+nx <= 7; start++ {
					for _, nw := range []int{4, 8, 12, 16} {
						out := make([]float32, nx*16)
						mulRows(ks, out, 16, x[start*k:], k, nx, w, k, nw, k)
						for r := range nx {
							for c := range nw {
								if out[r*16+c] != all[(start+r)*16+c] {
									t.Fatalf("%s k=%d: rows [%d,%d) against %d w rows give %v at (%d,%d), all at once %v",
										ks.name, k, start, start+nx, nw, out[r*16+c], start+r, c, all[(start+r)*16+c])
								}
							}
						}
					}
				}
			}
		}
	}
}
