package etcdproc

import "syscall"

// sysProcAttr kills etcd if its parent dies without stopping it (a crash, a
// test binary's timeout), so no etcd outlives the process that started it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
