package loader

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/stokehq/stoke/engine/device"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/internal/tier"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/bucket/bucketest"
	"github.com/stokehq/stoke/weightstore/manifest"
	"github.com/stokehq/stoke/weightstore/nodecache"
	"github.com/stokehq/stoke/weightstore/push"
	"github.com/stokehq/stoke/weightstore/synth"
)

// writeCheckpoint writes a synthetic tiny checkpoint in several shards.
func writeCheckpoint(t *testing.T, seed uint64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "src")
	if err := synth.Write(context.Background(), dir, synth.Options{Preset: "tiny", DType: dtype.F32, ShardSize: 256 << 10, Seed: seed}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// pushTo pushes dir as model name into the bucket rooted at root.
func pushTo(t *testing.T, root bucket.Bucket, open func(url string) bucket.Bucket, name, dir string) *manifest.Manifest {
	t.Helper()
	m, err := push.Push(context.Background(), dir, open(strings.TrimSuffix(root.URL(), "/")+"/"+name), push.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// checkSame fails unless res holds exactly the files of dir.
func checkSame(t *testing.T, res *Result, dir string) {
	t.Helper()
	files, ok := res.Files()
	if !ok {
		t.Fatal("the loaded memory is not host-addressable")
	}
	for _, f := range res.Manifest.Files {
		want, err := os.ReadFile(filepath.Join(dir, f.Name))
		if err != nil {
			t.Fatal(err)
		}
		if got := files[f.Name]; !bytes.Equal(got, want) {
			t.Fatalf("%s: loaded %d bytes that differ from the source's %d", f.Name, len(got), len(want))
		}
	}
}

// minioBucket is a bucket on a real MinIO server, with ways to open it
// under other URLs and to reach it with a plain S3 client.
type minioBucket struct {
	srv    *bucketest.Server
	client *minio.Client
	opts   bucket.S3Options
}

func startMinIO(t *testing.T) *minioBucket {
	t.Helper()
	srv := bucketest.StartServer(t)
	bucketest.MakeBucket(t, srv.Endpoint, bucketest.AccessKey, bucketest.SecretKey, "models")
	return &minioBucket{srv: srv, client: bucketest.Client(t, srv.Endpoint, bucketest.AccessKey, bucketest.SecretKey),
		opts: bucket.S3Options{Endpoint: srv.Endpoint, AccessKey: bucketest.AccessKey, SecretKey: bucketest.SecretKey, PathStyle: true, MaxRetries: 1}}
}

func (mb *minioBucket) open(t *testing.T) func(string) bucket.Bucket {
	return func(url string) bucket.Bucket {
		b, err := bucket.Open(context.Background(), url, mb.opts)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}

func openFile(t *testing.T) func(string) bucket.Bucket {
	return func(url string) bucket.Bucket {
		b, err := bucket.Open(context.Background(), url, bucket.S3Options{})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}

func TestLoadRevisionFromBucketThenCache(t *testing.T) {
	src := writeCheckpoint(t, 1)
	mb := startMinIO(t)
	fileRoot := t.TempDir()
	buckets := map[string]func() (bucket.Bucket, func(string) bucket.Bucket){
		"file": func() (bucket.Bucket, func(string) bucket.Bucket) {
			open := openFile(t)
			return open("file://" + fileRoot), open
		},
		"minio": func() (bucket.Bucket, func(string) bucket.Bucket) {
			open := mb.open(t)
			return open("s3://models"), open
		},
	}
	dev := device.NewCPU()
	for name, mk := range buckets {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			root, open := mk()
			m := pushTo(t, root, open, "tiny", src)
			cache, err := nodecache.NewDir(t.TempDir(), nodecache.DirOptions{})
			if err != nil {
				t.Fatal(err)
			}
			opts := Options{Parallel: 4, ChunkSize: 64 << 10}
			first, err := LoadRevision(ctx, dev, cache, Request{Bucket: root, Model: "tiny"}, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer first.Free()
			if err := first.WaitCache(ctx); err != nil {
				t.Fatal(err)
			}
			if first.Tier != tier.Bucket || first.FromBucket != m.TotalBytes || first.Manifest.Revision != m.Revision {
				t.Fatalf("first load: tier %s, %d bytes from the bucket, revision %s; want t3, %d, %s", first.Tier, first.FromBucket, first.Manifest.Revision, m.TotalBytes, m.Revision)
			}
			checkSame(t, first, src)

			second, err := LoadRevision(ctx, dev, cache, Request{Bucket: root, Model: "tiny", Revision: m.Revision}, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer second.Free()
			if second.Tier != tier.Cache || second.FromBucket != 0 || second.FromCache != m.TotalBytes {
				t.Fatalf("second load: tier %s, %d bytes from the bucket, %d from the cache; want t2 and all from the cache", second.Tier, second.FromBucket, second.FromCache)
			}
			checkSame(t, second, src)

			// A pinned revision the bucket no longer holds still loads
			// from the cache; an unknown one is a clear error.
			pushTo(t, root, open, "tiny", writeCheckpoint(t, 2))
			third, err := LoadRevision(ctx, dev, cache, Request{Bucket: root, Model: "tiny", Revision: m.Revision}, opts)
			if err != nil {
				t.Fatal(err)
			}
			third.Free()
			_, err = LoadRevision(ctx, dev, cache, Request{Bucket: root, Model: "tiny", Revision: "sha256:" + strings.Repeat("ab", 32)}, opts)
			if err == nil || !strings.Contains(err.Error(), "not hold the one asked for") {
				t.Fatalf("unknown revision: err = %v", err)
			}
		})
	}
}

// TestLoadRevisionHandsOverHostFiles checks Options.HostFiles, from the
// bucket and from the cache: it gets every small file, verified, before
// the weights start streaming.
func TestLoadRevisionHandsOverHostFiles(t *testing.T) {
	src := writeCheckpoint(t, 1)
	root := t.TempDir()
	open := openFile(t)
	b := open("file://" + root)
	m := pushTo(t, b, open, "tiny", src)
	cache, err := nodecache.NewDir(t.TempDir(), nodecache.DirOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []tier.Tier{tier.Bucket, tier.Cache} {
		var events, handovers int
		var host map[string][]byte
		opts := Options{Parallel: 2, ChunkSize: 64 << 10,
			Progress: func(Progress) { events++ },
			HostFiles: func(h map[string][]byte) {
				if events != 0 {
					t.Errorf("%s: host files handed over after %d progress events of the weights", want, events)
				}
				handovers++
				host = h
			}}
		res, err := LoadRevision(context.Background(), device.NewCPU(), cache, Request{Bucket: b, Model: "tiny", Revision: m.Revision}, opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := res.WaitCache(context.Background()); err != nil {
			t.Fatal(err)
		}
		if res.Tier != want || handovers != 1 || events == 0 {
			t.Fatalf("load: tier %s, %d handovers, %d progress events; want %s, 1, some", res.Tier, handovers, events, want)
		}
		for _, f := range m.Files {
			data, ok := host[f.Name]
			if OnDevice(f.Name) == ok {
				t.Fatalf("%s: handed over %v, want %v", f.Name, ok, !OnDevice(f.Name))
			}
			if wantData, _ := os.ReadFile(filepath.Join(src, f.Name)); ok && !bytes.Equal(data, wantData) {
				t.Fatalf("%s: handed over content differs from the source", f.Name)
			}
		}
		checkSame(t, res, src)
		res.Free()
	}
}

// TestLoadRevisionSingleFlight loads one revision from several goroutines
// at once through one cache: each gets the right bytes, and every blob is
// fetched from the bucket by exactly one of them.
func TestLoadRevisionSingleFlight(t *testing.T) {
	src := writeCheckpoint(t, 3)
	open := openFile(t)
	root := open("file://" + t.TempDir())
	m := pushTo(t, root, open, "tiny", src)
	cache, err := nodecache.NewDir(t.TempDir(), nodecache.DirOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dev := device.NewCPU()
	var mu sync.Mutex
	var fromBucket int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := LoadRevision(context.Background(), dev, cache, Request{Bucket: root, Model: "tiny"}, Options{Parallel: 2, ChunkSize: 32 << 10})
			if err != nil {
				t.Error(err)
				return
			}
			defer res.Free()
			checkSame(t, res, src)
			mu.Lock()
			fromBucket += res.FromBucket
			mu.Unlock()
		}()
	}
	wg.Wait()
	if fromBucket != m.TotalBytes {
		t.Fatalf("%d bytes came from the bucket over 4 concurrent loads, want each file once: %d", fromBucket, m.TotalBytes)
	}
}

// TestLoadRevisionFaults breaks a pushed revision in the ways a bucket can
// break and checks each load fails with a clear error, caches nothing for
// the broken file and leaves the next good load working.
func TestLoadRevisionFaults(t *testing.T) {
	src := writeCheckpoint(t, 4)
	mb := startMinIO(t)
	open := mb.open(t)
	root := open("s3://models")
	dev := device.NewCPU()
	ctx := context.Background()
	shard := func(m *manifest.Manifest) manifest.File {
		for _, f := range m.Files {
			if OnDevice(f.Name) {
				return f
			}
		}
		t.Fatal("no shard")
		return manifest.File{}
	}
	putObject := func(t *testing.T, key string, data []byte) {
		if err := root.Put(ctx, key, bytes.NewReader(data), int64(len(data))); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name    string
		breakIt func(t *testing.T, model string, f manifest.File)
		want    string
	}{
		{name: "missing shard", breakIt: func(t *testing.T, model string, f manifest.File) {
			if err := root.Delete(ctx, model+"/"+f.Name); err != nil {
				t.Fatal(err)
			}
		}, want: "is missing"},
		{name: "truncated shard", breakIt: func(t *testing.T, model string, f manifest.File) {
			data, _ := os.ReadFile(filepath.Join(src, f.Name))
			putObject(t, model+"/"+f.Name, data[:len(data)-100])
		}, want: "is truncated"},
		{name: "flipped bit", breakIt: func(t *testing.T, model string, f manifest.File) {
			data, _ := os.ReadFile(filepath.Join(src, f.Name))
			data[len(data)/2] ^= 0x10
			putObject(t, model+"/"+f.Name, data)
		}, want: "corrupt"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			model := strings.ReplaceAll(c.name, " ", "-")
			m := pushTo(t, root, open, model, src)
			f := shard(m)
			c.breakIt(t, model, f)
			cache, err := nodecache.NewDir(t.TempDir(), nodecache.DirOptions{})
			if err != nil {
				t.Fatal(err)
			}
			_, err = LoadRevision(ctx, dev, cache, Request{Bucket: root, Model: model}, Options{Parallel: 4, ChunkSize: 32 << 10, Backoff: 1})
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), f.Name) {
				t.Fatalf("err = %v, want one naming %s and saying %q", err, f.Name, c.want)
			}
			if b, err := cache.Open(ctx, f); !errors.Is(err, nodecache.ErrNotExist) {
				if b != nil {
					b.Close()
				}
				t.Fatalf("the broken shard is in the cache (err %v)", err)
			}
			if _, err := cache.OpenRevision(ctx, m.Revision); !errors.Is(err, nodecache.ErrNotExist) {
				t.Fatalf("the broken revision is in the cache (err %v)", err)
			}
			// Repair the object: the next load fetches and verifies it.
			data, _ := os.ReadFile(filepath.Join(src, f.Name))
			putObject(t, model+"/"+f.Name, data)
			res, err := LoadRevision(ctx, dev, cache, Request{Bucket: root, Model: model}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer res.Free()
			checkSame(t, res, src)
		})
	}

	t.Run("server stops mid-load", func(t *testing.T) {
		m := pushTo(t, root, open, "stopped", src)
		cache, err := nodecache.NewDir(t.TempDir(), nodecache.DirOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var once sync.Once
		opts := Options{Parallel: 2, ChunkSize: 16 << 10, Retries: 2, Backoff: 1, ProgressEvery: time.Millisecond,
			Progress: func(p Progress) {
				if p.Bytes > 0 && !p.Done {
					once.Do(mb.srv.Stop)
				}
			}}
		_, err = LoadRevision(ctx, dev, cache, Request{Bucket: root, Model: "stopped"}, opts)
		once.Do(func() {})
		if err == nil {
			t.Fatal("the load finished although the server stopped")
		}
		if !strings.Contains(err.Error(), "attempts") {
			t.Fatalf("err = %v, want a read failing after its retries", err)
		}
		if _, err := cache.OpenRevision(ctx, m.Revision); !errors.Is(err, nodecache.ErrNotExist) {
			t.Fatalf("a revision whose load failed is in the cache (err %v)", err)
		}
		if err := mb.srv.Start(); err != nil {
			t.Fatal(err)
		}
		res, err := LoadRevision(ctx, dev, cache, Request{Bucket: root, Model: "stopped"}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer res.Free()
		checkSame(t, res, src)
	})
}

func TestPrefetchFillsTheCache(t *testing.T) {
	src := writeCheckpoint(t, 5)
	open := openFile(t)
	root := open("file://" + t.TempDir())
	m := pushTo(t, root, open, "tiny", src)
	cache, err := nodecache.NewDir(t.TempDir(), nodecache.DirOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 2 { // the second finds everything cached
		got, err := Prefetch(ctx, cache, Request{Bucket: root, Model: "tiny"}, Options{Parallel: 2})
		if err != nil {
			t.Fatal(err)
		}
		if got.Revision != m.Revision {
			t.Fatalf("prefetched %s, want %s", got.Revision, m.Revision)
		}
	}
	res, err := LoadRevision(ctx, device.NewCPU(), cache, Request{Bucket: root, Model: "tiny", Revision: m.Revision}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer res.Free()
	if res.Tier != tier.Cache {
		t.Fatalf("load after a prefetch: %s, want t2", res.Tier)
	}
	checkSame(t, res, src)
	if _, err := Prefetch(ctx, cache, Request{Bucket: root, Model: "tiny", Revision: "sha256:" + strings.Repeat("1", 64)}, Options{}); err == nil {
		t.Fatal("prefetched a revision the bucket does not hold")
	}
}
