package push

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/bucket/bucketest"
	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/manifest"
	"github.com/stokehq/stoke/weightstore/synth"
)

// recorder is a Bucket that passes every call to a real bucket and records
// the writes, in order.
type recorder struct {
	bucket.Bucket
	mu     sync.Mutex
	events []string // "put KEY" or "delete KEY"
	// afterPut, when set, runs after each successful Put with the number of
	// Puts so far.
	afterPut func(n int)
}

func (r *recorder) Put(ctx context.Context, key string, rd io.Reader, size int64) error {
	err := r.Bucket.Put(ctx, key, rd, size)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.events = append(r.events, "put "+key)
	n := len(r.puts())
	hook := r.afterPut
	r.mu.Unlock()
	if hook != nil {
		hook(n)
	}
	return nil
}

func (r *recorder) Delete(ctx context.Context, key string) error {
	r.mu.Lock()
	r.events = append(r.events, "delete "+key)
	r.mu.Unlock()
	return r.Bucket.Delete(ctx, key)
}

// puts returns the keys put so far; the caller holds mu or the push is over.
func (r *recorder) puts() []string {
	var keys []string
	for _, e := range r.events {
		if k, ok := strings.CutPrefix(e, "put "); ok {
			keys = append(keys, k)
		}
	}
	return keys
}

func (r *recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events, r.afterPut = nil, nil
}

// writeTiny writes a synthetic tiny checkpoint in nine shards with
// a stoke.yaml beside it.
func writeTiny(t *testing.T, seed uint64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "src")
	if err := synth.Write(context.Background(), dir, synth.Options{Preset: "tiny", DType: dtype.F32, ShardSize: 64 << 10, Seed: seed}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, SpecFile), []byte("replicas:\n  min: 0\n  max: 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// localFiles hashes every file of dir.
func localFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		out[e.Name()] = hex.EncodeToString(sum[:])
	}
	return out
}

// remoteSum reads key back from b and hashes it.
func remoteSum(t *testing.T, b bucket.Bucket, key string) string {
	t.Helper()
	r, err := b.ReadRange(context.Background(), key, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// destinations returns the buckets a push test runs against: a file://
// directory and a prefix of a real MinIO bucket.
func destinations(t *testing.T) map[string]func(name string) bucket.Bucket {
	t.Helper()
	ctx := context.Background()
	root := t.TempDir()
	dests := map[string]func(string) bucket.Bucket{
		"file": func(name string) bucket.Bucket {
			b, err := bucket.Open(ctx, "file://"+filepath.Join(root, name), bucket.S3Options{})
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
	}
	if testing.Short() && os.Getenv("STOKE_SKIP_MINIO") == "1" {
		return dests
	}
	ep, ak, sk := bucketest.StartMinIO(t)
	bucketest.MakeBucket(t, ep, ak, sk, "models")
	dests["minio"] = func(name string) bucket.Bucket {
		b, err := bucket.Open(ctx, "s3://models/"+name, bucket.S3Options{Endpoint: ep, AccessKey: ak, SecretKey: sk, PathStyle: true})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	return dests
}

func TestPush(t *testing.T) {
	src := writeTiny(t, 1)
	want := localFiles(t, src)
	for backend, open := range destinations(t) {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			rec := &recorder{Bucket: open("tiny")}
			var out bytes.Buffer
			m, err := Push(ctx, src, rec, Options{Parallel: 3, Progress: &out})
			if err != nil {
				t.Fatal(err)
			}
			if m.Model != "tiny" {
				t.Errorf("model = %q, want tiny", m.Model)
			}
			if m.DType != "F32" {
				t.Errorf("dtype = %q, want F32", m.DType)
			}
			if !strings.Contains(string(m.Spec), `"max":2`) {
				t.Errorf("spec = %s, want stoke.yaml's content", m.Spec)
			}
			puts := rec.puts()
			if len(puts) != len(want)+1 || puts[len(puts)-1] != manifest.FileName {
				t.Fatalf("puts = %v, want the %d files then %s last", puts, len(want), manifest.FileName)
			}
			if !strings.Contains(out.String(), "uploaded config.json") {
				t.Errorf("progress output lacks config.json:\n%s", out.String())
			}
			// The committed manifest lists exactly the source files, and
			// every object reads back bit-identical.
			var total int64
			got := map[string]string{}
			for _, f := range m.Files {
				got[f.Name] = f.SHA256
				total += f.Size
				if sum := remoteSum(t, rec, f.Name); sum != want[f.Name] {
					t.Errorf("%s: remote sha256 %s, source %s", f.Name, sum, want[f.Name])
				}
			}
			if len(got) != len(want) {
				t.Errorf("manifest files %v, want %v", got, want)
			}
			for name, sum := range want {
				if got[name] != sum {
					t.Errorf("manifest %s sha256 = %q, want %s", name, got[name], sum)
				}
			}
			if m.TotalBytes != total || m.Revision != manifest.Revision(m.Files) {
				t.Errorf("manifest total %d revision %s inconsistent with its files", m.TotalBytes, m.Revision)
			}
			r, err := rec.ReadRange(ctx, manifest.FileName, 0, -1)
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(r)
			r.Close()
			stored, err := manifest.Parse(data)
			if err != nil {
				t.Fatal(err)
			}
			if stored.Revision != m.Revision {
				t.Errorf("stored revision %s, returned %s", stored.Revision, m.Revision)
			}

			// Pushing the same content again uploads nothing.
			rec.reset()
			again, err := Push(ctx, src, rec, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if len(rec.events) != 0 {
				t.Errorf("second push wrote %v, want nothing", rec.events)
			}
			if again.Revision != m.Revision || !again.CreatedAt.Equal(stored.CreatedAt) {
				t.Errorf("second push returned revision %s created %v, want the stored %s created %v", again.Revision, again.CreatedAt, m.Revision, stored.CreatedAt)
			}

			// New content retires the old manifest before uploading and
			// commits a new revision.
			rec.reset()
			src2 := writeTiny(t, 2)
			m2, err := Push(ctx, src2, rec, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if m2.Revision == m.Revision {
				t.Fatal("different weights kept the revision")
			}
			if len(rec.events) < 2 || rec.events[0] != "delete "+manifest.FileName || rec.events[len(rec.events)-1] != "put "+manifest.FileName {
				t.Errorf("events %v: want the old manifest deleted first and the new one put last", rec.events)
			}
			// config.json and the tokenizer are unchanged and already there.
			if slices.Contains(rec.puts(), checkpoint.TokenizerFile) {
				t.Errorf("puts %v re-uploaded an unchanged file", rec.puts())
			}
			for name, sum := range localFiles(t, src2) {
				if got := remoteSum(t, rec, name); got != sum {
					t.Errorf("after the second revision %s reads back %s, want %s", name, got, sum)
				}
			}
		})
	}
}

func TestPushCancelled(t *testing.T) {
	src := writeTiny(t, 3)
	nfiles := len(localFiles(t, src))
	for backend, open := range destinations(t) {
		t.Run(backend, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			rec := &recorder{Bucket: open("cancelled")}
			rec.afterPut = func(n int) {
				if n == 2 {
					cancel()
				}
			}
			_, err := Push(ctx, src, rec, Options{Parallel: 1})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Push after cancel: err = %v, want context.Canceled", err)
			}
			if slices.Contains(rec.puts(), manifest.FileName) {
				t.Errorf("puts %v include the manifest", rec.puts())
			}
			if _, err := rec.Stat(context.Background(), manifest.FileName); !errors.Is(err, bucket.ErrNotExist) {
				t.Errorf("stat manifest after a cancelled push: %v, want ErrNotExist", err)
			}
			done := rec.puts()
			// One finished upload is corrupted behind push's back, same size.
			corrupt := done[0]
			obj, err := rec.Bucket.Stat(context.Background(), corrupt)
			if err != nil {
				t.Fatal(err)
			}
			if err := rec.Bucket.Put(context.Background(), corrupt, bytes.NewReader(make([]byte, obj.Size)), obj.Size); err != nil {
				t.Fatal(err)
			}
			done = done[1:]

			// Resuming skips what the first attempt finished intact and
			// re-uploads what no longer hashes right.
			rec.reset()
			m, err := Push(context.Background(), src, rec, Options{Parallel: 1})
			if err != nil {
				t.Fatal(err)
			}
			puts := rec.puts()
			for _, k := range done {
				if slices.Contains(puts, k) {
					t.Errorf("resumed push re-uploaded %s (puts %v)", k, puts)
				}
			}
			if !slices.Contains(puts, corrupt) {
				t.Errorf("resumed push kept the corrupted %s (puts %v)", corrupt, puts)
			}
			if len(puts) != nfiles+1-len(done) || puts[len(puts)-1] != manifest.FileName {
				t.Errorf("resumed puts %v, want the %d missing files and the manifest last", puts, nfiles-len(done))
			}
			if len(m.Files) != nfiles {
				t.Errorf("manifest lists %d files, want %d", len(m.Files), nfiles)
			}
		})
	}
}

func TestPushRefusesBrokenCheckpoint(t *testing.T) {
	tests := []struct {
		name   string
		break_ func(t *testing.T, dir string)
		want   string
	}{
		{"missing shard", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, "model-00002-of-00009.safetensors")); err != nil {
				t.Fatal(err)
			}
		}, "model-00002-of-00009.safetensors named in model.safetensors.index.json is missing"},
		{"bad config", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, checkpoint.ConfigFile), []byte("{"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "config"},
		{"missing config", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, checkpoint.ConfigFile)); err != nil {
				t.Fatal(err)
			}
		}, "config.json"},
		{"truncated shard", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "model-00001-of-00009.safetensors")
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(p, fi.Size()-10); err != nil {
				t.Fatal(err)
			}
		}, "model-00001-of-00009.safetensors"},
		{"bad stoke.yaml", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, SpecFile), []byte("replicas: [\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "stoke.yaml"},
	}
	root := t.TempDir()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := writeTiny(t, 4)
			if _, err := os.Stat(filepath.Join(src, "model-00009-of-00009.safetensors")); err != nil {
				t.Fatalf("the test wants nine shards: %v", err)
			}
			tc.break_(t, src)
			b, err := bucket.Open(context.Background(), "file://"+filepath.Join(root, strings.ReplaceAll(tc.name, " ", "-")), bucket.S3Options{})
			if err != nil {
				t.Fatal(err)
			}
			rec := &recorder{Bucket: b}
			_, err = Push(context.Background(), src, rec, Options{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Push of a broken checkpoint: err = %v, want one mentioning %q", err, tc.want)
			}
			if len(rec.events) != 0 {
				t.Errorf("refused push still wrote %v", rec.events)
			}
		})
	}
}

func TestPushQuantize(t *testing.T) {
	src := writeTiny(t, 5)
	for backend, open := range destinations(t) {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			rec := &recorder{Bucket: open("tiny-fp8")}
			m, err := Push(ctx, src, rec, Options{Quantize: true, ShardSize: 32 << 10})
			if err != nil {
				t.Fatal(err)
			}
			if m.DType != "F8_E4M3" {
				t.Errorf("dtype = %q, want F8_E4M3", m.DType)
			}
			if m.Model != "tiny-fp8" {
				t.Errorf("model = %q", m.Model)
			}
			// Download the revision and open it as a checkpoint.
			dl := filepath.Join(t.TempDir(), "dl")
			if err := os.Mkdir(dl, 0o755); err != nil {
				t.Fatal(err)
			}
			var shards int
			for _, f := range m.Files {
				r, err := rec.ReadRange(ctx, f.Name, 0, -1)
				if err != nil {
					t.Fatal(err)
				}
				data, err := io.ReadAll(r)
				r.Close()
				if err != nil {
					t.Fatal(err)
				}
				if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != f.SHA256 {
					t.Errorf("%s reads back with another sha256 than the manifest's", f.Name)
				}
				if err := os.WriteFile(filepath.Join(dl, f.Name), data, 0o644); err != nil {
					t.Fatal(err)
				}
				if strings.HasSuffix(f.Name, ".safetensors") {
					shards++
				}
			}
			if shards < 2 {
				t.Errorf("pushed %d shards, want several at a 32 KiB shard size", shards)
			}
			ck, err := checkpoint.Open(dl)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			if q := ck.Config().Quantization; q == nil || q.QuantMethod != "fp8" {
				t.Errorf("pushed config quantization = %+v, want fp8", q)
			}
			w, ok := ck.Lookup("model.layers.0.mlp.down_proj.weight")
			if !ok || w.DType != dtype.F8E4M3 {
				t.Errorf("down_proj weight: found %v dtype %v, want F8_E4M3", ok, w.DType)
			}
			if _, err := os.Stat(filepath.Join(dl, SpecFile)); err != nil {
				t.Errorf("stoke.yaml did not travel with the FP8 copy: %v", err)
			}

			// Quantisation is deterministic, so pushing again is a no-op.
			rec.reset()
			again, err := Push(ctx, src, rec, Options{Quantize: true, ShardSize: 32 << 10})
			if err != nil {
				t.Fatal(err)
			}
			if again.Revision != m.Revision || len(rec.events) != 0 {
				t.Errorf("second FP8 push: revision %s (want %s), writes %v (want none)", again.Revision, m.Revision, rec.events)
			}
		})
	}
}

func TestPushReshard(t *testing.T) {
	src := writeTiny(t, 6)
	b, err := bucket.Open(context.Background(), "file://"+filepath.Join(t.TempDir(), "one"), bucket.S3Options{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := Push(context.Background(), src, b, Options{ShardSize: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range m.Files {
		names = append(names, f.Name)
	}
	if !slices.Contains(names, checkpoint.SingleFile) || slices.Contains(names, checkpoint.IndexFile) || m.DType != "F32" {
		t.Errorf("resharded to 1 GiB: files %v dtype %s, want one model.safetensors in F32", names, m.DType)
	}
}

func TestModelName(t *testing.T) {
	tests := []struct {
		url, want string
		ok        bool
	}{
		{"s3://models/llama-3.1-8b", "llama-3.1-8b", true},
		{"s3://models/team/tiny", "tiny", true},
		{"file:///srv/models/tiny", "tiny", true},
		{"s3://bucket-only", "bucket-only", true},
		{"file:///", "", false},
	}
	for _, tc := range tests {
		got, err := ModelName(tc.url)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ModelName(%q) = %q, %v; want %q, ok=%v", tc.url, got, err, tc.want, tc.ok)
		}
	}
}
