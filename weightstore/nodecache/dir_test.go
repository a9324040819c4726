//go:build unix

package nodecache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stokehq/stoke/internal/testmodel"
	"github.com/stokehq/stoke/weightstore/manifest"
)

// testBytes returns n deterministic pseudo-random bytes.
func testBytes(n int, seed byte) []byte {
	var key [32]byte
	key[0] = seed
	buf := make([]byte, n)
	rand.NewChaCha8(key).Read(buf)
	return buf
}

func fileOf(name string, data []byte) manifest.File {
	sum := sha256.Sum256(data)
	return manifest.File{Name: name, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
}

func newTestDir(t testing.TB, opts DirOptions) *Dir {
	t.Helper()
	d, err := NewDir(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func ingest(t testing.TB, d *Dir, f manifest.File, data []byte) {
	t.Helper()
	ctx := t.Context()
	w, err := d.Create(ctx, f)
	if errors.Is(err, ErrExists) {
		return
	}
	if err != nil {
		t.Fatalf("Create %s: %v", f.Name, err)
	}
	defer w.Close()
	if _, err := w.Write(data); err != nil {
		t.Fatalf("Write %s: %v", f.Name, err)
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatalf("Commit %s: %v", f.Name, err)
	}
}

func readBlob(t testing.TB, b Blob) []byte {
	t.Helper()
	data, err := io.ReadAll(io.NewSectionReader(b, 0, b.Size()))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// testRevision is a revision's manifest and its files' content by name.
type testRevision struct {
	m     *manifest.Manifest
	files map[string][]byte
}

func newTestRevision(t testing.TB, model string, files map[string][]byte) testRevision {
	t.Helper()
	m := &manifest.Manifest{Model: model, DType: "F32", CreatedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
	for name, data := range files {
		m.Files = append(m.Files, fileOf(name, data))
		m.TotalBytes += int64(len(data))
	}
	m.Revision = manifest.Revision(m.Files)
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	return testRevision{m: m, files: files}
}

// commit ingests r's files and commits r.
func (r testRevision) commit(t testing.TB, d *Dir) {
	t.Helper()
	for _, f := range r.m.Files {
		ingest(t, d, f, r.files[f.Name])
	}
	if err := d.CommitRevision(t.Context(), r.m); err != nil {
		t.Fatalf("CommitRevision %s: %v", r.m.Model, err)
	}
}

func ingestTemps(t testing.TB, d *Dir) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(d.ingestDir(), "*.tmp"))
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestDirIngestOpen(t *testing.T) {
	for _, size := range []int{0, 1, 4096, 1<<20 + 7} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			d := newTestDir(t, DirOptions{})
			data := testBytes(size, 1)
			f := fileOf("model.safetensors", data)
			if _, err := d.Open(t.Context(), f); !errors.Is(err, ErrNotExist) {
				t.Fatalf("Open before ingest: %v, want ErrNotExist", err)
			}
			ingest(t, d, f, data)
			b, err := d.Open(t.Context(), f)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if b.Size() != int64(size) {
				t.Errorf("Size = %d, want %d", b.Size(), size)
			}
			if got := readBlob(t, b); !bytes.Equal(got, data) {
				t.Errorf("content differs from what was written")
			}
			fi, err := os.Stat(d.blobPath(f.SHA256))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o444 {
				t.Errorf("blob mode %v, want read-only", fi.Mode().Perm())
			}
			if _, err := d.Create(t.Context(), f); !errors.Is(err, ErrExists) {
				t.Errorf("Create of a committed blob: %v, want ErrExists", err)
			}
			if temps := ingestTemps(t, d); len(temps) != 0 {
				t.Errorf("temp files left: %v", temps)
			}
			if u, err := d.Usage(); err != nil || u != int64(size) {
				t.Errorf("Usage = %d, %v; want %d", u, err, size)
			}
		})
	}
}

func TestDirDigestMismatch(t *testing.T) {
	data := testBytes(1000, 2)
	flipped := bytes.Clone(data)
	flipped[500] ^= 1
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"wrong byte", flipped},
		{"short", data[:999]},
		{"long", append(bytes.Clone(data), 0)},
		{"empty", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newTestDir(t, DirOptions{})
			f := fileOf("w", data)
			w, err := d.Create(t.Context(), f)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Write(tc.data); err != nil {
				t.Fatal(err)
			}
			if err := w.Commit(t.Context()); !errors.Is(err, ErrDigestMismatch) {
				t.Fatalf("Commit: %v, want ErrDigestMismatch", err)
			}
			if err := w.Close(); err != nil {
				t.Errorf("Close after failed Commit: %v", err)
			}
			if _, err := d.Open(t.Context(), f); !errors.Is(err, ErrNotExist) {
				t.Errorf("Open after mismatch: %v, want ErrNotExist", err)
			}
			if temps := ingestTemps(t, d); len(temps) != 0 {
				t.Errorf("temp files left: %v", temps)
			}
			// The lock was released: the right content can be ingested now.
			ingest(t, d, f, data)
			b, err := d.Open(t.Context(), f)
			if err != nil {
				t.Fatal(err)
			}
			b.Close()
		})
	}
}

func TestDirCloseAbandons(t *testing.T) {
	d := newTestDir(t, DirOptions{})
	data := testBytes(1000, 3)
	f := fileOf("w", data)
	w, err := d.Create(t.Context(), f)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data[:500]); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data[500:]); err == nil {
		t.Error("Write after Close succeeded")
	}
	if err := w.Commit(t.Context()); err == nil {
		t.Error("Commit after Close succeeded")
	}
	if temps := ingestTemps(t, d); len(temps) != 0 {
		t.Errorf("temp files left: %v", temps)
	}
	if _, err := d.Open(t.Context(), f); !errors.Is(err, ErrNotExist) {
		t.Errorf("Open after Close: %v, want ErrNotExist", err)
	}
	w, err = d.Create(t.Context(), f)
	if err != nil {
		t.Fatalf("Create after Close: %v", err)
	}
	w.Write(data)
	if err := w.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("Close after Commit: %v", err)
	}
	if _, err := d.Open(t.Context(), f); err != nil {
		t.Errorf("Close after Commit discarded the blob: %v", err)
	}
}

func TestDirInvalidInput(t *testing.T) {
	d := newTestDir(t, DirOptions{})
	good := fileOf("x", []byte("x"))
	for _, tc := range []struct {
		name string
		f    manifest.File
	}{
		{"empty digest", manifest.File{Name: "x", Size: 1}},
		{"path", manifest.File{Name: "x", Size: 1, SHA256: "../../../../../../../../../../../../../../../../../../../etc/passwd"}},
		{"upper case", manifest.File{Name: "x", Size: 1, SHA256: strings.ToUpper(good.SHA256)}},
		{"short", manifest.File{Name: "x", Size: 1, SHA256: good.SHA256[:63]}},
		{"negative size", manifest.File{Name: "x", Size: -1, SHA256: good.SHA256}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := d.Create(t.Context(), tc.f); err == nil || errors.Is(err, ErrNotExist) {
				t.Errorf("Create: %v, want a validation error", err)
			}
			if _, err := d.Open(t.Context(), tc.f); err == nil || errors.Is(err, ErrNotExist) {
				t.Errorf("Open: %v, want a validation error", err)
			}
		})
	}
	for _, rev := range []string{"", "sha256:", good.SHA256, "sha256:../" + good.SHA256[3:], "md5:" + good.SHA256, "sha256:" + strings.ToUpper(good.SHA256)} {
		if _, err := d.OpenRevision(t.Context(), rev); err == nil || errors.Is(err, ErrNotExist) {
			t.Errorf("OpenRevision(%q): %v, want a validation error", rev, err)
		}
	}
	if _, err := NewDir(t.TempDir(), DirOptions{MaxBytes: -1}); err == nil {
		t.Error("NewDir accepted a negative budget")
	}
}

func TestDirConcurrentCreate(t *testing.T) {
	d := newTestDir(t, DirOptions{})
	data := testBytes(256<<10, 4)
	f := fileOf("w", data)
	const n = 8
	var (
		wg                sync.WaitGroup
		mu                sync.Mutex
		ingested, existed int
		errs              []error
	)
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			w, err := d.Create(ctx, f)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, ErrExists):
				existed++
				return
			case err != nil:
				errs = append(errs, err)
				return
			}
			defer w.Close()
			// Write in pieces so that others pile up on the lock.
			for off := 0; off < len(data); off += 4096 {
				if _, err := w.Write(data[off : off+4096]); err != nil {
					errs = append(errs, err)
					return
				}
			}
			if err := w.Commit(ctx); err != nil {
				errs = append(errs, err)
				return
			}
			ingested++
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(errors.Join(errs...))
	}
	if ingested != 1 || existed != n-1 {
		t.Errorf("%d writers ingested and %d got ErrExists, want 1 and %d", ingested, existed, n-1)
	}
	b, err := d.Open(t.Context(), f)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !bytes.Equal(readBlob(t, b), data) {
		t.Error("content differs")
	}
}

func TestDirOpenCorrupt(t *testing.T) {
	data := testBytes(1000, 5)
	for _, tc := range []struct {
		name    string
		corrupt func(path string) error
	}{
		{"truncated", func(path string) error { return os.Truncate(path, 999) }},
		{"extended", func(path string) error { return os.Truncate(path, 1001) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newTestDir(t, DirOptions{})
			f := fileOf("w", data)
			ingest(t, d, f, data)
			path := d.blobPath(f.SHA256)
			if err := os.Chmod(path, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := tc.corrupt(path); err != nil {
				t.Fatal(err)
			}
			if _, err := d.Open(t.Context(), f); !errors.Is(err, ErrNotExist) {
				t.Fatalf("Open of a corrupt blob: %v, want ErrNotExist", err)
			}
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("corrupt blob still there: %v", err)
			}
			ingest(t, d, f, data)
			b, err := d.Open(t.Context(), f)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if !bytes.Equal(readBlob(t, b), data) {
				t.Error("content differs after re-ingest")
			}
		})
	}
}

func TestDirRevision(t *testing.T) {
	d := newTestDir(t, DirOptions{})
	shared := testBytes(3000, 6)
	r := newTestRevision(t, "tiny", map[string][]byte{
		"config.json":       []byte(`{"dim":64}`),
		"model.safetensors": testBytes(100_000, 7),
		"tokenizer.json":    shared,
		"copy.json":         shared,
		"empty.txt":         {},
	})
	if _, err := d.OpenRevision(t.Context(), r.m.Revision); !errors.Is(err, ErrNotExist) {
		t.Fatalf("OpenRevision before commit: %v, want ErrNotExist", err)
	}
	r.commit(t, d)
	if err := d.CommitRevision(t.Context(), r.m); err != nil {
		t.Errorf("second CommitRevision: %v", err)
	}
	rv, err := d.OpenRevision(t.Context(), r.m.Revision)
	if err != nil {
		t.Fatal(err)
	}
	defer rv.Close()
	if !strings.HasPrefix(rv.Dir(), d.Root()+string(filepath.Separator)) {
		t.Errorf("Dir %s is not under the root %s", rv.Dir(), d.Root())
	}
	want, _ := r.m.Marshal()
	got, err := rv.Manifest().Marshal()
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("Manifest() = %s, %v; want %s", got, err, want)
	}
	entries, err := os.ReadDir(rv.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(r.files)+1 {
		t.Errorf("revision directory has %d entries, want %d files and the manifest", len(entries), len(r.files))
	}
	for name, data := range r.files {
		got, err := os.ReadFile(filepath.Join(rv.Dir(), name))
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("file %s: %d bytes, %v; want %d bytes equal", name, len(got), err, len(data))
		}
	}
	onDisk, err := os.ReadFile(filepath.Join(rv.Dir(), manifest.FileName))
	if err != nil || !bytes.Equal(onDisk, want) {
		t.Errorf("%s = %s, %v; want %s", manifest.FileName, onDisk, err, want)
	}
	if u, err := d.Usage(); err != nil || u != r.m.TotalBytes-int64(len(shared)) {
		t.Errorf("Usage = %d, %v; want %d (a shared blob counts once)", u, err, r.m.TotalBytes-int64(len(shared)))
	}
	if err := rv.Close(); err != nil {
		t.Error(err)
	}
	if err := rv.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestDirCommitRevisionMissingBlob(t *testing.T) {
	d := newTestDir(t, DirOptions{})
	r := newTestRevision(t, "tiny", map[string][]byte{"a.bin": testBytes(100, 8), "b.bin": testBytes(200, 9)})
	ingest(t, d, r.m.Files[0], r.files[r.m.Files[0].Name])
	missing := r.m.Files[1].Name
	err := d.CommitRevision(t.Context(), r.m)
	if !errors.Is(err, ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("CommitRevision: %v, want ErrNotExist naming %s", err, missing)
	}
	if _, err := d.OpenRevision(t.Context(), r.m.Revision); !errors.Is(err, ErrNotExist) {
		t.Errorf("OpenRevision after a failed commit: %v, want ErrNotExist", err)
	}
	entries, err := os.ReadDir(d.revisionsDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left in revisions/: %s", e.Name())
	}
	bad := *r.m
	bad.TotalBytes++
	if err := d.CommitRevision(t.Context(), &bad); err == nil {
		t.Error("CommitRevision accepted an invalid manifest")
	}
}

func TestDirOpenRevisionCorrupt(t *testing.T) {
	d := newTestDir(t, DirOptions{})
	r := newTestRevision(t, "tiny", map[string][]byte{"a.bin": testBytes(100, 10)})
	r.commit(t, d)
	path := filepath.Join(d.revisionPath(strings.TrimPrefix(r.m.Revision, manifest.RevisionPrefix)), "a.bin")
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 50); err != nil {
		t.Fatal(err)
	}
	if _, err := d.OpenRevision(t.Context(), r.m.Revision); !errors.Is(err, ErrNotExist) {
		t.Fatalf("OpenRevision of a corrupt revision: %v, want ErrNotExist", err)
	}
	if _, err := os.Stat(filepath.Dir(path)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("corrupt revision still there: %v", err)
	}
}

// revisionOpens reports whether OpenRevision finds r.
func revisionOpens(t *testing.T, d *Dir, r testRevision) bool {
	t.Helper()
	rv, err := d.OpenRevision(t.Context(), r.m.Revision)
	if errors.Is(err, ErrNotExist) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	rv.Close()
	return true
}

func blobOpens(t *testing.T, d *Dir, f manifest.File) bool {
	t.Helper()
	b, err := d.Open(t.Context(), f)
	if errors.Is(err, ErrNotExist) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	return true
}

// threeRevisions returns revisions of size bytes each with distinct
// content.
func threeRevisions(t *testing.T, size int) [3]testRevision {
	var rs [3]testRevision
	for i := range rs {
		rs[i] = newTestRevision(t, fmt.Sprintf("m%d", i), map[string][]byte{
			"a.bin": testBytes(size/2, byte(20+2*i)),
			"b.bin": testBytes(size-size/2, byte(21+2*i)),
		})
	}
	return rs
}

func TestDirEvictLRU(t *testing.T) {
	const size = 10_000
	d := newTestDir(t, DirOptions{MaxBytes: 2 * size})
	rs := threeRevisions(t, size)
	rs[0].commit(t, d)
	rs[1].commit(t, d)
	if !revisionOpens(t, d, rs[0]) { // now rs[1] is the least recently used
		t.Fatal("revision 0 missing")
	}
	rs[2].commit(t, d)
	for i, want := range []bool{true, false, true} {
		if got := revisionOpens(t, d, rs[i]); got != want {
			t.Errorf("revision %d present = %v, want %v", i, got, want)
		}
		for _, f := range rs[i].m.Files {
			if got := blobOpens(t, d, f); got != want {
				t.Errorf("revision %d blob %s present = %v, want %v", i, f.Name, got, want)
			}
		}
	}
	if u, err := d.Usage(); err != nil || u != 2*size {
		t.Errorf("Usage = %d, %v; want %d", u, err, 2*size)
	}
}

func TestDirEvictKeepsSharedBlob(t *testing.T) {
	const size = 10_000
	d := newTestDir(t, DirOptions{MaxBytes: 3 * size})
	shared := testBytes(size, 30)
	ra := newTestRevision(t, "a", map[string][]byte{"shared.bin": shared, "a.bin": testBytes(size, 31)})
	rb := newTestRevision(t, "b", map[string][]byte{"shared.bin": shared, "b.bin": testBytes(size, 32)})
	rc := newTestRevision(t, "c", map[string][]byte{"c.bin": testBytes(size, 33)})
	ra.commit(t, d)
	rb.commit(t, d)
	rc.commit(t, d)
	if revisionOpens(t, d, ra) || !revisionOpens(t, d, rb) || !revisionOpens(t, d, rc) {
		t.Fatal("want revision a alone evicted")
	}
	for name, want := range map[string]bool{"shared.bin": true, "a.bin": false} {
		if got := blobOpens(t, d, fileOf(name, ra.files[name])); got != want {
			t.Errorf("blob %s present = %v, want %v", name, got, want)
		}
	}
	if u, err := d.Usage(); err != nil || u != 3*size {
		t.Errorf("Usage = %d, %v; want %d", u, err, 3*size)
	}
}

func TestDirEvictSkipsOpen(t *testing.T) {
	const size = 10_000
	d := newTestDir(t, DirOptions{MaxBytes: size})
	rs := threeRevisions(t, size)
	rs[0].commit(t, d)
	rv, err := d.OpenRevision(t.Context(), rs[0].m.Revision)
	if err != nil {
		t.Fatal(err)
	}
	rs[1].commit(t, d)
	if !revisionOpens(t, d, rs[0]) {
		t.Fatal("an open revision was evicted")
	}
	got, err := os.ReadFile(filepath.Join(rv.Dir(), "a.bin"))
	if err != nil || !bytes.Equal(got, rs[0].files["a.bin"]) {
		t.Errorf("reading the open revision: %d bytes, %v", len(got), err)
	}
	if u, err := d.Usage(); err != nil || u != 2*size {
		t.Errorf("Usage = %d, %v; want %d (over budget while open)", u, err, 2*size)
	}
	if err := rv.Close(); err != nil {
		t.Fatal(err)
	}
	// revisionOpens touched revision 0 last, so make revision 1 the most
	// recently used before evicting.
	if !revisionOpens(t, d, rs[1]) {
		t.Fatal("revision 1 missing")
	}
	if err := d.Evict(t.Context()); err != nil {
		t.Fatal(err)
	}
	if revisionOpens(t, d, rs[0]) || !revisionOpens(t, d, rs[1]) {
		t.Error("after Close, Evict did not evict revision 0 alone")
	}
}

func TestDirEvictOrphansFirst(t *testing.T) {
	const size = 10_000
	for _, tc := range []struct {
		name         string
		grace        time.Duration
		orphanStays  bool
		oldestEvicts bool
	}{
		{"no grace", -1, false, false},
		{"within grace", time.Hour, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newTestDir(t, DirOptions{MaxBytes: 2 * size, OrphanGrace: tc.grace})
			rs := threeRevisions(t, size)
			rs[0].commit(t, d)
			rs[1].commit(t, d)
			orphan := testBytes(size, 99)
			of := fileOf("orphan", orphan)
			ingest(t, d, of, orphan)
			if err := d.Evict(t.Context()); err != nil {
				t.Fatal(err)
			}
			if got := blobOpens(t, d, of); got != tc.orphanStays {
				t.Errorf("orphan present = %v, want %v", got, tc.orphanStays)
			}
			if got := revisionOpens(t, d, rs[0]); got == tc.oldestEvicts {
				t.Errorf("oldest revision present = %v, want %v", got, !tc.oldestEvicts)
			}
			if !revisionOpens(t, d, rs[1]) {
				t.Error("newest revision evicted")
			}
		})
	}
}

func TestDirSweep(t *testing.T) {
	d := newTestDir(t, DirOptions{})
	digest := fileOf("x", []byte("x")).SHA256
	leftovers := []string{
		filepath.Join(d.revisionsDir(), digest+".tmp-123", "a.bin"),
		filepath.Join(d.revisionsDir(), digest+".del-1-2", "a.bin"),
		filepath.Join(d.revisionsDir(), digest+".lock"),
		filepath.Join(d.ingestDir(), digest+".123.tmp"),
		filepath.Join(d.ingestDir(), digest+".lock"),
	}
	for _, path := range leftovers {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Evict(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{d.revisionsDir(), d.ingestDir()} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			t.Errorf("left after Evict: %s", filepath.Join(dir, e.Name()))
		}
	}
}

func TestDirStories260K(t *testing.T) {
	src := testmodel.Dir(t)
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, e := range entries {
		if e.Type().IsRegular() {
			data, err := os.ReadFile(filepath.Join(src, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			files[e.Name()] = data
		}
	}
	r := newTestRevision(t, "stories260K", files)
	d := newTestDir(t, DirOptions{MaxBytes: r.m.TotalBytes})
	r.commit(t, d)
	rv, err := d.OpenRevision(t.Context(), r.m.Revision)
	if err != nil {
		t.Fatal(err)
	}
	defer rv.Close()
	for name, data := range files {
		got, err := os.ReadFile(filepath.Join(rv.Dir(), name))
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s: %d bytes, %v; want %d bytes equal", name, len(got), err, len(data))
		}
	}
}

// Cross-process tests re-execute the test binary running
// TestDirHelperProcess, whose environment says what to do.
const (
	helperModeEnv = "STOKE_NODECACHE_HELPER"
	helperRootEnv = "STOKE_NODECACHE_HELPER_ROOT"
	helperArgEnv  = "STOKE_NODECACHE_HELPER_ARG"
)

// helperBlobSize is the blob the writer helper ingests (seed 42).
const helperBlobSize = 1 << 20

// TestDirHelperProcess is not a test: it is the other process of the
// cross-process tests. It holds its state until its stdin closes or it is
// killed.
func TestDirHelperProcess(t *testing.T) {
	mode := os.Getenv(helperModeEnv)
	if mode == "" {
		t.Skip("helper process for the cross-process tests")
	}
	d, err := NewDir(os.Getenv(helperRootEnv), DirOptions{})
	if err != nil {
		t.Fatal(err)
	}
	switch mode {
	case "write-half":
		data := testBytes(helperBlobSize, 42)
		w, err := d.Create(t.Context(), fileOf("w", data))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(data[:len(data)/2]); err != nil {
			t.Fatal(err)
		}
	case "open-revision":
		rv, err := d.OpenRevision(t.Context(), os.Getenv(helperArgEnv))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d.Root(), "helper-ready"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		defer rv.Close()
	default:
		t.Fatalf("unknown helper mode %q", mode)
	}
	io.Copy(io.Discard, os.Stdin)
}

// startHelper starts TestDirHelperProcess in mode on d and returns it and
// a channel closed when it exits.
func startHelper(t *testing.T, d *Dir, mode, arg string) (*exec.Cmd, <-chan struct{}) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestDirHelperProcess$", "-test.v")
	cmd.Env = append(os.Environ(), helperModeEnv+"="+mode, helperRootEnv+"="+d.Root(), helperArgEnv+"="+arg)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("helper output:\n%s", out.String())
		}
	})
	return cmd, exited
}

// waitFor polls until cond holds, failing when the helper exits first.
func waitFor(t *testing.T, exited <-chan struct{}, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		select {
		case <-exited:
			t.Fatalf("helper exited before %s", what)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

func TestDirCrossProcessWriter(t *testing.T) {
	d := newTestDir(t, DirOptions{})
	data := testBytes(helperBlobSize, 42)
	f := fileOf("w", data)
	cmd, exited := startHelper(t, d, "write-half", "")
	var childTemp string
	waitFor(t, exited, "the helper's temp file", func() bool {
		temps := ingestTemps(t, d)
		if len(temps) == 1 {
			if fi, err := os.Stat(temps[0]); err == nil && fi.Size() == int64(len(data)/2) {
				childTemp = temps[0]
				return true
			}
		}
		return false
	})

	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if w, err := d.Create(ctx, f); !errors.Is(err, context.DeadlineExceeded) {
		if err == nil {
			w.Close()
		}
		t.Fatalf("Create while another process ingests: %v, want to wait until the deadline", err)
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	w, err := d.Create(t.Context(), f)
	if err != nil {
		t.Fatalf("Create after the writer was killed: %v", err)
	}
	defer w.Close()
	if _, err := os.Stat(childTemp); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the killed writer's temp file %s is still there: %v", childTemp, err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	b, err := d.Open(t.Context(), f)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !bytes.Equal(readBlob(t, b), data) {
		t.Error("content differs")
	}
}

func TestDirCrossProcessOpenRevision(t *testing.T) {
	d := newTestDir(t, DirOptions{MaxBytes: 1})
	r := newTestRevision(t, "tiny", map[string][]byte{"a.bin": testBytes(1000, 11)})
	for _, f := range r.m.Files {
		ingest(t, d, f, r.files[f.Name])
	}
	// Committed alone, the revision is spared by its own CommitRevision.
	if err := d.CommitRevision(t.Context(), r.m); err != nil {
		t.Fatal(err)
	}
	cmd, exited := startHelper(t, d, "open-revision", r.m.Revision)
	waitFor(t, exited, "the helper to open the revision", func() bool {
		_, err := os.Stat(filepath.Join(d.Root(), "helper-ready"))
		return err == nil
	})
	if err := d.Evict(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !revisionOpens(t, d, r) {
		t.Fatal("a revision open in another process was evicted")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	if err := d.Evict(t.Context()); err != nil {
		t.Fatal(err)
	}
	if revisionOpens(t, d, r) {
		t.Error("revision not evicted once the other process died")
	}
	if u, err := d.Usage(); err != nil || u != 0 {
		t.Errorf("Usage = %d, %v; want 0", u, err)
	}
}

// BenchmarkDirRevisionReadAt reads a 512 MiB revision file from the cache
// with 4 goroutines doing 4 MiB ReadAt calls, to compare with cat.
func BenchmarkDirRevisionReadAt(b *testing.B) {
	const (
		size    = 512 << 20
		chunk   = 4 << 20
		readers = 4
	)
	d := newTestDir(b, DirOptions{})
	r := newTestRevision(b, "bench", map[string][]byte{"model.safetensors": testBytes(size, 1)})
	r.commit(b, d)
	r.files = nil
	rv, err := d.OpenRevision(b.Context(), r.m.Revision)
	if err != nil {
		b.Fatal(err)
	}
	defer rv.Close()
	f, err := os.Open(filepath.Join(rv.Dir(), "model.safetensors"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	bufs := make([][]byte, readers)
	for i := range bufs {
		bufs[i] = make([]byte, chunk)
	}
	b.SetBytes(size)
	b.ResetTimer()
	for b.Loop() {
		var wg sync.WaitGroup
		for i := range readers {
			wg.Go(func() {
				for off := int64(i) * chunk; off < size; off += readers * chunk {
					if _, err := f.ReadAt(bufs[i], off); err != nil && err != io.EOF {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
}

func TestDirRemove(t *testing.T) {
	ctx := context.Background()
	d, err := NewDir(t.TempDir(), DirOptions{})
	if err != nil {
		t.Fatal(err)
	}
	shared := []byte("shared weights")
	a := newTestRevision(t, "a", map[string][]byte{"w.safetensors": shared, "config.json": []byte(`{"a":1}`)})
	b := newTestRevision(t, "b", map[string][]byte{"w.safetensors": shared, "config.json": []byte(`{"b":2}`)})
	a.commit(t, d)
	b.commit(t, d)
	open, err := d.OpenRevision(ctx, b.m.Revision)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Remove(ctx, b.m.Revision); !errors.Is(err, ErrInUse) {
		t.Fatalf("remove an open revision: %v, want ErrInUse", err)
	}
	open.Close()
	if err := d.Remove(ctx, a.m.Revision); err != nil {
		t.Fatal(err)
	}
	if _, err := d.OpenRevision(ctx, a.m.Revision); !errors.Is(err, ErrNotExist) {
		t.Fatalf("removed revision still opens: %v", err)
	}
	// b keeps the blob they share; a's own config is gone.
	if blob, err := d.Open(ctx, fileOf("w.safetensors", shared)); err != nil {
		t.Fatalf("the shared blob went with a: %v", err)
	} else {
		blob.Close()
	}
	if _, err := d.Open(ctx, fileOf("config.json", []byte(`{"a":1}`))); !errors.Is(err, ErrNotExist) {
		t.Fatalf("a's own blob survived: %v", err)
	}
	if err := d.Remove(ctx, a.m.Revision); !errors.Is(err, ErrNotExist) {
		t.Fatalf("remove twice: %v", err)
	}
}
