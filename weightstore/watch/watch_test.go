package watch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/manifest"
	"github.com/stokehq/stoke/weightstore/push"
)

// TestWatcher runs every scenario against a file:// bucket and against a
// real MinIO server (one per test binary run).
func TestWatcher(t *testing.T) {
	src := writeTiny(t)
	scenarios := []struct {
		name string
		run  func(t *testing.T, e *env, src string)
	}{
		{"push", testPush},
		{"committed checks", testCommitted},
		{"plain upload matches push", testPlainMatchesPush},
		{"plain upload still changing", testPlainChanging},
		{"plain upload missing a shard", testPlainMissingShard},
		{"files newer than the manifest", testStaleManifest},
		{"adapters", testAdapters},
	}
	for _, be := range backends() {
		t.Run(be.name, func(t *testing.T) {
			newEnv := be.start(t)
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) { sc.run(t, newEnv(t), src) })
			}
		})
	}
}

// testPush: a pushed checkpoint becomes a ready revision on the first pass;
// later passes change nothing. Objects that are not part of any checkpoint
// are ignored.
func testPush(t *testing.T, e *env, src string) {
	ctx := context.Background()
	m, err := push.Push(ctx, src, e.openPrefix(t, "tiny"), push.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Objects outside any checkpoint, uploaded after the manifest: none of
	// them may make the manifest stale or show up as a model.
	e.upload(t, "loose.txt", filepath.Join(src, "config.json"))
	e.upload(t, "tiny/sub/nested.json", filepath.Join(src, "config.json"))
	e.upload(t, "tiny/.hidden", filepath.Join(src, "config.json"))
	e.upload(t, `bad\name/config.json`, filepath.Join(src, "config.json"))

	e.scan(t)
	r := checkOne(t, e, "tiny", m.Revision, store.RevisionReady)
	if r.Reason != "" {
		t.Errorf("ready revision has reason %q", r.Reason)
	}
	got, err := manifest.Parse(r.Manifest)
	if err != nil || got.Revision != m.Revision {
		t.Errorf("stored manifest: %v, revision %v; want the pushed one", err, got)
	}
	ev := e.events.list()
	if len(ev) != 1 || ev[0].Digest != m.Revision || ev[0].State != store.RevisionReady {
		t.Fatalf("events = %+v, want one ready event for %s", ev, m.Revision)
	}
	// Idempotent: more passes, even after the quiet period, change nothing.
	for range 3 {
		e.clock.Advance(testQuiet + time.Second)
		e.scan(t)
	}
	again := checkOne(t, e, "tiny", m.Revision, store.RevisionReady)
	if !again.UpdatedAt.Equal(r.UpdatedAt) {
		t.Errorf("revision updated again: %v -> %v", r.UpdatedAt, again.UpdatedAt)
	}
	if n := len(e.events.list()); n != 1 {
		t.Errorf("%d events after re-scanning, want 1", n)
	}
	models, err := e.st.Models(ctx)
	if err != nil || !slices.Equal(models, []string{"tiny"}) {
		t.Errorf("Models = %v, %v; want [tiny]", models, err)
	}
	// A pushed manifest is left as push wrote it.
	data, err := readObject(t, e.root, "tiny/"+manifest.FileName)
	if err != nil {
		t.Fatal(err)
	}
	if cur, err := manifest.Parse(data); err != nil || !cur.CreatedAt.Equal(m.CreatedAt) {
		t.Errorf("manifest.json was rewritten: %v %v", cur, err)
	}
}

// testCommitted uploads a pushed checkpoint with a plain client, broken in
// various ways, manifest last: each becomes one revision in the expected
// state, once.
func testCommitted(t *testing.T, e *env, src string) {
	tests := []struct {
		name string
		// mutate breaks the pushed copy in dir (manifest m) before it is
		// uploaded and returns the expected digest ("" for m's).
		mutate  func(t *testing.T, dir string, m *manifest.Manifest) string
		want    store.RevisionState
		reasons []string
	}{
		{
			name: "valid",
			want: store.RevisionReady,
		},
		{
			name: "truncated shard",
			mutate: func(t *testing.T, dir string, m *manifest.Manifest) string {
				p := filepath.Join(dir, shard2)
				fi, err := os.Stat(p)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Truncate(p, fi.Size()-100); err != nil {
					t.Fatal(err)
				}
				return ""
			},
			want:    store.RevisionFailed,
			reasons: []string{shard2, "bytes"},
		},
		{
			name: "listed file missing",
			mutate: func(t *testing.T, dir string, m *manifest.Manifest) string {
				if err := os.Remove(filepath.Join(dir, "tokenizer.json")); err != nil {
					t.Fatal(err)
				}
				return ""
			},
			want:    store.RevisionFailed,
			reasons: []string{"tokenizer.json", "missing"},
		},
		{
			name: "garbage safetensors header",
			mutate: func(t *testing.T, dir string, m *manifest.Manifest) string {
				f, err := os.OpenFile(filepath.Join(dir, shard1), os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				// Same size, so only the header check can notice.
				if _, err := f.WriteAt([]byte("\x20\x00\x00\x00\x00\x00\x00\x00not json at all, just garbage!!!"), 0); err != nil {
					t.Fatal(err)
				}
				return ""
			},
			want:    store.RevisionFailed,
			reasons: []string{shard1, "invalid safetensors header"},
		},
		{
			name: "index names a shard the manifest lacks",
			mutate: func(t *testing.T, dir string, m *manifest.Manifest) string {
				if err := os.Remove(filepath.Join(dir, shard3)); err != nil {
					t.Fatal(err)
				}
				m.Files = slices.DeleteFunc(m.Files, func(f manifest.File) bool { return f.Name == shard3 })
				writeManifest(t, dir, m)
				return m.Revision
			},
			want:    store.RevisionFailed,
			reasons: []string{"shard " + shard3 + " named in model.safetensors.index.json is missing"},
		},
		{
			name: "config does not parse",
			mutate: func(t *testing.T, dir string, m *manifest.Manifest) string {
				if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"hidden_size": "big"}`), 0o644); err != nil {
					t.Fatal(err)
				}
				m.Files = localFiles(t, dir)
				writeManifest(t, dir, m)
				return m.Revision
			},
			want:    store.RevisionFailed,
			reasons: []string{"config.json"},
		},
		{
			name: "manifest claims another dtype",
			mutate: func(t *testing.T, dir string, m *manifest.Manifest) string {
				m.DType = "BF16"
				writeManifest(t, dir, m)
				return m.Revision
			},
			want:    store.RevisionFailed,
			reasons: []string{"dtype BF16", "F32"},
		},
		{
			name: "manifest does not parse",
			mutate: func(t *testing.T, dir string, m *manifest.Manifest) string {
				data := []byte(`{"model": "broken", "files": [`)
				if err := os.WriteFile(filepath.Join(dir, manifest.FileName), data, 0o644); err != nil {
					t.Fatal(err)
				}
				sum := sha256.Sum256(data)
				return manifest.RevisionPrefix + hex.EncodeToString(sum[:])
			},
			want:    store.RevisionFailed,
			reasons: []string{"manifest.json does not parse"},
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := "m" + string(rune('a'+i))
			dir, m := pushedCopy(t, src, name)
			digest := m.Revision
			if tt.mutate != nil {
				if d := tt.mutate(t, dir, m); d != "" {
					digest = d
				}
			}
			before := len(e.events.list())
			e.uploadDir(t, name, dir)
			e.scan(t)
			r := checkOne(t, e, name, digest, tt.want, tt.reasons...)
			ev := e.events.list()[before:]
			if len(ev) != 1 || ev[0].Model != name || ev[0].State != tt.want {
				t.Fatalf("events = %+v, want one %s event for %s", ev, tt.want, name)
			}
			// Later passes, even past the quiet period, neither record it
			// again nor treat the prefix as a plain upload.
			for range 2 {
				e.clock.Advance(testQuiet + time.Second)
				e.scan(t)
			}
			again := checkOne(t, e, name, digest, tt.want)
			if !again.UpdatedAt.Equal(r.UpdatedAt) || again.Reason != r.Reason {
				t.Errorf("revision changed on re-scan: %+v -> %+v", r, again)
			}
			if n := len(e.events.list()) - before; n != 1 {
				t.Errorf("%d events after re-scanning, want 1", n)
			}
			want, err := os.ReadFile(filepath.Join(dir, manifest.FileName))
			if err != nil {
				t.Fatal(err)
			}
			if got, err := readObject(t, e.root, name+"/"+manifest.FileName); err != nil || string(got) != string(want) {
				t.Errorf("manifest.json changed in the bucket (err %v)", err)
			}
		})
	}
}

// testPlainMatchesPush uploads the same checkpoint with push and, file by
// file without a manifest, with a plain client: after the quiet period both
// prefixes hold the same revision.
func testPlainMatchesPush(t *testing.T, e *env, src string) {
	ctx := context.Background()
	pushed, err := push.Push(ctx, src, e.openPrefix(t, "pushed"), push.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e.uploadDir(t, "plain", src)
	e.scan(t)
	checkOne(t, e, "pushed", pushed.Revision, store.RevisionReady)

	e.clock.Advance(testQuiet / 2)
	e.scan(t)
	if revs := e.revisions(t, "plain"); len(revs) != 0 {
		t.Fatalf("plain upload recorded before its quiet period: %+v", revs)
	}
	if _, err := e.root.Stat(ctx, "plain/"+manifest.FileName); !errors.Is(err, bucket.ErrNotExist) {
		t.Fatalf("manifest.json written before the quiet period (stat err %v)", err)
	}

	e.clock.Advance(testQuiet / 2)
	e.scan(t)
	r := checkOne(t, e, "plain", pushed.Revision, store.RevisionReady)
	data, err := readObject(t, e.root, "plain/"+manifest.FileName)
	if err != nil {
		t.Fatalf("the watcher wrote no manifest.json: %v", err)
	}
	m, err := manifest.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if m.Model != "plain" || m.Revision != pushed.Revision || m.DType != pushed.DType || m.TotalBytes != pushed.TotalBytes {
		t.Errorf("written manifest %s/%s/%s/%d, want plain/%s/%s/%d", m.Model, m.Revision, m.DType, m.TotalBytes,
			pushed.Revision, pushed.DType, pushed.TotalBytes)
	}
	if !slices.Equal(m.Files, pushed.Files) {
		t.Errorf("written files %+v, want %+v", m.Files, pushed.Files)
	}
	if !m.CreatedAt.Equal(e.clock.Now()) {
		t.Errorf("created_at %v, want the watcher's clock %v", m.CreatedAt, e.clock.Now())
	}
	if string(r.Manifest) != string(data) {
		t.Errorf("stored manifest differs from the written one")
	}

	for range 2 {
		e.clock.Advance(testQuiet + time.Second)
		e.scan(t)
	}
	checkOne(t, e, "plain", pushed.Revision, store.RevisionReady)
	if ev := e.events.list(); len(ev) != 2 {
		t.Errorf("events = %+v, want one per prefix", ev)
	}
	if again, err := readObject(t, e.root, "plain/"+manifest.FileName); err != nil || string(again) != string(data) {
		t.Errorf("manifest.json rewritten by a later pass (err %v)", err)
	}
}

// testPlainChanging: an incomplete upload is left alone, and every change
// restarts the quiet period.
func testPlainChanging(t *testing.T, e *env, src string) {
	e.uploadDir(t, "grow", src, "config.json")
	e.scan(t)
	e.clock.Advance(3 * testQuiet)
	e.scan(t)
	if revs := e.revisions(t, "grow"); len(revs) != 0 {
		t.Fatalf("upload without config.json recorded: %+v", revs)
	}

	e.upload(t, "grow/config.json", filepath.Join(src, "config.json"))
	e.scan(t)
	e.clock.Advance(testQuiet - time.Second)
	e.scan(t)

	// A file rewritten just before the quiet period ends restarts it.
	readme := filepath.Join(t.TempDir(), "README.md")
	if err := os.WriteFile(readme, []byte("# tiny\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.upload(t, "grow/README.md", readme)
	e.scan(t)
	e.clock.Advance(testQuiet - time.Second)
	e.scan(t)
	if revs := e.revisions(t, "grow"); len(revs) != 0 {
		t.Fatalf("recorded while the upload was still changing: %+v", revs)
	}
	e.clock.Advance(2 * time.Second)
	e.scan(t)
	want := manifest.Revision(append(localFiles(t, src), localFiles(t, filepath.Dir(readme))...))
	checkOne(t, e, "grow", want, store.RevisionReady)
}

// testPlainMissingShard: a quiet upload whose index names an absent shard
// becomes one failed revision naming it; the shard arriving later makes a
// ready one.
func testPlainMissingShard(t *testing.T, e *env, src string) {
	ctx := context.Background()
	e.uploadDir(t, "holey", src, shard2)
	e.scan(t)
	e.clock.Advance(testQuiet)
	e.scan(t)
	want := manifest.Revision(localFiles(t, src, shard2))
	checkOne(t, e, "holey", want, store.RevisionFailed,
		"shard "+shard2+" named in model.safetensors.index.json is missing")
	if _, err := e.root.Stat(ctx, "holey/"+manifest.FileName); !errors.Is(err, bucket.ErrNotExist) {
		t.Errorf("a failed upload got a manifest.json (stat err %v)", err)
	}
	for range 2 {
		e.clock.Advance(testQuiet + time.Second)
		e.scan(t)
	}
	checkOne(t, e, "holey", want, store.RevisionFailed)
	if ev := e.events.list(); len(ev) != 1 || ev[0].State != store.RevisionFailed {
		t.Fatalf("events = %+v, want one failed event", ev)
	}

	e.upload(t, "holey/"+shard2, filepath.Join(src, shard2))
	e.scan(t)
	e.clock.Advance(testQuiet)
	e.scan(t)
	revs := e.revisions(t, "holey")
	full := manifest.Revision(localFiles(t, src))
	if len(revs) != 2 || revs[0].Digest != full || revs[0].State != store.RevisionReady || revs[1].Digest != want {
		t.Fatalf("revisions = %+v, want the complete one ready, newest, over the failed one", revs)
	}
	if ev := e.events.list(); len(ev) != 2 {
		t.Errorf("events = %+v, want 2", ev)
	}
}

// testStaleManifest: files uploaded over a pushed model with a plain client
// (newer than its manifest) make a new revision once quiet, with a new
// manifest.
func testStaleManifest(t *testing.T, e *env, src string) {
	ctx := context.Background()
	first, err := push.Push(ctx, src, e.openPrefix(t, "tiny"), push.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e.scan(t)
	checkOne(t, e, "tiny", first.Revision, store.RevisionReady)

	readme := filepath.Join(t.TempDir(), "README.md")
	if err := os.WriteFile(readme, []byte("# tiny, second edition\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The new file must carry a later time than the manifest (listings
	// have millisecond times at worst), so a few tries suffice.
	for i := 0; ; i++ {
		e.upload(t, "tiny/README.md", readme)
		objs, err := e.root.List(ctx, "tiny/")
		if err != nil {
			t.Fatal(err)
		}
		files := groupByModel(objs)["tiny"]
		if files["README.md"].LastModified.After(files[manifest.FileName].LastModified) {
			break
		}
		if i == 100 {
			t.Fatalf("README.md keeps the manifest's time %v", files[manifest.FileName].LastModified)
		}
	}
	e.scan(t)
	if revs := e.revisions(t, "tiny"); len(revs) != 1 {
		t.Fatalf("new files recorded before the quiet period: %+v", revs)
	}
	e.clock.Advance(testQuiet)
	e.scan(t)
	want := manifest.Revision(append(localFiles(t, src), localFiles(t, filepath.Dir(readme))...))
	revs := e.revisions(t, "tiny")
	if len(revs) != 2 || revs[0].Digest != want || revs[0].State != store.RevisionReady {
		t.Fatalf("revisions = %+v, want a new ready %s first", revs, want)
	}
	latest, err := e.st.LatestReady(ctx, "tiny")
	if err != nil || latest.Digest != want {
		t.Errorf("LatestReady = %s, %v; want %s", latest.Digest, err, want)
	}
	data, err := readObject(t, e.root, "tiny/"+manifest.FileName)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := manifest.Parse(data); err != nil || m.Revision != want {
		t.Errorf("manifest.json now %v (err %v), want revision %s", m, err, want)
	}
	e.clock.Advance(testQuiet + time.Second)
	e.scan(t)
	if revs := e.revisions(t, "tiny"); len(revs) != 2 {
		t.Errorf("%d revisions after re-scanning, want 2", len(revs))
	}
}

// TestGroupByModelSkipsHidden: a hidden prefix is no model on any bucket
// (the file bucket lists none; S3 lists them all).
func TestGroupByModelSkipsHidden(t *testing.T) {
	objs := []bucket.Object{{Key: "tiny/config.json"}, {Key: ".hidden/config.json"}, {Key: "..x/config.json"}, {Key: "tiny/.cache"}}
	groups := groupByModel(objs)
	if len(groups) != 1 || len(groups["tiny"]) != 1 {
		t.Fatalf("groups %v, want only tiny with config.json", groups)
	}
}
