package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// ErrInvalid is wrapped by every error that reports a malformed GGUF file.
var ErrInvalid = errors.New("invalid gguf file")

// Limits on what a file may declare, so a corrupt header cannot demand a
// huge allocation.
const (
	maxStringLen = 1 << 24
	maxArrayLen  = 1 << 26
	maxCount     = 1 << 20
	maxDims      = 4
)

// TensorInfo describes one tensor of a GGUF file.
type TensorInfo struct {
	Name string
	Type TensorType
	// Dims are the dimensions innermost first (ggml's ne).
	Dims []uint64
	// Offset is where the data starts, relative to the data section.
	Offset uint64
	// Size is the number of data bytes.
	Size uint64
}

// File is a parsed GGUF file whose tensor data is read on demand.
type File struct {
	Version uint32
	// KV holds the metadata in file order.
	KV      []KV
	Tensors []TensorInfo
	// DataOffset is where the data section starts in the file.
	DataOffset int64

	r      io.ReaderAt
	closer io.Closer
	kv     map[string]any
	byName map[string]int
}

// Open parses the GGUF file at path. Close it when done.
func Open(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open gguf: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open gguf: %w", err)
	}
	g, err := Read(f, st.Size())
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open gguf %s: %w", path, err)
	}
	g.closer = f
	return g, nil
}

// Read parses a GGUF file of size bytes read through r.
func Read(r io.ReaderAt, size int64) (*File, error) {
	p := &parser{r: io.NewSectionReader(r, 0, size)}
	magic := p.bytes(4)
	if p.err == nil && string(magic) != Magic {
		return nil, fmt.Errorf("%w: magic is %q, not %q", ErrInvalid, magic, Magic)
	}
	g := &File{r: r, kv: map[string]any{}, byName: map[string]int{}}
	g.Version = p.u32()
	if p.err == nil && g.Version != 2 && g.Version != 3 {
		return nil, fmt.Errorf("%w: version %d is not supported (want 2 or 3)", ErrInvalid, g.Version)
	}
	nTensors, nKV := p.u64(), p.u64()
	if p.err != nil {
		return nil, p.fail("header")
	}
	if nTensors > maxCount || nKV > maxCount {
		return nil, fmt.Errorf("%w: header declares %d tensors and %d metadata pairs", ErrInvalid, nTensors, nKV)
	}
	for i := uint64(0); i < nKV; i++ {
		key := p.str()
		v := p.value()
		if p.err != nil {
			return nil, p.fail(fmt.Sprintf("metadata pair %d (%q)", i, key))
		}
		if _, dup := g.kv[key]; dup {
			return nil, fmt.Errorf("%w: metadata key %q appears twice", ErrInvalid, key)
		}
		g.kv[key] = v
		g.KV = append(g.KV, KV{key, v})
	}
	alignment := uint64(DefaultAlignment)
	if v, ok := g.kv["general.alignment"]; ok {
		a, ok := v.(uint32)
		if !ok || a == 0 || a&(a-1) != 0 {
			return nil, fmt.Errorf("%w: general.alignment %v is not a power of two (uint32)", ErrInvalid, v)
		}
		alignment = uint64(a)
	}
	for i := uint64(0); i < nTensors; i++ {
		var t TensorInfo
		t.Name = p.str()
		nd := p.u32()
		if p.err == nil && (nd == 0 || nd > maxDims) {
			return nil, fmt.Errorf("%w: tensor %q has %d dimensions", ErrInvalid, t.Name, nd)
		}
		for j := uint32(0); j < nd && p.err == nil; j++ {
			t.Dims = append(t.Dims, p.u64())
		}
		t.Type = TensorType(p.u32())
		t.Offset = p.u64()
		if p.err != nil {
			return nil, p.fail(fmt.Sprintf("tensor info %d", i))
		}
		n, err := t.Type.ByteSize(t.Dims)
		if err != nil {
			return nil, fmt.Errorf("%w: tensor %q: %v", ErrInvalid, t.Name, err)
		}
		t.Size = n
		if t.Offset%alignment != 0 {
			return nil, fmt.Errorf("%w: tensor %q offset %d is not aligned to %d", ErrInvalid, t.Name, t.Offset, alignment)
		}
		if _, dup := g.byName[t.Name]; dup {
			return nil, fmt.Errorf("%w: tensor %q appears twice", ErrInvalid, t.Name)
		}
		g.byName[t.Name] = len(g.Tensors)
		g.Tensors = append(g.Tensors, t)
	}
	g.DataOffset = int64(alignUp(uint64(p.off), alignment))
	for _, t := range g.Tensors {
		if end := uint64(g.DataOffset) + t.Offset + t.Size; end > uint64(size) || end < t.Offset {
			return nil, fmt.Errorf("%w: tensor %q (%d bytes at %d) runs past the end of the %d-byte file", ErrInvalid, t.Name, t.Size, t.Offset, size)
		}
	}
	return g, nil
}

// Close releases the file Open opened.
func (g *File) Close() error {
	if g.closer == nil {
		return nil
	}
	err := g.closer.Close()
	g.closer = nil
	return err
}

// Get returns the metadata value of key.
func (g *File) Get(key string) (any, bool) {
	v, ok := g.kv[key]
	return v, ok
}

// Tensor returns the info of the tensor called name.
func (g *File) Tensor(name string) (TensorInfo, bool) {
	i, ok := g.byName[name]
	if !ok {
		return TensorInfo{}, false
	}
	return g.Tensors[i], true
}

// TensorData reads the bytes of the tensor called name.
func (g *File) TensorData(name string) (TensorInfo, []byte, error) {
	t, ok := g.Tensor(name)
	if !ok {
		return TensorInfo{}, nil, fmt.Errorf("read gguf tensor: no tensor %q", name)
	}
	buf := make([]byte, t.Size)
	if _, err := g.r.ReadAt(buf, g.DataOffset+int64(t.Offset)); err != nil {
		return TensorInfo{}, nil, fmt.Errorf("read gguf tensor %s: %w", name, err)
	}
	return t, buf, nil
}

// parser reads GGUF primitives sequentially, remembering the first error.
type parser struct {
	r   *io.SectionReader
	off int64
	err error
}

func (p *parser) fail(what string) error {
	if errors.Is(p.err, io.EOF) || errors.Is(p.err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: truncated in %s", ErrInvalid, what)
	}
	return fmt.Errorf("%w: %s: %v", ErrInvalid, what, p.err)
}

func (p *parser) bytes(n int) []byte {
	if p.err != nil {
		return nil
	}
	b := make([]byte, n)
	m, err := p.r.ReadAt(b, p.off)
	p.off += int64(m)
	if m < n {
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		p.err = err
		return nil
	}
	return b
}

func (p *parser) u8() uint8 {
	if b := p.bytes(1); b != nil {
		return b[0]
	}
	return 0
}

func (p *parser) u16() uint16 {
	if b := p.bytes(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (p *parser) u32() uint32 {
	if b := p.bytes(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (p *parser) u64() uint64 {
	if b := p.bytes(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (p *parser) str() string {
	n := p.u64()
	if p.err != nil {
		return ""
	}
	if n > maxStringLen {
		p.err = fmt.Errorf("string of %d bytes is longer than %d", n, maxStringLen)
		return ""
	}
	return string(p.bytes(int(n)))
}

// value reads a type tag and the value it tags.
func (p *parser) value() any {
	t := ValueType(p.u32())
	if p.err != nil {
		return nil
	}
	if t != TypeArray {
		return p.scalar(t)
	}
	elem := ValueType(p.u32())
	n := p.u64()
	if p.err != nil {
		return nil
	}
	if n > maxArrayLen {
		p.err = fmt.Errorf("array of %d values is longer than %d", n, maxArrayLen)
		return nil
	}
	switch elem {
	case TypeString:
		return readArray[string](p, elem, n)
	case TypeInt32:
		return readArray[int32](p, elem, n)
	case TypeUint32:
		return readArray[uint32](p, elem, n)
	case TypeFloat32:
		return readArray[float32](p, elem, n)
	case TypeUint8:
		return readArray[uint8](p, elem, n)
	case TypeInt8:
		return readArray[int8](p, elem, n)
	case TypeUint16:
		return readArray[uint16](p, elem, n)
	case TypeInt16:
		return readArray[int16](p, elem, n)
	case TypeBool:
		return readArray[bool](p, elem, n)
	case TypeUint64:
		return readArray[uint64](p, elem, n)
	case TypeInt64:
		return readArray[int64](p, elem, n)
	case TypeFloat64:
		return readArray[float64](p, elem, n)
	}
	p.err = fmt.Errorf("array element type %d is not supported", elem)
	return nil
}

func readArray[T any](p *parser, elem ValueType, n uint64) []T {
	out := make([]T, 0, min(n, 1<<16))
	for i := uint64(0); i < n && p.err == nil; i++ {
		v, _ := p.scalar(elem).(T)
		out = append(out, v)
	}
	return out
}

// scalar reads a non-array value of type t.
func (p *parser) scalar(t ValueType) any {
	switch t {
	case TypeUint8:
		return p.u8()
	case TypeInt8:
		return int8(p.u8())
	case TypeUint16:
		return p.u16()
	case TypeInt16:
		return int16(p.u16())
	case TypeUint32:
		return p.u32()
	case TypeInt32:
		return int32(p.u32())
	case TypeFloat32:
		return math.Float32frombits(p.u32())
	case TypeBool:
		b := p.u8()
		if p.err == nil && b > 1 {
			p.err = fmt.Errorf("bool byte is %d", b)
		}
		return b == 1
	case TypeString:
		return p.str()
	case TypeUint64:
		return p.u64()
	case TypeInt64:
		return int64(p.u64())
	case TypeFloat64:
		return math.Float64frombits(p.u64())
	}
	if p.err == nil {
		p.err = fmt.Errorf("value type %d is not supported", t)
	}
	return nil
}
