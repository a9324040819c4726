// Package process is the default runtime backend: engine runtimes are
// `stoke engine --blank` child processes, each in its own process group,
// listening on a unix socket under the node's data directory. A record per
// runtime lets a restarted manager re-adopt live runtimes or clean up
// after dead ones, so none is ever leaked. A runtime writes its output to a
// log file of its own (see logfile.go), never to a pipe to the manager, so
// it outlives the manager that started it.
package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stokehq/stoke/runtime"
)

// Options configure the backend.
type Options struct {
	// Binary is the stoke executable runtimes run (default: this one).
	Binary string
	// Dir holds the sockets and records of the runtimes.
	Dir string
	// LogDir holds the runtimes' logs, ID.log and its rotated copies
	// (default Dir, where the containerd backend keeps them too).
	LogDir string
	// KeepLogs is how many runtimes that are gone keep their logs
	// (default DefaultKeepLogs; older ones are deleted).
	KeepLogs int
	// Env is added to the runtimes' environment.
	Env []string
	// Logger receives the backend's logs (slog.Default() when nil).
	Logger *slog.Logger
}

// Backend starts runtimes as child processes.
type Backend struct {
	opts Options
	// mu orders log pruning after a start's log file and record.
	mu sync.Mutex
}

// New returns a process backend keeping its files in opts.Dir.
func New(opts Options) (*Backend, error) {
	if opts.Dir == "" {
		return nil, errors.New("process backend: Options.Dir is required")
	}
	if opts.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("process backend: find the stoke binary: %w", err)
		}
		opts.Binary = exe
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.LogDir == "" {
		opts.LogDir = opts.Dir
	}
	if opts.KeepLogs <= 0 {
		opts.KeepLogs = DefaultKeepLogs
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("process backend: %w", err)
	}
	if err := os.MkdirAll(opts.LogDir, 0o755); err != nil {
		return nil, fmt.Errorf("process backend: %w", err)
	}
	return &Backend{opts: opts}, nil
}

// Name implements runtime.Backend.
func (*Backend) Name() string { return "process" }

// record is what the backend keeps on disk about a runtime.
type record struct {
	ID      string    `json:"id"`
	PID     int       `json:"pid"`
	Socket  string    `json:"socket"`
	Started time.Time `json:"started"`
}

func (b *Backend) recordPath(id string) string { return filepath.Join(b.opts.Dir, id+".json") }

// LogPath is the log file of runtime id (its current one; rotated ones
// lie beside it).
func (b *Backend) LogPath(id string) string { return filepath.Join(b.opts.LogDir, id+".log") }

// Start implements runtime.Backend.
func (b *Backend) Start(ctx context.Context, spec runtime.Spec) (runtime.Process, error) {
	if spec.ID == "" || filepath.Base(spec.ID) != spec.ID {
		return nil, fmt.Errorf("start runtime: bad id %q", spec.ID)
	}
	os.Remove(spec.Socket)
	logPath := b.LogPath(spec.ID)
	args := append([]string{"engine", "--blank", "--listen", "unix://" + spec.Socket, "--log-file", logPath}, spec.EngineArgs...)
	cmd := exec.Command(b.opts.Binary, args...)
	cmd.Env = append(os.Environ(), b.opts.Env...)
	b.mu.Lock()
	defer b.mu.Unlock()
	// The engine's standard output and error are its log file, opened for
	// appending (the engine's own rotating writer shares it): what it
	// prints before it opens the log, and a panic's trace, land there,
	// and nothing it writes goes to a pipe that dies with this process.
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start runtime %s: %w", spec.ID, err)
	}
	defer logFile.Close() // the child has its own copy
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start runtime %s: %w", spec.ID, err)
	}
	rec := record{ID: spec.ID, PID: cmd.Process.Pid, Socket: spec.Socket, Started: time.Now()}
	if err := b.writeRecord(rec); err != nil {
		syscall.Kill(-rec.PID, syscall.SIGKILL)
		cmd.Wait()
		return nil, fmt.Errorf("start runtime %s: %w", spec.ID, err)
	}
	p := &proc{b: b, rec: rec, done: make(chan struct{})}
	go func() {
		p.exitErr = cmd.Wait()
		// The group may hold more than the engine; take it down too.
		syscall.Kill(-rec.PID, syscall.SIGKILL)
		close(p.done)
	}()
	return p, nil
}

func (b *Backend) writeRecord(rec record) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	tmp := b.recordPath(rec.ID) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("write runtime record: %w", err)
	}
	return os.Rename(tmp, b.recordPath(rec.ID))
}

// Recover implements runtime.Backend: a recorded runtime whose process
// still runs this binary on its socket is adopted, unless its output goes
// to a pipe (an engine started before runtimes had log files: the first
// line it logged would kill it); anything else recorded is cleaned away,
// and so are the logs of all but the most recent runtimes that are gone.
func (b *Backend) Recover(ctx context.Context) ([]runtime.Process, error) {
	defer func() {
		b.mu.Lock()
		b.pruneLogs()
		b.mu.Unlock()
	}()
	paths, err := filepath.Glob(filepath.Join(b.opts.Dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var live []runtime.Process
	for _, path := range paths {
		data, err := os.ReadFile(path)
		var rec record
		if err == nil {
			err = json.Unmarshal(data, &rec)
		}
		if err != nil || rec.PID <= 0 {
			b.opts.Logger.Warn("removing an unreadable runtime record", "path", path, "err", err)
			os.Remove(path)
			continue
		}
		if !ours(rec) {
			b.opts.Logger.Info("runtime from an earlier run is gone; cleaning up", "runtime", rec.ID, "pid", rec.PID)
			b.cleanup(rec)
			continue
		}
		if fd, pipe := outputToPipe(rec.PID); pipe {
			b.opts.Logger.Warn("stopping a runtime from an earlier run that writes to a pipe to its dead manager", "runtime", rec.ID, "pid", rec.PID, "fd", fd)
			b.cleanup(rec)
			continue
		}
		p := &proc{b: b, rec: rec, done: make(chan struct{}), adopted: true}
		go p.watch()
		live = append(live, p)
	}
	return live, nil
}

// ours reports whether rec's process is alive and is the engine it
// recorded (a recycled pid runs something else).
func ours(rec record) bool {
	if syscall.Kill(rec.PID, 0) != nil {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", rec.PID))
	if err != nil {
		return false
	}
	return strings.Contains(string(cmdline), "unix://"+rec.Socket)
}

// outputToPipe reports whether pid's standard output or error is a pipe.
func outputToPipe(pid int) (fd int, pipe bool) {
	for _, fd := range []int{1, 2} {
		if target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, fd)); err == nil && strings.HasPrefix(target, "pipe:") {
			return fd, true
		}
	}
	return 0, false
}

func (b *Backend) cleanup(rec record) {
	if ours(rec) {
		syscall.Kill(-rec.PID, syscall.SIGKILL)
	}
	os.Remove(rec.Socket)
	os.Remove(b.recordPath(rec.ID))
}

// forget removes what a runtime that is gone left behind but its log, and
// prunes the logs of gone runtimes.
func (b *Backend) forget(rec record) {
	os.Remove(rec.Socket)
	b.mu.Lock()
	defer b.mu.Unlock()
	os.Remove(b.recordPath(rec.ID))
	b.pruneLogs()
}

// proc is a runtime process: a child, or adopted from an earlier manager.
type proc struct {
	b       *Backend
	rec     record
	done    chan struct{}
	exitErr error
	adopted bool
}

func (p *proc) ID() string            { return p.rec.ID }
func (p *proc) PID() int              { return p.rec.PID }
func (p *proc) Addr() string          { return "unix://" + p.rec.Socket }
func (p *proc) Done() <-chan struct{} { return p.done }

// LogPath is the runtime's log file.
func (p *proc) LogPath() string { return p.b.LogPath(p.rec.ID) }

// watch waits for an adopted process, which is not our child, to exit.
func (p *proc) watch() {
	for ours(p.rec) {
		time.Sleep(100 * time.Millisecond)
	}
	close(p.done)
}

func (p *proc) Stop(ctx context.Context, grace time.Duration) error {
	defer p.b.forget(p.rec)
	select {
	case <-p.done:
		return nil
	default:
	}
	syscall.Kill(-p.rec.PID, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	syscall.Kill(-p.rec.PID, syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("stop runtime %s (pid %d): still running after SIGKILL", p.rec.ID, p.rec.PID)
	}
}
