//go:build !linux

package etcdproc

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }
