package store

import (
	"context"
	"database/sql"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver, to set databases up behind the store's back
)

// TestOpenSetsUpSchemaAndSettings: a new database gets the current schema
// and the settings every connection needs, and reopening it keeps its data
// and applies no migration twice.
func TestOpenSetsUpSchemaAndSettings(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		tg := bk.fresh(t)
		var s *Store
		var err error
		var checks []struct{ query, want string }
		if bk.postgres {
			s, err = OpenState(ctx, tg.state, tg.dir)
			checks = []struct{ query, want string }{
				{"SELECT version FROM schema_version", strconv.Itoa(SchemaVersion)},
				{"SHOW lock_timeout", "10s"},
				{"SHOW application_name", "stoke"},
				{"SHOW transaction_isolation", "read committed"},
			}
		} else {
			// Characters that mean something in a SQLite URI must still
			// name the file.
			path := filepath.Join(tg.dir, "odd?name#with%chars.db")
			s, err = Open(ctx, path)
			if err == nil && s.Path() != path {
				t.Errorf("Path() = %q, want %q", s.Path(), path)
			}
			checks = []struct{ query, want string }{
				{"PRAGMA user_version", strconv.Itoa(SchemaVersion)},
				{"PRAGMA journal_mode", "wal"},
				{"PRAGMA busy_timeout", "10000"},
				{"PRAGMA foreign_keys", "1"},
			}
			tg.state, tg.dir = "", "" // reopened by path below
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range checks {
			var got string
			if err := s.db.QueryRowContext(ctx, c.query).Scan(&got); err != nil {
				t.Fatalf("%s: %v", c.query, err)
			}
			if got != c.want {
				t.Errorf("%s = %s, want %s", c.query, got, c.want)
			}
		}
		if _, err := s.PutRevision(ctx, Revision{Model: "m", Digest: "sha256:1"}); err != nil {
			t.Fatal(err)
		}
		path := s.Path()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}

		// Reopening keeps the data and applies no migration twice.
		if bk.postgres {
			s, err = OpenState(ctx, tg.state, tg.dir)
		} else {
			s, err = Open(ctx, path)
		}
		if err != nil {
			t.Fatalf("reopen: %v", err)
		}
		defer s.Close()
		if _, err := s.Revision(ctx, "m", "sha256:1"); err != nil {
			t.Errorf("after reopen: %v", err)
		}
	})
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		tg := bk.fresh(t)
		s, err := OpenState(ctx, tg.state, tg.dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.tx(ctx, func(tx *sql.Tx) error { return s.setSchemaVersion(ctx, tx, 99) }); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if s, err := OpenState(ctx, tg.state, tg.dir); err == nil || !strings.Contains(err.Error(), "newer") {
			if s != nil {
				s.Close()
			}
			t.Fatalf("Open of a version-99 database: err = %v, want one saying it is newer", err)
		}
	})
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

// rawDB opens the database of tg with a plain driver, behind the store's
// back, closed when t ends.
func rawDB(t *testing.T, bk backend, tg target) *sql.DB {
	t.Helper()
	driver, dsnOf := "sqlite", dsn(filepath.Join(tg.dir, "state.db"))
	if bk.postgres {
		driver, dsnOf = "pgx", tg.state
	}
	db, err := sql.Open(driver, dsnOf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestMigrationIsAtomic(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		tg := bk.fresh(t)
		// A database where a table the first migration creates exists but
		// the schema version says 0, as if a migration had half run:
		// applying it again fails and must leave the version untouched.
		// (PostgreSQL's first step creates every table; its conflict is
		// with one of the last, after an index it must not leave behind.)
		// The version table of PostgreSQL goes with a failed first step.
		conflict, versionQuery, indexQuery := "revisions", "PRAGMA user_version",
			"SELECT count(*) FROM sqlite_master WHERE name = 'revisions_by_model'"
		if bk.postgres {
			conflict = "rollouts"
			versionQuery = "SELECT count(*) FROM pg_class WHERE relname = 'schema_version'"
			indexQuery = "SELECT count(*) FROM pg_class WHERE relname = 'revisions_by_model'"
		}
		db := rawDB(t, bk, tg)
		if _, err := db.ExecContext(ctx, "CREATE TABLE "+conflict+" (x INTEGER)"); err != nil {
			t.Fatal(err)
		}
		if s, err := OpenState(ctx, tg.state, tg.dir); err == nil {
			s.Close()
			t.Fatal("Open succeeded over a conflicting table")
		}
		var v int
		if err := db.QueryRowContext(ctx, versionQuery).Scan(&v); err != nil {
			t.Fatal(err)
		}
		if v != 0 {
			t.Errorf("%s = %d after a failed migration, want 0", versionQuery, v)
		}
		var n int
		if err := db.QueryRowContext(ctx, indexQuery).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Error("the failed migration left its index behind")
		}
	})
}
