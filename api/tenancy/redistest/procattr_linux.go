package redistest

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the server killed when the test process dies without
// running its cleanup (a killed `go test`), so that none outlives it.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
