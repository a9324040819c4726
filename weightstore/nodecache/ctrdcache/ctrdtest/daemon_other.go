//go:build !linux

package ctrdtest

import (
	"errors"
	"testing"
)

// Start skips the test: the containerd node cache runs on Linux only.
func Start(t testing.TB) string {
	t.Helper()
	t.Skip("the containerd node cache runs on Linux only")
	return ""
}

// StartWithRuntime skips the test: containers run on Linux only.
func StartWithRuntime(t testing.TB) string { return Start(t) }

// MountsUnder reports that mounts cannot be listed here.
func MountsUnder(dir string) ([]string, error) {
	return nil, errors.New("listing mounts needs Linux")
}
