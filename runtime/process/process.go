// Package process is the default runtime backend: engine runtimes are
// `stoke engine --blank` child processes, each in its own process group,
// listening on a unix socket under the node's data directory. A record per
// runtime lets a restarted manager re-adopt live runtimes or clean up
// after dead ones, so none is ever leaked.
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
	"syscall"
	"time"

	"github.com/stokehq/stoke/internal/syncbuf"
	"github.com/stokehq/stoke/runtime"
)

// Options configure the backend.
type Options struct {
	// Binary is the stoke executable runtimes run (default: this one).
	Binary string
	// Dir holds the sockets and records of the runtimes.
	Dir string
	// Env is added to the runtimes' environment.
	Env []string
	// Logger receives the backend's logs (slog.Default() when nil).
	Logger *slog.Logger
}

// Backend starts runtimes as child processes.
type Backend struct {
	opts Options
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
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
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

// Start implements runtime.Backend.
func (b *Backend) Start(ctx context.Context, spec runtime.Spec) (runtime.Process, error) {
	if spec.ID == "" || filepath.Base(spec.ID) != spec.ID {
		return nil, fmt.Errorf("start runtime: bad id %q", spec.ID)
	}
	os.Remove(spec.Socket)
	args := append([]string{"engine", "--blank", "--listen", "unix://" + spec.Socket}, spec.EngineArgs...)
	cmd := exec.Command(b.opts.Binary, args...)
	cmd.Env = append(os.Environ(), b.opts.Env...)
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
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
	p := &proc{b: b, rec: rec, done: make(chan struct{}), out: out}
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
// still runs this binary on its socket is adopted; anything else recorded
// is cleaned away.
func (b *Backend) Recover(ctx context.Context) ([]runtime.Process, error) {
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

func (b *Backend) cleanup(rec record) {
	if ours(rec) {
		syscall.Kill(-rec.PID, syscall.SIGKILL)
	}
	os.Remove(rec.Socket)
	os.Remove(b.recordPath(rec.ID))
}

// proc is a runtime process: a child, or adopted from an earlier manager.
type proc struct {
	b       *Backend
	rec     record
	done    chan struct{}
	exitErr error
	out     *syncbuf.Buffer // nil when adopted
	adopted bool
}

func (p *proc) ID() string            { return p.rec.ID }
func (p *proc) PID() int              { return p.rec.PID }
func (p *proc) Socket() string        { return p.rec.Socket }
func (p *proc) Done() <-chan struct{} { return p.done }

// Output is what the runtime printed (empty for an adopted one).
func (p *proc) Output() string {
	if p.out == nil {
		return ""
	}
	return p.out.String()
}

// watch waits for an adopted process, which is not our child, to exit.
func (p *proc) watch() {
	for ours(p.rec) {
		time.Sleep(100 * time.Millisecond)
	}
	close(p.done)
}

func (p *proc) Stop(ctx context.Context, grace time.Duration) error {
	defer func() {
		os.Remove(p.rec.Socket)
		os.Remove(p.b.recordPath(p.rec.ID))
	}()
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
