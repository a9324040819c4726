package safetensors

import (
	"bytes"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// File is an open safetensors file whose data region is mapped read-only
// (or, where mapping fails, read into memory). It is safe for concurrent
// use by readers; slices it hands out are valid until Close.
type File struct {
	path    string
	header  *Header
	data    []byte // the data region, DataStart..EOF
	mapping []byte // the whole mapping to unmap on Close; nil when data was read
	closed  bool
}

// Open opens the safetensors file at path, validates its header and maps
// its data.
func Open(path string) (*File, error) { return open(path, true) }

// open is Open with the choice of mapping, so tests can exercise the
// read-into-memory fallback.
func open(path string, tryMmap bool) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open safetensors file: %w", err)
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	size := st.Size()
	h, err := ReadHeader(fd, size)
	if err != nil {
		return nil, fmt.Errorf("read header of %s: %w", path, err)
	}
	f := &File{path: path, header: h}
	if tryMmap && size > h.DataStart && int64(int(size)) == size {
		m, err := unix.Mmap(int(fd.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
		if err == nil {
			f.mapping = m
			f.data = m[h.DataStart:]
			return f, nil
		}
	}
	f.data = make([]byte, size-h.DataStart)
	if _, err := fd.ReadAt(f.data, h.DataStart); err != nil {
		return nil, fmt.Errorf("read data of %s: %w", path, err)
	}
	return f, nil
}

// FromBytes parses a safetensors file held in memory (a device buffer the
// host addresses, say) and serves zero-copy views into data, which the
// caller keeps alive and unchanged until it is done with the File. name
// identifies the file in errors.
func FromBytes(name string, data []byte) (*File, error) {
	h, err := ReadHeader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		return nil, fmt.Errorf("read header of %s: %w", name, err)
	}
	return &File{path: name, header: h, data: data[h.DataStart:]}, nil
}

// Path is the path the file was opened from.
func (f *File) Path() string { return f.path }

// Header is the file's parsed header.
func (f *File) Header() *Header { return f.header }

// Mapped reports whether the data is memory-mapped rather than copied into
// memory.
func (f *File) Mapped() bool { return f.mapping != nil }

// TensorData returns the tensor called name and its bytes, a view into the
// file's mapping that must not be written to or used after Close.
func (f *File) TensorData(name string) (TensorInfo, []byte, error) {
	if f.closed {
		return TensorInfo{}, nil, fmt.Errorf("tensor %q of %s: file is closed", name, f.path)
	}
	t, ok := f.header.Lookup(name)
	if !ok {
		return TensorInfo{}, nil, fmt.Errorf("tensor %q not found in %s", name, f.path)
	}
	return t, f.data[t.Begin:t.End:t.End], nil
}

// Close releases the mapping. Slices returned by TensorData become invalid.
// Closing twice is harmless.
func (f *File) Close() error {
	m := f.mapping
	f.mapping, f.data, f.closed = nil, nil, true
	if m == nil {
		return nil
	}
	if err := unix.Munmap(m); err != nil {
		return fmt.Errorf("unmap %s: %w", f.path, err)
	}
	return nil
}
