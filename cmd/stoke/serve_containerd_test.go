//go:build linux

package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"

	"github.com/stokehq/stoke/weightstore/nodecache/ctrdcache/ctrdtest"
)

// staticStoke compiles this command as a static linux binary, the one the
// engine image packages.
func staticStoke(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "stoke")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build a static stoke: %v\n%s", err, out)
	}
	return bin
}

// TestServeContainerd runs `stoke serve --runtime containerd` against a
// private containerd: a pushed model is prefetched into containerd's
// content store as a committed snapshot, its first request is served by a
// runc container of the engine image whose weights came from that
// snapshot (t2), and after a SIGKILL of serve the next serve re-adopts the
// container and serves from it without loading anything (t0).
func TestServeContainerd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and imports the engine image; not with -short")
	}
	socket := ctrdtest.StartWithRuntime(t)
	bin := staticStoke(t)
	out, err := imagesCmd(t, "build", "--binary", bin, "--out", t.TempDir(), "--import", "--containerd-socket", socket)
	if err != nil {
		t.Fatalf("images build --import: %v\n%s", err, out)
	}
	if !strings.Contains(out, "imported stoke.local/engine:dev") {
		t.Fatalf("the engine image was not imported:\n%s", out)
	}
	client, err := containerd.New(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	cctx := namespaces.WithNamespace(context.Background(), "stoke")

	bucketDir := t.TempDir()
	pushTo(t, bucketDir, "chat", "replicas:\n  min: 0\n  max: 1\nidle_delay: 1h\n")
	data := t.TempDir()
	args := []string{"--data", data, "--bucket", "file://" + bucketDir, "--watch-interval", "100ms", "--warm", "1", "--slots", "2",
		"--kv-cache-memory", "64MiB", "--threads", "1", "--runtime", "containerd", "--containerd-socket", socket}

	first := launchServe(t, nil, freeAddr(t), args...)
	first.waitHealthy(t)
	waitUntil(t, "the revision is prefetched into containerd and a warm container is blank", 60*time.Second, func() bool {
		log, _ := os.ReadFile(first.logPath)
		return strings.Contains(string(log), "revision prefetched into the node cache") && runtimesIn(t, first.base, "blank", "") == 1
	})
	replica := complete(t, first.base, "chat")
	if replica == "" {
		t.Fatal("no X-Stoke-Replica on the answer")
	}
	var acq struct {
		Runtime  string `json:"runtime"`
		Tier     string `json:"tier"`
		LoadTier string `json:"load_tier"`
	}
	getJSON(t, first.base+"/admin/deployments/chat/acquisition?runtime="+replica, &acq)
	if acq.Tier != "t2" || acq.LoadTier != "t2" {
		t.Errorf("first acquisition %+v, want t2: weights from the snapshot in containerd", acq)
	}
	c, err := client.LoadContainer(cctx, replica)
	if err != nil {
		t.Fatalf("runtime %s is no container in containerd: %v", replica, err)
	}
	task, err := c.Task(cctx, nil)
	if err != nil {
		t.Fatalf("container %s has no task: %v", replica, err)
	}
	if st, err := task.Status(cctx); err != nil || st.Status != containerd.Running {
		t.Fatalf("container %s: %+v %v, want running", replica, st, err)
	}

	if fi, err := os.Stat(filepath.Join(data, "rt", replica+".log")); err != nil || fi.Size() == 0 {
		t.Errorf("the container's engine log under DATA/rt: %v", err)
	}

	syscall.Kill(first.cmd.Process.Pid, syscall.SIGKILL) // serve alone: its containers run on
	<-first.done

	second := launchServe(t, nil, freeAddr(t), args...)
	second.waitHealthy(t)
	if got := complete(t, second.base, "chat"); got != replica {
		t.Errorf("the first request after the restart was served by %q, want the re-adopted container %s", got, replica)
	}
	getJSON(t, second.base+"/admin/deployments/chat/acquisition?runtime="+replica, &acq)
	if acq.Runtime != replica || acq.Tier != "t0" {
		t.Errorf("acquisition after the restart %+v, want the re-adopted %s at t0 (nothing loaded)", acq, replica)
	}
	if log, _ := os.ReadFile(second.logPath); strings.Contains(string(log), "acquisition failed") {
		t.Errorf("the restarted serve logged an acquisition failure:\n%s", log)
	}
}
