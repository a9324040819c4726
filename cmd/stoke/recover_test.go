package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runtimeJSON is one runtime of GET /admin/runtimes.
type runtimeJSON struct {
	ID     string `json:"id"`
	State  string `json:"state"`
	Model  string `json:"model"`
	Socket string `json:"socket"`
	InUse  bool   `json:"in_use"`
	Slot   int    `json:"slot"`
	Class  string `json:"class"`
}

func listRuntimes(t testing.TB, base string) []runtimeJSON {
	t.Helper()
	var rts struct {
		Data []runtimeJSON `json:"data"`
	}
	getJSON(t, base+"/admin/runtimes", &rts)
	return rts.Data
}

// complete sends a short completion through serve and returns the runtime
// that served it (the activator's X-Stoke-Replica header).
func complete(t testing.TB, base, model string) string {
	t.Helper()
	resp, err := http.Post(base+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"`+model+`","prompt":"hello","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion of %s: %d %s", model, resp.StatusCode, body)
	}
	return resp.Header.Get("X-Stoke-Replica")
}

// enginePost posts an admin operation straight to an engine's socket.
func enginePost(t testing.TB, socket, path string) {
	t.Helper()
	c := &http.Client{Transport: unixTransport(socket, 0)}
	defer c.CloseIdleConnections()
	resp, err := c.Post("http://engine"+path, "application/json", nil)
	if err != nil {
		t.Fatalf("POST %s to the engine: %v", path, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s to the engine: %d", path, resp.StatusCode)
	}
}

// alive reports whether pid runs and is not a zombie.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(filepath.Join("/proc", itoa(pid), "stat"))
	f := strings.Fields(string(stat))
	return err == nil && len(f) > 2 && f[2] != "Z"
}

func itoa(n int) string { return strconv.Itoa(n) }

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return -1
	}
	return fi.Size()
}

// killEnginesAtEnd kills, when the test ends, every engine the runtime
// records under data still name: a serve killed with -9 leaves its
// runtimes to the next one, and a failed test may leave them to nobody.
// A data race an engine reported in its log fails the test.
func killEnginesAtEnd(t *testing.T, data string) {
	t.Cleanup(func() {
		logs, _ := filepath.Glob(filepath.Join(data, "rt", "*.log"))
		for _, p := range logs {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), "WARNING: DATA RACE") {
				t.Errorf("engine log %s reports a data race:\n%s", p, b)
			}
		}
		paths, _ := filepath.Glob(filepath.Join(data, "rt", "*.json"))
		for _, p := range paths {
			var rec struct {
				PID    int    `json:"pid"`
				Socket string `json:"socket"`
			}
			if b, err := os.ReadFile(p); err == nil && json.Unmarshal(b, &rec) == nil && rec.PID > 0 {
				if cmdline, err := os.ReadFile(filepath.Join("/proc", itoa(rec.PID), "cmdline")); err == nil &&
					strings.Contains(string(cmdline), "unix://"+rec.Socket) {
					syscall.Kill(-rec.PID, syscall.SIGKILL)
				}
			}
		}
	})
}

// TestServeRecoversAfterKill9 kills `stoke serve` with SIGKILL while a
// replica is ready and a warm runtime is blank, and restarts it on the
// same data directory: the first request is served by the re-adopted
// replica (t0: no load, no acquisition error), the re-adopted engines keep
// running when they log (their logs go to files under the data directory,
// not to a pipe to the dead serve), and the re-adopted blank runtime loads
// another model.
func TestServeRecoversAfterKill9(t *testing.T) {
	bucketDir := t.TempDir()
	pushTo(t, bucketDir, "chat", "replicas:\n  min: 1\n  max: 1\n")
	pushTo(t, bucketDir, "other", "replicas:\n  min: 0\n  max: 1\nidle_delay: 1h\n")
	data := t.TempDir()
	killEnginesAtEnd(t, data)
	args := []string{"--data", data, "--bucket", "file://" + bucketDir, "--watch-interval", "100ms",
		"--warm", "1", "--slots", "3", "--sim-profile", "llama-3.1-8b-fp8-h100"}

	first := launchServe(t, nil, freeAddr(t), args...)
	first.waitHealthy(t)
	waitUntil(t, "chat has a ready replica and the warm pool a blank runtime", 30*time.Second, func() bool {
		return readyReplicas(t, first.base, "chat") == 1 && runtimesIn(t, first.base, "blank", "") == 1
	})
	replica := complete(t, first.base, "chat")
	var ready, blank runtimeJSON
	for _, r := range listRuntimes(t, first.base) {
		switch r.State {
		case "ready":
			ready = r
		case "blank":
			blank = r
		}
	}
	if replica == "" || replica != ready.ID {
		t.Fatalf("served by %q, want the ready replica %s", replica, ready.ID)
	}
	pids := map[string]int{}
	for _, r := range []runtimeJSON{ready, blank} {
		var pid int
		if _, err := fmt.Sscan(pidBySocket(r.Socket), &pid); err != nil || pid <= 0 {
			t.Fatalf("no engine process for %s", r.ID)
		}
		pids[r.ID] = pid
	}

	syscall.Kill(first.cmd.Process.Pid, syscall.SIGKILL) // serve alone: its runtimes run on
	<-first.done
	time.Sleep(200 * time.Millisecond) // let a pipe's reader, if any, be gone for sure

	second := launchServe(t, nil, freeAddr(t), args...)
	second.waitHealthy(t)
	if got := complete(t, second.base, "chat"); got != ready.ID {
		t.Errorf("the first request after the restart was served by %q, want the re-adopted replica %s", got, ready.ID)
	}
	var acq struct {
		Runtime string `json:"runtime"`
		Tier    string `json:"tier"`
	}
	getJSON(t, second.base+"/admin/deployments/chat/acquisition?runtime="+ready.ID, &acq)
	if acq.Runtime != ready.ID || acq.Tier != "t0" {
		t.Errorf("acquisition of %s: %+v, want tier t0 (re-adopted ready, nothing loaded)", ready.ID, acq)
	}

	// The re-adopted replica logs (sleep, wake) and lives on; its log file
	// under the data directory grows.
	logPath := filepath.Join(data, "rt", ready.ID+".log")
	before := fileSize(logPath)
	if before < 0 {
		t.Errorf("no log file %s for runtime %s", logPath, ready.ID)
	}
	enginePost(t, ready.Socket, "/admin/sleep")
	enginePost(t, ready.Socket, "/admin/wake")
	if !alive(pids[ready.ID]) {
		t.Errorf("the re-adopted engine of %s died when it logged", ready.ID)
	}
	if after := fileSize(logPath); after <= before {
		t.Errorf("%s did not grow when the engine logged (%d → %d bytes)", logPath, before, after)
	}
	if got := complete(t, second.base, "chat"); got != ready.ID {
		t.Errorf("a request after sleep and wake was served by %q, want %s", got, ready.ID)
	}

	// The re-adopted blank runtime takes a load (which the engine logs).
	if got := complete(t, second.base, "other"); got != blank.ID {
		t.Errorf("other was served by %q, want the re-adopted blank runtime %s", got, blank.ID)
	}
	if !alive(pids[blank.ID]) {
		t.Errorf("the re-adopted blank engine of %s died", blank.ID)
	}
	if b, _ := os.ReadFile(filepath.Join(data, "rt", blank.ID+".log")); !strings.Contains(string(b), "model loaded") {
		t.Errorf("the log of %s does not show its load:\n%s", blank.ID, b)
	}
	log := second.log()
	for _, bad := range []string{"acquisition failed", "runtime gone", "acquire a replica"} {
		if strings.Contains(log, bad) {
			t.Errorf("the restarted serve logged %q", bad)
		}
	}
	for id, pid := range pids {
		if !alive(pid) {
			t.Errorf("engine of %s (pid %d) is gone", id, pid)
		}
	}
}

// TestServeRefusesALockedDataDir starts a second serve on the data
// directory of a running one: it fails at once with one line naming the
// directory and the first one's pid, and the first one's runtimes are
// left alone. A serve on another data directory but the same address
// fails before it starts or adopts anything.
func TestServeRefusesALockedDataDir(t *testing.T) {
	bucketDir := pushServed(t, "chat", "replicas:\n  min: 1\n  max: 1\n")
	data := t.TempDir()
	killEnginesAtEnd(t, data)
	args := []string{"--data", data, "--bucket", "file://" + bucketDir, "--watch-interval", "100ms",
		"--warm", "1", "--slots", "2", "--sim-profile", "llama-3.1-8b-fp8-h100"}
	addr := freeAddr(t)
	first := launchServe(t, nil, addr, args...)
	first.waitHealthy(t)
	waitUntil(t, "chat has a ready replica and the warm pool a blank runtime", 30*time.Second, func() bool {
		return readyReplicas(t, first.base, "chat") == 1 && runtimesIn(t, first.base, "blank", "") == 1
	})
	replica := complete(t, first.base, "chat")
	before := listRuntimes(t, first.base)

	run := func(args ...string) (string, error) {
		cmd := exec.Command(os.Args[0], append([]string{"serve"}, args...)...)
		cmd.Env = append(os.Environ(), runMainEnv+"=1")
		done := make(chan struct{})
		var out []byte
		var err error
		go func() { out, err = cmd.CombinedOutput(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Fatalf("serve %v did not fail at once", args)
		}
		return strings.TrimSpace(string(out)), err
	}
	out, err := run(append([]string{"--listen", freeAddr(t)}, args...)...)
	if err == nil {
		t.Fatalf("a second serve on %s started:\n%s", data, out)
	}
	pid := itoa(first.cmd.Process.Pid)
	if strings.Contains(out, "\n") || !strings.Contains(out, data) || !strings.Contains(out, "pid "+pid) {
		t.Errorf("second serve's error %q: want one line naming %s and pid %s", out, data, pid)
	}

	// Another data directory, the same address: refused before anything
	// is started or adopted there.
	other := t.TempDir()
	out, err = run("--listen", addr, "--data", other, "--bucket", "file://"+bucketDir, "--warm", "1", "--sim-profile", "llama-3.1-8b-fp8-h100")
	if err == nil || !strings.Contains(out, "address already in use") {
		t.Errorf("serve on a taken address: %v %q, want address already in use", err, out)
	}
	if recs, _ := filepath.Glob(filepath.Join(other, "rt", "*.json")); len(recs) != 0 {
		t.Errorf("the serve refused its address started runtimes: %v", recs)
	}

	// The first serve's runtimes are untouched and serve on.
	after := listRuntimes(t, first.base)
	if len(after) != len(before) {
		t.Fatalf("runtimes %+v after the second serve, want %+v", after, before)
	}
	for i := range after {
		if after[i].ID != before[i].ID || after[i].State != before[i].State {
			t.Errorf("runtime %+v after the second serve, was %+v", after[i], before[i])
		}
	}
	if got := complete(t, first.base, "chat"); got != replica {
		t.Errorf("served by %q after the second serve, want %s", got, replica)
	}
	if log := first.log(); strings.Contains(log, "runtime gone") {
		t.Errorf("the first serve lost a runtime:\n%s", log)
	}
}
