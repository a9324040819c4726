package process

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLogFileRotatesAndFollows writes past a log's size: it rotates, keeps
// its backups, and the descriptors it was given (standard output and
// error in an engine) follow the new file, so what is written to them
// lands beside the log, not in a rotated copy.
func TestLogFileRotatesAndFollows(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rt-0-1.log")
	// A descriptor standing for standard error, pointed elsewhere first.
	stderr, err := os.Create(filepath.Join(dir, "elsewhere"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	l, err := OpenLog(LogOptions{Path: path, MaxBytes: 1 << 20, Backups: 2, FDs: []int{int(stderr.Fd())}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	fmt.Fprintln(stderr, "panic: before any rotation")
	line := []byte(strings.Repeat("x", 1023) + "\n")
	for range 3 * 1024 { // 3 MiB: three rotations
		if _, err := l.Write(line); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Fprintln(stderr, "panic: after the rotations")
	cur, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(cur, []byte("panic: after the rotations")) {
		t.Fatalf("what was written to the descriptor after a rotation is not in the current log (%d bytes)", len(cur))
	}
	if len(cur) > 1<<20 {
		t.Fatalf("the current log holds %d bytes, past its 1 MiB", len(cur))
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "elsewhere")); len(b) != 0 {
		t.Fatalf("the descriptor still wrote to its old file: %q", b)
	}
	waitFor(t, "lumberjack to remove the oldest backups", func() bool {
		backups, _ := filepath.Glob(filepath.Join(dir, "rt-0-1-*.log"))
		return len(backups) == 2
	})
	backups, _ := filepath.Glob(filepath.Join(dir, "rt-0-1-*.log"))
	for _, b := range backups {
		if id, ok := logID(filepath.Base(b)); !ok || id != "rt-0-1" {
			t.Fatalf("backup %s: runtime %q, want rt-0-1", b, id)
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPruneLogsKeepsLiveAndRecent leaves the logs of runtimes that run
// and of the most recent gone ones, and deletes the rest, backups too.
func TestPruneLogsKeepsLiveAndRecent(t *testing.T) {
	dir := t.TempDir()
	b, err := New(Options{Dir: dir, KeepLogs: 2})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	write := func(name string, age time.Duration) {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("log\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(p, now.Add(-age), now.Add(-age))
	}
	write("rt-0-1.log", time.Hour) // live, however old
	os.WriteFile(b.recordPath("rt-0-1"), []byte(`{}`), 0o600)
	write("rt-0-2.log", 3*time.Minute)
	write("rt-0-2-2026-01-02T03-04-05.000.log", 4*time.Minute)
	write("rt-1-3.log", 2*time.Minute)
	write("rt-1-4.log", time.Minute)
	write("rt-1-4-2026-01-02T03-04-05.000.log.gz", 5*time.Minute)
	write("rt-1-5.log", 10*time.Minute)
	write("notes.txt", 10*time.Minute)
	b.mu.Lock()
	b.pruneLogs()
	b.mu.Unlock()
	var left []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		left = append(left, e.Name())
	}
	want := []string{"notes.txt", "rt-0-1.json", "rt-0-1.log", "rt-1-3.log", "rt-1-4-2026-01-02T03-04-05.000.log.gz", "rt-1-4.log"}
	if strings.Join(left, " ") != strings.Join(want, " ") {
		t.Fatalf("left %v, want %v", left, want)
	}
}

// fakeEngine starts a process whose command line names socket, as an
// engine's does, writing its output to out (a pipe unless an *os.File).
func fakeEngine(t *testing.T, b *Backend, id string, out any) int {
	t.Helper()
	socket := filepath.Join(b.opts.Dir, id+".sock")
	cmd := exec.Command("sh", "-c", "sleep 60; true", "unix://"+socket)
	switch o := out.(type) {
	case *os.File:
		cmd.Stdout, cmd.Stderr = o, o
	default:
		cmd.Stdout, cmd.Stderr = &bytes.Buffer{}, &bytes.Buffer{}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go cmd.Wait()
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	data, _ := json.Marshal(record{ID: id, PID: cmd.Process.Pid, Socket: socket, Started: time.Now()})
	if err := os.WriteFile(b.recordPath(id), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// TestRecoverRefusesEnginesWritingToPipes re-adopts a runtime whose output
// goes to a file, and stops one whose output goes to a pipe (started
// before runtimes had log files): with its manager dead, the first line it
// logged would kill it with SIGPIPE.
func TestRecoverRefusesEnginesWritingToPipes(t *testing.T) {
	dir := t.TempDir()
	b, err := New(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(b.LogPath("rt-0-1"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	fakeEngine(t, b, "rt-0-1", logFile)
	piped := fakeEngine(t, b, "rt-1-2", nil)
	procs, err := b.Recover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) != 1 || procs[0].ID() != "rt-0-1" {
		t.Fatalf("recovered %v, want only rt-0-1", procs)
	}
	waitFor(t, "the piped engine killed", func() bool {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", piped))
		f := strings.Fields(string(stat))
		return err != nil || (len(f) > 2 && f[2] == "Z")
	})
	if _, err := os.Stat(b.recordPath("rt-1-2")); !os.IsNotExist(err) {
		t.Fatalf("the piped engine's record is still there (%v)", err)
	}
	if err := procs[0].Stop(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
}
