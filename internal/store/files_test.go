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
	ctx := context.Background()
	s := openTemp(t)
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
}

// A database written before the files table existed (schema version 2)
// keeps its deployments and gains the table.
func TestFilesMigrationKeepsOldDatabase(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := sql.Open("sqlite", dsn(path))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range migrations[:2] {
		if _, err := db.ExecContext(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.ExecContext(ctx, `PRAGMA user_version = 2; INSERT INTO deployments (name, revision, updated_at) VALUES ('old', 'sha256:o', 1)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
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
