//go:build linux

package ctrdcache

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/containerd/containerd/mount"
)

// An owner names a process across PID reuse: the boot, the PID namespace,
// the PID and the process's start time, "boot/pidns/pid/start". Views and
// revision builds carry their owner so that what a killed process left can
// be told from what a live one holds.

// selfOwner returns this process's owner string, or "" when /proc cannot
// tell (then nothing this process leaves is ever reclaimed as stale).
func selfOwner() string {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return ""
	}
	pid := os.Getpid()
	start, err := startTime(pid)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%s/%s/%d/%s", strings.TrimSpace(string(boot)), pidNamespace(ns), pid, start)
}

// pidNamespace turns "pid:[4026531836]" into "4026531836".
func pidNamespace(link string) string {
	return strings.TrimSuffix(strings.TrimPrefix(link, "pid:["), "]")
}

// startTime returns field 22 of /proc/pid/stat: when the process started,
// in clock ticks since boot.
func startTime(pid int) (string, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", err
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return "", fmt.Errorf("/proc/%d/stat: no ')'", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	// fields[0] is field 3 (state), so field 22 is fields[19].
	if len(fields) < 20 {
		return "", fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(fields))
	}
	return fields[19], nil
}

// ownerGone reports whether the process named by owner has certainly
// exited: it ran before this boot, or it ran in this PID namespace and its
// PID is now free or another process's. An owner from another PID
// namespace, or an unreadable one, is never gone.
func (c *Cache) ownerGone(owner string) bool {
	if c.owner == "" || owner == "" {
		return false
	}
	mine := strings.Split(c.owner, "/")
	theirs := strings.Split(owner, "/")
	if len(theirs) != 4 {
		return false
	}
	if theirs[0] != mine[0] {
		return true
	}
	if theirs[1] != mine[1] {
		return false
	}
	pid, err := strconv.Atoi(theirs[2])
	if err != nil || pid <= 0 {
		return false
	}
	start, err := startTime(pid)
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	return err == nil && start != theirs[3]
}

// unmountStale detaches whatever is mounted at dir, a directory that a
// gone owner made for a view or a build, and removes it. A path that is
// not such a directory is left alone.
func (c *Cache) unmountStale(dir string) error {
	base := filepath.Base(dir)
	if !filepath.IsAbs(dir) || !strings.HasPrefix(base, viewDirPrefix) && !strings.HasPrefix(base, buildDirPrefix) {
		return nil
	}
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := mount.UnmountAll(dir, syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount %s: %w", dir, err)
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}
