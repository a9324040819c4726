package watch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/bucket/bucketest"
	"github.com/stokehq/stoke/weightstore/manifest"
	"github.com/stokehq/stoke/weightstore/push"
	"github.com/stokehq/stoke/weightstore/synth"
)

// Shards of the synthetic checkpoint writeTiny writes.
const (
	shard1 = "model-00001-of-00003.safetensors"
	shard2 = "model-00002-of-00003.safetensors"
	shard3 = "model-00003-of-00003.safetensors"
)

// testQuiet is the quiet period of the watchers under test.
const testQuiet = 10 * time.Second

// clock is a test clock that moves only when told to.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// events collects the revisions a watcher reports.
type events struct {
	mu   sync.Mutex
	revs []store.Revision
}

func (e *events) add(r store.Revision) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.revs = append(e.revs, r)
}

func (e *events) list() []store.Revision {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.revs)
}

// backend makes empty buckets of one kind.
type backend struct {
	name string
	// start prepares the backend for the test t and returns a function
	// creating a fresh, empty bucket for each test under it.
	start func(t *testing.T) func(t *testing.T) *env
}

// env is one empty bucket with a watcher over it.
type env struct {
	root       bucket.Bucket // the bucket at its root
	openPrefix func(t *testing.T, name string) bucket.Bucket
	// upload stores a local file under key the way a plain S3 client (or
	// a copy into the directory) would.
	upload func(t *testing.T, key, path string)
	st     *store.Store
	clock  *clock
	events *events
	w      *Watcher
}

func backends() []backend {
	return []backend{
		{"file", func(t *testing.T) func(t *testing.T) *env { return newFileEnv }},
		{"minio", func(t *testing.T) func(t *testing.T) *env {
			ep, ak, sk := bucketest.StartMinIO(t)
			opts := bucket.S3Options{Endpoint: ep, AccessKey: ak, SecretKey: sk, PathStyle: true}
			client := bucketest.Client(t, ep, ak, sk)
			var seq atomic.Int64
			return func(t *testing.T) *env {
				name := fmt.Sprintf("models-%d", seq.Add(1))
				bucketest.MakeBucket(t, ep, ak, sk, name)
				e := &env{
					openPrefix: func(t *testing.T, prefix string) bucket.Bucket {
						return openBucket(t, "s3://"+name+"/"+prefix, opts)
					},
					upload: func(t *testing.T, key, path string) {
						t.Helper()
						if _, err := client.FPutObject(context.Background(), name, key, path, minio.PutObjectOptions{}); err != nil {
							t.Fatalf("upload %s: %v", key, err)
						}
					},
				}
				e.root = openBucket(t, "s3://"+name, opts)
				return e.withWatcher(t)
			}
		}},
	}
}

func openBucket(t *testing.T, url string, opts bucket.S3Options) bucket.Bucket {
	t.Helper()
	b, err := bucket.Open(context.Background(), url, opts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// withWatcher gives e a fresh store and a watcher on a test clock.
func (e *env) withWatcher(t *testing.T) *env {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e.st, e.clock, e.events = st, newClock(), &events{}
	e.w = New(e.root, st, Options{Quiet: testQuiet, Parallel: 3, Now: e.clock.Now, OnRevision: e.events.add})
	return e
}

// scan runs one pass, failing the test on error.
func (e *env) scan(t *testing.T) {
	t.Helper()
	if err := e.w.Scan(context.Background()); err != nil {
		t.Fatalf("Scan: %v", err)
	}
}

// revisions lists the store's revisions of model.
func (e *env) revisions(t *testing.T, model string) []store.Revision {
	t.Helper()
	revs, err := e.st.Revisions(context.Background(), model)
	if err != nil {
		t.Fatal(err)
	}
	return revs
}

// uploadDir uploads every file of dir under name/ with a plain client,
// in name order, except the skipped ones; a manifest.json in dir goes last.
func (e *env) uploadDir(t *testing.T, name, dir string, skip ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	hasManifest := false
	for _, ent := range ents {
		n := ent.Name()
		switch {
		case slices.Contains(skip, n):
		case n == manifest.FileName:
			hasManifest = true
		default:
			e.upload(t, name+"/"+n, filepath.Join(dir, n))
		}
	}
	if hasManifest {
		e.upload(t, name+"/"+manifest.FileName, filepath.Join(dir, manifest.FileName))
	}
}

// readObject reads a whole object.
func readObject(t *testing.T, b bucket.Bucket, key string) ([]byte, error) {
	t.Helper()
	r, err := b.ReadRange(context.Background(), key, 0, -1)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

// writeTiny writes a synthetic tiny checkpoint in three shards.
func writeTiny(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tiny")
	if err := synth.Write(context.Background(), dir, synth.Options{Preset: "tiny", DType: dtype.F32, ShardSize: 200 << 10, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{shard1, shard2, shard3} {
		if _, err := os.Stat(filepath.Join(dir, s)); err != nil {
			t.Fatalf("the synthetic checkpoint lacks %s: %v", s, err)
		}
	}
	return dir
}

// pushedCopy pushes src to a local directory bucket and returns that
// directory: the checkpoint's files and their manifest.json.
func pushedCopy(t *testing.T, src, name string) (string, *manifest.Manifest) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	m, err := push.Push(context.Background(), src, openBucket(t, "file://"+dir, bucket.S3Options{}), push.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return dir, m
}

// localFiles hashes the files of dir (but its manifest and the skipped
// ones), as a manifest would list them.
func localFiles(t *testing.T, dir string, skip ...string) []manifest.File {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []manifest.File
	for _, ent := range ents {
		n := ent.Name()
		if n == manifest.FileName || slices.Contains(skip, n) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		files = append(files, manifest.File{Name: n, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])})
	}
	return files
}

// readManifest parses dir's manifest.json.
func readManifest(t *testing.T, dir string) *manifest.Manifest {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// writeManifest replaces dir's manifest.json with m, re-deriving its
// revision and total from its files.
func writeManifest(t *testing.T, dir string, m *manifest.Manifest) {
	t.Helper()
	m.Revision = manifest.Revision(m.Files)
	m.TotalBytes = 0
	for _, f := range m.Files {
		m.TotalBytes += f.Size
	}
	data, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, manifest.FileName), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkOne checks that model has exactly one revision, in state want, with
// digest (when not empty) and a reason holding every one of reasons.
func checkOne(t *testing.T, e *env, model, digest string, want store.RevisionState, reasons ...string) store.Revision {
	t.Helper()
	revs := e.revisions(t, model)
	if len(revs) != 1 {
		t.Fatalf("model %s has %d revisions, want 1: %+v", model, len(revs), revs)
	}
	r := revs[0]
	if r.State != want || digest != "" && r.Digest != digest {
		t.Fatalf("revision %s is %s (reason %q), want %s %s", r.Digest, r.State, r.Reason, digest, want)
	}
	for _, s := range reasons {
		if !strings.Contains(r.Reason, s) {
			t.Errorf("reason %q does not mention %q", r.Reason, s)
		}
	}
	if r.Source != e.root.URL()+"/"+model {
		t.Errorf("source = %q, want %q", r.Source, e.root.URL()+"/"+model)
	}
	return r
}

// faultyBucket fails the calls its hooks say to fail.
type faultyBucket struct {
	bucket.Bucket
	failList atomic.Bool
	// failRead, when > 0, is the number of the ReadRange call (from 1)
	// that fails; reads counts the calls.
	failRead, reads atomic.Int64
}

var errInjected = errors.New("injected fault")

func (f *faultyBucket) List(ctx context.Context, prefix string) ([]bucket.Object, error) {
	if f.failList.Load() {
		return nil, errInjected
	}
	return f.Bucket.List(ctx, prefix)
}

func (f *faultyBucket) ReadRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if n := f.reads.Add(1); n == f.failRead.Load() {
		return nil, errInjected
	}
	return f.Bucket.ReadRange(ctx, key, off, n)
}

// newFileEnv makes an env over a fresh file:// bucket, copying files in to
// upload them.
func newFileEnv(t *testing.T) *env {
	dir := t.TempDir()
	e := &env{
		openPrefix: func(t *testing.T, name string) bucket.Bucket {
			return openBucket(t, "file://"+filepath.Join(dir, name), bucket.S3Options{})
		},
		upload: func(t *testing.T, key, path string) {
			t.Helper()
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			dst := filepath.Join(dir, filepath.FromSlash(key))
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, data, 0o644); err != nil {
				t.Fatal(err)
			}
		},
	}
	e.root = openBucket(t, "file://"+dir, bucket.S3Options{})
	return e.withWatcher(t)
}
