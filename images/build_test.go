package images

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// extract unpacks an archive into a new directory and returns it.
func extract(t *testing.T, archive string) string {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dir := t.TempDir()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return dir
		}
		if err != nil {
			t.Fatalf("read %s: %v", archive, err)
		}
		if !filepath.IsLocal(h.Name) {
			t.Fatalf("%s holds entry %q outside the archive's root", archive, h.Name)
		}
		p := filepath.Join(dir, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatalf("read %s from %s: %v", h.Name, archive, err)
			}
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("%s holds entry %q of type %c", archive, h.Name, h.Typeflag)
		}
	}
}

// layerEntry is one file of a layer's tar.
type layerEntry struct {
	hdr  *tar.Header
	data []byte
}

func readLayer(t *testing.T, l v1.Layer) map[string]layerEntry {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	diff := sha256.New()
	tr := tar.NewReader(io.TeeReader(rc, diff))
	entries := map[string]layerEntry{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read layer: %v", err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("read layer entry %s: %v", h.Name, err)
		}
		entries[h.Name] = layerEntry{h, b}
	}
	io.Copy(diff, rc) // the tar's zero blocks past the end
	want, err := l.DiffID()
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("sha256:%x", diff.Sum(nil)); got != want.String() {
		t.Errorf("layer's uncompressed digest is %s, its diff id says %s", got, want)
	}
	return entries
}

func TestBuildWritesWhatTheImagesShouldSay(t *testing.T) {
	bin := stokeBinary(t)
	binBytes, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	res := stokeImages(t)

	tests := []struct {
		name, ref string
		cmd       []string
	}{
		{StokeImage, "stoke.local/stoke:dev", []string{"serve"}},
		{EngineImage, "stoke.local/engine:dev", []string{"engine", "--blank", "--listen", "unix:///run/stoke/engine.sock"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if res.Refs[tc.name] != tc.ref {
				t.Errorf("ref = %q, want %q", res.Refs[tc.name], tc.ref)
			}
			if want := ArchiveName(tc.name); filepath.Base(res.Archives[tc.name]) != want {
				t.Errorf("archive %s, want a file named %s", res.Archives[tc.name], want)
			}
			dir := extract(t, res.Archives[tc.name])
			checkBlobDigests(t, dir)
			if b, err := os.ReadFile(filepath.Join(dir, "oci-layout")); err != nil || !strings.Contains(string(b), `"imageLayoutVersion":"1.0.0"`) {
				t.Errorf("oci-layout = %q, %v", b, err)
			}

			idx, err := layout.ImageIndexFromPath(dir)
			if err != nil {
				t.Fatalf("read image layout of %s: %v", describe(res, tc.name), err)
			}
			im, err := idx.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			if len(im.Manifests) != 1 {
				t.Fatalf("index lists %d manifests, want 1", len(im.Manifests))
			}
			desc := im.Manifests[0]
			if desc.Digest.String() != res.Digests[tc.name] {
				t.Errorf("index points at %s, Build said %s", desc.Digest, res.Digests[tc.name])
			}
			if desc.MediaType != types.OCIManifestSchema1 {
				t.Errorf("manifest media type %s", desc.MediaType)
			}
			if got := desc.Annotations[AnnotationImageName]; got != tc.ref {
				t.Errorf("index annotation %s = %q, want %q", AnnotationImageName, got, tc.ref)
			}
			if got := desc.Annotations[AnnotationRefName]; got != "dev" {
				t.Errorf("index annotation %s = %q, want dev", AnnotationRefName, got)
			}
			if desc.Platform == nil || desc.Platform.OS != "linux" || desc.Platform.Architecture != "amd64" {
				t.Errorf("index platform %+v, want linux/amd64", desc.Platform)
			}

			img, err := idx.Image(desc.Digest)
			if err != nil {
				t.Fatal(err)
			}
			m, err := img.Manifest()
			if err != nil {
				t.Fatal(err)
			}
			if m.Config.MediaType != types.OCIConfigJSON {
				t.Errorf("config media type %s", m.Config.MediaType)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cf.OS != "linux" || cf.Architecture != "amd64" {
				t.Errorf("config platform %s/%s, want linux/amd64", cf.OS, cf.Architecture)
			}
			if !cf.Created.Time.Equal(time.Unix(0, 0)) {
				t.Errorf("created %v, want the Unix epoch", cf.Created.Time)
			}
			c := cf.Config
			if !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/stoke"}) {
				t.Errorf("entrypoint %q", c.Entrypoint)
			}
			if !slices.Equal(c.Cmd, tc.cmd) {
				t.Errorf("cmd %q, want %q", c.Cmd, tc.cmd)
			}
			if c.WorkingDir != WorkingDir {
				t.Errorf("working dir %q, want %q", c.WorkingDir, WorkingDir)
			}
			if !slices.Contains(c.Env, "PATH=/usr/local/bin:/usr/bin:/bin") {
				t.Errorf("env %q has no PATH", c.Env)
			}
			for k, want := range map[string]string{
				"org.opencontainers.image.version": "dev",
				"org.opencontainers.image.source":  sourceURL,
				"org.opencontainers.image.created": "1970-01-01T00:00:00Z",
			} {
				if c.Labels[k] != want {
					t.Errorf("label %s = %q, want %q", k, c.Labels[k], want)
				}
			}
			if c.Labels["org.opencontainers.image.title"] == "" || c.Labels["org.opencontainers.image.description"] == "" {
				t.Errorf("labels lack a title or a description: %v", c.Labels)
			}

			layers, err := img.Layers()
			if err != nil {
				t.Fatal(err)
			}
			if len(layers) != 1 || len(m.Layers) != 1 || len(cf.RootFS.DiffIDs) != 1 {
				t.Fatalf("%d layers, %d in the manifest, %d diff ids; want 1 of each", len(layers), len(m.Layers), len(cf.RootFS.DiffIDs))
			}
			if m.Layers[0].MediaType != types.OCILayer {
				t.Errorf("layer media type %s", m.Layers[0].MediaType)
			}
			if d := m.Layers[0].Digest.String(); d != res.Layer {
				t.Errorf("layer %s, Build said %s", d, res.Layer)
			}
			if tc.name != StokeImage {
				// The same layer, byte for byte, as checkBlobDigests and
				// the digest show: its content was read for the first.
				return
			}
			entries := readLayer(t, layers[0])
			bin, ok := entries["usr/local/bin/stoke"]
			switch {
			case !ok:
				t.Fatalf("layer has no usr/local/bin/stoke; it has %v", keys(entries))
			case bin.hdr.Typeflag != tar.TypeReg || bin.hdr.Mode != 0o755:
				t.Errorf("usr/local/bin/stoke: type %c mode %o, want a regular file of mode 755", bin.hdr.Typeflag, bin.hdr.Mode)
			case !bytes.Equal(bin.data, binBytes):
				t.Errorf("usr/local/bin/stoke holds %d bytes that differ from the %d of %s", len(bin.data), len(binBytes), stokeBinary(t))
			}
			for name, want := range map[string]int64{"tmp/": 0o1777, "run/stoke/": 0o755, "var/lib/stoke/": 0o755} {
				e, ok := entries[name]
				if !ok || e.hdr.Typeflag != tar.TypeDir || e.hdr.Mode != want {
					t.Errorf("layer entry %s: %+v, want a directory of mode %o", name, e.hdr, want)
				}
			}
			if _, ok := entries["etc/passwd"]; ok {
				t.Error("layer has an etc/passwd")
			}
			for name, e := range entries {
				if e.hdr.Uid != 0 || e.hdr.Gid != 0 || !e.hdr.ModTime.Equal(time.Unix(0, 0)) {
					t.Errorf("layer entry %s: owner %d:%d, mtime %v; want 0:0 at the epoch", name, e.hdr.Uid, e.hdr.Gid, e.hdr.ModTime)
				}
			}
		})
	}
}

// checkBlobDigests checks that every blob in a layout is named after its
// content's digest.
func checkBlobDigests(t *testing.T, dir string) {
	t.Helper()
	blobs, err := os.ReadDir(filepath.Join(dir, "blobs", "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	if len(blobs) != 3 {
		t.Errorf("%d blobs, want 3 (manifest, config, layer)", len(blobs))
	}
	for _, b := range blobs {
		data, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", b.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprintf("%x", sha256.Sum256(data)); got != b.Name() {
			t.Errorf("blob %s has digest %s", b.Name(), got)
		}
	}
}

func keys(m map[string]layerEntry) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func TestBuildIsDeterministic(t *testing.T) {
	bin := tinyBinary(t)
	first := buildImages(t, Options{Binary: bin})
	again := buildImages(t, Options{Binary: bin})
	later := buildImages(t, Options{Binary: bin, Created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)})
	for _, name := range []string{StokeImage, EngineImage} {
		if first.Digests[name] != again.Digests[name] {
			t.Errorf("%s: digest %s, then %s from the same binary", name, first.Digests[name], again.Digests[name])
		}
		a, b := fileDigest(t, first.Archives[name]), fileDigest(t, again.Archives[name])
		if a != b {
			t.Errorf("%s: archives differ between two builds (%s, %s)", name, a, b)
		}
		if later.Digests[name] == first.Digests[name] {
			t.Errorf("%s: another creation time gave the same digest %s", name, first.Digests[name])
		}
	}
	if first.Digests[StokeImage] == first.Digests[EngineImage] {
		t.Errorf("stoke and engine images have the same digest %s", first.Digests[StokeImage])
	}
	// The layer's timestamps follow the creation time too.
	if first.Layer == later.Layer {
		t.Errorf("layer %s did not change with the creation time", first.Layer)
	}
}

func fileDigest(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", sha256.Sum256(b))
}

func TestBuildNamesImagesAfterRepositoryAndTag(t *testing.T) {
	tests := []struct {
		repo, tag string
		want      map[string]string
	}{
		{"", "", map[string]string{StokeImage: "stoke.local/stoke:dev", EngineImage: "stoke.local/engine:dev"}},
		{"registry.example.com:5000/team/", "v1.2.3", map[string]string{
			StokeImage: "registry.example.com:5000/team/stoke:v1.2.3", EngineImage: "registry.example.com:5000/team/engine:v1.2.3"}},
		{"ghcr.io/stokehq", "0.1", map[string]string{StokeImage: "ghcr.io/stokehq/stoke:0.1", EngineImage: "ghcr.io/stokehq/engine:0.1"}},
	}
	for _, tc := range tests {
		t.Run(tc.repo+":"+tc.tag, func(t *testing.T) {
			res := buildImages(t, Options{Repository: tc.repo, Tag: tc.tag})
			for name, want := range tc.want {
				if res.Refs[name] != want {
					t.Errorf("%s: ref %q, want %q", name, res.Refs[name], want)
				}
				idx, err := layout.ImageIndexFromPath(extract(t, res.Archives[name]))
				if err != nil {
					t.Fatal(err)
				}
				im, err := idx.IndexManifest()
				if err != nil {
					t.Fatal(err)
				}
				if got := im.Manifests[0].Annotations[AnnotationImageName]; got != want {
					t.Errorf("%s: archive names %q, want %q", name, got, want)
				}
			}
		})
	}
}

func TestBuildRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	notELF := filepath.Join(dir, "script")
	if err := os.WriteFile(notELF, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The test binary links the C library whenever cgo is on; a dynamic
	// binary from the system serves either way.
	dynamic := "/bin/sh"
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"no output directory", Options{Binary: notELF}, "no output directory"},
		{"missing binary", Options{Binary: filepath.Join(dir, "absent"), Out: dir}, "absent"},
		{"not an ELF file", Options{Binary: notELF, Out: dir}, "read ELF header of " + notELF},
		{"dynamic binary", Options{Binary: dynamic, Out: dir}, "dynamically linked"},
		{"bad tag", Options{Binary: notELF, Out: dir, Tag: "no spaces allowed"}, "image reference"},
		{"bad repository", Options{Binary: notELF, Out: dir, Repository: "stoke.local/Upper"}, "image reference"},
		{"package that does not build", Options{Source: moduleRoot, Package: "./images/no-such-command", Out: dir}, "go build ./images/no-such-command"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Build(context.Background(), tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Build: %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 1 {
		t.Errorf("output directory holds %d entries after failed builds (%v), want only the script", len(entries), err)
	}
}

func TestBuildCompilesStokeWhenGivenNoBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles stoke; skipped in -short")
	}
	res, err := Build(context.Background(), Options{Source: moduleRoot, Out: t.TempDir()})
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	// go build -trimpath of the same tree gives the same binary, so the
	// images match those of the package's binary.
	want := stokeImages(t)
	for _, name := range []string{StokeImage, EngineImage} {
		if res.Digests[name] != want.Digests[name] {
			t.Errorf("%s: digest %s, want %s as from the test's own build", name, res.Digests[name], want.Digests[name])
		}
	}
}
