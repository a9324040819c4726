package files

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/bucket/bucketest"
)

// backends opens an empty blob store of each kind: file:// and s3://
// (MinIO; skipped with STOKE_SKIP_MINIO=1).
func backends(t *testing.T) map[string]func(t *testing.T) bucket.Bucket {
	return map[string]func(t *testing.T) bucket.Bucket{
		"file": func(t *testing.T) bucket.Bucket {
			b, err := bucket.Open(context.Background(), "file://"+filepath.Join(t.TempDir(), "files"), bucket.S3Options{})
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		"s3": func(t *testing.T) bucket.Bucket {
			ep, ak, sk := bucketest.StartMinIO(t)
			bucketest.MakeBucket(t, ep, ak, sk, "stoke")
			b, err := bucket.Open(context.Background(), "s3://stoke/files", bucket.S3Options{Endpoint: ep, AccessKey: ak, SecretKey: sk, PathStyle: true})
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
	}
}

func newStore(t *testing.T, b bucket.Bucket, o Options) (*Store, *store.Store) {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	o.Blobs, o.Meta, o.SpoolDir = b, st, t.TempDir()
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return s, st
}

// assertEmpty fails unless the blob store holds nothing and owner has no
// file listed.
func assertEmpty(t *testing.T, s *Store, b bucket.Bucket, owner string) {
	t.Helper()
	ctx := context.Background()
	objs, err := b.List(ctx, "")
	if err != nil || len(objs) != 0 {
		t.Errorf("blob store holds %v (%v), want nothing", objs, err)
	}
	page, _, err := s.List(ctx, owner, ListOptions{Limit: 10})
	if err != nil || len(page) != 0 {
		t.Errorf("files listed %v (%v), want none", page, err)
	}
}

const line = `{"custom_id":"r1","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[]}}` + "\n"

func TestStore(t *testing.T) {
	for name, open := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			b := open(t)
			s, _ := newStore(t, b, Options{MaxBytes: 4 * int64(len(line)), MaxLines: 3})
			const own = "tenant-a"
			content := strings.Repeat(line, 3)
			// One byte at a time: the counting must not depend on read sizes.
			f, err := s.Create(ctx, own, "in.jsonl", PurposeBatch, iotest.OneByteReader(strings.NewReader(content)))
			if err != nil {
				t.Fatal(err)
			}
			if !regexp.MustCompile(`^file-[a-z2-7]{26}$`).MatchString(f.ID) || f.Bytes != int64(len(content)) || f.Lines != 3 ||
				f.Filename != "in.jsonl" || f.Purpose != "batch" || f.Owner != own || f.CreatedAt.IsZero() {
				t.Errorf("Create = %+v", f)
			}
			got, err := s.Get(ctx, own, f.ID)
			if err != nil || got != f {
				t.Errorf("Get = %+v, %v; want %+v", got, err, f)
			}
			_, rc, err := s.Open(ctx, own, f.ID)
			if err != nil {
				t.Fatal(err)
			}
			data, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || string(data) != content {
				t.Errorf("content = %q, %v; want %q", data, err, content)
			}

			for _, c := range []struct {
				name    string
				purpose string
				fname   string
				content string
				want    error
			}{
				{"one byte over", "batch", "a.jsonl", strings.Repeat(line, 4) + "x", ErrTooLarge},
				{"too many lines", "batch", "a.jsonl", strings.Repeat(line, 4), ErrTooManyLines},
				{"empty", "batch", "a.jsonl", "", ErrBadFile},
				{"not jsonl", "batch", "a.csv", line, ErrBadFile},
				{"no name", "batch", "", line, ErrBadFile},
				{"bad purpose", "fine-tune", "a.jsonl", line, ErrPurpose},
			} {
				t.Run(c.name, func(t *testing.T) {
					_, err := s.Create(ctx, own, c.fname, c.purpose, strings.NewReader(c.content))
					if !errors.Is(err, c.want) {
						t.Fatalf("Create: %v, want %v", err, c.want)
					}
					objs, _ := b.List(ctx, "")
					if len(objs) != 1 || objs[0].Key != f.ID {
						t.Errorf("after a refused upload the blob store holds %v, want only %s", objs, f.ID)
					}
				})
			}
			// A stream that fails midway leaves nothing either.
			if _, err := s.Create(ctx, own, "a.jsonl", "batch", io.MultiReader(strings.NewReader(line), iotest.ErrReader(io.ErrUnexpectedEOF))); !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("Create of a failing stream: %v", err)
			}

			if _, err := s.Delete(ctx, own, f.ID); err != nil {
				t.Fatal(err)
			}
			for what, err := range map[string]error{
				"Get":    func() error { _, err := s.Get(ctx, own, f.ID); return err }(),
				"Open":   func() error { _, _, err := s.Open(ctx, own, f.ID); return err }(),
				"Delete": func() error { _, err := s.Delete(ctx, own, f.ID); return err }(),
			} {
				if !errors.Is(err, ErrNotFound) {
					t.Errorf("%s after delete: %v, want ErrNotFound", what, err)
				}
			}
			assertEmpty(t, s, b, own)
			if ents, err := os.ReadDir(s.o.SpoolDir); err != nil || len(ents) != 0 {
				t.Errorf("spool directory holds %v (%v), want nothing", ents, err)
			}
		})
	}
}

// An owner sees only its own files: another owner's is ErrNotFound from
// Get, Open and Delete, with the same message as once it is gone, is not
// listed, is no list cursor, and survives the refused delete. Staged
// uploads and output files keep the owner they were made for.
func TestOwnersSeeOnlyTheirOwn(t *testing.T) {
	ctx := context.Background()
	b, _ := bucket.Open(ctx, t.TempDir(), bucket.S3Options{})
	s, _ := newStore(t, b, Options{})
	a, err := s.Create(ctx, "tenant-a", "a.jsonl", PurposeBatch, strings.NewReader(line))
	if err != nil {
		t.Fatal(err)
	}
	u, err := s.Stage(ctx, "tenant-b", "b.jsonl", strings.NewReader(line))
	if err != nil {
		t.Fatal(err)
	}
	fb, err := u.Commit(ctx, PurposeBatch)
	if err != nil || fb.Owner != "tenant-b" {
		t.Fatalf("Commit = %+v, %v; want owner tenant-b", fb, err)
	}
	out, err := s.CreateOutput(ctx, "tenant-a", "out.jsonl", strings.NewReader(line))
	if err != nil || out.Owner != "tenant-a" {
		t.Fatalf("CreateOutput = %+v, %v; want owner tenant-a", out, err)
	}
	// Nobody's (auth off) is an owner like any other.
	n, err := s.Create(ctx, "", "n.jsonl", PurposeBatch, strings.NewReader(line))
	if err != nil {
		t.Fatal(err)
	}

	refusals := func(owner, id string) map[string]error {
		return map[string]error{
			"Get":    func() error { _, err := s.Get(ctx, owner, id); return err }(),
			"Open":   func() error { _, _, err := s.Open(ctx, owner, id); return err }(),
			"Delete": func() error { _, err := s.Delete(ctx, owner, id); return err }(),
		}
	}
	for _, c := range []struct{ owner, id string }{{"tenant-b", a.ID}, {"", a.ID}, {"tenant-b", out.ID}, {"tenant-a", fb.ID}, {"tenant-a", n.ID}} {
		for what, err := range refusals(c.owner, c.id) {
			if !errors.Is(err, ErrNotFound) {
				t.Errorf("%s of %s by %q: %v, want ErrNotFound", what, c.id, c.owner, err)
			}
			if want := "file " + c.id + ": no such file"; err == nil || err.Error() != want {
				t.Errorf("%s of %s by %q: %v, want %q, as an unknown id's", what, c.id, c.owner, err, want)
			}
		}
	}
	list := func(owner string, o ListOptions) []string {
		page, _, err := s.List(ctx, owner, o)
		if err != nil {
			t.Fatalf("List(%q): %v", owner, err)
		}
		var ids []string
		for _, f := range page {
			ids = append(ids, f.ID)
		}
		return ids
	}
	for owner, want := range map[string][]string{"tenant-a": {a.ID, out.ID}, "tenant-b": {fb.ID}, "": {n.ID}, "tenant-c": nil} {
		if got := list(owner, ListOptions{Limit: 10, Asc: true}); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("List(%q) = %v, want %v", owner, got, want)
		}
	}
	if _, _, err := s.List(ctx, "tenant-b", ListOptions{Limit: 10, After: a.ID}); !errors.Is(err, ErrNotFound) {
		t.Errorf("List by tenant-b after tenant-a's file: %v, want ErrNotFound", err)
	}

	// The owner still has it all, content included, and may delete it.
	_, rc, err := s.Open(ctx, "tenant-a", a.ID)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(data) != line {
		t.Errorf("owner's content = %q, %v; want %q", data, err, line)
	}
	if _, err := s.Delete(ctx, "tenant-a", a.ID); err != nil {
		t.Fatalf("owner's Delete: %v", err)
	}
	if _, err := b.Stat(ctx, a.BlobKey); !errors.Is(err, bucket.ErrNotExist) {
		t.Errorf("content after the owner's delete: %v", err)
	}
	for what, err := range refusals("tenant-a", a.ID) {
		if want := "file " + a.ID + ": no such file"; err == nil || err.Error() != want {
			t.Errorf("%s of a deleted file: %v, want %q", what, err, want)
		}
	}
}

func TestDefaults(t *testing.T) {
	b, _ := bucket.Open(context.Background(), t.TempDir(), bucket.S3Options{})
	s, _ := newStore(t, b, Options{})
	if s.MaxBytes() != 200<<20 || s.MaxLines() != 50_000 {
		t.Errorf("limits = %d bytes, %d lines; want 200 MiB, 50000", s.MaxBytes(), s.MaxLines())
	}
	if _, err := New(Options{}); err == nil {
		t.Error("New without stores succeeded")
	}
}

func TestCountLines(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
	}{
		{"", 0}, {"a", 1}, {"a\n", 1}, {"a\nb", 2}, {"a\n\n\r\nb\r\n", 2}, {"\n\n", 0}, {" \n", 1},
	} {
		cr := &counter{r: strings.NewReader(c.in), maxBytes: 100, maxLines: 100}
		if _, err := io.Copy(io.Discard, cr); err != nil || cr.lines != c.want || cr.n != int64(len(c.in)) {
			t.Errorf("%q: %d lines, %d bytes, %v; want %d lines", c.in, cr.lines, cr.n, err, c.want)
		}
	}
}

func TestIDsDiffer(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id, err := newID()
		if err != nil || seen[id] || len(id) != len("file-")+26 {
			t.Fatalf("newID = %q, %v (seen before: %v)", id, err, seen[id])
		}
		seen[id] = true
	}
}

// Sweep deletes blobs no row names once they are older than the grace
// period, and keeps recorded files and fresh uploads.
func TestSweep(t *testing.T) {
	ctx := context.Background()
	b, _ := bucket.Open(ctx, t.TempDir(), bucket.S3Options{})
	now := time.Now()
	s, _ := newStore(t, b, Options{Now: func() time.Time { return now }})
	f, err := s.Create(ctx, "tenant-a", "a.jsonl", PurposeBatch, strings.NewReader(line))
	if err != nil {
		t.Fatal(err)
	}
	// A staged, never committed upload: what a crash before the row leaves.
	u, err := s.Stage(ctx, "tenant-b", "b.jsonl", strings.NewReader(line))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Put(ctx, "other", bytes.NewReader([]byte("x")), 1); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Sweep(ctx, time.Hour); err != nil || n != 0 {
		t.Errorf("Sweep within the grace period deleted %d (%v), want 0", n, err)
	}
	now = now.Add(2 * time.Hour)
	if n, err := s.Sweep(ctx, time.Hour); err != nil || n != 1 {
		t.Errorf("Sweep deleted %d (%v), want 1", n, err)
	}
	if _, err := b.Stat(ctx, u.f.BlobKey); !errors.Is(err, bucket.ErrNotExist) {
		t.Errorf("orphan blob after Sweep: %v", err)
	}
	for _, key := range []string{f.BlobKey, "other"} {
		if _, err := b.Stat(ctx, key); err != nil {
			t.Errorf("Sweep removed %s: %v", key, err)
		}
	}
}
