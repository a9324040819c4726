// Package bucketest starts a real MinIO server for tests that need an S3
// endpoint. The server binary comes from scripts/install-minio.sh, which
// `make deps` (and so `make test`) runs.
package bucketest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/stokehq/stoke/internal/gobin"
	"github.com/stokehq/stoke/internal/syncbuf"
)

// Root credentials of the servers StartMinIO starts.
const (
	// AccessKey is the root user (MINIO_ROOT_USER).
	AccessKey = "stoke-test"
	// SecretKey is the root password (MINIO_ROOT_PASSWORD).
	SecretKey = "stoke-test-secret"
)

// startTimeout bounds how long a server may take to become ready.
const startTimeout = 60 * time.Second

// Binary returns the path of the MinIO server binary (gobin.Find).
func Binary() (string, error) { return gobin.Find("minio") }

// StartMinIO starts a MinIO server on a free loopback port with a temporary
// data directory, waits until it is ready and stops it when the test ends.
// It returns the endpoint ("http://127.0.0.1:PORT") and root credentials.
// Without the binary the test fails, telling how to install it, or is
// skipped when STOKE_SKIP_MINIO=1.
func StartMinIO(t testing.TB) (endpoint, accessKey, secretKey string) {
	t.Helper()
	s := StartServer(t)
	return s.Endpoint, AccessKey, SecretKey
}

// Server is a running MinIO server that a test can stop and start again
// (same address, same data), to see what a client does while it is away.
type Server struct {
	// Endpoint is "http://127.0.0.1:PORT".
	Endpoint                string
	bin, dir, addr, console string

	mu   sync.Mutex
	stop func()
}

// StartServer is StartMinIO returning the server, for tests that stop it.
func StartServer(t testing.TB) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		if os.Getenv("STOKE_SKIP_MINIO") == "1" {
			t.Skipf("%v; skipping (STOKE_SKIP_MINIO=1)", err)
		}
		t.Fatalf("%v: run `make deps` (scripts/install-minio.sh)", err)
	}
	// A port found free may be taken before MinIO binds it; try again then.
	var lastErr error
	for range 3 {
		ports, err := freePorts(2)
		if err != nil {
			t.Fatal(err)
		}
		s := &Server{bin: bin, dir: t.TempDir(), addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), console: fmt.Sprintf("127.0.0.1:%d", ports[1])}
		s.Endpoint = "http://" + s.addr
		if lastErr = s.Start(); lastErr == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("start MinIO: %v", lastErr)
	return nil
}

// Stop kills the server; its data stays for Start. Stopping a stopped
// server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	stop := s.stop
	s.stop = nil
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// Start starts a stopped server again on its address and data, and waits
// until it is ready.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stop != nil {
		return nil
	}
	cmd := exec.Command(s.bin, "server", filepath.Join(s.dir, "data"),
		"--address", s.addr,
		"--console-address", s.console,
		"--certs-dir", filepath.Join(s.dir, "certs"),
		"--quiet")
	cmd.Env = append(os.Environ(),
		"MINIO_ROOT_USER="+AccessKey,
		"MINIO_ROOT_PASSWORD="+SecretKey,
		"MINIO_BROWSER=off",
		"MINIO_UPDATE=off",
		"HOME="+s.dir,
	)
	var out syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run %s: %w", s.bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		cmd.Process.Kill()
		<-exited
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := waitReady(ctx, s.Endpoint, exited); err != nil {
		stop()
		return fmt.Errorf("MinIO at %s: %w; its output:\n%s", s.addr, err, out.String())
	}
	s.stop = stop
	return nil
}

// waitReady polls MinIO's liveness, readiness and cluster probes: the
// first two answer 200 before the object layer is up (requests then get
// "Server not initialized yet"); the cluster probe waits for it.
func waitReady(ctx context.Context, endpoint string, exited <-chan error) error {
	client := &http.Client{Timeout: 2 * time.Second}
	for _, probe := range []string{"/minio/health/live", "/minio/health/ready", "/minio/health/cluster"} {
		for {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+probe, nil)
			if err != nil {
				return err
			}
			resp, err := client.Do(req)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			select {
			case err := <-exited:
				return fmt.Errorf("server exited before %s answered: %v", probe, err)
			case <-ctx.Done():
				return fmt.Errorf("%s did not answer 200 in %v", probe, startTimeout)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// freePorts returns n distinct loopback TCP ports that were free just now.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Client returns a minio-go client for a server StartMinIO started.
func Client(t testing.TB, endpoint, accessKey, secretKey string) *minio.Client {
	t.Helper()
	host := strings.TrimPrefix(endpoint, "http://")
	c, err := minio.New(host, &minio.Options{
		Creds:        credentials.NewStaticV4(accessKey, secretKey, ""),
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		t.Fatalf("MinIO client for %s: %v", endpoint, err)
	}
	return c
}

// MakeBucket creates the bucket name on the server, failing the test if it
// cannot.
func MakeBucket(t testing.TB, endpoint, accessKey, secretKey, name string) {
	t.Helper()
	c := Client(t, endpoint, accessKey, secretKey)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A just-started server may still be initialising its drive.
	for {
		err := c.MakeBucket(ctx, name, minio.MakeBucketOptions{})
		if err == nil {
			return
		}
		if minio.ToErrorResponse(err).Code != "XMinioServerNotInitialized" || ctx.Err() != nil {
			t.Fatalf("make bucket %s at %s: %v", name, endpoint, errors.Join(err, ctx.Err()))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
