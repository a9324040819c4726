package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/internal/testmodel"
)

// rawFile assembles a safetensors file from a header JSON string and a data
// region of dataLen bytes.
func rawFile(header string, dataLen int) []byte {
	b := make([]byte, 8, 8+len(header)+dataLen)
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	for i := range dataLen {
		b = append(b, byte(i))
	}
	return b
}

// withLength is a file whose 8-byte prefix claims n header bytes followed by
// body.
func withLength(n uint64, body string) []byte {
	b := make([]byte, 8, 8+len(body))
	binary.LittleEndian.PutUint64(b, n)
	return append(b, body...)
}

type badCase struct {
	name string
	file []byte
	want []string // substrings the error must contain
}

func badCases() []badCase {
	t := func(entry string) string { return `{"t":` + entry + `}` }
	return []badCase{
		{"empty file", nil, []string{"shorter than the 8-byte"}},
		{"short file", []byte{1, 2, 3}, []string{"3 bytes", "shorter"}},
		{"length past eof", withLength(100, "{}"), []string{"header length 100", "past the end"}},
		{"absurd length", withLength(1<<40, "{}"), []string{"exceeds"}},
		{"max uint64 length", withLength(math.MaxUint64, "{}"), []string{"exceeds"}},
		{"empty header", rawFile("", 0), []string{"does not start with '{'"}},
		{"not json", rawFile(`{"a":`, 0), []string{"header JSON"}},
		{"not an object", rawFile(`[1,2]`, 0), []string{"does not start with '{'"}},
		{"leading space", rawFile(` {}`, 0), []string{"does not start with '{'"}},
		{"trailing garbage", rawFile(`{} x`, 0), []string{"after the closing brace"}},
		{"second object", rawFile(`{}{}`, 0), []string{"after the closing brace"}},
		{"invalid utf8", rawFile("{\"\xff\":{}}", 0), []string{"UTF-8"}},
		{"entry not object", rawFile(t(`5`), 0), []string{`tensor "t"`, "not an object"}},
		{"entry is array", rawFile(t(`["F32"]`), 0), []string{`tensor "t"`, "not an object"}},
		{"unknown dtype", rawFile(t(`{"dtype":"F33","shape":[1],"data_offsets":[0,4]}`), 4), []string{`tensor "t"`, "dtype", `"F33"`}},
		{"dtype not string", rawFile(t(`{"dtype":4,"shape":[1],"data_offsets":[0,4]}`), 4), []string{`tensor "t"`, "dtype must be a string"}},
		{"dtype null", rawFile(t(`{"dtype":null,"shape":[1],"data_offsets":[0,4]}`), 4), []string{`tensor "t"`, "dtype must be a string"}},
		{"missing dtype", rawFile(t(`{"shape":[1],"data_offsets":[0,4]}`), 4), []string{`tensor "t"`, "missing dtype"}},
		{"missing shape", rawFile(t(`{"dtype":"F32","data_offsets":[0,4]}`), 4), []string{`tensor "t"`, "missing shape"}},
		{"missing offsets", rawFile(t(`{"dtype":"F32","shape":[1]}`), 4), []string{`tensor "t"`, "missing data_offsets"}},
		{"shape not array", rawFile(t(`{"dtype":"F32","shape":1,"data_offsets":[0,4]}`), 4), []string{`tensor "t"`, "shape", "not an array"}},
		{"shape null", rawFile(t(`{"dtype":"F32","shape":null,"data_offsets":[0,4]}`), 4), []string{`tensor "t"`, "shape", "not an array"}},
		{"negative dim", rawFile(t(`{"dtype":"F32","shape":[2,-1],"data_offsets":[0,4]}`), 4), []string{`tensor "t"`, "shape", "negative"}},
		{"float dim", rawFile(t(`{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}`), 4), []string{`tensor "t"`, "shape", "not an integer"}},
		{"exponent dim", rawFile(t(`{"dtype":"F32","shape":[1e0],"data_offsets":[0,4]}`), 4), []string{`tensor "t"`, "shape", "not an integer"}},
		{"string dim", rawFile(t(`{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}`), 4), []string{`tensor "t"`, "shape", "not an integer"}},
		{"null dim", rawFile(t(`{"dtype":"F32","shape":[null],"data_offsets":[0,4]}`), 4), []string{`tensor "t"`, "shape", "not an integer"}},
		{"huge dim", rawFile(t(`{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,4]}`), 4), []string{`tensor "t"`, "shape", "int64 range"}},
		{"numel overflow", rawFile(t(`{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,4]}`), 4), []string{`tensor "t"`, "element count overflows"}},
		{"bytes overflow", rawFile(t(`{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,4]}`), 4), []string{`tensor "t"`, "byte size overflows"}},
		{"offsets one int", rawFile(t(`{"dtype":"F32","shape":[1],"data_offsets":[4]}`), 4), []string{`tensor "t"`, "data_offsets must hold 2"}},
		{"offsets three ints", rawFile(t(`{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}`), 4), []string{`tensor "t"`, "data_offsets must hold 2"}},
		{"offsets not array", rawFile(t(`{"dtype":"F32","shape":[1],"data_offsets":"0-4"}`), 4), []string{`tensor "t"`, "data_offsets", "not an array"}},
		{"offset string", rawFile(t(`{"dtype":"F32","shape":[1],"data_offsets":[0,"4"]}`), 4), []string{`tensor "t"`, "data_offsets", "not an integer"}},
		{"offset negative", rawFile(t(`{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}`), 4), []string{`tensor "t"`, "data_offsets", "negative"}},
		{"begin after end", rawFile(t(`{"dtype":"F32","shape":[1],"data_offsets":[8,4]}`), 8), []string{`tensor "t"`, "begin 8 > end 4"}},
		{"size mismatch", rawFile(t(`{"dtype":"F32","shape":[2],"data_offsets":[0,4]}`), 4), []string{`tensor "t"`, "span 4 bytes", "needs 8"}},
		{"duplicate tensor", rawFile(`{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 2), []string{`duplicate key "t"`}},
		{"duplicate field", rawFile(t(`{"dtype":"U8","dtype":"F32","shape":[1],"data_offsets":[0,1]}`), 1), []string{`tensor "t"`, `duplicate key "dtype"`}},
		{"gap between", rawFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`, 12), []string{`tensor "b"`, "gap of 4 bytes"}},
		{"not from zero", rawFile(t(`{"dtype":"F32","shape":[1],"data_offsets":[4,8]}`), 8), []string{`tensor "t"`, "gap of 4 bytes"}},
		{"overlap", rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8), []string{`tensor "b"`, "overlap", `"a"`}},
		{"same offsets", rawFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 4), []string{"overlap"}},
		{"past eof", rawFile(t(`{"dtype":"F32","shape":[2],"data_offsets":[0,8]}`), 4), []string{"need 8 data bytes", "only 4"}},
		{"huge offsets", rawFile(t(`{"dtype":"U8","shape":[1],"data_offsets":[9223372036854775806,9223372036854775807]}`), 1), []string{`tensor "t"`, "gap"}},
		{"trailing bytes", rawFile(t(`{"dtype":"F32","shape":[1],"data_offsets":[0,4]}`), 8), []string{"4 trailing bytes"}},
		{"trailing bytes no tensors", rawFile(`{}`, 3), []string{"3 trailing bytes"}},
		{"metadata not object", rawFile(`{"__metadata__":5}`, 0), []string{"__metadata__", "not an object"}},
		{"metadata number value", rawFile(`{"__metadata__":{"k":1}}`, 0), []string{"__metadata__", `"k"`, "must be a string"}},
		{"metadata nested", rawFile(`{"__metadata__":{"k":{"a":"b"}}}`, 0), []string{"__metadata__", `"k"`, "must be a string"}},
		{"metadata duplicate key", rawFile(`{"__metadata__":{"k":"a","k":"b"}}`, 0), []string{"__metadata__", `duplicate key "k"`}},
		{"metadata twice", rawFile(`{"__metadata__":{},"__metadata__":{}}`, 0), []string{`duplicate key "__metadata__"`}},
	}
}

func TestParseHeaderRejects(t *testing.T) {
	for _, tc := range badCases() {
		t.Run(tc.name, func(t *testing.T) {
			h, err := ParseHeader(tc.file, int64(len(tc.file)))
			if err == nil {
				t.Fatalf("ParseHeader accepted a bad file: %+v", h)
			}
			if !errors.Is(err, ErrInvalidHeader) {
				t.Errorf("error %q does not wrap ErrInvalidHeader", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			// The io.ReaderAt path must agree.
			if _, err := ReadHeader(bytes.NewReader(tc.file), int64(len(tc.file))); err == nil {
				t.Errorf("ReadHeader accepted a bad file")
			}
		})
	}
}

func TestParseHeaderAccepts(t *testing.T) {
	cases := []struct {
		name    string
		file    []byte
		tensors []TensorInfo
		meta    map[string]string
	}{
		{"empty", rawFile(`{}`, 0), []TensorInfo{}, nil},
		{"trailing spaces", rawFile(`{}    `, 0), []TensorInfo{}, nil},
		{"metadata null", rawFile(`{"__metadata__":null}`, 0), []TensorInfo{}, nil},
		{"metadata only", rawFile(`{"__metadata__":{"format":"pt","x":"é"}}`, 0), []TensorInfo{}, map[string]string{"format": "pt", "x": "é"}},
		{
			"sorted by offset, scalar, empty, unknown field",
			rawFile(`{"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[4,16]},"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"z":{"dtype":"F8_E4M3","shape":[0,7],"data_offsets":[16,16],"extra":[1]}}`, 16),
			[]TensorInfo{
				{Name: "s", DType: dtype.F32, Shape: []int{}, Begin: 0, End: 4},
				{Name: "b", DType: dtype.BF16, Shape: []int{2, 3}, Begin: 4, End: 16},
				{Name: "z", DType: dtype.F8E4M3, Shape: []int{0, 7}, Begin: 16, End: 16},
			},
			nil,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, err := ParseHeader(tc.file, int64(len(tc.file)))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(h.Tensors, tc.tensors) {
				t.Errorf("tensors = %+v, want %+v", h.Tensors, tc.tensors)
			}
			if !reflect.DeepEqual(h.Metadata, tc.meta) {
				t.Errorf("metadata = %v, want %v", h.Metadata, tc.meta)
			}
			if got := h.DataStart + h.DataSize(); got != int64(len(tc.file)) {
				t.Errorf("DataStart+DataSize = %d, want file size %d", got, len(tc.file))
			}
			for _, want := range tc.tensors {
				got, ok := h.Lookup(want.Name)
				if !ok || !reflect.DeepEqual(got, want) {
					t.Errorf("Lookup(%q) = %+v, %v", want.Name, got, ok)
				}
			}
			if _, ok := h.Lookup("absent"); ok {
				t.Errorf("Lookup found an absent tensor")
			}
		})
	}
}

func TestParseHeaderShortBuffer(t *testing.T) {
	f := rawFile(`{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 1)
	// A buffer cut inside the JSON must be refused, not read past.
	_, err := ParseHeader(f[:20], int64(len(f)))
	if err == nil || !strings.Contains(err.Error(), "header needs") {
		t.Fatalf("err = %v, want a short-buffer error", err)
	}
	// The header alone, without data, is enough.
	h, err := ParseHeader(f[:len(f)-1], int64(len(f)))
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Tensors) != 1 || h.Tensors[0].Name != "t" {
		t.Fatalf("tensors = %+v", h.Tensors)
	}
}

func TestNumElements(t *testing.T) {
	cases := []struct {
		shape []int
		want  int64
	}{{nil, 1}, {[]int{}, 1}, {[]int{7}, 7}, {[]int{2, 3, 4}, 24}, {[]int{5, 0}, 0}}
	for _, tc := range cases {
		if got := (TensorInfo{Shape: tc.shape}).NumElements(); got != tc.want {
			t.Errorf("NumElements(%v) = %d, want %d", tc.shape, got, tc.want)
		}
	}
}

func f32Bytes(vs ...float32) []byte {
	b := make([]byte, 4*len(vs))
	for i, v := range vs {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

func sampleTensors() []Tensor {
	return []Tensor{
		{Name: "z.first", DType: dtype.F32, Shape: []int{2, 3}, Data: f32Bytes(1, 2, 3, 4, 5, -6.5)},
		{Name: "a<&>\"quoted\"", DType: dtype.BF16, Shape: []int{3}, Data: []byte{1, 2, 3, 4, 5, 6}},
		{Name: "scalar", DType: dtype.I64, Shape: []int{}, Data: []byte{9, 8, 7, 6, 5, 4, 3, 2}},
		{Name: "empty", DType: dtype.F16, Shape: []int{0, 4}, Data: nil},
		{Name: "fp8", DType: dtype.F8E4M3, Shape: []int{5}, Data: []byte{0x38, 0x40, 0x7e, 0xfe, 0}},
		{Name: "last.f32", DType: dtype.F32, Shape: []int{1}, Data: f32Bytes(3.25)},
	}
}

func TestRoundTrip(t *testing.T) {
	meta := map[string]string{"format": "pt", "note": "<tag> & \"quotes\" ünïcode\n"}
	want := sampleTensors()
	for _, mmap := range []bool{true, false} {
		name := "read"
		if mmap {
			name = "mmap"
		}
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "m.safetensors")
			if err := WriteFile(path, want, meta); err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			f, err := open(path, mmap)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Mapped() != mmap {
				t.Errorf("Mapped() = %v, want %v", f.Mapped(), mmap)
			}
			if f.Path() != path {
				t.Errorf("Path() = %q", f.Path())
			}
			h := f.Header()
			if h.DataStart%8 != 0 {
				t.Errorf("DataStart %d is not 8-aligned", h.DataStart)
			}
			if !reflect.DeepEqual(h.Metadata, meta) {
				t.Errorf("metadata = %q, want %q", h.Metadata, meta)
			}
			if len(h.Tensors) != len(want) {
				t.Fatalf("%d tensors, want %d", len(h.Tensors), len(want))
			}
			// Declared order is preserved both in the layout and the JSON.
			lastKey := -1
			for i, w := range want {
				ti, data, err := f.TensorData(w.Name)
				if err != nil {
					t.Fatal(err)
				}
				if h.Tensors[i].Name != w.Name {
					t.Errorf("tensor %d is %q, want %q (declared order)", i, h.Tensors[i].Name, w.Name)
				}
				if ti.DType != w.DType || !reflect.DeepEqual(ti.Shape, w.Shape) {
					t.Errorf("%q: got %s %v, want %s %v", w.Name, ti.DType, ti.Shape, w.DType, w.Shape)
				}
				if !bytes.Equal(data, w.Data) {
					t.Errorf("%q: data %v, want %v", w.Name, data, w.Data)
				}
				if !bytes.Equal(raw[h.DataStart+ti.Begin:h.DataStart+ti.End], w.Data) {
					t.Errorf("%q: bytes on disk differ", w.Name)
				}
				if cap(data) != len(data) {
					t.Errorf("%q: cap %d > len %d lets append clobber the next tensor", w.Name, cap(data), len(data))
				}
				key := bytes.Index(raw[8:h.DataStart], []byte(strconv.Quote(w.Name)+`:{"dtype":"`+w.DType.String()))
				if key < 0 || key < lastKey {
					t.Errorf("%q: header keys are not in declared order", w.Name)
				}
				lastKey = key
				if len(data) > 0 {
					_, again, _ := f.TensorData(w.Name)
					if &again[0] != &data[0] {
						t.Errorf("%q: TensorData copies instead of returning a view", w.Name)
					}
					// Tensors are packed back to back, so only those at an
					// aligned offset are aligned in memory.
					if ti.Begin%8 == 0 && uintptr(unsafe.Pointer(&data[0]))%8 != 0 {
						t.Errorf("%q: data at offset %d is not 8-byte aligned in memory", w.Name, ti.Begin)
					}
				}
			}
			if _, _, err := f.TensorData("nope"); err == nil || !strings.Contains(err.Error(), `"nope"`) || !strings.Contains(err.Error(), path) {
				t.Errorf("missing tensor error %v does not name tensor and file", err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
			if _, _, err := f.TensorData("scalar"); err == nil {
				t.Errorf("TensorData after Close succeeded")
			}
		})
	}
}

func TestWriteFileIsAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.safetensors")
	if err := WriteFile(path, sampleTensors()[:1], nil); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(path)
	bad := sampleTensors()
	bad[2].Data = bad[2].Data[:3]
	err := WriteFile(path, bad, nil)
	if err == nil || !strings.Contains(err.Error(), `"scalar"`) || !strings.Contains(err.Error(), path) {
		t.Fatalf("err = %v, want a size error naming the tensor and the file", err)
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(before, after) {
		t.Errorf("failed WriteFile changed the existing file")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries after a failed write, want 1 (temp file left behind?)", len(entries))
	}
	if err := WriteFile(filepath.Join(dir, "missing", "x.safetensors"), nil, nil); err == nil {
		t.Errorf("WriteFile into a missing directory succeeded")
	}
}

type failWriter struct{ n int }

func (w *failWriter) Write(p []byte) (int, error) {
	if w.n <= 0 {
		return 0, errors.New("disk full")
	}
	w.n--
	return len(p), nil
}

func TestWriterErrors(t *testing.T) {
	two := []TensorInfo{
		{Name: "a", DType: dtype.F32, Shape: []int{2}},
		{Name: "b", DType: dtype.U8, Shape: []int{3}},
	}
	cases := []struct {
		name    string
		tensors []TensorInfo
		steps   func(w *Writer) error
		newErr  string
		stepErr string
	}{
		{name: "invalid dtype", tensors: []TensorInfo{{Name: "x", DType: dtype.Invalid, Shape: []int{1}}}, newErr: `"x"`},
		{name: "negative dim", tensors: []TensorInfo{{Name: "x", DType: dtype.F32, Shape: []int{-1}}}, newErr: "negative"},
		{name: "overflow", tensors: []TensorInfo{{Name: "x", DType: dtype.F64, Shape: []int{1 << 62}}}, newErr: "overflows"},
		{name: "duplicate", tensors: []TensorInfo{{Name: "x", DType: dtype.U8}, {Name: "x", DType: dtype.U8}}, newErr: `"x": declared twice`},
		{name: "reserved name", tensors: []TensorInfo{{Name: "__metadata__", DType: dtype.U8}}, newErr: "reserved"},
		{name: "wrong order", tensors: two, steps: func(w *Writer) error { return w.WriteTensor("b", make([]byte, 3)) }, stepErr: `expected tensor "a"`},
		{name: "wrong size", tensors: two, steps: func(w *Writer) error { return w.WriteTensor("a", make([]byte, 7)) }, stepErr: "got 7 bytes"},
		{name: "too many", tensors: two, steps: func(w *Writer) error {
			_ = w.WriteTensor("a", make([]byte, 8))
			_ = w.WriteTensor("b", make([]byte, 3))
			return w.WriteTensor("c", nil)
		}, stepErr: "already written"},
		{name: "missing at close", tensors: two, steps: func(w *Writer) error {
			_ = w.WriteTensor("a", make([]byte, 8))
			return w.Close()
		}, stepErr: `1 tensors not written: ["b"]`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			w, err := NewWriter(&buf, tc.tensors, nil)
			if tc.newErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.newErr) {
					t.Fatalf("NewWriter err = %v, want %q", err, tc.newErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.steps(w); err == nil || !strings.Contains(err.Error(), tc.stepErr) {
				t.Fatalf("err = %v, want %q", err, tc.stepErr)
			}
		})
	}

	t.Run("sticky write error", func(t *testing.T) {
		w, err := NewWriter(&failWriter{n: 1}, two, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.WriteTensor("a", make([]byte, 8)); err == nil || !strings.Contains(err.Error(), "disk full") {
			t.Fatalf("err = %v, want disk full", err)
		}
		if err := w.Close(); err == nil {
			t.Fatalf("Close after a failed write succeeded")
		}
	})
	t.Run("header write error", func(t *testing.T) {
		if _, err := NewWriter(&failWriter{}, two, nil); err == nil {
			t.Fatalf("NewWriter ignored a failed header write")
		}
	})
}

func TestWriterStreams(t *testing.T) {
	var buf bytes.Buffer
	infos := []TensorInfo{{Name: "w", DType: dtype.U8, Shape: []int{3}, Begin: 99, End: 1}}
	w, err := NewWriter(&buf, infos, map[string]string{"k": "v"})
	if err != nil {
		t.Fatal(err)
	}
	headerLen := buf.Len()
	if headerLen%8 != 0 {
		t.Errorf("header occupies %d bytes, not a multiple of 8", headerLen)
	}
	if err := w.WriteTensor("w", []byte{7, 8, 9}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if infos[0].Begin != 99 {
		t.Errorf("NewWriter modified the caller's slice")
	}
	h, err := ParseHeader(buf.Bytes(), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if h.DataStart != int64(headerLen) || h.Tensors[0].Begin != 0 || h.Tensors[0].End != 3 {
		t.Errorf("header = %+v, want data at %d and offsets [0,3]", h, headerLen)
	}
	if !bytes.Equal(buf.Bytes()[headerLen:], []byte{7, 8, 9}) {
		t.Errorf("data = %v", buf.Bytes()[headerLen:])
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.safetensors")
	if err := os.WriteFile(bad, rawFile(`{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, 4), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		path string
		want []string
	}{
		{filepath.Join(dir, "absent.safetensors"), []string{"absent.safetensors"}},
		{bad, []string{bad, `tensor "t"`}},
	}
	for _, tc := range cases {
		_, err := Open(tc.path)
		if err == nil {
			t.Fatalf("Open(%s) succeeded", tc.path)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Open error %q does not mention %q", err, w)
			}
		}
	}
}

func TestStories260K(t *testing.T) {
	path := filepath.Join(testmodel.Dir(t), "model.safetensors")
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := f.Header()
	if len(h.Tensors) != 47 {
		t.Errorf("%d tensors, want 47", len(h.Tensors))
	}
	first := h.Tensors[0]
	if first.Name != "model.embed_tokens.weight" || first.DType != dtype.F32 || !reflect.DeepEqual(first.Shape, []int{512, 64}) {
		t.Errorf("first tensor = %+v, want model.embed_tokens.weight F32 [512 64]", first)
	}
	if h.Metadata["format"] != "pt" {
		t.Errorf("metadata = %v", h.Metadata)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range h.Tensors {
		_, data, err := f.TensorData(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(data)) != ti.NumElements()*int64(ti.DType.Size()) {
			t.Errorf("%s: %d bytes for %v", ti.Name, len(data), ti.Shape)
		}
		if !bytes.Equal(data, raw[h.DataStart+ti.Begin:h.DataStart+ti.End]) {
			t.Errorf("%s: mapped bytes differ from the file", ti.Name)
		}
	}
}

// eofReader returns io.EOF together with a read that reaches the end, as
// io.ReaderAt allows.
type eofReader struct{ b []byte }

func (r eofReader) ReadAt(p []byte, off int64) (int, error) {
	if off >= int64(len(r.b)) {
		return 0, io.EOF
	}
	n := copy(p, r.b[off:])
	if off+int64(n) == int64(len(r.b)) {
		return n, io.EOF
	}
	return n, nil
}

func TestReadHeaderReaderAt(t *testing.T) {
	good := rawFile(`{"t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`, 2)
	header := good[:len(good)-2]
	cases := []struct {
		name    string
		r       io.ReaderAt
		size    int64
		wantErr string
	}{
		{"eof with full read", eofReader{header}, int64(len(good)), ""},
		{"bytes reader", bytes.NewReader(good), int64(len(good)), ""},
		{"size larger than input", eofReader{header[:20]}, int64(len(good)), "unexpected EOF"},
	}
	for _, tc := range cases {
		h, err := ReadHeader(tc.r, tc.size)
		if tc.wantErr == "" {
			if err != nil || len(h.Tensors) != 1 {
				t.Errorf("%s: h=%+v err=%v", tc.name, h, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.wantErr)
		}
	}
}
