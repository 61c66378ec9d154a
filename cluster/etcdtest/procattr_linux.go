package etcdtest

import "syscall"

// sysProcAttr kills etcd if the test process dies without cleaning up (a
// panic, a timeout), so no etcd outlives its test binary.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
