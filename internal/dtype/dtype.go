// Package dtype names the element types that checkpoints and kernels share
// and converts single values between them and float32.
package dtype

import (
	"encoding/binary"
	"fmt"
	"math"
)

// DType is the element type of a tensor.
type DType uint8

// The element types stoke understands. Only F32, BF16, F16 and F8E4M3 carry
// model weights; the others are accepted so that any valid safetensors file
// can be read.
const (
	Invalid DType = iota
	F64
	F32
	F16
	BF16
	F8E4M3
	F8E5M2
	I64
	I32
	I16
	I8
	U8
	Bool
)

var names = [...]string{
	Invalid: "INVALID",
	F64:     "F64",
	F32:     "F32",
	F16:     "F16",
	BF16:    "BF16",
	F8E4M3:  "F8_E4M3",
	F8E5M2:  "F8_E5M2",
	I64:     "I64",
	I32:     "I32",
	I16:     "I16",
	I8:      "I8",
	U8:      "U8",
	Bool:    "BOOL",
}

var sizes = [...]int{
	F64: 8, F32: 4, F16: 2, BF16: 2, F8E4M3: 1, F8E5M2: 1,
	I64: 8, I32: 4, I16: 2, I8: 1, U8: 1, Bool: 1,
}

// Parse returns the DType for a safetensors dtype name such as "F8_E4M3".
func Parse(name string) (DType, error) {
	for d, n := range names {
		if d != int(Invalid) && n == name {
			return DType(d), nil
		}
	}
	return Invalid, fmt.Errorf("unknown dtype %q", name)
}

// String returns the safetensors name of d.
func (d DType) String() string {
	if int(d) < len(names) {
		return names[d]
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// Size is the number of bytes one element of d occupies (0 for Invalid).
func (d DType) Size() int {
	if int(d) < len(sizes) {
		return sizes[d]
	}
	return 0
}

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool {
	switch d {
	case F64, F32, F16, BF16, F8E4M3, F8E5M2:
		return true
	}
	return false
}

// BF16ToF32 widens a bfloat16 bit pattern to float32 exactly.
func BF16ToF32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// F32ToBF16 rounds f to the nearest bfloat16, ties to even; NaN stays NaN.
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// F16ToF32 widens an IEEE half-precision bit pattern to float32 exactly.
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	default:
		f := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	}
}

// F32ToF16 rounds f to the nearest IEEE half, ties to even, overflowing to
// infinity.
func F32ToF16(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	a := u & 0x7fffffff
	switch {
	case a > 0x7f800000:
		return sign | 0x7e00
	case a >= 0x477ff000: // rounds to 65536 or more
		return sign | 0x7c00
	case a >= 0x38800000: // normal half
		a += 0xfff + (a>>13)&1
		return sign | uint16((a-(112<<23))>>13)
	default: // subnormal half or zero: scale so the units are 2^-24
		v := math.Float32frombits(a) * (1 << 24)
		return sign | uint16(roundEven(v))
	}
}

// E4M3 is the largest finite float8 E4M3FN magnitude.
const E4M3Max = 448.0

var e4m3Table = func() (t [256]float32) {
	for i := range t {
		t[i] = decodeE4M3(uint8(i))
	}
	return t
}()

func decodeE4M3(b uint8) float32 {
	exp := int(b>>3) & 0xf
	mant := float64(b & 7)
	var v float64
	switch {
	case b&0x7f == 0x7f:
		return float32(math.NaN())
	case exp == 0:
		v = mant / 8 * math.Ldexp(1, -6)
	default:
		v = (1 + mant/8) * math.Ldexp(1, exp-7)
	}
	if b&0x80 != 0 {
		v = -v
	}
	return float32(v)
}

// E4M3ToF32 decodes a float8 E4M3FN value (0x7F and 0xFF are NaN).
func E4M3ToF32(b uint8) float32 { return e4m3Table[b] }

// E4M3Table returns the decoded value of every float8 E4M3FN bit pattern,
// for kernels that dequantise by lookup.
func E4M3Table() *[256]float32 { return &e4m3Table }

// F32ToE4M3 rounds f to the nearest float8 E4M3FN value, ties to even,
// saturating at ±448; NaN becomes 0x7F (0xFF when negative).
func F32ToE4M3(f float32) uint8 {
	u := math.Float32bits(f)
	var sign uint8
	if u&0x80000000 != 0 {
		sign = 0x80
	}
	a := math.Float32frombits(u & 0x7fffffff)
	switch {
	case a != a:
		return sign | 0x7f
	case a >= E4M3Max:
		return sign | 0x7e
	case a < 1.0/64: // subnormal range: units of 2^-9
		return sign | uint8(roundEven(a*512))
	}
	// Normal: keep 3 mantissa bits, ties to even, on the float32 pattern.
	bits := math.Float32bits(a)
	bits += 0x7ffff + (bits>>20)&1
	exp := int(bits>>23) - 127 + 7
	mant := (bits >> 20) & 7
	if exp > 15 || (exp == 15 && mant == 7) {
		return sign | 0x7e
	}
	return sign | uint8(exp)<<3 | uint8(mant)
}

func roundEven(v float32) float32 { return float32(math.RoundToEven(float64(v))) }

// ToFloat32 decodes little-endian elements of a float dtype into float32.
func ToFloat32(d DType, data []byte) ([]float32, error) {
	size := d.Size()
	if size == 0 || len(data)%size != 0 {
		return nil, fmt.Errorf("%d bytes are not a whole number of %v elements", len(data), d)
	}
	out := make([]float32, len(data)/size)
	switch d {
	case F32:
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
	case BF16:
		for i := range out {
			out[i] = BF16ToF32(binary.LittleEndian.Uint16(data[2*i:]))
		}
	case F16:
		for i := range out {
			out[i] = F16ToF32(binary.LittleEndian.Uint16(data[2*i:]))
		}
	case F8E4M3:
		for i, b := range data {
			out[i] = e4m3Table[b]
		}
	default:
		return nil, fmt.Errorf("dtype %v cannot be read as float32", d)
	}
	return out, nil
}

// FromFloat32 encodes float32 values as little-endian elements of d.
func FromFloat32(d DType, v []float32) ([]byte, error) {
	out := make([]byte, len(v)*d.Size())
	switch d {
	case F32:
		for i, f := range v {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(f))
		}
	case BF16:
		for i, f := range v {
			binary.LittleEndian.PutUint16(out[2*i:], F32ToBF16(f))
		}
	case F16:
		for i, f := range v {
			binary.LittleEndian.PutUint16(out[2*i:], F32ToF16(f))
		}
	case F8E4M3:
		for i, f := range v {
			out[i] = F32ToE4M3(f)
		}
	default:
		return nil, fmt.Errorf("dtype %v cannot be written from float32", d)
	}
	return out, nil
}
