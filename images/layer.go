package images

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// BinaryPath is where the stoke binary lies inside the images.
const BinaryPath = "/usr/local/bin/stoke"

// WorkingDir is the images' working directory, where `stoke serve` keeps
// its state unless told otherwise.
const WorkingDir = "/var/lib/stoke"

// SocketDir is the directory the engine image listens in; a runtime
// backend bind-mounts a host directory there to reach the socket.
const SocketDir = "/run/stoke"

// layoutDirs are the directories of the root filesystem besides the
// binary's, with their modes. /tmp is world-writable and sticky as
// everywhere; there is no /etc/passwd: the images run as uid 0 by number.
var layoutDirs = []struct {
	name string
	mode int64
}{
	{"etc/", 0o755},
	{"run/", 0o755},
	{"run/stoke/", 0o755},
	{"tmp/", 0o1777},
	{"usr/", 0o755},
	{"usr/local/", 0o755},
	{"usr/local/bin/", 0o755},
	{"var/", 0o755},
	{"var/lib/", 0o755},
	{"var/lib/stoke/", 0o755},
}

// binaryLayer is the image's one layer, held gzip-compressed in memory.
type binaryLayer struct {
	gz             []byte
	digest, diffID v1.Hash
}

// newBinaryLayer writes the root filesystem with the binary at
// BinaryPath as a gzip-compressed tar. Every header is fixed (owner 0:0,
// modification time mtime, USTAR format), so the same binary always gives
// the same bytes.
func newBinaryLayer(binary string, mtime time.Time) (*binaryLayer, error) {
	f, err := os.Open(binary)
	if err != nil {
		return nil, fmt.Errorf("open binary for the layer: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", binary, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", binary)
	}

	var gzBuf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gzBuf, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	diff := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(zw, diff))
	header := func(name string, typ byte, mode, size int64) *tar.Header {
		return &tar.Header{Typeflag: typ, Name: name, Mode: mode, Size: size, ModTime: mtime, Format: tar.FormatUSTAR}
	}
	for _, d := range layoutDirs {
		if err := tw.WriteHeader(header(d.name, tar.TypeDir, d.mode, 0)); err != nil {
			return nil, fmt.Errorf("write layer entry %s: %w", d.name, err)
		}
	}
	name := BinaryPath[1:]
	if err := tw.WriteHeader(header(name, tar.TypeReg, 0o755, fi.Size())); err != nil {
		return nil, fmt.Errorf("write layer entry %s: %w", name, err)
	}
	if n, err := io.Copy(tw, f); err != nil {
		return nil, fmt.Errorf("copy %s into the layer: %w", binary, err)
	} else if n != fi.Size() {
		return nil, fmt.Errorf("copy %s into the layer: it changed size from %d to %d bytes while being read", binary, fi.Size(), n)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("finish the layer's tar: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("finish the layer's gzip stream: %w", err)
	}
	l := &binaryLayer{gz: gzBuf.Bytes()}
	l.digest = v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", sha256.Sum256(l.gz))}
	l.diffID = v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", diff.Sum(nil))}
	return l, nil
}

// Digest returns the digest of the compressed layer.
func (l *binaryLayer) Digest() (v1.Hash, error) { return l.digest, nil }

// DiffID returns the digest of the uncompressed tar.
func (l *binaryLayer) DiffID() (v1.Hash, error) { return l.diffID, nil }

// Compressed returns the gzip stream.
func (l *binaryLayer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.gz)), nil
}

// Uncompressed returns the tar.
func (l *binaryLayer) Uncompressed() (io.ReadCloser, error) {
	zr, err := gzip.NewReader(bytes.NewReader(l.gz))
	if err != nil {
		return nil, fmt.Errorf("decompress layer %s: %w", l.digest, err)
	}
	return zr, nil
}

// Size returns the compressed size.
func (l *binaryLayer) Size() (int64, error) { return int64(len(l.gz)), nil }

// MediaType returns the OCI gzip layer type.
func (l *binaryLayer) MediaType() (types.MediaType, error) { return types.OCILayer, nil }
