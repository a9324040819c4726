package bucket_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/bucket/bucketest"
)

// impl opens a fresh, empty bucket of one kind.
type impl struct {
	name string
	open func(t *testing.T) bucket.Bucket
}

// fileImpl opens file:// buckets in temporary directories.
func fileImpl() impl {
	return impl{"file", func(t *testing.T) bucket.Bucket {
		dir := t.TempDir()
		// A file next to the root must never show up.
		if err := os.WriteFile(filepath.Join(dir, "root-sibling"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		return mustOpen(t, "file://"+filepath.Join(dir, "root"), bucket.S3Options{})
	}}
}

// s3Impls returns s3:// buckets with and without a key prefix, each a new
// bucket on one MinIO server started for the calling test.
func s3Impls(t *testing.T) []impl {
	endpoint, ak, sk := bucketest.StartMinIO(t)
	opts := bucket.S3Options{Endpoint: endpoint, AccessKey: ak, SecretKey: sk}
	n := 0
	s3 := func(prefix string) func(t *testing.T) bucket.Bucket {
		return func(t *testing.T) bucket.Bucket {
			n++
			name := fmt.Sprintf("bucket-%03d", n)
			bucketest.MakeBucket(t, endpoint, ak, sk, name)
			// An object just outside the prefix must never show up.
			if prefix != "" {
				c := bucketest.Client(t, endpoint, ak, sk)
				if _, err := c.PutObject(context.Background(), name, prefix+"-sibling", strings.NewReader("x"), 1, minio.PutObjectOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			return mustOpen(t, "s3://"+name+"/"+prefix, opts)
		}
	}
	return []impl{{"prefix", s3("models/m1")}, {"root", s3("")}}
}

func mustOpen(t *testing.T, url string, opts bucket.S3Options) bucket.Bucket {
	t.Helper()
	b, err := bucket.Open(context.Background(), url, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", url, err)
	}
	return b
}

func put(t *testing.T, b bucket.Bucket, key string, data []byte) {
	t.Helper()
	if err := b.Put(context.Background(), key, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatalf("Put(%s): %v", key, err)
	}
}

func read(t *testing.T, b bucket.Bucket, key string, off, n int64) ([]byte, error) {
	t.Helper()
	rc, err := b.ReadRange(context.Background(), key, off, n)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("ReadRange(%s, %d, %d): reading: %v", key, off, n, err)
	}
	return data, nil
}

func keys(objs []bucket.Object) []string {
	var ks []string
	for _, o := range objs {
		ks = append(ks, o.Key)
	}
	return ks
}

// pattern returns n deterministic pseudo-random bytes.
func pattern(n int, seed uint64) []byte {
	b := make([]byte, n)
	var s [32]byte
	s[0] = byte(seed)
	rand.NewChaCha8(s).Read(b)
	return b
}

func TestBucket(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, b bucket.Bucket)
	}{
		{"ListStat", testListStat},
		{"ReadRange", testReadRange},
		{"EmptyObject", testEmptyObject},
		{"LargeObject", testLargeObject},
		{"Overwrite", testOverwrite},
		{"Delete", testDelete},
		{"Missing", testMissing},
		{"InvalidKeys", testInvalidKeys},
		{"ShortPut", testShortPut},
		{"CancelledPut", testCancelledPut},
		{"ConcurrentPut", testConcurrentPut},
	}
	runAll := func(t *testing.T, im impl) {
		t.Run(im.name, func(t *testing.T) {
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) { tt.run(t, im.open(t)) })
			}
		})
	}
	runAll(t, fileImpl())
	t.Run("s3", func(t *testing.T) {
		for _, im := range s3Impls(t) {
			runAll(t, im)
		}
	})
}

func testListStat(t *testing.T, b bucket.Bucket) {
	ctx := context.Background()
	all := []string{"a/b1", "a/b2", "a/c/d.json", "ab", "b", "z/y/x/w.bin"}
	for i, k := range slices.Backward(all) {
		put(t, b, k, bytes.Repeat([]byte{'k'}, i+1))
	}
	tests := []struct {
		prefix string
		want   []string
	}{
		{"", all},
		{"a", []string{"a/b1", "a/b2", "a/c/d.json", "ab"}},
		{"a/", []string{"a/b1", "a/b2", "a/c/d.json"}},
		{"a/b", []string{"a/b1", "a/b2"}},
		{"a/c/", []string{"a/c/d.json"}},
		{"a/b1/", nil},
		{"z/y/x/w.bin", []string{"z/y/x/w.bin"}},
		{"missing/", nil},
		{"q", nil},
	}
	for _, tt := range tests {
		objs, err := b.List(ctx, tt.prefix)
		if err != nil {
			t.Fatalf("List(%q): %v", tt.prefix, err)
		}
		if got := keys(objs); !slices.Equal(got, tt.want) {
			t.Errorf("List(%q) = %q, want %q", tt.prefix, got, tt.want)
		}
	}
	objs, err := b.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range objs {
		wantSize := int64(i + 1)
		if o.Size != wantSize || o.ETag == "" || o.LastModified.IsZero() {
			t.Errorf("List entry %+v: want size %d and a non-empty ETag and time", o, wantSize)
		}
		st, err := b.Stat(ctx, o.Key)
		if err != nil {
			t.Fatalf("Stat(%s): %v", o.Key, err)
		}
		// S3's HEAD reports the time to the second, its listing to the millisecond.
		if st.Key != o.Key || st.Size != o.Size || st.ETag != o.ETag || !st.LastModified.Truncate(time.Second).Equal(o.LastModified.Truncate(time.Second)) {
			t.Errorf("Stat(%s) = %+v, List said %+v", o.Key, st, o)
		}
	}
	for _, bad := range []string{"/a", "../a", "a/../b"} {
		if _, err := b.List(ctx, bad); !errors.Is(err, bucket.ErrInvalidKey) {
			t.Errorf("List(%q) error = %v, want ErrInvalidKey", bad, err)
		}
	}
}

func testReadRange(t *testing.T, b bucket.Bucket) {
	data := pattern(1000, 1)
	put(t, b, "obj", data)
	tests := []struct {
		name    string
		off, n  int64
		want    []byte
		wantErr error
	}{
		{"start", 0, 10, data[:10], nil},
		{"middle", 100, 50, data[100:150], nil},
		{"end", 990, 10, data[990:], nil},
		{"to end", 500, -1, data[500:], nil},
		{"whole", 0, -1, data, nil},
		{"one byte", 999, 1, data[999:], nil},
		{"zero length", 10, 0, nil, nil},
		{"runs past end", 995, 100, data[995:], nil},
		{"at end", 1000, 5, nil, nil},
		{"at end to end", 1000, -1, nil, nil},
		{"past end", 1001, 1, nil, bucket.ErrInvalidRange},
		{"far past end", 5000, -1, nil, bucket.ErrInvalidRange},
		{"negative offset", -1, 5, nil, bucket.ErrInvalidRange},
	}
	for _, tt := range tests {
		got, err := read(t, b, "obj", tt.off, tt.n)
		if tt.wantErr != nil {
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("%s: ReadRange(%d, %d) error = %v, want %v", tt.name, tt.off, tt.n, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: ReadRange(%d, %d): %v", tt.name, tt.off, tt.n, err)
			continue
		}
		if !bytes.Equal(got, tt.want) {
			t.Errorf("%s: ReadRange(%d, %d) = %d bytes, want %d bytes equal to the source", tt.name, tt.off, tt.n, len(got), len(tt.want))
		}
	}
}

func testEmptyObject(t *testing.T, b bucket.Bucket) {
	put(t, b, "dir/empty", nil)
	st, err := b.Stat(context.Background(), "dir/empty")
	if err != nil || st.Size != 0 {
		t.Fatalf("Stat = %+v, %v; want size 0", st, err)
	}
	objs, err := b.List(context.Background(), "dir/")
	if err != nil || !slices.Equal(keys(objs), []string{"dir/empty"}) {
		t.Fatalf("List = %v, %v; want [dir/empty]", keys(objs), err)
	}
	for _, r := range []struct{ off, n int64 }{{0, -1}, {0, 10}, {0, 0}} {
		got, err := read(t, b, "dir/empty", r.off, r.n)
		if err != nil || len(got) != 0 {
			t.Errorf("ReadRange(%d, %d) = %d bytes, %v; want 0 bytes", r.off, r.n, len(got), err)
		}
	}
	if _, err := read(t, b, "dir/empty", 1, -1); !errors.Is(err, bucket.ErrInvalidRange) {
		t.Errorf("ReadRange(1, -1) error = %v, want ErrInvalidRange", err)
	}
}

func testLargeObject(t *testing.T, b bucket.Bucket) {
	const size = 20<<20 + 12345 // above minio-go's 16 MiB part size
	data := pattern(size, 2)
	put(t, b, "shards/model-00001.safetensors", data)
	st, err := b.Stat(context.Background(), "shards/model-00001.safetensors")
	if err != nil || st.Size != size {
		t.Fatalf("Stat = %+v, %v; want size %d", st, err, size)
	}
	if strings.HasPrefix(b.URL(), "s3://") && !strings.Contains(st.ETag, "-") {
		t.Errorf("ETag %q has no part count: the upload was not multipart", st.ETag)
	}
	got, err := read(t, b, st.Key, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(got) != sha256.Sum256(data) {
		t.Errorf("full read of %d bytes differs from the %d bytes written", len(got), size)
	}
	// A range across the first part boundary.
	got, err = read(t, b, st.Key, 16<<20-100, 200)
	if err != nil || !bytes.Equal(got, data[16<<20-100:16<<20+100]) {
		t.Errorf("range across the part boundary: %d bytes, %v; want the source's 200 bytes", len(got), err)
	}
}

func testOverwrite(t *testing.T, b bucket.Bucket) {
	ctx := context.Background()
	put(t, b, "config.json", []byte("v1"))
	first, err := b.Stat(ctx, "config.json")
	if err != nil {
		t.Fatal(err)
	}
	put(t, b, "config.json", []byte("version two"))
	second, err := b.Stat(ctx, "config.json")
	if err != nil {
		t.Fatal(err)
	}
	if second.Size != 11 || second.ETag == first.ETag {
		t.Errorf("after overwrite Stat = %+v (before %+v); want size 11 and a new ETag", second, first)
	}
	got, err := read(t, b, "config.json", 0, -1)
	if err != nil || string(got) != "version two" {
		t.Errorf("read after overwrite = %q, %v", got, err)
	}
	objs, err := b.List(ctx, "")
	if err != nil || !slices.Equal(keys(objs), []string{"config.json"}) {
		t.Errorf("List after overwrite = %v, %v; want one object", keys(objs), err)
	}
}

func testDelete(t *testing.T, b bucket.Bucket) {
	ctx := context.Background()
	put(t, b, "a/b/c", []byte("x"))
	put(t, b, "a/keep", []byte("y"))
	if err := b.Delete(ctx, "a/b/c"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := b.Stat(ctx, "a/b/c"); !errors.Is(err, bucket.ErrNotExist) {
		t.Errorf("Stat after Delete error = %v, want ErrNotExist", err)
	}
	objs, err := b.List(ctx, "")
	if err != nil || !slices.Equal(keys(objs), []string{"a/keep"}) {
		t.Errorf("List after Delete = %v, %v; want [a/keep]", keys(objs), err)
	}
	for _, key := range []string{"a/b/c", "never/existed", "a"} {
		if err := b.Delete(ctx, key); err != nil {
			t.Errorf("Delete(%s) of a missing key: %v", key, err)
		}
	}
	if got, err := read(t, b, "a/keep", 0, -1); err != nil || string(got) != "y" {
		t.Errorf("a/keep after deletes = %q, %v", got, err)
	}
	if u := b.URL(); strings.HasPrefix(u, "file://") {
		if _, err := os.Stat(filepath.Join(strings.TrimPrefix(u, "file://"), "a", "b")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("empty directory a/b left behind: %v", err)
		}
	}
}

func testMissing(t *testing.T, b bucket.Bucket) {
	ctx := context.Background()
	put(t, b, "dir/file", []byte("x"))
	for _, key := range []string{"nope", "dir", "dir/file/below", "dir/nope"} {
		if _, err := b.Stat(ctx, key); !errors.Is(err, bucket.ErrNotExist) || !strings.Contains(err.Error(), key) {
			t.Errorf("Stat(%s) error = %v, want ErrNotExist naming the key", key, err)
		}
		if _, err := b.ReadRange(ctx, key, 0, -1); !errors.Is(err, bucket.ErrNotExist) {
			t.Errorf("ReadRange(%s) error = %v, want ErrNotExist", key, err)
		}
		if _, err := b.ReadRange(ctx, key, 0, 0); !errors.Is(err, bucket.ErrNotExist) {
			t.Errorf("ReadRange(%s, 0, 0) error = %v, want ErrNotExist", key, err)
		}
	}
}

func testInvalidKeys(t *testing.T, b bucket.Bucket) {
	ctx := context.Background()
	bad := []string{"", "/etc/passwd", "..", "../escape", "a/../../escape", "a//b", "a/./b", "./a", "a/", "nul\x00byte"}
	if strings.HasPrefix(b.URL(), "file://") {
		bad = append(bad, "dir/.stoke-tmp-123")
	}
	for _, key := range bad {
		if err := b.Put(ctx, key, strings.NewReader("evil"), 4); !errors.Is(err, bucket.ErrInvalidKey) {
			t.Errorf("Put(%q) error = %v, want ErrInvalidKey", key, err)
		}
		if _, err := b.Stat(ctx, key); !errors.Is(err, bucket.ErrInvalidKey) {
			t.Errorf("Stat(%q) error = %v, want ErrInvalidKey", key, err)
		}
		if _, err := b.ReadRange(ctx, key, 0, -1); !errors.Is(err, bucket.ErrInvalidKey) {
			t.Errorf("ReadRange(%q) error = %v, want ErrInvalidKey", key, err)
		}
		if err := b.Delete(ctx, key); !errors.Is(err, bucket.ErrInvalidKey) {
			t.Errorf("Delete(%q) error = %v, want ErrInvalidKey", key, err)
		}
	}
	if objs, err := b.List(ctx, ""); err != nil || len(objs) != 0 {
		t.Errorf("List after rejected puts = %v, %v; want nothing", keys(objs), err)
	}
	if u := b.URL(); strings.HasPrefix(u, "file://") {
		// Nothing may have landed next to the root either.
		parent := filepath.Dir(strings.TrimPrefix(u, "file://"))
		ents, err := os.ReadDir(parent)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if e.Name() != "root" && e.Name() != "root-sibling" {
				t.Errorf("unexpected %s next to the bucket root", e.Name())
			}
		}
	}
}

func testShortPut(t *testing.T, b bucket.Bucket) {
	ctx := context.Background()
	if err := b.Put(ctx, "short", strings.NewReader("12345"), 10); err == nil {
		t.Fatal("Put of 5 bytes claiming 10 succeeded")
	}
	// The same through a reader that cannot seek.
	if err := b.Put(ctx, "short", struct{ io.Reader }{strings.NewReader("12345")}, 10); err == nil {
		t.Fatal("Put of 5 unseekable bytes claiming 10 succeeded")
	}
	if _, err := b.Stat(ctx, "short"); !errors.Is(err, bucket.ErrNotExist) {
		t.Errorf("Stat after a failed Put error = %v, want ErrNotExist", err)
	}
	// Unknown size: read to EOF.
	if err := b.Put(ctx, "unsized", strings.NewReader("12345"), -1); err != nil {
		t.Fatalf("Put with unknown size: %v", err)
	}
	if got, err := read(t, b, "unsized", 0, -1); err != nil || string(got) != "12345" {
		t.Errorf("read unsized = %q, %v", got, err)
	}
}

// failingReader delivers some bytes, then an error.
type failingReader struct{ n int }

func (r *failingReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, errors.New("source broke")
	}
	k := min(len(p), r.n)
	clear(p[:k])
	r.n -= k
	return k, nil
}

func testCancelledPut(t *testing.T, b bucket.Bucket) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Put(ctx, "cancelled", strings.NewReader("data"), 4); err == nil {
		t.Error("Put with a cancelled context succeeded")
	}
	if err := b.Put(context.Background(), "broken", &failingReader{n: 1000}, 5000); err == nil {
		t.Error("Put from a failing reader succeeded")
	}
	objs, err := b.List(context.Background(), "")
	if err != nil || len(objs) != 0 {
		t.Errorf("List after failed puts = %v, %v; want nothing", keys(objs), err)
	}
}

func testConcurrentPut(t *testing.T, b bucket.Bucket) {
	const writers, size = 6, 256 << 10
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for i := range writers {
		wg.Go(func() {
			data := bytes.Repeat([]byte{byte('A' + i)}, size)
			errs[i] = b.Put(context.Background(), "same/key", bytes.NewReader(data), size)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("writer %d: %v", i, err)
		}
	}
	got, err := read(t, b, "same/key", 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != size || got[0] < 'A' || got[0] >= 'A'+writers || !bytes.Equal(got, bytes.Repeat(got[:1], size)) {
		t.Errorf("after concurrent puts the object is %d bytes, not one writer's complete %d", len(got), size)
	}
	objs, err := b.List(context.Background(), "")
	if err != nil || !slices.Equal(keys(objs), []string{"same/key"}) {
		t.Errorf("List after concurrent puts = %v, %v; want [same/key]", keys(objs), err)
	}
	if u := b.URL(); strings.HasPrefix(u, "file://") {
		ents, err := os.ReadDir(filepath.Join(strings.TrimPrefix(u, "file://"), "same"))
		if err != nil || len(ents) != 1 {
			t.Errorf("directory holds %d entries (%v), want just the object: temporary files left", len(ents), err)
		}
	}
}

func TestOpenS3Errors(t *testing.T) {
	endpoint, ak, sk := bucketest.StartMinIO(t)
	bucketest.MakeBucket(t, endpoint, ak, sk, "exists")
	good := bucket.S3Options{Endpoint: endpoint, AccessKey: ak, SecretKey: sk}
	withRegion := func(o bucket.S3Options) bucket.S3Options { o.Region = "us-east-1"; return o }
	wrongSecret, wrongKey := good, good
	wrongSecret.SecretKey = "not-the-secret"
	wrongKey.AccessKey = "nobody"
	noScheme := good
	noScheme.Endpoint = "ftp://" + strings.TrimPrefix(endpoint, "http://")

	tests := []struct {
		name    string
		url     string
		opts    bucket.S3Options
		wantErr error  // nil: Open succeeds
		wantMsg string // in the error
	}{
		{"ok", "s3://exists/some/prefix", good, nil, ""},
		{"ok with region", "s3://exists", withRegion(good), nil, ""},
		{"missing bucket", "s3://missing-bucket/x", good, bucket.ErrBucketNotExist, "missing-bucket"},
		{"missing bucket with region", "s3://missing-bucket", withRegion(good), bucket.ErrBucketNotExist, "missing-bucket"},
		{"wrong secret", "s3://exists", wrongSecret, bucket.ErrAccessDenied, "s3://exists"},
		{"wrong secret with region", "s3://exists", withRegion(wrongSecret), bucket.ErrAccessDenied, "s3://exists"},
		{"unknown access key", "s3://exists", wrongKey, bucket.ErrAccessDenied, "s3://exists"},
		{"bad endpoint scheme", "s3://exists", noScheme, nil, "ftp"},
		{"unsupported scheme", "gs://exists/x", good, nil, "unsupported scheme"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := bucket.Open(context.Background(), tt.url, tt.opts)
			switch {
			case tt.wantErr == nil && tt.wantMsg == "":
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				if _, _, _, err := bucket.SplitURL(b.URL()); err != nil || b.URL() != strings.TrimSuffix(tt.url, "/") {
					t.Errorf("URL() = %q (%v), want %q", b.URL(), err, tt.url)
				}
			case err == nil:
				t.Fatalf("Open succeeded, want an error")
			case tt.wantErr != nil && !errors.Is(err, tt.wantErr):
				t.Errorf("Open error = %v, want %v", err, tt.wantErr)
			case !strings.Contains(err.Error(), tt.wantMsg):
				t.Errorf("Open error %q does not mention %q", err, tt.wantMsg)
			}
		})
	}

	// A server that is not there.
	stopped := good
	stopped.Endpoint = "http://127.0.0.1:1"
	if _, err := bucket.Open(context.Background(), "s3://exists", stopped); err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("Open against a closed port error = %v, want one naming the endpoint", err)
	}
}

func TestOpenFile(t *testing.T) {
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "dir")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(tmp, "plain-file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		url     string
		wantErr error
		wantURL string
	}{
		{"existing dir", "file://" + dir, nil, "file://" + dir},
		{"plain path", dir + "/", nil, "file://" + dir},
		{"missing dir under an existing one", "file://" + dir + "/new", nil, "file://" + dir + "/new"},
		{"missing parent", "file://" + dir + "/no/such/dir", bucket.ErrBucketNotExist, ""},
		{"root is a file", "file://" + file, bucket.ErrBucketNotExist, ""},
		{"parent is a file", file + "/below", bucket.ErrBucketNotExist, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := bucket.Open(context.Background(), tt.url, bucket.S3Options{})
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Open(%s) error = %v, want %v", tt.url, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open(%s): %v", tt.url, err)
			}
			if b.URL() != tt.wantURL {
				t.Errorf("URL() = %q, want %q", b.URL(), tt.wantURL)
			}
			if objs, err := b.List(context.Background(), ""); err != nil || len(objs) != 0 {
				t.Errorf("List = %v, %v; want empty", keys(objs), err)
			}
		})
	}

	// The first Put creates a missing root; a relative file:// URL works.
	t.Chdir(dir)
	b := mustOpen(t, "file://./rel/", bucket.S3Options{})
	put(t, b, "k", []byte("v"))
	if got, err := os.ReadFile(filepath.Join(dir, "rel", "k")); err != nil || string(got) != "v" {
		t.Errorf("relative root: file holds %q, %v", got, err)
	}
}

func TestSplitURL(t *testing.T) {
	tests := []struct {
		url                    string
		scheme, bucket, prefix string
		wantErr                bool
	}{
		{"s3://models", "s3", "models", "", false},
		{"s3://models/", "s3", "models", "", false},
		{"s3://models/llama/8b", "s3", "models", "llama/8b", false},
		{"s3://models/llama/8b/", "s3", "models", "llama/8b", false},
		{"S3://models/x", "s3", "models", "x", false},
		{"file:///var/lib/stoke", "file", "", "/var/lib/stoke", false},
		{"file:///var/lib/stoke/", "file", "", "/var/lib/stoke", false},
		{"file://./.stoke/bucket", "file", "", ".stoke/bucket", false},
		{"/abs/dir", "file", "", "/abs/dir", false},
		{"rel/dir/../other", "file", "", "rel/other", false},
		{"", "", "", "", true},
		{"s3://", "", "", "", true},
		{"s3:///prefix", "", "", "", true},
		{"s3://b/a/../../x", "", "", "", true},
		{"s3://b/a//x", "", "", "", true},
		{"file://", "", "", "", true},
		{"gs://bucket/x", "", "", "", true},
		{"http://host/x", "", "", "", true},
		{"s3://b/nul\x00", "", "", "", true},
	}
	for _, tt := range tests {
		scheme, bkt, prefix, err := bucket.SplitURL(tt.url)
		if tt.wantErr {
			if err == nil {
				t.Errorf("SplitURL(%q) = %q, %q, %q; want an error", tt.url, scheme, bkt, prefix)
			}
			continue
		}
		if err != nil || scheme != tt.scheme || bkt != tt.bucket || prefix != tt.prefix {
			t.Errorf("SplitURL(%q) = %q, %q, %q, %v; want %q, %q, %q", tt.url, scheme, bkt, prefix, err, tt.scheme, tt.bucket, tt.prefix)
		}
	}
}

func TestS3OptionsFromEnv(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want bucket.S3Options
	}{
		{
			env: map[string]string{
				"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ACCESS_KEY_ID": "ak",
				"AWS_SECRET_ACCESS_KEY": "sk", "AWS_REGION": "eu-west-1", "AWS_SESSION_TOKEN": "tok",
				"AWS_DEFAULT_REGION": "ignored",
			},
			want: bucket.S3Options{Endpoint: "http://127.0.0.1:9000", AccessKey: "ak", SecretKey: "sk", Region: "eu-west-1", SessionToken: "tok"},
		},
		{
			env:  map[string]string{"AWS_DEFAULT_REGION": "us-west-2"},
			want: bucket.S3Options{Region: "us-west-2"},
		},
	}
	vars := []string{"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_SESSION_TOKEN"}
	for i, tt := range tests {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			for _, v := range vars {
				t.Setenv(v, tt.env[v])
			}
			if got := bucket.S3OptionsFromEnv(); got != tt.want {
				t.Errorf("S3OptionsFromEnv() = %+v, want %+v", got, tt.want)
			}
		})
	}
}
