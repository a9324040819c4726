package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

func TestFilesCRUDAndPages(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		s := bk.open(t)
		base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
		// Five files, two sharing a creation time (ordered by id then).
		for i, ts := range []int{0, 1, 1, 2, 3} {
			purpose := "batch"
			if i == 4 {
				purpose = "other"
			}
			f := File{ID: fmt.Sprintf("file-%d", i), Filename: "in.jsonl", Purpose: purpose, Bytes: int64(10 * i), Lines: i,
				BlobKey: fmt.Sprintf("file-%d", i), CreatedAt: base.Add(time.Duration(ts) * time.Second)}
			if err := s.CreateFile(ctx, f); err != nil {
				t.Fatal(err)
			}
		}
		got, err := s.File(ctx, "file-3")
		if err != nil {
			t.Fatal(err)
		}
		if want := (File{ID: "file-3", Filename: "in.jsonl", Purpose: "batch", Bytes: 30, Lines: 3, BlobKey: "file-3", CreatedAt: base.Add(2 * time.Second)}); got != want {
			t.Errorf("File = %+v, want %+v", got, want)
		}
		if err := s.CreateFile(ctx, got); !errors.Is(err, ErrInvalid) {
			t.Errorf("CreateFile of a recorded id: %v, want ErrInvalid", err)
		}
		if err := s.CreateFile(ctx, File{ID: "file-x"}); !errors.Is(err, ErrInvalid) {
			t.Errorf("CreateFile without a blob key: %v, want ErrInvalid", err)
		}

		ids := func(fs []File) (out []string) {
			for _, f := range fs {
				out = append(out, f.ID)
			}
			return out
		}
		for _, c := range []struct {
			name string
			q    FileQuery
			want []string
			more bool
		}{
			{"all asc", FileQuery{Limit: 10}, []string{"file-0", "file-1", "file-2", "file-3", "file-4"}, false},
			{"all desc", FileQuery{Limit: 10, Desc: true}, []string{"file-4", "file-3", "file-2", "file-1", "file-0"}, false},
			{"first page", FileQuery{Limit: 2}, []string{"file-0", "file-1"}, true},
			{"after a tie", FileQuery{Limit: 2, After: "file-1"}, []string{"file-2", "file-3"}, true},
			{"desc after a tie", FileQuery{Limit: 2, After: "file-2", Desc: true}, []string{"file-1", "file-0"}, false},
			{"purpose", FileQuery{Limit: 10, Purpose: "batch", After: "file-2"}, []string{"file-3"}, false},
			{"exact fit", FileQuery{Limit: 5}, []string{"file-0", "file-1", "file-2", "file-3", "file-4"}, false},
		} {
			t.Run(c.name, func(t *testing.T) {
				page, more, err := s.Files(ctx, c.q)
				if err != nil {
					t.Fatal(err)
				}
				if fmt.Sprint(ids(page)) != fmt.Sprint(c.want) || more != c.more {
					t.Errorf("Files(%+v) = %v more=%v, want %v more=%v", c.q, ids(page), more, c.want, c.more)
				}
			})
		}
		if _, _, err := s.Files(ctx, FileQuery{Limit: 1, After: "file-nope"}); !errors.Is(err, ErrNotFound) {
			t.Errorf("Files after a missing id: %v, want ErrNotFound", err)
		}
		if _, _, err := s.Files(ctx, FileQuery{}); !errors.Is(err, ErrInvalid) {
			t.Errorf("Files with limit 0: %v, want ErrInvalid", err)
		}

		del, err := s.DeleteFile(ctx, "file-2")
		if err != nil || del.BlobKey != "file-2" {
			t.Fatalf("DeleteFile = %+v, %v", del, err)
		}
		if _, err := s.File(ctx, "file-2"); !errors.Is(err, ErrNotFound) {
			t.Errorf("File after delete: %v, want ErrNotFound", err)
		}
		if _, err := s.DeleteFile(ctx, "file-2"); !errors.Is(err, ErrNotFound) {
			t.Errorf("second DeleteFile: %v, want ErrNotFound", err)
		}
	})
}

// openMigratedFrom writes a database as schema version (its first version
// migrations) with the rows of seed (SQL), then opens it with Open, which
// migrates it to the current schema.
func openMigratedFrom(t *testing.T, version int, seed string) *Store {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := sql.Open("sqlite", dsn(path))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range migrations[:version] {
		if _, err := db.ExecContext(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d; %s", version, seed)); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// A database written before the files table existed (schema version 2)
// keeps its deployments and gains the table.
func TestFilesMigrationKeepsOldDatabase(t *testing.T) {
	ctx := context.Background()
	s := openMigratedFrom(t, 2, `INSERT INTO deployments (name, revision, updated_at) VALUES ('old', 'sha256:o', 1)`)
	if d, err := s.Deployment(ctx, "old"); err != nil || d.Revision != "sha256:o" {
		t.Errorf("deployment after migration = %+v, %v", d, err)
	}
	if err := s.CreateFile(ctx, File{ID: "file-a", Purpose: "batch", BlobKey: "file-a"}); err != nil {
		t.Errorf("CreateFile after migration: %v", err)
	}
	var v int
	if err := s.db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil || v != SchemaVersion || SchemaVersion < 3 {
		t.Errorf("user_version = %d (%v), SchemaVersion %d; want it current", v, err, SchemaVersion)
	}
}

// Files are listed by owner, always ("" included), and another owner's
// file as a cursor is as unknown as a missing one; File and DeleteFile
// return the owner recorded.
func TestFilesByOwner(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		s := bk.open(t)
		base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
		// Interleaved in time: a-0, b-0, n-0 (owner ""), a-1, b-1, n-1.
		owners := map[string]string{"a": "tenant-a", "b": "tenant-b", "n": ""}
		for i := range 2 {
			for j, o := range []string{"a", "b", "n"} {
				id := fmt.Sprintf("file-%s-%d", o, i)
				f := File{ID: id, Owner: owners[o], Filename: "in.jsonl", Purpose: "batch", BlobKey: id,
					CreatedAt: base.Add(time.Duration(3*i+j) * time.Second)}
				if err := s.CreateFile(ctx, f); err != nil {
					t.Fatal(err)
				}
			}
		}
		if f, err := s.File(ctx, "file-b-1"); err != nil || f.Owner != "tenant-b" {
			t.Errorf("File = %+v, %v; want owner tenant-b", f, err)
		}
		ids := func(fs []File) (out []string) {
			for _, f := range fs {
				if f.Owner != owners[f.ID[5:6]] {
					t.Errorf("file %s read back with owner %q", f.ID, f.Owner)
				}
				out = append(out, f.ID)
			}
			return out
		}
		for _, c := range []struct {
			name string
			q    FileQuery
			want []string
			more bool
		}{
			{"a", FileQuery{Owner: "tenant-a", Limit: 10}, []string{"file-a-0", "file-a-1"}, false},
			{"b desc", FileQuery{Owner: "tenant-b", Limit: 10, Desc: true}, []string{"file-b-1", "file-b-0"}, false},
			{"no owner", FileQuery{Limit: 10}, []string{"file-n-0", "file-n-1"}, false},
			{"a page", FileQuery{Owner: "tenant-a", Limit: 1}, []string{"file-a-0"}, true},
			{"a after its own", FileQuery{Owner: "tenant-a", Limit: 1, After: "file-a-0"}, []string{"file-a-1"}, false},
			{"unknown owner", FileQuery{Owner: "tenant-c", Limit: 10}, nil, false},
		} {
			t.Run(c.name, func(t *testing.T) {
				page, more, err := s.Files(ctx, c.q)
				if err != nil {
					t.Fatal(err)
				}
				if fmt.Sprint(ids(page)) != fmt.Sprint(c.want) || more != c.more {
					t.Errorf("Files(%+v) = %v more=%v, want %v more=%v", c.q, ids(page), more, c.want, c.more)
				}
			})
		}
		for _, q := range []FileQuery{
			{Owner: "tenant-b", Limit: 10, After: "file-a-0"},
			{Limit: 10, After: "file-a-0"},
			{Owner: "tenant-a", Limit: 10, After: "file-n-0"},
		} {
			if page, _, err := s.Files(ctx, q); !errors.Is(err, ErrNotFound) {
				t.Errorf("Files(%+v) after another owner's file = %v, %v; want ErrNotFound", q, ids(page), err)
			}
		}
		if f, err := s.DeleteFile(ctx, "file-a-1"); err != nil || f.Owner != "tenant-a" {
			t.Errorf("DeleteFile = %+v, %v; want owner tenant-a", f, err)
		}
	})
}

// Files recorded before owners existed (schema version 5) belong to "".
func TestFilesMigrationOwnsOldFilesAsNobody(t *testing.T) {
	ctx := context.Background()
	s := openMigratedFrom(t, 5,
		`INSERT INTO files (id, filename, purpose, bytes, lines, blob_key, created_at) VALUES ('file-old', 'in.jsonl', 'batch', 1, 1, 'file-old', 1)`)
	if f, err := s.File(ctx, "file-old"); err != nil || f.Owner != "" {
		t.Errorf("old file = %+v, %v; want owner \"\"", f, err)
	}
	if page, _, err := s.Files(ctx, FileQuery{Limit: 10}); err != nil || len(page) != 1 {
		t.Errorf("Files of owner \"\" = %+v, %v; want the old file", page, err)
	}
	if page, _, err := s.Files(ctx, FileQuery{Owner: "tenant-a", Limit: 10}); err != nil || len(page) != 0 {
		t.Errorf("Files of tenant-a = %+v, %v; want none", page, err)
	}
}
