package store

import (
	"context"
	"database/sql"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// openTemp opens a fresh store in the test's temporary directory.
func openTemp(t *testing.T) *Store {
	t.Helper()
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestOpenSetsUpSchemaAndPragmas(t *testing.T) {
	ctx := context.Background()
	// Characters that mean something in a SQLite URI must still name the file.
	path := filepath.Join(t.TempDir(), "odd?name#with%chars.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if s.Path() != path {
		t.Errorf("Path() = %q, want %q", s.Path(), path)
	}
	checks := []struct {
		pragma string
		want   string
	}{
		{"user_version", strconv.Itoa(SchemaVersion)},
		{"journal_mode", "wal"},
		{"busy_timeout", "10000"},
		{"foreign_keys", "1"},
	}
	for _, c := range checks {
		var got string
		if err := s.db.QueryRowContext(ctx, "PRAGMA "+c.pragma).Scan(&got); err != nil {
			t.Fatalf("PRAGMA %s: %v", c.pragma, err)
		}
		if got != c.want {
			t.Errorf("PRAGMA %s = %s, want %s", c.pragma, got, c.want)
		}
	}
	if _, err := s.PutRevision(ctx, Revision{Model: "m", Digest: "sha256:1"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Reopening keeps the data and applies no migration twice.
	s, err = Open(ctx, path)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	if _, err := s.Revision(ctx, "m", "sha256:1"); err != nil {
		t.Errorf("after reopen: %v", err)
	}
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.ExecContext(ctx, "PRAGMA user_version = 99"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err := Open(ctx, path); err == nil || !strings.Contains(err.Error(), "newer") {
		if s != nil {
			s.Close()
		}
		t.Fatalf("Open of a version-99 database: err = %v, want one saying it is newer", err)
	}
}

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		path string
	}{
		{"empty path", ""},
		{"missing directory", filepath.Join(t.TempDir(), "no", "such", "dir", "state.db")},
		{"a directory", t.TempDir()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Open(ctx, tt.path)
			if err == nil {
				s.Close()
				t.Fatalf("Open(%q) succeeded", tt.path)
			}
		})
	}
}

func TestMigrationIsAtomic(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	// A database where the revisions table exists but user_version says 0,
	// as if a migration had half run: applying it again fails and must
	// leave the version untouched.
	db, err := sql.Open("sqlite", dsn(path))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE revisions (x INTEGER)"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if s, err := Open(ctx, path); err == nil {
		s.Close()
		t.Fatal("Open succeeded over a conflicting table")
	}
	db, err = sql.Open("sqlite", dsn(path))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v int
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v != 0 {
		t.Errorf("user_version = %d after a failed migration, want 0", v)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_master WHERE name = 'revisions_by_model'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Error("the failed migration left its index behind")
	}
}
