package images

import (
	"archive/tar"
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations of an archive's index that name the image.
const (
	// AnnotationImageName carries the full reference; containerd's import
	// and Docker's load name the image after it.
	AnnotationImageName = "io.containerd.image.name"
	// AnnotationRefName carries the tag, as the OCI image layout asks.
	AnnotationRefName = "org.opencontainers.image.ref.name"
)

// ociLayout is the content of an image layout's oci-layout file.
const ociLayout = `{"imageLayoutVersion":"1.0.0"}`

// writeArchive writes img as an OCI image-layout tar at path, replacing
// any file there only once the archive is complete. The index names the
// image ref (and tag). Every tar header is fixed, so the same image gives
// the same archive. It returns the manifest's digest.
func writeArchive(path string, img v1.Image, ref, tag string, platform v1.Platform) (v1.Hash, error) {
	manifest, err := img.RawManifest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("manifest of %s: %w", ref, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("digest of %s: %w", ref, err)
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("config of %s: %w", ref, err)
	}
	configName, err := img.ConfigName()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("config digest of %s: %w", ref, err)
	}
	layers, err := img.Layers()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("layers of %s: %w", ref, err)
	}
	index, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType:   types.OCIManifestSchema1,
			Size:        int64(len(manifest)),
			Digest:      digest,
			Annotations: map[string]string{AnnotationImageName: ref, AnnotationRefName: tag},
			Platform:    &platform,
		}},
	})
	if err != nil {
		return v1.Hash{}, fmt.Errorf("index of %s: %w", ref, err)
	}

	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return v1.Hash{}, fmt.Errorf("create archive %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	bw := bufio.NewWriterSize(tmp, 1<<20)
	a := archiveWriter{tw: tar.NewWriter(bw), mtime: time.Unix(0, 0)}
	a.file("oci-layout", []byte(ociLayout))
	a.file("index.json", index)
	a.dir("blobs/")
	a.dir("blobs/sha256/")
	for _, l := range layers {
		a.layer(l)
	}
	a.file(blobPath(configName), config)
	a.file(blobPath(digest), manifest)
	err = a.err
	if err == nil {
		err = a.tw.Close()
	}
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return v1.Hash{}, fmt.Errorf("write archive %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return v1.Hash{}, fmt.Errorf("write archive %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return v1.Hash{}, fmt.Errorf("write archive %s: %w", path, err)
	}
	return digest, nil
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

// archiveWriter writes tar entries with fixed headers, keeping the first
// error.
type archiveWriter struct {
	tw    *tar.Writer
	mtime time.Time
	err   error
}

func (a *archiveWriter) header(name string, typ byte, mode, size int64) {
	if a.err != nil {
		return
	}
	a.err = a.tw.WriteHeader(&tar.Header{Typeflag: typ, Name: name, Mode: mode, Size: size, ModTime: a.mtime, Format: tar.FormatUSTAR})
	if a.err != nil {
		a.err = fmt.Errorf("entry %s: %w", name, a.err)
	}
}

func (a *archiveWriter) dir(name string) { a.header(name, tar.TypeDir, 0o755, 0) }

func (a *archiveWriter) file(name string, b []byte) {
	a.header(name, tar.TypeReg, 0o644, int64(len(b)))
	if a.err == nil {
		if _, err := a.tw.Write(b); err != nil {
			a.err = fmt.Errorf("entry %s: %w", name, err)
		}
	}
}

func (a *archiveWriter) layer(l v1.Layer) {
	if a.err != nil {
		return
	}
	digest, err := l.Digest()
	if err != nil {
		a.err = fmt.Errorf("layer digest: %w", err)
		return
	}
	size, err := l.Size()
	if err != nil {
		a.err = fmt.Errorf("size of layer %s: %w", digest, err)
		return
	}
	rc, err := l.Compressed()
	if err != nil {
		a.err = fmt.Errorf("read layer %s: %w", digest, err)
		return
	}
	defer rc.Close()
	name := blobPath(digest)
	a.header(name, tar.TypeReg, 0o644, size)
	if a.err != nil {
		return
	}
	if n, err := io.Copy(a.tw, rc); err != nil {
		a.err = fmt.Errorf("entry %s: %w", name, err)
	} else if n != size {
		a.err = fmt.Errorf("entry %s: layer has %d bytes, said %d", name, n, size)
	}
}
