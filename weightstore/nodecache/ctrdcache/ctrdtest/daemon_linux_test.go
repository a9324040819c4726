//go:build linux

package ctrdtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd"
)

func TestStart(t *testing.T) {
	socket := Start(t)
	if len(socket) > maxSocketPath {
		t.Errorf("socket path %s is %d bytes, more than %d", socket, len(socket), maxSocketPath)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := containerd.New(socket, containerd.WithDefaultNamespace(Namespace))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	resp, err := client.IntrospectionService().Plugins(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	loaded := map[string]bool{}
	for _, p := range resp.Plugins {
		if p.InitErr == nil {
			loaded[p.Type+"."+p.ID] = true
		}
	}
	for _, want := range []string{"io.containerd.snapshotter.v1.overlayfs", "io.containerd.snapshotter.v1.native", "io.containerd.content.v1.content", "io.containerd.grpc.v1.leases"} {
		if !loaded[want] {
			t.Errorf("plugin %s is not loaded", want)
		}
	}
	for _, unwanted := range []string{"io.containerd.grpc.v1.cri", "io.containerd.runtime.v2.task"} {
		if loaded[unwanted] {
			t.Errorf("plugin %s is loaded", unwanted)
		}
	}
}

// TestDaemon starts and stops daemons directly, with short and long
// directories, and checks what stop leaves.
func TestDaemon(t *testing.T) {
	bin, err := exec.LookPath("containerd")
	if err != nil {
		skip(t, "containerd is not installed: %v", err)
	}
	if uid := os.Geteuid(); uid != 0 {
		skip(t, "needs root; running as uid %d", uid)
	}
	for _, tc := range []struct {
		name      string
		dir       func(t *testing.T) string
		wantShort bool
	}{
		{"short dir", func(t *testing.T) string { return t.TempDir() }, false},
		{"long dir", func(t *testing.T) string {
			dir := filepath.Join(t.TempDir(), strings.Repeat("d", 120))
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			return dir
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.dir(t)
			d, err := startDaemon(bin, dir, false)
			if err != nil {
				t.Fatal(err)
			}
			if got := d.shortDir != ""; got != tc.wantShort {
				t.Errorf("socket %s in a short directory: %v, want %v", d.socket, got, tc.wantShort)
			}
			if len(d.socket) > maxSocketPath {
				t.Errorf("socket path %s is %d bytes", d.socket, len(d.socket))
			}
			for _, sub := range []string{"root", "state"} {
				if _, err := os.Stat(filepath.Join(dir, sub)); err != nil {
					t.Errorf("daemon's %s directory: %v", sub, err)
				}
			}
			pid := d.cmd.Process.Pid
			if err := d.stop(); err != nil {
				t.Fatalf("stop: %v", err)
			}
			if err := syscall.Kill(-pid, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("process group %d after stop: %v, want ESRCH", pid, err)
			}
			if _, err := os.Stat(d.socket); !errors.Is(err, os.ErrNotExist) && tc.wantShort {
				t.Errorf("socket %s after stop: %v, want it removed with its directory", d.socket, err)
			}
		})
	}
}

// recorder is a testing.TB that records how skip ended the test instead of
// ending the real one.
type recorder struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (r *recorder) Helper() {}

func (r *recorder) Skipf(format string, args ...any) {
	r.skipped, r.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed, r.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestSkipFailsWhenRequired(t *testing.T) {
	for _, tc := range []struct {
		env                string
		wantSkip, wantFail bool
	}{
		{"", true, false},
		{"0", true, false},
		{"1", false, true},
	} {
		t.Run("STOKE_REQUIRE_CONTAINERD="+tc.env, func(t *testing.T) {
			t.Setenv("STOKE_REQUIRE_CONTAINERD", tc.env)
			r := &recorder{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				skip(r, "containerd is %s", "missing")
			}()
			<-done
			if r.skipped != tc.wantSkip || r.failed != tc.wantFail || !strings.Contains(r.msg, "containerd is missing") {
				t.Fatalf("skipped %v, failed %v (%q); want skipped %v, failed %v", r.skipped, r.failed, r.msg, tc.wantSkip, tc.wantFail)
			}
		})
	}
}

func TestMountsUnder(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`/tmp/a`, "/tmp/a"},
		{`/tmp/a\040b`, "/tmp/a b"},
		{`/tmp/a\134b`, `/tmp/a\b`},
		{`/tmp/a\0`, `/tmp/a\0`},
		{`/tmp/a\999`, `/tmp/a\999`},
	} {
		if got := unescapeMountinfo(tc.in); got != tc.want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	mounts, err := MountsUnder("/")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(mounts, "/") {
		t.Errorf("MountsUnder(/) = %v, want it to hold /", mounts)
	}
	none, err := MountsUnder(t.TempDir())
	if err != nil || len(none) != 0 {
		t.Errorf("MountsUnder(a fresh directory) = %v, %v; want none", none, err)
	}
}
