// Package safetensors reads and writes checkpoints in the safetensors format:
// an 8-byte little-endian header length N, N bytes of JSON describing every
// tensor, then the tensors' bytes packed back to back.
//
// Parsing is strict in the way Hugging Face's reference reader is strict
// (tensors must tile the data region exactly, sizes must match shapes) and
// additionally rejects duplicate keys, which encoding/json would silently
// collapse.
package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"unicode/utf8"

	"github.com/stokehq/stoke/internal/dtype"
)

// MaxHeaderSize is the largest JSON header accepted, in bytes. Real headers
// are a few hundred KiB even for models with tens of thousands of tensors;
// the cap stops a hostile length prefix from causing a huge allocation.
const MaxHeaderSize = 100 << 20

// metadataKey is the reserved header key holding free-form string metadata.
const metadataKey = "__metadata__"

// ErrInvalidHeader is wrapped by every error that reports a malformed
// safetensors header, so callers can tell bad files from I/O failures.
var ErrInvalidHeader = errors.New("invalid safetensors header")

// TensorInfo describes one tensor of a safetensors file.
type TensorInfo struct {
	Name  string
	DType dtype.DType
	Shape []int
	// Begin and End are byte offsets relative to the start of the data
	// region (Header.DataStart), End exclusive.
	Begin, End int64
}

// NumElements is the product of the shape (1 for a scalar).
func (t TensorInfo) NumElements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= int64(d)
	}
	return n
}

// Size is the number of data bytes the tensor occupies (End - Begin).
func (t TensorInfo) Size() int64 { return t.End - t.Begin }

// Header is the parsed header of a safetensors file.
type Header struct {
	// Tensors are sorted by Begin; they tile the data region exactly.
	Tensors []TensorInfo
	// Metadata is the "__metadata__" object, nil when the file has none.
	Metadata map[string]string
	// DataStart is the absolute file offset of the data region, 8+N.
	DataStart int64

	index map[string]int
}

// Lookup returns the tensor called name.
func (h *Header) Lookup(name string) (TensorInfo, bool) {
	if h.index != nil {
		i, ok := h.index[name]
		if !ok {
			return TensorInfo{}, false
		}
		return h.Tensors[i], true
	}
	for _, t := range h.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return TensorInfo{}, false
}

// DataSize is the number of bytes of the data region, the End of the last
// tensor.
func (h *Header) DataSize() int64 {
	if len(h.Tensors) == 0 {
		return 0
	}
	return h.Tensors[len(h.Tensors)-1].End
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidHeader, fmt.Sprintf(format, args...))
}

// headerLen validates the 8-byte length prefix of a file of fileSize bytes
// and returns N.
func headerLen(prefix []byte, fileSize int64) (int64, error) {
	if fileSize < 8 || len(prefix) < 8 {
		return 0, invalid("file is %d bytes, shorter than the 8-byte header length", fileSize)
	}
	n := binary.LittleEndian.Uint64(prefix[:8])
	if n > MaxHeaderSize {
		return 0, invalid("header length %d exceeds the %d-byte limit", n, MaxHeaderSize)
	}
	if int64(n) > fileSize-8 {
		return 0, invalid("header length %d runs past the end of the %d-byte file", n, fileSize)
	}
	return int64(n), nil
}

// ReadHeader reads and validates the header of a safetensors file of size
// bytes accessible through r.
func ReadHeader(r io.ReaderAt, size int64) (*Header, error) {
	var prefix [8]byte
	if size >= 8 {
		if err := readFull(r, prefix[:], 0); err != nil {
			return nil, fmt.Errorf("read header length: %w", err)
		}
	}
	n, err := headerLen(prefix[:], size)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, 8+n)
	copy(buf, prefix[:])
	if err := readFull(r, buf[8:], 8); err != nil {
		return nil, fmt.Errorf("read %d-byte header: %w", n, err)
	}
	return ParseHeader(buf, size)
}

// readFull fills p from r at off; io.ReaderAt may report io.EOF alongside a
// complete read that ends at the end of the input.
func readFull(r io.ReaderAt, p []byte, off int64) error {
	n, err := r.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// ParseHeader parses and validates a safetensors header. buf is a prefix of
// the file including the 8-byte length and at least the whole JSON header;
// fileSize is the size of the whole file, against which the tensors' extent
// is checked.
func ParseHeader(buf []byte, fileSize int64) (*Header, error) {
	n, err := headerLen(buf, fileSize)
	if err != nil {
		return nil, err
	}
	if int64(len(buf)) < 8+n {
		return nil, invalid("buffer holds %d bytes but the header needs %d", len(buf), 8+n)
	}
	js := buf[8 : 8+n]
	if !utf8.Valid(js) {
		return nil, invalid("header is not valid UTF-8")
	}
	if len(js) == 0 || js[0] != '{' {
		return nil, invalid("header does not start with '{'")
	}
	members, err := decodeObject(js)
	if err != nil {
		return nil, invalid("header JSON: %v", err)
	}
	h := &Header{DataStart: 8 + n, Tensors: make([]TensorInfo, 0, len(members))}
	for _, m := range members {
		if m.key == metadataKey {
			if h.Metadata, err = parseMetadata(m.raw); err != nil {
				return nil, err
			}
			continue
		}
		t, err := parseTensor(m.key, m.raw)
		if err != nil {
			return nil, err
		}
		h.Tensors = append(h.Tensors, t)
	}
	sort.SliceStable(h.Tensors, func(i, j int) bool {
		a, b := h.Tensors[i], h.Tensors[j]
		if a.Begin != b.Begin {
			return a.Begin < b.Begin
		}
		return a.End < b.End
	})
	dataLen := fileSize - h.DataStart
	var next int64
	for i, t := range h.Tensors {
		switch {
		case t.Begin > next:
			return nil, invalid("tensor %q: data_offsets leave a gap of %d bytes before it (begins at %d, previous data ends at %d)", t.Name, t.Begin-next, t.Begin, next)
		case t.Begin < next:
			return nil, invalid("tensor %q: data_offsets [%d, %d] overlap tensor %q which ends at %d", t.Name, t.Begin, t.End, h.Tensors[i-1].Name, next)
		}
		next = t.End
	}
	if next > dataLen {
		return nil, invalid("tensors need %d data bytes but the file holds only %d after the header", next, dataLen)
	}
	if next < dataLen {
		return nil, invalid("file has %d trailing bytes after the last tensor", dataLen-next)
	}
	h.index = make(map[string]int, len(h.Tensors))
	for i, t := range h.Tensors {
		h.index[t.Name] = i
	}
	return h, nil
}

type member struct {
	key string
	raw json.RawMessage
}

// decodeObject splits a JSON object into its members in order, rejecting
// duplicate keys and anything after the closing brace but whitespace.
func decodeObject(data []byte) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("not an object")
	}
	seen := make(map[string]struct{})
	var out []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("object key is %v, not a string", tok)
		}
		if _, dup := seen[key]; dup {
			return nil, fmt.Errorf("duplicate key %q", key)
		}
		seen[key] = struct{}{}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("value of %q: %w", key, err)
		}
		out = append(out, member{key: key, raw: raw})
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if tok, err := dec.Token(); err != io.EOF {
		if err != nil {
			return nil, fmt.Errorf("after the closing brace: %w", err)
		}
		return nil, fmt.Errorf("unexpected %v after the closing brace", tok)
	}
	return out, nil
}

func parseMetadata(raw json.RawMessage) (map[string]string, error) {
	if string(raw) == "null" {
		return nil, nil
	}
	if len(raw) == 0 || raw[0] != '{' {
		return nil, invalid("%s is not an object", metadataKey)
	}
	members, err := decodeObject(raw)
	if err != nil {
		return nil, invalid("%s: %v", metadataKey, err)
	}
	md := make(map[string]string, len(members))
	for _, m := range members {
		s, err := parseString(m.raw)
		if err != nil {
			return nil, invalid("%s[%q]: value must be a string", metadataKey, m.key)
		}
		md[m.key] = s
	}
	return md, nil
}

func parseString(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", errors.New("not a string")
	}
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}

// parseInts decodes a JSON array of non-negative integers.
func parseInts(raw json.RawMessage) ([]int64, error) {
	if len(raw) == 0 || raw[0] != '[' {
		return nil, errors.New("not an array")
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, err
	}
	out := make([]int64, len(elems))
	for i, e := range elems {
		v, err := strconv.ParseInt(string(e), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("element %d (%s) is not an integer in int64 range", i, e)
		}
		if v < 0 {
			return nil, fmt.Errorf("element %d is negative (%d)", i, v)
		}
		out[i] = v
	}
	return out, nil
}

func parseTensor(name string, raw json.RawMessage) (TensorInfo, error) {
	t := TensorInfo{Name: name}
	if len(raw) == 0 || raw[0] != '{' {
		return t, invalid("tensor %q: entry is not an object", name)
	}
	members, err := decodeObject(raw)
	if err != nil {
		return t, invalid("tensor %q: %v", name, err)
	}
	var haveDType, haveShape, haveOffsets bool
	var offsets []int64
	for _, m := range members {
		switch m.key {
		case "dtype":
			s, err := parseString(m.raw)
			if err != nil {
				return t, invalid("tensor %q: dtype must be a string", name)
			}
			if t.DType, err = dtype.Parse(s); err != nil {
				return t, invalid("tensor %q: dtype: %v", name, err)
			}
			haveDType = true
		case "shape":
			dims, err := parseInts(m.raw)
			if err != nil {
				return t, invalid("tensor %q: shape: %v", name, err)
			}
			t.Shape = make([]int, len(dims))
			for i, d := range dims {
				if d > math.MaxInt {
					return t, invalid("tensor %q: shape: dimension %d is too large (%d)", name, i, d)
				}
				t.Shape[i] = int(d)
			}
			haveShape = true
		case "data_offsets":
			if offsets, err = parseInts(m.raw); err != nil {
				return t, invalid("tensor %q: data_offsets: %v", name, err)
			}
			if len(offsets) != 2 {
				return t, invalid("tensor %q: data_offsets must hold 2 integers, has %d", name, len(offsets))
			}
			t.Begin, t.End = offsets[0], offsets[1]
			haveOffsets = true
		}
	}
	switch {
	case !haveDType:
		return t, invalid("tensor %q: missing dtype", name)
	case !haveShape:
		return t, invalid("tensor %q: missing shape", name)
	case !haveOffsets:
		return t, invalid("tensor %q: missing data_offsets", name)
	}
	size, err := byteSize(t.DType, t.Shape)
	if err != nil {
		return t, invalid("tensor %q: shape %v: %v", name, t.Shape, err)
	}
	if t.Begin > t.End {
		return t, invalid("tensor %q: data_offsets begin %d > end %d", name, t.Begin, t.End)
	}
	if t.End-t.Begin != size {
		return t, invalid("tensor %q: data_offsets [%d, %d] span %d bytes but %s %v needs %d", name, t.Begin, t.End, t.End-t.Begin, t.DType, t.Shape, size)
	}
	return t, nil
}

// byteSize is the number of bytes a tensor of type dt and shape occupies,
// failing on negative dimensions and int64 overflow.
func byteSize(dt dtype.DType, shape []int) (int64, error) {
	es := int64(dt.Size())
	if es == 0 {
		return 0, fmt.Errorf("dtype %s has no size", dt)
	}
	n := int64(1)
	for i, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("dimension %d is negative (%d)", i, d)
		}
		if d != 0 && n > math.MaxInt64/int64(d) {
			return 0, errors.New("element count overflows int64")
		}
		n *= int64(d)
	}
	if n > math.MaxInt64/es {
		return 0, errors.New("byte size overflows int64")
	}
	return n * es, nil
}
