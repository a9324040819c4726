package safetensors

import (
	"bytes"
	"reflect"
	"testing"
)

// validFiles are well-formed files for the fuzz seed corpus.
func validFiles(t testing.TB) [][]byte {
	var out [][]byte
	write := func(tensors []Tensor, meta map[string]string) {
		var buf bytes.Buffer
		infos := make([]TensorInfo, len(tensors))
		for i, x := range tensors {
			infos[i] = TensorInfo{Name: x.Name, DType: x.DType, Shape: x.Shape}
		}
		w, err := NewWriter(&buf, infos, meta)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range tensors {
			if err := w.WriteTensor(x.Name, x.Data); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		out = append(out, buf.Bytes())
	}
	write(nil, nil)
	write(sampleTensors(), map[string]string{"format": "pt"})
	write(sampleTensors()[:1], nil)
	out = append(out,
		rawFile(`{"__metadata__":null}`, 0),
		rawFile(`{"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[4,16]},"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}`, 16),
	)
	return out
}

// FuzzParseHeader checks that ParseHeader never panics and that whatever it
// accepts is self-consistent and survives a rewrite through Writer.
func FuzzParseHeader(f *testing.F) {
	for _, b := range validFiles(f) {
		f.Add(b)
	}
	for _, c := range badCases() {
		f.Add(c.file)
	}
	f.Fuzz(func(t *testing.T, file []byte) {
		size := int64(len(file))
		h, err := ParseHeader(file, size)
		_, rerr := ReadHeader(bytes.NewReader(file), size)
		if (err == nil) != (rerr == nil) {
			t.Fatalf("ParseHeader err %v but ReadHeader err %v", err, rerr)
		}
		if err != nil {
			return
		}
		if h.DataStart+h.DataSize() != size {
			t.Fatalf("tensors end at %d, file is %d bytes", h.DataStart+h.DataSize(), size)
		}
		var next int64
		for _, ti := range h.Tensors {
			if ti.Begin != next || ti.End < ti.Begin {
				t.Fatalf("tensor %q at [%d,%d] does not follow %d", ti.Name, ti.Begin, ti.End, next)
			}
			if ti.End-ti.Begin != ti.NumElements()*int64(ti.DType.Size()) {
				t.Fatalf("tensor %q: size does not match shape", ti.Name)
			}
			if got, ok := h.Lookup(ti.Name); !ok || !reflect.DeepEqual(got, ti) {
				t.Fatalf("Lookup(%q) = %+v, %v", ti.Name, got, ok)
			}
			next = ti.End
		}

		// Rewriting what was parsed must give a file that parses the same.
		var buf bytes.Buffer
		w, err := NewWriter(&buf, h.Tensors, h.Metadata)
		if err != nil {
			t.Fatalf("NewWriter rejects a parsed header: %v", err)
		}
		data := file[h.DataStart:]
		for _, ti := range h.Tensors {
			if err := w.WriteTensor(ti.Name, data[ti.Begin:ti.End]); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		h2, err := ParseHeader(buf.Bytes(), int64(buf.Len()))
		if err != nil {
			t.Fatalf("rewritten file does not parse: %v", err)
		}
		if !reflect.DeepEqual(h.Tensors, h2.Tensors) {
			t.Fatalf("tensors changed on rewrite: %+v vs %+v", h.Tensors, h2.Tensors)
		}
		if len(h.Metadata) != len(h2.Metadata) || (len(h.Metadata) > 0 && !reflect.DeepEqual(h.Metadata, h2.Metadata)) {
			t.Fatalf("metadata changed on rewrite: %q vs %q", h.Metadata, h2.Metadata)
		}
		if !bytes.Equal(buf.Bytes()[h2.DataStart:], data) {
			t.Fatalf("data changed on rewrite")
		}
	})
}
