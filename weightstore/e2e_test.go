// Package weightstore_test checks the weight store end to end: a checkpoint
// pushed with stoke's push, or uploaded plainly with an S3 client, becomes
// a ready revision through the watcher, and loads bit-identical to the
// source, first from the bucket (T3) and then from each node cache (T2).
package weightstore_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/stokehq/stoke/engine/device"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/internal/tier"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/bucket/bucketest"
	"github.com/stokehq/stoke/weightstore/loader"
	"github.com/stokehq/stoke/weightstore/nodecache"
	"github.com/stokehq/stoke/weightstore/nodecache/ctrdcache"
	"github.com/stokehq/stoke/weightstore/nodecache/ctrdcache/ctrdtest"
	"github.com/stokehq/stoke/weightstore/push"
	"github.com/stokehq/stoke/weightstore/synth"
	"github.com/stokehq/stoke/weightstore/watch"
)

func TestPushAndPlainUploadBecomeRevisionsThatLoad(t *testing.T) {
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "src")
	if err := synth.Write(ctx, src, synth.Options{Preset: "tiny", DType: dtype.F8E4M3, ShardSize: 128 << 10, Seed: 9}); err != nil {
		t.Fatal(err)
	}
	ep, ak, sk := bucketest.StartMinIO(t)
	bucketest.MakeBucket(t, ep, ak, sk, "models")
	s3 := bucket.S3Options{Endpoint: ep, AccessKey: ak, SecretKey: sk, PathStyle: true}
	root, err := bucket.Open(ctx, "s3://models", s3)
	if err != nil {
		t.Fatal(err)
	}

	// "pushed" goes up with stoke push; "plain" file by file with the
	// MinIO client, no manifest.
	dest, err := bucket.Open(ctx, "s3://models/pushed", s3)
	if err != nil {
		t.Fatal(err)
	}
	pushed, err := push.Push(ctx, src, dest, push.Options{})
	if err != nil {
		t.Fatal(err)
	}
	client := bucketest.Client(t, ep, ak, sk)
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if _, err := client.FPutObject(ctx, "models", "plain/"+e.Name(), filepath.Join(src, e.Name()), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Now()
	w := watch.New(root, st, watch.Options{Quiet: time.Minute, Now: func() time.Time { return now }})
	if err := w.Scan(ctx); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * time.Minute)
	if err := w.Scan(ctx); err != nil {
		t.Fatal(err)
	}
	revisions := map[string]string{}
	for _, model := range []string{"pushed", "plain"} {
		rev, err := st.LatestReady(ctx, model)
		if err != nil {
			t.Fatalf("%s: no ready revision: %v", model, err)
		}
		revisions[model] = rev.Digest
	}
	if revisions["pushed"] != pushed.Revision || revisions["plain"] != pushed.Revision {
		t.Fatalf("revisions %v, want both %s (same content)", revisions, pushed.Revision)
	}

	caches := map[string]func(t *testing.T) nodecache.Cache{
		"dir": func(t *testing.T) nodecache.Cache {
			c, err := nodecache.NewDir(t.TempDir(), nodecache.DirOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return c
		},
		"containerd": func(t *testing.T) nodecache.Cache {
			c, err := ctrdcache.New(ctx, ctrdcache.Options{Socket: ctrdtest.Start(t), Namespace: ctrdtest.Namespace})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		},
	}
	dev := device.NewCPU()
	for name, newCache := range caches {
		t.Run(name, func(t *testing.T) {
			cache := newCache(t)
			for _, model := range []string{"pushed", "plain"} {
				for _, want := range []tier.Tier{tier.Bucket, tier.Cache} {
					if model == "plain" && want == tier.Bucket {
						// Same content: the blobs are cached already.
						want = tier.Cache
					}
					res, err := loader.LoadRevision(ctx, dev, cache, loader.Request{Bucket: root, Model: model, Revision: revisions[model]}, loader.Options{ChunkSize: 64 << 10})
					if err != nil {
						t.Fatal(err)
					}
					if res.Tier != want {
						t.Errorf("%s: tier %s, want %s", model, res.Tier, want)
					}
					checkSame(t, res, src)
					if err := res.WaitCache(ctx); err != nil {
						t.Fatal(err)
					}
					res.Free()
				}
			}
		})
	}
}

// checkSame fails unless res holds exactly the files of dir (the
// watcher's manifest.json aside).
func checkSame(t *testing.T, res *loader.Result, dir string) {
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
			t.Fatalf("%s: loaded bytes differ from the source", f.Name)
		}
	}
}
