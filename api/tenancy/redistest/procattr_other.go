//go:build !linux

package redistest

import "os/exec"

// dieWithParent does nothing here: only Linux kills a child with its
// parent; the test's cleanup stops the server.
func dieWithParent(cmd *exec.Cmd) {}
