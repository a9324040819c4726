package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/stokehq/stoke/internal/dtype"
)

// Tensor is a tensor held in memory, as given to WriteFile.
type Tensor struct {
	Name  string
	DType dtype.DType
	Shape []int
	Data  []byte
}

// Writer streams a safetensors file: NewWriter writes the header, then each
// tensor's bytes follow through WriteTensor in the declared order.
type Writer struct {
	w       io.Writer
	tensors []TensorInfo
	next    int   // index of the next tensor to write
	err     error // sticky write error
}

// NewWriter validates the tensors, lays them out back to back in the given
// order, and writes the header to w. The Begin and End of tensors are
// ignored and recomputed. The JSON is padded with spaces so that the data
// region starts at a multiple of 8 bytes.
func NewWriter(w io.Writer, tensors []TensorInfo, metadata map[string]string) (*Writer, error) {
	layout := make([]TensorInfo, len(tensors))
	seen := make(map[string]struct{}, len(tensors))
	var off int64
	for i, t := range tensors {
		if t.Name == metadataKey {
			return nil, fmt.Errorf("tensor %d: name %q is reserved", i, t.Name)
		}
		if _, dup := seen[t.Name]; dup {
			return nil, fmt.Errorf("tensor %q: declared twice", t.Name)
		}
		seen[t.Name] = struct{}{}
		if t.DType.Size() == 0 {
			return nil, fmt.Errorf("tensor %q: invalid dtype %s", t.Name, t.DType)
		}
		size, err := byteSize(t.DType, t.Shape)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: shape %v: %w", t.Name, t.Shape, err)
		}
		t.Shape = slices.Clone(t.Shape)
		t.Begin, t.End = off, off+size
		if t.End < off {
			return nil, fmt.Errorf("tensor %q: data offsets overflow int64", t.Name)
		}
		off = t.End
		layout[i] = t
	}
	hdr, err := encodeHeader(layout, metadata)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(hdr); err != nil {
		return nil, fmt.Errorf("write safetensors header: %w", err)
	}
	return &Writer{w: w, tensors: layout}, nil
}

// encodeHeader renders the length prefix and the padded JSON header, keys in
// declared order with "__metadata__" (sorted keys) first.
func encodeHeader(tensors []TensorInfo, metadata map[string]string) ([]byte, error) {
	var b bytes.Buffer
	b.Write(make([]byte, 8))
	b.WriteByte('{')
	first := true
	sep := func() {
		if !first {
			b.WriteByte(',')
		}
		first = false
	}
	if len(metadata) > 0 {
		sep()
		writeString(&b, metadataKey)
		b.WriteString(":{")
		keys := make([]string, 0, len(metadata))
		for k := range metadata {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeString(&b, k)
			b.WriteByte(':')
			writeString(&b, metadata[k])
		}
		b.WriteByte('}')
	}
	for _, t := range tensors {
		sep()
		writeString(&b, t.Name)
		b.WriteString(`:{"dtype":`)
		writeString(&b, t.DType.String())
		b.WriteString(`,"shape":[`)
		for i, d := range t.Shape {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(d))
		}
		b.WriteString(`],"data_offsets":[`)
		b.WriteString(strconv.FormatInt(t.Begin, 10))
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(t.End, 10))
		b.WriteString("]}")
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	out := b.Bytes()
	n := len(out) - 8
	if n > MaxHeaderSize {
		return nil, fmt.Errorf("safetensors header would be %d bytes, over the %d-byte limit", n, MaxHeaderSize)
	}
	binary.LittleEndian.PutUint64(out[:8], uint64(n))
	return out, nil
}

// writeString writes s as a JSON string without HTML escaping.
func writeString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)       // encoding a string into a bytes.Buffer cannot fail
	b.Truncate(b.Len() - 1) // Encode appends a newline
}

// WriteTensor writes the bytes of the next declared tensor, which must be
// called name and be exactly its size.
func (w *Writer) WriteTensor(name string, data []byte) error {
	if w.err != nil {
		return w.err
	}
	if w.next >= len(w.tensors) {
		return fmt.Errorf("write tensor %q: all %d declared tensors already written", name, len(w.tensors))
	}
	t := w.tensors[w.next]
	if name != t.Name {
		return fmt.Errorf("write tensor %q: expected tensor %q next", name, t.Name)
	}
	if int64(len(data)) != t.End-t.Begin {
		return fmt.Errorf("write tensor %q: got %d bytes, %s %v needs %d", name, len(data), t.DType, t.Shape, t.End-t.Begin)
	}
	if _, err := w.w.Write(data); err != nil {
		w.err = fmt.Errorf("write tensor %q: %w", name, err)
		return w.err
	}
	w.next++
	return nil
}

// Close checks that every declared tensor was written. It does not close the
// underlying io.Writer.
func (w *Writer) Close() error {
	if w.err != nil {
		return w.err
	}
	if w.next < len(w.tensors) {
		missing := make([]string, 0, len(w.tensors)-w.next)
		for _, t := range w.tensors[w.next:] {
			missing = append(missing, strconv.Quote(t.Name))
		}
		if len(missing) > 5 {
			missing = append(missing[:5], fmt.Sprintf("and %d more", len(missing)-5))
		}
		return fmt.Errorf("close safetensors writer: %d tensors not written: %v", len(w.tensors)-w.next, missing)
	}
	return nil
}

// WriteFile writes tensors, in order, to a safetensors file at path. The file
// appears atomically: it is written to a temporary file in the same
// directory, synced, and renamed into place.
func WriteFile(path string, tensors []Tensor, metadata map[string]string) (err error) {
	infos := make([]TensorInfo, len(tensors))
	for i, t := range tensors {
		infos[i] = TensorInfo{Name: t.Name, DType: t.DType, Shape: t.Shape}
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	w, err := NewWriter(tmp, infos, metadata)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	for _, t := range tensors {
		if err := w.WriteTensor(t.Name, t.Data); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("write %s: sync: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: close: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if d, derr := os.Open(dir); derr == nil {
		// Best effort: make the rename durable; some filesystems refuse.
		_ = d.Sync()
		d.Close()
	}
	return nil
}
