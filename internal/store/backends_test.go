package store

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stokehq/stoke/internal/store/pgtest"
)

// The tests run against each backend (eachBackend): SQLite always,
// PostgreSQL on a private server of pgtest's (skipped where PostgreSQL is
// not installed, unless STOKE_REQUIRE_POSTGRES=1).
func TestMain(m *testing.M) { pgtest.Main(m) }

// backend is a database the tests run against.
type backend struct {
	name     string
	postgres bool
}

// backends are the databases every test runs against.
func backends() []backend {
	return []backend{{name: "sqlite"}, {name: "postgres", postgres: true}}
}

// eachBackend runs fn as a subtest on each backend.
func eachBackend(t *testing.T, fn func(t *testing.T, bk backend)) {
	t.Helper()
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) { fn(t, b) })
	}
}

// target is a database and a gateway's data directory: what OpenState
// opens.
type target struct{ state, dir string }

// fresh is a new, empty database of the backend with a data directory.
func (b backend) fresh(t testing.TB) target {
	t.Helper()
	if b.postgres {
		return target{state: pgtest.Start(t), dir: t.TempDir()}
	}
	return target{dir: t.TempDir()}
}

// replica is another gateway sharing tg's database, as another process:
// on SQLite the same data directory (the same file), on PostgreSQL its own
// data directory (and usage journal).
func (b backend) replica(t testing.TB, tg target) target {
	if b.postgres {
		return target{state: tg.state, dir: t.TempDir()}
	}
	return tg
}

// journal is the path of the usage journal of a store opened at tg.
func (b backend) journal(tg target) string {
	if b.postgres {
		return filepath.Join(tg.dir, PostgresJournal)
	}
	return journalPath(filepath.Join(tg.dir, "state.db"))
}

// openAt opens the store at tg, closed when t ends.
func openAt(t testing.TB, tg target) *Store {
	t.Helper()
	s, err := OpenState(context.Background(), tg.state, tg.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// open opens a fresh store of the backend, closed when t ends.
func (b backend) open(t testing.TB) *Store {
	t.Helper()
	return openAt(t, b.fresh(t))
}
