//go:build linux

package ctrdtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd"

	"github.com/stokehq/stoke/internal/syncbuf"
)

// disabledPlugins are the plugins a content-and-snapshots daemon does not
// need. Without runtimes no shim is ever started; without cri nothing
// touches CNI or the host's /var/lib; without opt nothing lands in /opt.
var disabledPlugins = []string{
	"io.containerd.grpc.v1.cri",
	"io.containerd.internal.v1.opt",
	"io.containerd.internal.v1.restart",
	"io.containerd.internal.v1.tracing",
	"io.containerd.tracing.processor.v1.otlp",
	"io.containerd.monitor.v1.cgroups",
	"io.containerd.runtime.v1.linux",
	"io.containerd.runtime.v2.task",
	"io.containerd.service.v1.tasks-service",
	"io.containerd.grpc.v1.tasks",
	"io.containerd.snapshotter.v1.aufs",
	"io.containerd.snapshotter.v1.btrfs",
	"io.containerd.snapshotter.v1.devmapper",
	"io.containerd.snapshotter.v1.zfs",
}

// runtimePlugins are the disabled plugins that running containers needs.
var runtimePlugins = map[string]bool{
	"io.containerd.monitor.v1.cgroups":       true,
	"io.containerd.runtime.v1.linux":         true,
	"io.containerd.runtime.v2.task":          true,
	"io.containerd.service.v1.tasks-service": true,
	"io.containerd.grpc.v1.tasks":            true,
}

// Start starts a private containerd whose root, state and configuration
// live under t.TempDir(), listening on its own socket, waits until it
// answers and stops it when the test ends. It returns the socket's path.
// The daemon keeps the overlayfs and native snapshotters, the content
// store, leases and the garbage collector; it has no runtimes, so it never
// starts a shim.
//
// The test is skipped when containerd is not installed, when the test does
// not run as root, or when the daemon does not start, unless
// STOKE_REQUIRE_CONTAINERD=1 makes those failures.
func Start(t testing.TB) string {
	t.Helper()
	return start(t, false)
}

// StartWithRuntime is Start with containerd's runc runtime and tasks
// service enabled, for tests that run containers. The test must delete
// its containers before it ends (register that cleanup after this call);
// it is skipped as Start is, and also when runc is not installed.
func StartWithRuntime(t testing.TB) string {
	t.Helper()
	for _, bin := range []string{"runc", "containerd-shim-runc-v2"} {
		if _, err := exec.LookPath(bin); err != nil {
			skip(t, "%s is not installed (run scripts/install-containerd.sh, which `make deps` runs): %v", bin, err)
		}
	}
	return start(t, true)
}

func start(t testing.TB, withRuntime bool) string {
	t.Helper()
	bin, err := exec.LookPath("containerd")
	if err != nil {
		skip(t, "containerd is not installed (run scripts/install-containerd.sh, which `make deps` runs): %v", err)
	}
	if uid := os.Geteuid(); uid != 0 {
		skip(t, "the containerd node cache needs root to run containerd and mount snapshots; running as uid %d", uid)
	}
	d, err := startDaemon(bin, t.TempDir(), withRuntime)
	if err != nil {
		skip(t, "start containerd: %v", err)
	}
	t.Cleanup(func() {
		if err := d.stop(); err != nil {
			t.Errorf("stop containerd: %v", err)
		}
	})
	return d.socket
}

func skip(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("STOKE_REQUIRE_CONTAINERD") == "1" {
		t.Fatalf(format+" (STOKE_REQUIRE_CONTAINERD=1)", args...)
	}
	t.Skipf(format, args...)
}

// daemon is a running private containerd.
type daemon struct {
	dir      string // root of its files
	socket   string
	shortDir string // holds the socket when dir is too long for one; else ""
	cmd      *exec.Cmd
	exited   chan error
	out      *syncbuf.Buffer
}

func startDaemon(bin, dir string, withRuntime bool) (*daemon, error) {
	d := &daemon{dir: dir, socket: filepath.Join(dir, "containerd.sock"), exited: make(chan error, 1), out: &syncbuf.Buffer{}}
	if len(d.socket) > maxSocketPath {
		short, err := os.MkdirTemp("", "ctrd")
		if err != nil {
			return nil, fmt.Errorf("directory for the socket: %w", err)
		}
		d.shortDir = short
		d.socket = filepath.Join(short, "c.sock")
		if len(d.socket) > maxSocketPath {
			os.RemoveAll(short)
			return nil, fmt.Errorf("socket path %s is longer than %d bytes even under %s", d.socket, maxSocketPath, os.TempDir())
		}
	}
	config := filepath.Join(dir, "config.toml")
	if err := writeConfig(config, dir, d.socket, withRuntime); err != nil {
		d.removeShortDir()
		return nil, err
	}
	d.cmd = exec.Command(bin, "--config", config)
	d.cmd.Stdout, d.cmd.Stderr = d.out, d.out
	// Its own process group, so that stop reaches anything it forks; and
	// killed by the kernel if the test binary dies without cleaning up.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		d.removeShortDir()
		return nil, fmt.Errorf("run %s: %w", bin, err)
	}
	go func() { d.exited <- d.cmd.Wait() }()

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := d.waitServing(ctx); err != nil {
		stopErr := d.stop()
		return nil, fmt.Errorf("containerd at %s: %w; its output:\n%s", d.socket, errors.Join(err, stopErr), d.out.String())
	}
	return d, nil
}

// writeConfig writes a version 2 configuration that keeps every path of the
// daemon under dir.
func writeConfig(path, dir, socket string, withRuntime bool) error {
	for _, p := range []string{dir, socket} {
		if strings.ContainsAny(p, "\"\\\n") {
			return fmt.Errorf("path %q cannot go into a TOML string unescaped", p)
		}
	}
	var quoted []string
	for _, p := range disabledPlugins {
		if withRuntime && runtimePlugins[p] {
			continue
		}
		quoted = append(quoted, `"`+p+`"`)
	}
	config := fmt.Sprintf(`version = 2
root = "%[1]s/root"
state = "%[1]s/state"
disabled_plugins = [%[3]s]

[grpc]
  address = "%[2]s"

[ttrpc]
  address = "%[2]s.ttrpc"

[debug]
  level = "warn"
`, dir, socket, strings.Join(quoted, ", "))
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		return fmt.Errorf("write containerd config: %w", err)
	}
	return nil
}

// waitServing polls the daemon until it answers gRPC health checks.
func (d *daemon) waitServing(ctx context.Context) error {
	var lastErr error
	for {
		lastErr = d.ping(ctx)
		if lastErr == nil {
			return nil
		}
		select {
		case err := <-d.exited:
			d.exited <- err // stop waits on it too
			return fmt.Errorf("exited before answering: %v", err)
		case <-ctx.Done():
			return fmt.Errorf("did not answer in %v: %w", startTimeout, lastErr)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (d *daemon) ping(ctx context.Context) error {
	if _, err := os.Stat(d.socket); err != nil {
		return err
	}
	client, err := containerd.New(d.socket, containerd.WithTimeout(2*time.Second))
	if err != nil {
		return err
	}
	defer client.Close()
	serving, err := client.IsServing(ctx)
	if err != nil {
		return err
	}
	if !serving {
		return errors.New("not serving yet")
	}
	return nil
}

// stop sends SIGTERM to the daemon's process group, SIGKILL after
// stopTimeout, and reports mounts left under its directory.
func (d *daemon) stop() error {
	pgid := d.cmd.Process.Pid
	var errs []error
	if err := syscall.Kill(-pgid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		errs = append(errs, fmt.Errorf("SIGTERM process group %d: %w", pgid, err))
	}
	select {
	case <-d.exited:
	case <-time.After(stopTimeout):
		errs = append(errs, fmt.Errorf("containerd did not exit %v after SIGTERM; killed; its output:\n%s", stopTimeout, d.out.String()))
		syscall.Kill(-pgid, syscall.SIGKILL)
		<-d.exited
	}
	// Whatever else is left in the group goes too.
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err == nil {
		errs = append(errs, fmt.Errorf("processes of group %d outlived containerd; killed", pgid))
	}
	if leaked, err := MountsUnder(d.dir); err != nil {
		errs = append(errs, err)
	} else if len(leaked) > 0 {
		for i := len(leaked) - 1; i >= 0; i-- {
			syscall.Unmount(leaked[i], syscall.MNT_DETACH)
		}
		errs = append(errs, fmt.Errorf("mounts left under %s (detached now): %s", d.dir, strings.Join(leaked, ", ")))
	}
	d.removeShortDir()
	return errors.Join(errs...)
}

func (d *daemon) removeShortDir() {
	if d.shortDir != "" {
		os.RemoveAll(d.shortDir)
	}
}

// MountsUnder returns the mount points at or below dir, in the order they
// were mounted, from /proc/self/mountinfo. Tests use it to check that
// nothing they mounted outlives them.
func MountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("list mounts: %w", err)
	}
	defer f.Close()
	dir = filepath.Clean(dir)
	var found []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// Field 5 is the mount point, with space, tab, newline and
		// backslash written as octal escapes.
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			found = append(found, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read /proc/self/mountinfo: %w", err)
	}
	return found, nil
}

func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, ok := octal3(s[i+1 : i+4]); ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func octal3(s string) (byte, bool) {
	var v int
	for i := 0; i < 3; i++ {
		if s[i] < '0' || s[i] > '7' {
			return 0, false
		}
		v = v*8 + int(s[i]-'0')
	}
	if v > 0xff {
		return 0, false
	}
	return byte(v), true
}
