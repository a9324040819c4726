//go:build linux

package images

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd"
	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/plugin"
	"github.com/containerd/containerd/runtime/v2/runc/options"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/stokehq/stoke/weightstore/nodecache/ctrdcache/ctrdtest"
)

// engineState asks the engine listening on the unix socket for its state.
func engineState(ctx context.Context, socket string) (string, error) {
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://engine/admin/state", nil)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /admin/state: %s", resp.Status)
	}
	var body struct {
		State string `json:"state"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return "", fmt.Errorf("decode /admin/state: %w", err)
	}
	return body.State, nil
}

func TestEngineImageRunsWithRunc(t *testing.T) {
	res := stokeImages(t)
	socket := ctrdtest.StartWithRuntime(t)
	// Runs after the container's cleanup below and before the daemon
	// stops: a shim that outlived its task is a failure, and goes.
	t.Cleanup(func() {
		if shims, err := shimsOf(socket); err != nil || len(shims) > 0 {
			for _, pid := range shims {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			t.Errorf("shims %v outlived the test (%v); killed", shims, err)
		}
	})
	ctx := namespaces.WithNamespace(context.Background(), testNamespace)
	imported, err := ImportArchive(ctx, res.Archives[EngineImage], ImportOptions{Socket: socket, Namespace: testNamespace})
	if err != nil {
		t.Fatalf("ImportArchive: %v", err)
	}
	client := openClient(t, socket)
	image, err := client.GetImage(ctx, imported[0].Name)
	if err != nil {
		t.Fatal(err)
	}

	sockDir := t.TempDir()
	scratch := t.TempDir()
	logPath := filepath.Join(scratch, "engine.log")
	suffix := make([]byte, 4)
	rand.Read(suffix)
	id := "engine-" + hex.EncodeToString(suffix)
	// A cgroup of its own at the top, which runc removes with the
	// container (containerd's default, /NAMESPACE/ID, leaves the
	// namespace's parent behind), and runc's state in a temporary
	// directory instead of /run/containerd/runc/NAMESPACE.
	cgroup := "/" + testNamespace + "-" + id
	started := time.Now()
	container, err := client.NewContainer(ctx, id,
		containerd.WithImage(image),
		containerd.WithSnapshotter(imported[0].Snapshotter),
		containerd.WithNewSnapshot(id, image),
		containerd.WithRuntime(plugin.RuntimeRuncV2, &options.Options{Root: filepath.Join(scratch, "runc")}),
		containerd.WithNewSpec(
			oci.WithImageConfig(image),
			oci.WithHostNamespace(specs.NetworkNamespace),
			oci.WithCgroup(cgroup),
			oci.WithMounts([]specs.Mount{{Type: "bind", Source: sockDir, Destination: SocketDir, Options: []string{"rbind", "rw"}}}),
		),
	)
	if err != nil {
		t.Fatalf("create container: %v", err)
	}
	// Whatever fails below, the task and the container go before the daemon.
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if task, err := container.Task(cctx, nil); err == nil {
			task.Kill(cctx, syscall.SIGKILL)
			if _, err := task.Delete(cctx, containerd.WithProcessKill); err != nil {
				t.Errorf("delete task in cleanup: %v", err)
			}
		}
		if err := container.Delete(cctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			t.Errorf("delete container in cleanup: %v", err)
		}
	})
	task, err := container.NewTask(ctx, cio.LogFile(logPath))
	if err != nil {
		t.Fatalf("create task: %v", err)
	}
	exited, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatalf("start task: %v", err)
	}
	engineLog := func() string {
		b, _ := os.ReadFile(logPath)
		return string(b)
	}

	engineSock := filepath.Join(sockDir, filepath.Base(EngineSocket))
	state, err := "", errors.New("not asked yet")
	deadline := time.After(30 * time.Second)
poll:
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		state, err = engineState(actx, engineSock)
		cancel()
		if err == nil {
			break
		}
		select {
		case st := <-exited:
			t.Fatalf("engine exited with status %d before answering; its log:\n%s", st.ExitCode(), engineLog())
		case <-deadline:
			break poll
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err != nil {
		t.Fatalf("engine never answered on %s: %v; its log:\n%s", engineSock, err, engineLog())
	}
	t.Logf("engine container answered %v after creating it", time.Since(started))
	if state != "blank" {
		t.Errorf("engine state %q, want blank", state)
	}

	// What must be gone after delete is there now, so that its absence
	// later means something.
	if shims, err := shimsOf(socket); err != nil || len(shims) != 1 {
		t.Errorf("shims of the running task: %v (%v), want one", shims, err)
	}
	if live := cgroupDirs(cgroup); len(live) == 0 {
		t.Errorf("no cgroup %s for the running task", cgroup)
	}

	if err := task.Kill(ctx, syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM the engine: %v", err)
	}
	select {
	case st := <-exited:
		if code, _, err := st.Result(); err != nil || code != 0 {
			t.Errorf("engine exited with %d, %v after SIGTERM, want 0; its log:\n%s", code, err, engineLog())
		}
	case <-time.After(20 * time.Second):
		t.Errorf("engine ignored SIGTERM for 20s; killing it; its log:\n%s", engineLog())
		task.Kill(ctx, syscall.SIGKILL)
		<-exited
	}
	if _, err := task.Delete(ctx); err != nil {
		t.Fatalf("delete task: %v", err)
	}
	if err := container.Delete(ctx, containerd.WithSnapshotCleanup); err != nil {
		t.Fatalf("delete container: %v", err)
	}

	// Nothing is left: no task, no container, no snapshot, no shim.
	tasks, err := client.TaskService().List(ctx, &tasks.ListTasksRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks.Tasks) != 0 {
		t.Errorf("%d tasks left after delete", len(tasks.Tasks))
	}
	if cs, err := client.Containers(ctx); err != nil || len(cs) != 0 {
		t.Errorf("%d containers left after delete (%v)", len(cs), err)
	}
	if _, err := client.SnapshotService(imported[0].Snapshotter).Stat(ctx, id); !errdefs.IsNotFound(err) {
		t.Errorf("snapshot %s after delete: %v, want not found", id, err)
	}
	var shims []int
	for wait := time.Now(); time.Since(wait) < 10*time.Second; time.Sleep(50 * time.Millisecond) {
		if shims, err = shimsOf(socket); err != nil || len(shims) == 0 {
			break
		}
	}
	if err != nil || len(shims) != 0 {
		t.Errorf("shims %v still run after the task's delete (%v)", shims, err)
	}
	if left := cgroupDirs(cgroup); len(left) > 0 {
		t.Errorf("cgroups left after delete: %v", left)
	}
	if _, err := os.Lstat(engineSock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("engine socket %s outlived the engine: %v", engineSock, err)
	}
}

// cgroupDirs lists the directories of cgroup path in the cgroup v2 tree or
// any cgroup v1 hierarchy.
func cgroupDirs(path string) []string {
	var found []string
	for _, pattern := range []string{"/sys/fs/cgroup" + path, "/sys/fs/cgroup/*" + path} {
		dirs, _ := filepath.Glob(pattern)
		found = append(found, dirs...)
	}
	return found
}

// shimsOf lists the processes started as shims of the containerd at
// socket: the shim's command line names the daemon's address.
func shimsOf(socket string) ([]int, error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var pids []int
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil {
			continue // gone meanwhile
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if len(args) == 0 || !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		if slices.Contains(args, socket) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}
