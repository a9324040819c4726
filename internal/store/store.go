// Package store is the platform's durable state, opened by every component
// that records or reads state: one SQLite database (modernc.org/sqlite, pure
// Go) in WAL mode when a gateway runs alone, or a PostgreSQL database (pgx's
// database/sql driver) that several gateway replicas share. Each table has
// its own file and typed methods, with one form of each query for both
// databases (dialect.go); the schema evolves through the numbered
// migrations in migrations.go, tracked by SQLite's user_version or
// PostgreSQL's schema_version table.
//
// Every write runs in a transaction that takes the database's write lock up
// front (SQLite's BEGIN IMMEDIATE, a transaction-level advisory lock on
// PostgreSQL), so a crash leaves the state of before or after a call, never
// a mixture, and concurrent callers, in this process or another, wait for
// each other (up to the busy timeout) instead of failing, and each sees
// what the one before it wrote. A Store is safe for concurrent use.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// BusyTimeout is how long a call waits for another writer of the same
// database (another process, or a connection of this one) before failing.
// On PostgreSQL it is the connections' lock_timeout, unless the URL sets
// one.
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
	db      *sql.DB
	dialect dialect
	// journal is where usage records are appended on a request's path
	// (journal.go).
	journal *usageJournal
	// path is the SQLite database file ("" on PostgreSQL); where says
	// where the state is in messages (the file, or the URL without its
	// password).
	path, where string
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
	s := &Store{db: db, dialect: sqliteDialect, path: abs, where: abs, now: time.Now}
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

// Path is the SQLite database file's absolute path; it is "" on
// PostgreSQL.
func (s *Store) Path() string { return s.path }

// Location says where the state is, for messages and logs: the SQLite
// database file's path, or the PostgreSQL URL with its password replaced.
func (s *Store) Location() string { return s.where }

// Close drains the usage journal and closes the database. Calls made
// afterwards fail.
func (s *Store) Close() error {
	jerr := s.journal.close(context.Background())
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close state store %s: %w", s.where, errors.Join(jerr, err))
	}
	if jerr != nil {
		return fmt.Errorf("close state store %s: %w", s.where, jerr)
	}
	return nil
}

// tx runs fn in one write transaction, which holds the database's write
// lock from its start (see the package's doc), committing when fn returns
// nil and rolling back otherwise.
func (s *Store) tx(ctx context.Context, fn func(*sql.Tx) error) error {
	// SQLite's transactions are BEGIN IMMEDIATE (dsn). PostgreSQL's are
	// READ COMMITTED whatever the database's default: each statement after
	// the lock then reads what the lock's previous holder committed (a
	// snapshot taken by the lock's own statement would not).
	var opts *sql.TxOptions
	if s.dialect == postgresDialect {
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	tx, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	if s.dialect == postgresDialect {
		if _, err := tx.ExecContext(ctx, pgWriteLock); err != nil {
			tx.Rollback()
			return fmt.Errorf("take the write lock: %w", err)
		}
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

// PostgresJournal is the name of the usage journal's file in the data
// directory of a gateway whose state is in PostgreSQL (its companions are
// PostgresJournal+".1" and PostgresJournal+".lock").
const PostgresJournal = "postgres-usage"

// OpenState opens the state store a gateway with the data directory
// dataDir is configured with, bringing its schema up to date:
//
//   - state "": SQLite, the file state.db in dataDir, as Open of it.
//   - state "postgres://…" or "postgresql://…": the PostgreSQL database
//     of that URL (pgx's forms and parameters), which other gateways may
//     share, with this gateway's usage journal in dataDir (PostgresJournal),
//     drained into the shared usage table.
//
// Anything else is an error. The URL's password appears in no error (nor
// in Location).
func OpenState(ctx context.Context, state, dataDir string) (*Store, error) {
	if dataDir == "" {
		return nil, errors.New("open state store: empty data directory")
	}
	switch {
	case state == "":
		return Open(ctx, filepath.Join(dataDir, "state.db"))
	case isPostgresURL(state):
		s, err := openPostgres(ctx, state, dataDir)
		return s, redactErr(err, secrets(state))
	}
	what := "a string that is not a URL"
	if scheme, _, ok := strings.Cut(state, "://"); ok && !strings.ContainsAny(scheme, "@:/") {
		what = fmt.Sprintf("a %s:// URL", scheme)
	}
	return nil, fmt.Errorf(`open state store: unsupported state %s; want "" (SQLite in the data directory) or a postgres:// or postgresql:// URL`, what)
}

// openPostgres is OpenState of a PostgreSQL URL.
func openPostgres(ctx context.Context, state, dataDir string) (*Store, error) {
	where := redactURL(state)
	cfg, err := pgx.ParseConfig(state)
	if err != nil {
		return nil, fmt.Errorf("open state store %s: %w", where, err)
	}
	if _, ok := cfg.RuntimeParams["lock_timeout"]; !ok {
		cfg.RuntimeParams["lock_timeout"] = strconv.FormatInt(BusyTimeout.Milliseconds(), 10)
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = "stoke"
	}
	dir, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, fmt.Errorf("open state store %s: data directory %s: %w", where, dataDir, err)
	}
	if fi, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("open state store %s: data directory: %w", where, err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("open state store %s: data directory %s is not a directory", where, dir)
	}
	db := sql.OpenDB(pgConnector{stdlib.GetConnector(*cfg)})
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open state store %s: %w", where, err)
	}
	s := &Store{db: db, dialect: postgresDialect, where: where, now: time.Now}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open state store %s: %w", where, err)
	}
	if s.journal, err = openUsageJournal(ctx, filepath.Join(dir, PostgresJournal), s.InsertUsage); err != nil {
		db.Close()
		return nil, fmt.Errorf("open state store %s: %w", where, err)
	}
	return s, nil
}
