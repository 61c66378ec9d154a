package soak

import (
	"os/exec"
	"syscall"
)

// setDeathSignal has the kernel kill the child if the soak dies first (a
// soak killed by a test's timeout leaves no decode behind), and puts it in
// a process group of its own: a Ctrl-C meant for the soak reaches the soak
// only, which stops its children itself.
func setDeathSignal(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	cmd.SysProcAttr.Setpgid = true
}
