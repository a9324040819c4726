package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// KV is one metadata pair. Value is one of uint8, int8, uint16, int16,
// uint32, int32, float32, bool, string, uint64, int64, float64, or a slice
// of one of them ([]string, []int32, []float32, ...) for an array.
type KV struct {
	Key   string
	Value any
}

// Tensor is a tensor to write: its name, ggml type, dimensions (innermost
// first, as ggml's ne), and a function giving its encoded bytes, called
// once when the tensor's data is written.
type Tensor struct {
	Name string
	Type TensorType
	Dims []uint64
	Data func() ([]byte, error)
}

// Write writes a GGUF file of the metadata and tensors to w, tensors in the
// order given, each aligned to alignment bytes (0: DefaultAlignment; a
// value other than 32 is also recorded as general.alignment unless kvs has
// it).
func Write(w io.Writer, kvs []KV, tensors []Tensor, alignment int) error {
	if alignment == 0 {
		alignment = DefaultAlignment
	}
	if alignment < 1 || alignment&(alignment-1) != 0 {
		return fmt.Errorf("write gguf: alignment %d is not a power of two", alignment)
	}
	seen := map[string]bool{}
	for _, kv := range kvs {
		if seen[kv.Key] {
			return fmt.Errorf("write gguf: metadata key %q appears twice", kv.Key)
		}
		seen[kv.Key] = true
	}
	if alignment != DefaultAlignment && !seen["general.alignment"] {
		kvs = append(kvs, KV{"general.alignment", uint32(alignment)})
	}

	bw := &countWriter{w: bufio.NewWriterSize(w, 1<<20)}
	bw.raw([]byte(Magic))
	bw.u32(Version)
	bw.u64(uint64(len(tensors)))
	bw.u64(uint64(len(kvs)))
	for _, kv := range kvs {
		bw.str(kv.Key)
		if err := bw.value(kv.Value); err != nil {
			return fmt.Errorf("write gguf: metadata %s: %w", kv.Key, err)
		}
	}
	sizes := make([]uint64, len(tensors))
	var offset uint64
	names := map[string]bool{}
	for i, t := range tensors {
		if names[t.Name] {
			return fmt.Errorf("write gguf: tensor %q appears twice", t.Name)
		}
		names[t.Name] = true
		n, err := t.Type.ByteSize(t.Dims)
		if err != nil {
			return fmt.Errorf("write gguf: tensor %s: %w", t.Name, err)
		}
		sizes[i] = n
		bw.str(t.Name)
		bw.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			bw.u64(d)
		}
		bw.u32(uint32(t.Type))
		bw.u64(offset)
		offset = alignUp(offset+n, uint64(alignment))
	}
	bw.pad(alignment)
	for i, t := range tensors {
		data, err := t.Data()
		if err != nil {
			return fmt.Errorf("write gguf: tensor %s: %w", t.Name, err)
		}
		if uint64(len(data)) != sizes[i] {
			return fmt.Errorf("write gguf: tensor %s has %d bytes, its type %v and dimensions %v need %d", t.Name, len(data), t.Type, t.Dims, sizes[i])
		}
		bw.raw(data)
		bw.pad(alignment)
	}
	if bw.err != nil {
		return fmt.Errorf("write gguf: %w", bw.err)
	}
	if err := bw.w.(*bufio.Writer).Flush(); err != nil {
		return fmt.Errorf("write gguf: %w", err)
	}
	return nil
}

func alignUp(n, a uint64) uint64 { return (n + a - 1) / a * a }

// countWriter writes little-endian GGUF primitives, remembering the first
// error and the number of bytes written.
type countWriter struct {
	w   io.Writer
	n   int64
	err error
	buf [8]byte
}

func (c *countWriter) raw(b []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(b)
	c.n += int64(n)
	c.err = err
}

func (c *countWriter) u8(v uint8) { c.raw([]byte{v}) }

func (c *countWriter) u16(v uint16) {
	binary.LittleEndian.PutUint16(c.buf[:], v)
	c.raw(c.buf[:2])
}

func (c *countWriter) u32(v uint32) {
	binary.LittleEndian.PutUint32(c.buf[:], v)
	c.raw(c.buf[:4])
}

func (c *countWriter) u64(v uint64) {
	binary.LittleEndian.PutUint64(c.buf[:], v)
	c.raw(c.buf[:8])
}

func (c *countWriter) str(s string) {
	c.u64(uint64(len(s)))
	c.raw([]byte(s))
}

func (c *countWriter) pad(alignment int) {
	if r := c.n % int64(alignment); r != 0 {
		c.raw(make([]byte, int64(alignment)-r))
	}
}

// value writes v's type tag and content.
func (c *countWriter) value(v any) error {
	t, err := typeOf(v)
	if err != nil {
		return err
	}
	c.u32(uint32(t))
	if t != TypeArray {
		c.scalar(v)
		return nil
	}
	elem, n, at := arrayOf(v)
	c.u32(uint32(elem))
	c.u64(uint64(n))
	for i := 0; i < n; i++ {
		c.scalar(at(i))
	}
	return nil
}

// scalar writes a non-array value without its type tag.
func (c *countWriter) scalar(v any) {
	switch x := v.(type) {
	case uint8:
		c.u8(x)
	case int8:
		c.u8(uint8(x))
	case uint16:
		c.u16(x)
	case int16:
		c.u16(uint16(x))
	case uint32:
		c.u32(x)
	case int32:
		c.u32(uint32(x))
	case float32:
		c.u32(math.Float32bits(x))
	case bool:
		if x {
			c.u8(1)
		} else {
			c.u8(0)
		}
	case string:
		c.str(x)
	case uint64:
		c.u64(x)
	case int64:
		c.u64(uint64(x))
	case float64:
		c.u64(math.Float64bits(x))
	}
}

// typeOf is the GGUF type of a Go value KV may hold.
func typeOf(v any) (ValueType, error) {
	switch v.(type) {
	case uint8:
		return TypeUint8, nil
	case int8:
		return TypeInt8, nil
	case uint16:
		return TypeUint16, nil
	case int16:
		return TypeInt16, nil
	case uint32:
		return TypeUint32, nil
	case int32:
		return TypeInt32, nil
	case float32:
		return TypeFloat32, nil
	case bool:
		return TypeBool, nil
	case string:
		return TypeString, nil
	case uint64:
		return TypeUint64, nil
	case int64:
		return TypeInt64, nil
	case float64:
		return TypeFloat64, nil
	case []uint8, []int8, []uint16, []int16, []uint32, []int32, []float32, []bool, []string, []uint64, []int64, []float64:
		return TypeArray, nil
	}
	return 0, fmt.Errorf("value of Go type %T has no GGUF type", v)
}

// arrayOf returns a slice value's element type, length and indexer.
func arrayOf(v any) (ValueType, int, func(int) any) {
	switch x := v.(type) {
	case []uint8:
		return TypeUint8, len(x), func(i int) any { return x[i] }
	case []int8:
		return TypeInt8, len(x), func(i int) any { return x[i] }
	case []uint16:
		return TypeUint16, len(x), func(i int) any { return x[i] }
	case []int16:
		return TypeInt16, len(x), func(i int) any { return x[i] }
	case []uint32:
		return TypeUint32, len(x), func(i int) any { return x[i] }
	case []int32:
		return TypeInt32, len(x), func(i int) any { return x[i] }
	case []float32:
		return TypeFloat32, len(x), func(i int) any { return x[i] }
	case []bool:
		return TypeBool, len(x), func(i int) any { return x[i] }
	case []string:
		return TypeString, len(x), func(i int) any { return x[i] }
	case []uint64:
		return TypeUint64, len(x), func(i int) any { return x[i] }
	case []int64:
		return TypeInt64, len(x), func(i int) any { return x[i] }
	case []float64:
		return TypeFloat64, len(x), func(i int) any { return x[i] }
	}
	return 0, 0, nil
}
