package pgtest

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

// connect opens a connection to the database at u, closed when t ends.
func connect(t *testing.T, u string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// TestStartGivesFreshDatabases: each Start is its own empty database on
// one loopback server, and is dropped when its test ends.
func TestStartGivesFreshDatabases(t *testing.T) {
	ctx := context.Background()
	var first string
	t.Run("first", func(t *testing.T) {
		first = Start(t)
		conn := connect(t, first)
		if _, err := conn.Exec(ctx, "CREATE TABLE mine (x int)"); err != nil {
			t.Fatal(err)
		}
	})
	if t.Failed() || first == "" {
		t.FailNow()
	}
	second := Start(t)
	u1, err := url.Parse(first)
	if err != nil {
		t.Fatal(err)
	}
	u2, err := url.Parse(second)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what      string
		got, want string
	}{
		{"host of the first", u1.Hostname(), "127.0.0.1"},
		{"one server", u2.Host, u1.Host},
	} {
		if c.got != c.want {
			t.Errorf("%s: %q, want %q", c.what, c.got, c.want)
		}
	}
	if u1.Path == u2.Path {
		t.Fatalf("two Starts gave the same database %s", u1.Path)
	}
	conn := connect(t, second)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE relname = 'mine'").Scan(&n); err != nil || n != 0 {
		t.Errorf("the second database holds the first's table: count %d, %v", n, err)
	}
	var exists bool
	err = conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", strings.TrimPrefix(u1.Path, "/")).Scan(&exists)
	if err != nil || exists {
		t.Errorf("the first test's database outlived it: exists %v, %v", exists, err)
	}
	var listen string
	if err := conn.QueryRow(ctx, "SHOW listen_addresses").Scan(&listen); err != nil || listen != "127.0.0.1" {
		t.Errorf("listen_addresses = %q, %v; want 127.0.0.1 only", listen, err)
	}
}

// TestStartNeedsThePassword: the server takes TCP connections only with
// the password.
func TestStartNeedsThePassword(t *testing.T) {
	u, err := url.Parse(Start(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("postgres", "wrong")
	conn, err := pgx.Connect(context.Background(), u.String())
	if err == nil {
		conn.Close(context.Background())
		t.Fatal("connected with a wrong password")
	}
}

// TestSweep: a stale directory whose server is gone is removed; a recent
// one, one whose server runs, and other directories stay.
func TestSweep(t *testing.T) {
	tmp := t.TempDir()
	old := time.Now().Add(-2 * staleAfter)
	mk := func(name, pid string, mtime time.Time) string {
		dir := filepath.Join(tmp, name)
		if err := os.MkdirAll(filepath.Join(dir, "data"), 0o700); err != nil {
			t.Fatal(err)
		}
		if pid != "" {
			if err := os.WriteFile(filepath.Join(dir, "data", "postmaster.pid"), []byte(pid+"\n/data\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chtimes(dir, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	cases := []struct {
		name, dir string
		kept      bool
	}{
		{"stale, no server", mk(dirPrefix+"1", "", old), false},
		{"stale, server gone", mk(dirPrefix+"2", "999999999", old), false},
		{"stale, server running", mk(dirPrefix+"3", strconv.Itoa(os.Getpid()), old), true},
		{"recent", mk(dirPrefix+"4", "", time.Now()), true},
		{"not a server's", mk("other-1", "", old), true},
	}
	sweep(tmp, time.Now().Add(-staleAfter))
	for _, c := range cases {
		_, err := os.Stat(c.dir)
		if kept := err == nil; kept != c.kept {
			t.Errorf("%s: kept %v, want %v", c.name, kept, c.kept)
		}
	}
}
