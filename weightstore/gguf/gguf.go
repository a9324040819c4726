// Package gguf writes and reads GGUF files, the single-file model format of
// llama.cpp, and exports a Hugging Face Llama checkpoint directory to one.
//
// A GGUF file (version 3, little-endian) is a header ("GGUF", version,
// tensor count, metadata count), typed metadata key/value pairs, one info
// record per tensor (name, dimensions innermost first, ggml type, offset
// into the data section), padding to the file's alignment, and the tensor
// data, each tensor starting at a multiple of the alignment.
//
// Export writes the llama architecture: llama.* hyperparameters, the
// vocabulary from tokenizer.json, 2-D weights in Q8_0 (blocks of 32 int8
// values with one fp16 scale) and norms in F32. Query and key projection
// rows are reordered from Hugging Face's rotate-half RoPE layout to the
// interleaved layout llama.cpp's llama architecture expects (see
// PermuteRoPE).
package gguf

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/stokehq/stoke/internal/dtype"
)

// Magic is the first four bytes of every GGUF file.
const Magic = "GGUF"

// Version is the GGUF version this package writes (and the only one it
// reads: 2 and 3 share the layout, earlier versions do not).
const Version = 3

// DefaultAlignment is the data alignment when general.alignment is absent.
const DefaultAlignment = 32

// ValueType is the type tag of a metadata value.
type ValueType uint32

// The metadata value types of GGUF.
const (
	TypeUint8 ValueType = iota
	TypeInt8
	TypeUint16
	TypeInt16
	TypeUint32
	TypeInt32
	TypeFloat32
	TypeBool
	TypeString
	TypeArray
	TypeUint64
	TypeInt64
	TypeFloat64
)

// TensorType is a ggml tensor element type.
type TensorType uint32

// The ggml tensor types this package writes and reads.
const (
	TensorF32  TensorType = 0
	TensorF16  TensorType = 1
	TensorQ8_0 TensorType = 8
	TensorBF16 TensorType = 30
)

// String names the type as ggml does.
func (t TensorType) String() string {
	switch t {
	case TensorF32:
		return "F32"
	case TensorF16:
		return "F16"
	case TensorQ8_0:
		return "Q8_0"
	case TensorBF16:
		return "BF16"
	}
	return fmt.Sprintf("ggml_type(%d)", uint32(t))
}

// blockShape is the number of elements per block and bytes per block of t;
// ok is false for a type this package does not know.
func (t TensorType) blockShape() (elems, bytes int, ok bool) {
	switch t {
	case TensorF32:
		return 1, 4, true
	case TensorF16, TensorBF16:
		return 1, 2, true
	case TensorQ8_0:
		return QK8_0, q8Block, true
	}
	return 0, 0, false
}

// ByteSize is the number of data bytes of a tensor of type t with the
// given dimensions (innermost first). The innermost dimension must be a
// whole number of blocks.
func (t TensorType) ByteSize(dims []uint64) (uint64, error) {
	elems, bytes, ok := t.blockShape()
	if !ok {
		return 0, fmt.Errorf("tensor type %v is not supported", t)
	}
	if len(dims) == 0 {
		return 0, fmt.Errorf("tensor has no dimensions")
	}
	if dims[0]%uint64(elems) != 0 {
		return 0, fmt.Errorf("innermost dimension %d is not a multiple of the %v block size %d", dims[0], t, elems)
	}
	n := uint64(1)
	for _, d := range dims {
		if d == 0 {
			return 0, fmt.Errorf("dimensions %v include zero", dims)
		}
		if n > math.MaxUint64/d {
			return 0, fmt.Errorf("dimensions %v overflow", dims)
		}
		n *= d
	}
	return n / uint64(elems) * uint64(bytes), nil
}

// File types (general.file_type) of llama.cpp, "mostly" the named type.
const (
	FileTypeAllF32    uint32 = 0
	FileTypeMostlyF16 uint32 = 1
	FileTypeMostlyQ80 uint32 = 7
)

// QK8_0 is the number of values in one Q8_0 block.
const QK8_0 = 32

// q8Block is the size in bytes of one Q8_0 block: an fp16 scale and 32
// int8 values.
const q8Block = 2 + QK8_0

// QuantizeQ8_0 encodes x (a multiple of 32 values) as Q8_0 blocks, as
// llama.cpp's reference quantiser does: per block the scale is
// d = max|x|/127 (stored as fp16) and each value is round(x/d).
func QuantizeQ8_0(x []float32) ([]byte, error) {
	if len(x)%QK8_0 != 0 {
		return nil, fmt.Errorf("quantize Q8_0: %d values are not a multiple of %d", len(x), QK8_0)
	}
	out := make([]byte, len(x)/QK8_0*q8Block)
	for b := 0; b < len(x)/QK8_0; b++ {
		blk := x[b*QK8_0 : (b+1)*QK8_0]
		var amax float32
		for _, v := range blk {
			if a := float32(math.Abs(float64(v))); a > amax {
				amax = a
			}
		}
		d := amax / 127
		var id float32
		if d != 0 {
			id = 1 / d
		}
		o := out[b*q8Block:]
		binary.LittleEndian.PutUint16(o, dtype.F32ToF16(d))
		for i, v := range blk {
			o[2+i] = byte(int8(math.Round(float64(v * id))))
		}
	}
	return out, nil
}

// DequantizeQ8_0 decodes Q8_0 blocks to float32: value = d × q.
func DequantizeQ8_0(data []byte) ([]float32, error) {
	if len(data)%q8Block != 0 {
		return nil, fmt.Errorf("dequantize Q8_0: %d bytes are not a whole number of %d-byte blocks", len(data), q8Block)
	}
	out := make([]float32, len(data)/q8Block*QK8_0)
	for b := 0; b < len(data)/q8Block; b++ {
		blk := data[b*q8Block : (b+1)*q8Block]
		d := dtype.F16ToF32(binary.LittleEndian.Uint16(blk))
		for i := 0; i < QK8_0; i++ {
			out[b*QK8_0+i] = d * float32(int8(blk[2+i]))
		}
	}
	return out, nil
}

// Decode returns a tensor's data of type t as float32 values.
func Decode(t TensorType, data []byte) ([]float32, error) {
	switch t {
	case TensorQ8_0:
		return DequantizeQ8_0(data)
	case TensorF32:
		return dtype.ToFloat32(dtype.F32, data)
	case TensorF16:
		return dtype.ToFloat32(dtype.F16, data)
	case TensorBF16:
		return dtype.ToFloat32(dtype.BF16, data)
	}
	return nil, fmt.Errorf("decode tensor: type %v is not supported", t)
}

// PermuteRoPE reorders the rows of a Hugging Face query or key projection
// ([heads×headDim] rows of cols values, row-major) from the rotate-half
// RoPE layout, where a head's rotary pairs are rows (i, i+headDim/2), to
// the interleaved layout of GGUF's llama architecture, where they are rows
// (2i, 2i+1): GGUF row h·headDim+2i+j is HF row h·headDim+j·headDim/2+i.
// This is the reordering llama.cpp's converter applies to q_proj and
// k_proj (with the KV head count for k_proj).
func PermuteRoPE(w []float32, heads, cols int) ([]float32, error) {
	if heads <= 0 || cols <= 0 || len(w)%(heads*cols) != 0 {
		return nil, fmt.Errorf("permute rope: %d values are not %d heads of rows of %d", len(w), heads, cols)
	}
	headDim := len(w) / (heads * cols)
	if headDim%2 != 0 {
		return nil, fmt.Errorf("permute rope: head dimension %d is odd", headDim)
	}
	half := headDim / 2
	out := make([]float32, len(w))
	for h := 0; h < heads; h++ {
		for i := 0; i < half; i++ {
			for j := 0; j < 2; j++ {
				dst := (h*headDim + 2*i + j) * cols
				src := (h*headDim + j*half + i) * cols
				copy(out[dst:dst+cols], w[src:src+cols])
			}
		}
	}
	return out, nil
}
