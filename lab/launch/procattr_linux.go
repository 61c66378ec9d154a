package launch

import "syscall"

// childAttr kills a node if the launcher dies without stopping it (a
// crash, a test binary's timeout), so that no node outlives its cluster.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
