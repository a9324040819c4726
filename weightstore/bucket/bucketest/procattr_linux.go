package bucketest

import "syscall"

// sysProcAttr makes the kernel kill the server if the test binary dies
// without running its cleanups.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
