// Package redistest runs a private redis-server for tests: a real server
// (Debian's redis-server), on a free loopback port, keeping nothing on disk.
package redistest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// RequireEnv is the environment variable that, set to 1, turns a missing
// redis-server from a skipped test into a failed one (for CI, where it
// must be installed).
const RequireEnv = "STOKE_REQUIRE_REDIS"

// startTimeout bounds how long a server may take to answer its first PING.
const startTimeout = 15 * time.Second

// Start runs a redis-server on a free loopback port, with no persistence
// (--save "" --appendonly no) and its working directory in t's temporary
// directory, and returns its address ("127.0.0.1:PORT"). The server is
// stopped when t's cleanup runs. Without a redis-server on $PATH, t is
// skipped with the reason, or fails when $STOKE_REQUIRE_REDIS is 1.
func Start(t testing.TB) (addr string) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		msg := fmt.Sprintf("redistest: no redis-server on $PATH (Debian: apt-get install redis-server): %v", err)
		if os.Getenv(RequireEnv) == "1" {
			t.Fatal(msg + " ($" + RequireEnv + "=1)")
		}
		t.Skip(msg)
	}
	var errs []error
	for range 5 { // another process may take the free port first
		addr, err := start(t, bin)
		if err == nil {
			return addr
		}
		errs = append(errs, err)
	}
	t.Fatalf("redistest: start redis-server: %v", errors.Join(errs...))
	return ""
}

// start runs one redis-server on a port that was free a moment ago.
func start(t testing.TB, bin string) (string, error) {
	port, err := freePort()
	if err != nil {
		return "", err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	out := &syncBuffer{}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", t.TempDir(), "--daemonize", "no", "--loglevel", "warning")
	cmd.Stdout, cmd.Stderr = out, out
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("run %s: %w", bin, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	}
	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-exited:
			return "", fmt.Errorf("redis-server on port %d exited: %s", port, strings.TrimSpace(out.String()))
		default:
		}
		if ping(addr) == nil {
			t.Cleanup(stop)
			return addr, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", fmt.Errorf("redis-server on port %d did not answer PING within %s: %s", port, startTimeout, strings.TrimSpace(out.String()))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// freePort is a loopback TCP port nothing listened on a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// ping sends PING to the server at addr and expects +PONG.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// syncBuffer is a bytes.Buffer safe for the server's two output streams.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
