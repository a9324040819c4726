package load

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kernels/kernelstest"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/server"
	"github.com/stokehq/stoke/internal/testmodel"
	"github.com/stokehq/stoke/internal/tier"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/bucket/bucketest"
	"github.com/stokehq/stoke/weightstore/nodecache"
	"github.com/stokehq/stoke/weightstore/push"
)

func TestCheckpointLoaderErrors(t *testing.T) {
	stories := testmodel.Dir(t)
	for _, tc := range []struct {
		name, path string
		opts       Options
		want       string
	}{
		{"no checkpoint", t.TempDir(), Options{KVCacheBytes: 1 << 20}, "config.json"},
		{"kv too small", stories, Options{KVCacheBytes: 100}, "holds no block"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Checkpoint(tc.opts)(context.Background(), engineapi.LoadRequest{Path: tc.path}, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
	loaded, err := Checkpoint(Options{Engine: server.EngineOptions{Sched: sched.Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 4, MaxModelLen: 100000}},
		KVCacheBytes: 1 << 20})(context.Background(), engineapi.LoadRequest{Path: stories}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer loaded.Close()
	if loaded.Name != "stories260K" || loaded.MaxModelLen != 512 {
		t.Fatalf("name %q, context %d: want the directory's name and the model's 512", loaded.Name, loaded.MaxModelLen)
	}
}

// TestBucketSourceServesGolden pushes stories260K to a bucket, serves it
// from there the way POST /admin/load {"source","model"} does (first from
// the bucket, then from the node cache) and checks both serve the golden
// greedy completions of the reference implementation, on every kernel set
// this CPU runs.
func TestBucketSourceServesGolden(t *testing.T) {
	cases, stories := testmodel.Golden(t), testmodel.Dir(t)
	ctx := context.Background()
	root := "file://" + t.TempDir()
	dest, err := bucket.Open(ctx, root+"/stories", bucket.S3Options{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := push.Push(ctx, stories, dest, push.Options{})
	if err != nil {
		t.Fatal(err)
	}
	kernelstest.ForEachSet(t, func(t *testing.T, set *kernels.Set) {
		checkBucketServesGolden(t, set, root, m.Revision, m.TotalBytes, cases)
	})
}

func checkBucketServesGolden(t *testing.T, set *kernels.Set, root, revision string, totalBytes int64, cases []testmodel.Case) {
	ctx := context.Background()
	cache, err := nodecache.NewDir(t.TempDir(), nodecache.DirOptions{})
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Engine: server.EngineOptions{Sched: sched.Config{MaxNumBatchedTokens: 256, MaxNumSeqs: 8}}, KVCacheBytes: 16 << 20, Threads: 2, Cache: cache, Kernels: set}
	for _, wantTier := range []tier.Tier{tier.Bucket, tier.Cache} {
		var last engineapi.LoadProgress
		loaded, err := Checkpoint(opts)(ctx, engineapi.LoadRequest{Source: root, Model: "stories", Revision: revision}, func(p engineapi.LoadProgress) { last = p })
		if err != nil {
			t.Fatal(err)
		}
		if last.Tier != wantTier || last.Revision != revision || last.Bytes != totalBytes || loaded.Name != "stories" {
			t.Fatalf("last progress %+v, model %q: want tier %s, revision %s, %d bytes, name stories", last, loaded.Name, wantTier, revision, totalBytes)
		}
		e, err := loaded.Start(core.NewMetrics(prometheus.NewRegistry(), loaded.Name))
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		go e.Run(runCtx)
		for _, c := range cases {
			s, err := e.Submit(core.Params{Prompt: c.PromptIDs, MaxTokens: len(c.Completion), Sampling: sample.Params{TopP: 1, Logprobs: -1}, IgnoreEOS: true})
			if err != nil {
				t.Fatal(err)
			}
			var got []int32
			for {
				d, ok := s.Next(runCtx)
				if !ok {
					break
				}
				got = append(got, d.IDs...)
			}
			if !slices.Equal(got, c.Completion) {
				t.Fatalf("%s from %s: %v, want %v", c.Name, wantTier, got, c.Completion)
			}
		}
		cancel()
		loaded.Close()
	}
}

func TestBucketSourceErrors(t *testing.T) {
	ep, ak, sk := bucketest.StartMinIO(t)
	bucketest.MakeBucket(t, ep, ak, sk, "models")
	good := bucket.S3Options{Endpoint: ep, AccessKey: ak, SecretKey: sk, PathStyle: true, MaxRetries: 1}
	wrongCreds := good
	wrongCreds.SecretKey = "not-the-secret"
	for _, tc := range []struct {
		name string
		s3   bucket.S3Options
		req  engineapi.LoadRequest
		want string
	}{
		{"wrong credentials", wrongCreds, engineapi.LoadRequest{Source: "s3://models", Model: "m"}, "access denied"},
		{"missing bucket", good, engineapi.LoadRequest{Source: "s3://no-such-bucket", Model: "m"}, "bucket does not exist"},
		{"missing model", good, engineapi.LoadRequest{Source: "s3://models", Model: "m"}, "not a pushed revision"},
		{"bad model name", good, engineapi.LoadRequest{Source: "s3://models", Model: "../m"}, "load model"},
		{"unsupported scheme", good, engineapi.LoadRequest{Source: "gs://models", Model: "m"}, "unsupported scheme"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Checkpoint(Options{S3: tc.s3, KVCacheBytes: 1 << 20})(context.Background(), tc.req, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// TestServedNamePerLoad loads through one loader several times: a load's
// served name is its own and never sticks to the loads after it, which
// fall back to the loader's name, else the checkpoint's.
func TestServedNamePerLoad(t *testing.T) {
	stories := testmodel.Dir(t)
	ctx := context.Background()
	root := "file://" + t.TempDir()
	dest, err := bucket.Open(ctx, root+"/stories", bucket.S3Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := push.Push(ctx, stories, dest, push.Options{}); err != nil {
		t.Fatal(err)
	}
	dir := func(served string) engineapi.LoadRequest {
		return engineapi.LoadRequest{Path: stories, ServedModelName: served}
	}
	fromBucket := func(served string) engineapi.LoadRequest {
		return engineapi.LoadRequest{Source: root, Model: "stories", ServedModelName: served}
	}
	for _, tc := range []struct {
		name   string
		loader string // Options.Engine.ServedName
		loads  []engineapi.LoadRequest
		want   []string
	}{
		{"directory", "", []engineapi.LoadRequest{dir("a"), dir("b"), dir("")}, []string{"a", "b", "stories260K"}},
		{"bucket", "", []engineapi.LoadRequest{fromBucket("a"), fromBucket(""), fromBucket("b")}, []string{"a", "stories", "b"}},
		{"mixed", "", []engineapi.LoadRequest{fromBucket("a"), dir(""), dir("b"), fromBucket("")}, []string{"a", "stories260K", "b", "stories"}},
		{"loader's name", "base", []engineapi.LoadRequest{dir("a"), dir(""), fromBucket("b"), fromBucket("")}, []string{"a", "base", "b", "base"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			load := Checkpoint(Options{Engine: server.EngineOptions{ServedName: tc.loader}, KVCacheBytes: 1 << 20, Threads: 1})
			for i, req := range tc.loads {
				loaded, err := load(ctx, req, nil)
				if err != nil {
					t.Fatal(err)
				}
				name := loaded.Name
				if err := loaded.Close(); err != nil {
					t.Fatal(err)
				}
				if name != tc.want[i] {
					t.Fatalf("load %d (%s, served name %q): name %q, want %q", i, req, req.ServedModelName, name, tc.want[i])
				}
			}
		})
	}
}
