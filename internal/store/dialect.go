package store

import (
	"context"
	"database/sql/driver"
	"errors"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// dialect is the SQL database a Store runs on. The methods issue one form
// of each query for both: SQLite's '?' placeholders (rewritten for
// PostgreSQL by its connections, below), RETURNING rather than
// LastInsertId, ON CONFLICT rather than INSERT OR IGNORE/REPLACE, and no
// function only one of them has. What differs beyond that (the schema and
// its version, the write lock, the errors) is decided on the dialect.
type dialect int

const (
	// sqliteDialect: modernc.org/sqlite, one database file.
	sqliteDialect dialect = iota
	// postgresDialect: PostgreSQL through pgx's database/sql driver.
	postgresDialect
)

// pgWriteLock takes the transaction-level advisory lock every write
// transaction on PostgreSQL takes first, so that writers, in this process
// or any other gateway's, run one at a time as they do on SQLite (BEGIN
// IMMEDIATE): a method's reads and checks within its transaction still
// hold when it writes. The key is "stoke" in ASCII (0x73746f6b65); advisory locks are
// per database, so only another program sharing stoke's database and
// choosing the same key could contend for it.
const pgWriteLock = "SELECT pg_advisory_xact_lock(495874698085)"

// rebind rewrites the '?' placeholders of query, outside string literals,
// quoted identifiers and comments, as PostgreSQL's $1, $2, …, in order.
func rebind(query string) string {
	if !strings.Contains(query, "?") {
		return query
	}
	var b strings.Builder
	b.Grow(len(query) + 8)
	n := 0
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		case c == '\'' || c == '"':
			// A quoted run ends at the next lone quote; a doubled quote
			// inside is an escaped one, which this reads as the run
			// ending and another starting at once.
			end := strings.IndexByte(query[i+1:], c)
			if end < 0 {
				b.WriteString(query[i:])
				return b.String()
			}
			b.WriteString(query[i : i+end+2])
			i += end + 1
			continue
		case c == '-' && strings.HasPrefix(query[i:], "--"):
			end := strings.IndexByte(query[i:], '\n')
			if end < 0 {
				b.WriteString(query[i:])
				return b.String()
			}
			b.WriteString(query[i : i+end+1])
			i += end
			continue
		case c == '/' && strings.HasPrefix(query[i:], "/*"):
			end := strings.Index(query[i+2:], "*/")
			if end < 0 {
				b.WriteString(query[i:])
				return b.String()
			}
			b.WriteString(query[i : i+end+4])
			i += end + 3
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// pgConnector makes the PostgreSQL connections of a Store: pgx's, with
// every query rebound as it is issued, so that the methods' queries (and
// their statements, prepared or not) need no dialect of their own.
type pgConnector struct{ driver.Connector }

// Connect opens one connection.
func (c pgConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	pc, ok := conn.(*stdlib.Conn)
	if !ok {
		conn.Close()
		return nil, errors.New("pgx returned a connection of an unexpected type")
	}
	return pgConn{pc}, nil
}

// pgConn is a pgx connection that rebinds queries; everything else (its
// transactions, pings, session resets, argument checks) is pgx's.
type pgConn struct{ *stdlib.Conn }

// Prepare prepares query, rebound.
func (c pgConn) Prepare(query string) (driver.Stmt, error) { return c.Conn.Prepare(rebind(query)) }

// PrepareContext prepares query, rebound.
func (c pgConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.Conn.PrepareContext(ctx, rebind(query))
}

// ExecContext runs query, rebound.
func (c pgConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.ExecContext(ctx, rebind(query), args)
}

// QueryContext runs query, rebound.
func (c pgConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.QueryContext(ctx, rebind(query), args)
}

// isUniqueViolation reports whether err is a database refusing a row that
// would duplicate a unique key (a primary key included), on either
// backend.
func isUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "23505" // unique_violation
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE || se.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
	}
	return false
}

// isPostgresURL reports whether state names a PostgreSQL database (in
// lower case, as pgx reads it).
func isPostgresURL(state string) bool {
	return strings.HasPrefix(state, "postgres://") || strings.HasPrefix(state, "postgresql://")
}

// redacted is the password placeholder in URLs and errors.
const redacted = "xxxxx"

// redactURL is the URL u with its password (in the user info or a
// password query parameter) replaced; a string that does not parse as a
// URL is not shown at all.
func redactURL(u string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		return "(a URL that does not parse)"
	}
	if _, ok := parsed.User.Password(); ok {
		parsed.User = url.UserPassword(parsed.User.Username(), redacted)
	}
	if q := parsed.Query(); q.Has("password") {
		q.Set("password", redacted)
		parsed.RawQuery = q.Encode()
	}
	return parsed.String()
}

// secrets are the forms the password of the URL u may take in text: as
// written and decoded, in the user info or a query parameter.
func secrets(u string) []string {
	var out []string
	parsed, err := url.Parse(u)
	if err != nil {
		// By hand: the user info runs from the scheme to the last '@'
		// (which may take more than the password: no harm in an error).
		if _, rest, ok := strings.Cut(u, "://"); ok {
			if at := strings.LastIndexByte(rest, '@'); at >= 0 {
				if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
					out = append(out, pw)
					if dec, err := url.PathUnescape(pw); err == nil {
						out = append(out, dec)
					}
				}
			}
		}
		return dedupSecrets(out)
	}
	if pw, ok := parsed.User.Password(); ok {
		out = append(out, pw)
		if raw := parsed.User.String(); strings.Contains(raw, ":") {
			out = append(out, raw[strings.IndexByte(raw, ':')+1:])
		}
	}
	for _, pw := range parsed.Query()["password"] {
		out = append(out, pw, url.QueryEscape(pw))
	}
	return dedupSecrets(out)
}

// dedupSecrets is secrets without empty or repeated ones, longest first.
func dedupSecrets(out []string) []string {
	kept := out[:0]
	for _, s := range out {
		if s != "" && s != redacted && !slices.Contains(kept, s) {
			kept = append(kept, s)
		}
	}
	// Longest first, so that no secret is half replaced by a shorter one
	// it contains.
	slices.SortFunc(kept, func(a, b string) int { return len(b) - len(a) })
	return kept
}

// redactedError is an error whose text shows none of secrets; errors.Is
// and errors.As still see what it wraps.
type redactedError struct {
	err     error
	secrets []string
}

// Error is the wrapped error's text with each secret replaced.
func (e *redactedError) Error() string {
	msg := e.err.Error()
	for _, s := range e.secrets {
		msg = strings.ReplaceAll(msg, s, redacted)
	}
	return msg
}

// Unwrap is the wrapped error.
func (e *redactedError) Unwrap() error { return e.err }

// redactErr wraps err so that its text shows none of secrets (nil stays
// nil).
func redactErr(err error, secrets []string) error {
	if err == nil || len(secrets) == 0 {
		return err
	}
	return &redactedError{err: err, secrets: secrets}
}
