// Package store is the platform's durable state: one SQLite database
// (modernc.org/sqlite, pure Go) in WAL mode, opened by every component that
// records or reads state. Each table has its own file and typed methods; the
// schema evolves through the numbered migrations in migrations.go, tracked by
// SQLite's user_version.
//
// Every write runs in a transaction that takes SQLite's write lock up front
// (BEGIN IMMEDIATE), so a crash leaves the state of before or after a call,
// never a mixture, and concurrent callers, in this process or another, wait
// for each other (up to the busy timeout) instead of failing. A Store is safe
// for concurrent use.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// BusyTimeout is how long a call waits for another writer of the same
// database (another process, or a connection of this one) before failing.
const BusyTimeout = 10 * time.Second

// Sentinel errors, matched with errors.Is. Read-only.
var (
	// ErrNotFound reports a record that does not exist.
	ErrNotFound = errors.New("not found")
	// ErrIllegalTransition reports a state change the record's state
	// machine does not allow.
	ErrIllegalTransition = errors.New("illegal state transition")
	// ErrInvalid reports a record with a missing or malformed field.
	ErrInvalid = errors.New("invalid record")
)

// Store is an open state database.
type Store struct {
	db *sql.DB
	// journal is where usage records are appended on a request's path
	// (journal.go).
	journal *usageJournal
	path    string
	// now stamps created/updated times; tests replace it.
	now func() time.Time
}

// Open opens (creating it if needed) the database file at path and brings its
// schema up to date. A database written by a newer stoke, with migrations
// this binary does not know, is refused rather than touched.
func Open(ctx context.Context, path string) (*Store, error) {
	if path == "" {
		return nil, errors.New("open state store: empty path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("open state store %s: %w", path, err)
	}
	db, err := sql.Open("sqlite", dsn(abs))
	if err != nil {
		return nil, fmt.Errorf("open state store %s: %w", abs, err)
	}
	s := &Store{db: db, path: abs, now: time.Now}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open state store %s: %w", abs, err)
	}
	if s.journal, err = openUsageJournal(ctx, journalPath(abs), s.InsertUsage); err != nil {
		db.Close()
		return nil, fmt.Errorf("open state store %s: %w", abs, err)
	}
	return s, nil
}

// dsn is the driver's connection string for the database file at the
// absolute path abs: a SQLite URI, so that any byte of the path is allowed,
// with the pragmas every connection needs.
func dsn(abs string) string {
	esc := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(filepath.ToSlash(abs))
	return "file:" + esc +
		"?_pragma=" + fmt.Sprintf("busy_timeout(%d)", BusyTimeout.Milliseconds()) +
		"&_pragma=journal_mode(WAL)" +
		"&_pragma=synchronous(FULL)" +
		"&_pragma=foreign_keys(1)" +
		"&_txlock=immediate"
}

// Path is the database file's absolute path.
func (s *Store) Path() string { return s.path }

// Close drains the usage journal and closes the database. Calls made
// afterwards fail.
func (s *Store) Close() error {
	jerr := s.journal.close(context.Background())
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close state store %s: %w", s.path, errors.Join(jerr, err))
	}
	if jerr != nil {
		return fmt.Errorf("close state store %s: %w", s.path, jerr)
	}
	return nil
}

// tx runs fn in one immediate transaction, committing when fn returns nil
// and rolling back otherwise.
func (s *Store) tx(ctx context.Context, fn func(*sql.Tx) error) error {
	return txOn(ctx, s.db, fn)
}

// txOn is tx on the handle db.
func txOn(ctx context.Context, db *sql.DB, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// stamp is the storage form of a time: Unix nanoseconds, UTC.
func stamp(t time.Time) int64 { return t.UnixNano() }

// unstamp turns a stored time back into a time.Time in UTC.
func unstamp(ns int64) time.Time { return time.Unix(0, ns).UTC() }
