package watch

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/manifest"
	"github.com/stokehq/stoke/weightstore/push"
	"github.com/stokehq/stoke/weightstore/synth"
)

// writeAdapterDir writes a synthetic adapter for base into a new directory
// with a manifest.json committing it, as `stoke push` would (without its
// check against the base, so that a broken adapter can be committed too).
func writeAdapterDir(t *testing.T, name string, base model.Config, rank int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if err := synth.WriteAdapter(dir, base, synth.AdapterOptions{Rank: rank, TargetModules: []string{"q_proj", "v_proj"}, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	var files []manifest.File
	var total int64
	for _, f := range []string{checkpoint.AdapterConfigFile, checkpoint.AdapterWeightsFile} {
		fh, err := os.Open(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		size, sum, err := manifest.Hash(context.Background(), fh)
		fh.Close()
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, manifest.File{Name: f, Size: size, SHA256: sum})
		total += size
	}
	m := manifest.Manifest{Model: name, Revision: manifest.Revision(files), Files: files, TotalBytes: total, DType: "F32",
		Base: "tiny", CreatedAt: time.Now()}
	data, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, manifest.FileName), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// testAdapters: adapters committed under a model's adapters/ folder become
// revisions of BASE:NAME, checked against the base's config; one that does
// not fit fails, one without a manifest is not recorded, and none of them
// touches the base model's own revision.
func testAdapters(t *testing.T, e *env, src string) {
	m, err := push.Push(context.Background(), src, e.openPrefix(t, "tiny"), push.Options{})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(src, checkpoint.ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := model.ParseConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	other := cfg
	other.HiddenSize *= 2
	e.uploadDir(t, "tiny/adapters/sql", writeAdapterDir(t, "sql", cfg, 4))
	e.uploadDir(t, "tiny/adapters/bad", writeAdapterDir(t, "bad", other, 4))
	e.uploadDir(t, "tiny/adapters/plain", writeAdapterDir(t, "plain", cfg, 4), manifest.FileName)
	e.scan(t)

	sql := e.revisions(t, "tiny:sql")
	if len(sql) != 1 || sql[0].State != store.RevisionReady || sql[0].Source != e.root.URL()+"/tiny/adapters/sql" {
		t.Fatalf("tiny:sql revisions %+v, want one ready at %s/tiny/adapters/sql", sql, e.root.URL())
	}
	bad := e.revisions(t, "tiny:bad")
	if len(bad) != 1 || bad[0].State != store.RevisionFailed || !strings.Contains(bad[0].Reason, "shape") {
		t.Fatalf("tiny:bad revisions %+v, want one failed for a shape", bad)
	}
	if revs := e.revisions(t, "tiny:plain"); len(revs) != 0 {
		t.Fatalf("an adapter without a manifest was recorded: %+v", revs)
	}
	base := e.revisions(t, "tiny")
	if len(base) != 1 || base[0].Digest != m.Revision || base[0].State != store.RevisionReady {
		t.Fatalf("the base model's revisions changed: %+v", base)
	}
	reported := map[string]store.RevisionState{}
	for _, r := range e.events.list() {
		reported[r.Model] = r.State
	}
	if reported["tiny:sql"] != store.RevisionReady || reported["tiny:bad"] != store.RevisionFailed {
		t.Fatalf("OnRevision saw %v", reported)
	}
	e.scan(t) // a later pass records nothing new
	if n := len(e.events.list()); n != len(reported) {
		t.Fatalf("a second pass reported %d revisions, want %d", n, len(reported))
	}
}
