package process

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"gopkg.in/natefinch/lumberjack.v2"
)

// Where runtime logs go. Every runtime's engine writes its log, and its
// standard output and error, to LogDir/ID.log, rotated by the engine past
// LogOptions.MaxBytes into at most LogOptions.Backups older files; the
// backend deletes the logs of all but the KeepLogs most recent runtimes
// that are gone. No output of a runtime goes through a pipe to the
// manager: a runtime outlives the manager that started it (a re-adopted
// engine would die of SIGPIPE the first time it logged to a pipe whose
// reader died).

// Defaults of the log files.
const (
	// DefaultLogMaxBytes is the size at which an engine's log rotates.
	DefaultLogMaxBytes = 10 << 20
	// DefaultLogBackups is how many rotated logs an engine keeps.
	DefaultLogBackups = 3
	// DefaultKeepLogs is how many gone runtimes' logs the backend keeps.
	DefaultKeepLogs = 8
)

// LogOptions configure an engine's own log file.
type LogOptions struct {
	// Path is the log file.
	Path string
	// MaxBytes is the size past which it rotates (rounded up to whole
	// MiB; default DefaultLogMaxBytes); Backups is how many rotated
	// files are kept (default DefaultLogBackups; negative: none).
	MaxBytes int64
	Backups  int
	// FDs are the descriptors pointed at the current file, now and after
	// every rotation (default 1 and 2: standard output and error, so what
	// the Go runtime prints, a panic's trace, lands beside the log).
	FDs []int
}

// LogFile is an engine's rotating log: slog writes to it, and the
// standard output and error follow its current file.
type LogFile struct {
	mu   sync.Mutex
	lj   *lumberjack.Logger
	path string
	fds  []int
	dev  uint64
	ino  uint64
}

// OpenLog opens (creating or appending to) an engine's log file and points
// opts.FDs at it.
func OpenLog(opts LogOptions) (*LogFile, error) {
	if opts.Path == "" {
		return nil, errors.New("open log: no path")
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultLogMaxBytes
	}
	switch {
	case opts.Backups == 0:
		opts.Backups = DefaultLogBackups
	case opts.Backups < 0:
		opts.Backups = 0
	}
	if opts.FDs == nil {
		opts.FDs = []int{1, 2}
	}
	const mib = 1 << 20
	// lumberjack keeps every backup when MaxBackups is 0; 1 is the least.
	l := &LogFile{path: opts.Path, fds: opts.FDs, lj: &lumberjack.Logger{Filename: opts.Path,
		MaxSize: int((opts.MaxBytes + mib - 1) / mib), MaxBackups: max(opts.Backups, 1)}}
	if err := os.MkdirAll(filepath.Dir(opts.Path), 0o755); err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	f, err := os.OpenFile(opts.Path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	f.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.follow(); err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	return l, nil
}

// Write implements io.Writer: it writes p to the current file, rotating
// first when p would take it past its size.
func (l *LogFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := l.lj.Write(p)
	if ferr := l.follow(); err == nil && ferr != nil {
		err = ferr
	}
	return n, err
}

// Rotate starts a new file now.
func (l *LogFile) Rotate() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return errors.Join(l.lj.Rotate(), l.follow())
}

// Close closes the file slog writes to (the descriptors stay open).
func (l *LogFile) Close() error { return l.lj.Close() }

// follow points the descriptors at the file now at the path, when it is
// another than the one they point at (a rotation moved theirs away).
func (l *LogFile) follow() error {
	fi, err := os.Stat(l.path)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || (uint64(st.Dev) == l.dev && st.Ino == l.ino) {
		return nil
	}
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, fd := range l.fds {
		if err := unix.Dup2(int(f.Fd()), fd); err != nil {
			return fmt.Errorf("point fd %d at %s: %w", fd, l.path, err)
		}
	}
	l.dev, l.ino = uint64(st.Dev), st.Ino
	return nil
}

// backupRE matches a rotated log's name (lumberjack's: ID-TIMESTAMP.log,
// maybe compressed) and captures the runtime id.
var backupRE = regexp.MustCompile(`^(.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}\.\d{3}\.log(\.gz)?$`)

// logID returns the runtime a file in the log directory belongs to.
func logID(name string) (string, bool) {
	if m := backupRE.FindStringSubmatch(name); m != nil {
		return m[1], true
	}
	if id, ok := strings.CutSuffix(name, ".log"); ok && id != "" {
		return id, true
	}
	return "", false
}

// pruneLogs deletes the logs (current and rotated) of all but the
// KeepLogs most recently written runtimes among those that have no
// record, that is that are gone. b.mu is held.
func (b *Backend) pruneLogs() {
	ents, err := os.ReadDir(b.opts.LogDir)
	if err != nil {
		return
	}
	type gone struct {
		files  []string
		latest time.Time
	}
	byID := map[string]*gone{}
	for _, e := range ents {
		id, ok := logID(e.Name())
		if !ok || e.IsDir() {
			continue
		}
		if _, err := os.Stat(b.recordPath(id)); err == nil {
			continue // it runs (or is starting)
		}
		g := byID[id]
		if g == nil {
			g = &gone{}
			byID[id] = g
		}
		g.files = append(g.files, filepath.Join(b.opts.LogDir, e.Name()))
		if fi, err := e.Info(); err == nil && fi.ModTime().After(g.latest) {
			g.latest = fi.ModTime()
		}
	}
	all := make([]*gone, 0, len(byID))
	for _, g := range byID {
		all = append(all, g)
	}
	slices.SortFunc(all, func(a, b *gone) int { return b.latest.Compare(a.latest) })
	for _, g := range all[min(len(all), b.opts.KeepLogs):] {
		for _, f := range g.files {
			os.Remove(f)
		}
	}
}
