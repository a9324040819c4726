//go:build unix

package nodecache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Lock kinds for lockFile and tryLockFile.
const (
	lockEX = unix.LOCK_EX
	lockSH = unix.LOCK_SH
)

// Lock waits back off from lockPollMin to lockPollMax between attempts.
const (
	lockPollMin = time.Millisecond
	lockPollMax = 50 * time.Millisecond
)

// fileLock is a held flock(2) on a lock file. flock locks belong to the
// open file description, so two opens of the same path exclude each other
// between goroutines of one process as well as between processes, and the
// kernel drops the lock when its holder dies.
//
// Lock files may be unlinked by an exclusive holder before it unlocks, so
// that they do not pile up; every acquirer therefore checks, once it holds
// the lock, that the path still names the inode it locked, and starts over
// when it does not.
type fileLock struct {
	f    *os.File
	path string
}

// lockFile takes a flock of kind how (unix.LOCK_EX or unix.LOCK_SH) on path,
// creating the file if needed and polling until ctx ends.
func lockFile(ctx context.Context, path string, how int) (*fileLock, error) {
	delay := lockPollMin
	for {
		l, err := tryLockFile(path, how)
		if err != nil {
			return nil, err
		}
		if l != nil {
			return l, nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("wait for lock %s: %w", path, ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, lockPollMax)
	}
}

// tryLockFile is lockFile without waiting: it returns nil, nil when another
// holder has the lock.
func tryLockFile(path string, how int) (*fileLock, error) {
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("open lock %s: %w", path, err)
		}
		if err := flockNB(f, how); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, nil
			}
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		held, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("stat lock %s: %w", path, err)
		}
		named, err := os.Stat(path)
		if err == nil && os.SameFile(held, named) {
			return &fileLock{f: f, path: path}, nil
		}
		// The previous holder unlinked the file: the lock is worthless.
		f.Close()
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("stat lock %s: %w", path, err)
		}
	}
}

// flockNB takes the lock without blocking, retrying on EINTR.
func flockNB(f *os.File, how int) error {
	conn, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	err = conn.Control(func(fd uintptr) {
		for {
			ferr = unix.Flock(int(fd), how|unix.LOCK_NB)
			if ferr != unix.EINTR {
				return
			}
		}
	})
	if err != nil {
		return err
	}
	return ferr
}

// unlock releases the lock. With remove, which only an exclusive holder may
// ask for, the lock file is unlinked first.
func (l *fileLock) unlock(remove bool) error {
	var rmErr error
	if remove {
		if err := os.Remove(l.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			rmErr = fmt.Errorf("remove lock %s: %w", l.path, err)
		}
	}
	if err := l.f.Close(); err != nil {
		return fmt.Errorf("unlock %s: %w", l.path, err)
	}
	return rmErr
}
