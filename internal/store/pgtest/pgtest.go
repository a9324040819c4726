// Package pgtest runs a private PostgreSQL server for tests: started from the
// system's binaries (Debian's /usr/lib/postgresql/*/bin, or initdb and
// postgres on PATH) the first time a test of the binary asks for it, in a
// temporary directory, listening on a free loopback port (127.0.0.1 only)
// and on a unix socket in that directory, and shared by every test of the
// binary. Each Start gives its test a fresh, empty database.
//
// A test binary that uses it runs its tests through Main, which stops the
// server and removes its directory when they end:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// Should the binary die without Main's cleanup, the kernel sends the server
// SIGQUIT (an immediate shutdown) as its parent goes.
//
// PostgreSQL refuses to run as root: when the tests do, the server runs as
// the system's postgres user. Without the binaries (or, as root, without a
// postgres user) Start skips its test with the reason, unless
// STOKE_REQUIRE_POSTGRES=1, when it fails it instead.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// RequireEnv is the environment variable that, set to 1, turns a missing
// PostgreSQL into a test failure rather than a skip.
const RequireEnv = "STOKE_REQUIRE_POSTGRES"

// startTimeout bounds the server's start (initdb included) and each
// database's creation.
const startTimeout = 2 * time.Minute

// dirPrefix names the servers' temporary directories.
const dirPrefix = "stoke-pgtest-"

// staleAfter is how old the directory of a server that is not running
// must be for sweep to remove it.
const staleAfter = time.Hour

// errUnavailable marks the reasons no server can be started here at all
// (as opposed to one failing to start).
var errUnavailable = errors.New("PostgreSQL is not available")

// shared is the test binary's one server. It is package state by
// necessity: Start is called from unrelated tests that share the server,
// and Main stops it.
var shared struct {
	mu      sync.Mutex
	started bool
	srv     *server
	err     error
}

// server is a running PostgreSQL server.
type server struct {
	dir      string // the temporary directory: data/, sock/, postgres.log
	port     int
	password string // of the superuser postgres, for TCP connections
	cmd      *exec.Cmd
	exited   chan struct{} // closed once the server process is gone
	waitErr  error         // how it ended, once exited is closed
	dbs      atomic.Int64  // databases created so far, for their names
}

// Start returns the URL of a new, empty database on the test binary's
// PostgreSQL server (starting the server on the first call), dropped when
// t ends. Connections from the URL authenticate with a password over TCP
// on 127.0.0.1.
func Start(t testing.TB) (url string) {
	t.Helper()
	srv, err := get()
	if err != nil {
		if errors.Is(err, errUnavailable) && os.Getenv(RequireEnv) != "1" {
			t.Skipf("pgtest: %v (set %s=1 to fail instead)", err, RequireEnv)
		}
		t.Fatalf("pgtest: %v", err)
	}
	name := fmt.Sprintf("stoke_test_%d", srv.dbs.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := srv.admin(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		// FORCE ends connections a test left open.
		if err := srv.admin(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	return srv.url(name)
}

// Main runs the tests of m, stops the server if one was started, and exits
// with the tests' status. Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if err := stop(); err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// get returns the shared server, starting it on the first call; a start
// that failed fails every later call the same way.
func get() (*server, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.started {
		shared.started = true
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		shared.srv, shared.err = start(ctx)
	}
	return shared.srv, shared.err
}

// stop shuts the shared server down, if it runs, and removes its directory.
func stop() error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	srv := shared.srv
	shared.srv, shared.err = nil, errors.New("the server was stopped")
	if srv == nil {
		return nil
	}
	return srv.stop()
}

// binDir finds the directory of initdb and postgres: the newest Debian
// versioned one, or PATH's.
func binDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return version(b) - version(a) })
	for _, d := range dirs {
		if isExecutable(filepath.Join(d, "initdb")) && isExecutable(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		d := filepath.Dir(p)
		if isExecutable(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", fmt.Errorf("%w: no initdb and postgres in /usr/lib/postgresql/*/bin or on PATH", errUnavailable)
}

// version is the major version in a Debian path /usr/lib/postgresql/N/bin
// (0 when it has none).
func version(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// credential is who the server runs as: nil for the current user, the
// postgres user when that is root (which PostgreSQL refuses).
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("%w: running as root and there is no postgres user to run the server as: %v", errUnavailable, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user postgres: uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user postgres: gid %q: %w", u.Gid, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// start initializes a cluster in a new temporary directory and runs a
// server on it.
func start(ctx context.Context) (*server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	sweep(os.TempDir(), time.Now().Add(-staleAfter))
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("make the server's directory: %w", err)
	}
	srv, err := startIn(ctx, bin, dir, cred)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return srv, nil
}

// startIn is start in the directory dir.
func startIn(ctx context.Context, bin, dir string, cred *syscall.Credential) (*server, error) {
	var pw [16]byte
	if _, err := rand.Read(pw[:]); err != nil {
		return nil, fmt.Errorf("make a password: %w", err)
	}
	srv := &server{dir: dir, password: hex.EncodeToString(pw[:])}
	sock := filepath.Join(dir, "sock")
	pwfile := filepath.Join(dir, "pwfile")
	if err := os.Mkdir(sock, 0o700); err != nil {
		return nil, fmt.Errorf("make the socket directory: %w", err)
	}
	if err := os.WriteFile(pwfile, []byte(srv.password+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("write the password file: %w", err)
	}
	if cred != nil {
		for _, p := range []string{dir, sock, pwfile} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return nil, fmt.Errorf("hand %s to the postgres user: %w", p, err)
			}
		}
	}
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "--pgdata", filepath.Join(dir, "data"),
		"--username", "postgres", "--pwfile", pwfile, "--auth-host", "scram-sha-256", "--auth-local", "trust",
		"--encoding", "UTF8", "--locale", "C", "--no-sync")
	initdb.Dir = dir
	initdb.Env = append(os.Environ(), "LC_ALL=C")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	os.Remove(pwfile)

	// A free port can be taken between finding it and the server binding
	// it: try a few.
	var lastErr error
	for range 3 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		srv.port = port
		if lastErr = srv.run(ctx, bin, sock, cred); lastErr == nil {
			return srv, nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

// freePort is a TCP port on 127.0.0.1 nothing listens on (yet).
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// run starts the server on srv.port and waits until it accepts
// connections; a server that fails to is stopped.
func (srv *server) run(ctx context.Context, bin, sock string, cred *syscall.Credential) error {
	logPath := filepath.Join(srv.dir, "postgres.log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open the server's log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", filepath.Join(srv.dir, "data"),
		"-c", "listen_addresses=127.0.0.1", "-p", strconv.Itoa(srv.port), "-c", "unix_socket_directories="+sock,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=300", "-c", "logging_collector=off")
	cmd.Dir = srv.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.Stdout, cmd.Stderr = logf, logf
	// Pdeathsig fires when the thread that started the server ends, so
	// that thread is kept for the server's life: a goroutine locked to it
	// starts the server and waits for it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT}
	srv.cmd, srv.exited = cmd, make(chan struct{})
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the server
		if err := cmd.Start(); err != nil {
			started <- err
			close(srv.exited)
			return
		}
		started <- nil
		srv.waitErr = cmd.Wait()
		close(srv.exited)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	if err := srv.waitReady(ctx); err != nil {
		srv.halt()
		log, _ := os.ReadFile(logPath)
		return fmt.Errorf("postgres on port %d: %w\n%s", srv.port, err, tail(log, 4000))
	}
	return nil
}

// waitReady polls the server until it accepts a connection, it exits, or
// ctx ends.
func (srv *server) waitReady(ctx context.Context) error {
	for {
		attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := pgx.Connect(attempt, srv.url("postgres"))
		cancel()
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-srv.exited:
			return fmt.Errorf("it exited before accepting connections: %v", srv.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("not accepting connections: %w (last: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// tail is the last n bytes of b.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// url is the URL of the database name on the server.
func (srv *server) url(name string) string {
	return fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/%s?sslmode=disable", srv.password, srv.port, name)
}

// admin runs one statement as the superuser in the postgres database.
func (srv *server) admin(ctx context.Context, stmt string) error {
	conn, err := pgx.Connect(ctx, srv.url("postgres"))
	if err != nil {
		return fmt.Errorf("connect to the server: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, stmt); err != nil {
		return fmt.Errorf("%s: %w", stmt, err)
	}
	return nil
}

// stop shuts the server down and removes its directory.
func (srv *server) stop() error {
	err := srv.halt()
	if rerr := os.RemoveAll(srv.dir); rerr != nil {
		err = errors.Join(err, fmt.Errorf("remove the server's directory: %w", rerr))
	}
	return err
}

// halt shuts the server down: a fast shutdown, then a kill if it lingers.
func (srv *server) halt() error {
	select {
	case <-srv.exited:
		return nil
	default:
	}
	srv.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-srv.exited:
		return nil
	case <-time.After(30 * time.Second):
		srv.cmd.Process.Kill()
		<-srv.exited
		return errors.New("the server did not shut down within 30s and was killed")
	}
}

// sweep removes the directories in tmp that servers of test binaries that
// died without Main's cleanup left (killed, or interrupted): those last
// changed before cutoff whose server is not running. Failures are ignored:
// what cannot be removed stays.
func sweep(tmp string, cutoff time.Time) {
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), dirPrefix) {
			continue
		}
		dir := filepath.Join(tmp, e.Name())
		fi, err := e.Info()
		if err != nil || fi.ModTime().After(cutoff) || running(dir) {
			continue
		}
		os.RemoveAll(dir)
	}
}

// running reports whether the server of the directory dir may still run:
// its postmaster.pid names a live process.
func running(dir string) bool {
	pidFile, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	if err != nil {
		return true // cannot tell: keep it
	}
	first, _, _ := strings.Cut(string(pidFile), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return false
	}
	return syscall.Kill(pid, 0) != syscall.ESRCH
}
