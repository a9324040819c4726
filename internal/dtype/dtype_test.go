package dtype

import (
	"math"
	"testing"
)

func TestParseRoundTrip(t *testing.T) {
	for d := F64; d <= Bool; d++ {
		got, err := Parse(d.String())
		if err != nil || got != d {
			t.Fatalf("Parse(%q) = %v, %v", d.String(), got, err)
		}
		if d.Size() == 0 {
			t.Fatalf("%v has no size", d)
		}
	}
	if _, err := Parse("F7"); err == nil {
		t.Fatal("Parse accepted an unknown dtype")
	}
}

func TestE4M3Exhaustive(t *testing.T) {
	for i := 0; i < 256; i++ {
		b := uint8(i)
		f := E4M3ToF32(b)
		if b&0x7f == 0x7f {
			if !math.IsNaN(float64(f)) {
				t.Fatalf("%#x decodes to %v, want NaN", b, f)
			}
			continue
		}
		if got := F32ToE4M3(f); got != b && !(f == 0 && got&0x7f == 0) {
			t.Fatalf("round trip %#x -> %v -> %#x", b, f, got)
		}
	}
	if E4M3ToF32(0x7e) != 448 || E4M3ToF32(0x01) != 1.0/512 {
		t.Fatal("decode of max or min subnormal is wrong")
	}
}

func TestF32ToE4M3Rounding(t *testing.T) {
	cases := []struct {
		in   float32
		want uint8
	}{
		{0, 0x00},
		{1, 0x38},
		{-1, 0xb8},
		{448, 0x7e},
		{1000, 0x7e},
		{float32(math.Inf(-1)), 0xfe},
		{float32(math.NaN()), 0x7f},
		{1.0625, 0x38},       // halfway between 1 and 1.125: ties to even (1)
		{1.1875, 0x3a},       // halfway between 1.125 and 1.25: ties to even (1.25)
		{464, 0x7e},          // halfway to 480: saturates
		{1.0 / 1024, 0},      // half the smallest subnormal: ties to even (0)
		{3.0 / 1024, 2},      // 1.5 units of 2^-9: ties to even (2)
		{0.0146484375, 0x08}, // 7.5 units of 2^-9 rounds up to min normal 2^-6
	}
	for _, c := range cases {
		if got := F32ToE4M3(c.in); got != c.want {
			t.Errorf("F32ToE4M3(%v) = %#x, want %#x", c.in, got, c.want)
		}
	}
}

func TestE4M3IsNearest(t *testing.T) {
	// Every float in a dense sweep must map to a code no farther than any other.
	for v := float32(-500); v <= 500; v += 0.013 {
		got := E4M3ToF32(F32ToE4M3(v))
		clamped := float32(math.Max(-E4M3Max, math.Min(E4M3Max, float64(v))))
		best := float32(math.Inf(1))
		for i := 0; i < 256; i++ {
			if f := E4M3ToF32(uint8(i)); !math.IsNaN(float64(f)) {
				best = min(best, abs(f-clamped))
			}
		}
		if abs(got-clamped) > best {
			t.Fatalf("%v -> %v, but a code %v away exists", v, got, best)
		}
	}
}

func TestBF16AndF16(t *testing.T) {
	for _, v := range []float32{0, 1, -2.5, 3.140625, 65504, 1e-7, 6e-5} {
		if got := BF16ToF32(F32ToBF16(v)); abs(got-v) > abs(v)/128 {
			t.Errorf("bf16 round trip %v -> %v", v, got)
		}
		if got := F16ToF32(F32ToF16(v)); abs(got-v) > abs(v)/1024+1.0/(1<<24) {
			t.Errorf("f16 round trip %v -> %v", v, got)
		}
	}
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		f := F16ToF32(h)
		if math.IsNaN(float64(f)) {
			continue
		}
		if got := F32ToF16(f); got != h {
			t.Fatalf("f16 %#x -> %v -> %#x", h, f, got)
		}
		if got := F32ToBF16(BF16ToF32(h)); got != h && !math.IsNaN(float64(BF16ToF32(h))) {
			t.Fatalf("bf16 %#x -> %#x", h, got)
		}
	}
	if F32ToBF16(1+1.0/256) != 0x3f80 || F32ToBF16(1+3.0/256) != 0x3f82 {
		t.Fatal("bf16 ties are not to even")
	}
}

func abs(f float32) float32 { return float32(math.Abs(float64(f))) }

func TestFloat32Conversions(t *testing.T) {
	in := []float32{0, 1, -2, 0.5, 448}
	for _, d := range []DType{F32, BF16, F16, F8E4M3} {
		b, err := FromFloat32(d, in)
		if err != nil {
			t.Fatalf("%v: %v", d, err)
		}
		if len(b) != len(in)*d.Size() {
			t.Fatalf("%v: %d bytes", d, len(b))
		}
		out, err := ToFloat32(d, b)
		if err != nil {
			t.Fatalf("%v: %v", d, err)
		}
		for i := range in {
			if out[i] != in[i] {
				t.Fatalf("%v: %v -> %v", d, in[i], out[i])
			}
		}
	}
	if _, err := ToFloat32(F32, make([]byte, 5)); err == nil {
		t.Fatal("accepted a partial element")
	}
	if _, err := ToFloat32(I32, make([]byte, 4)); err == nil {
		t.Fatal("accepted an integer dtype")
	}
}
