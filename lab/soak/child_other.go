//go:build !linux

package soak

import "os/exec"

// setDeathSignal does nothing where the kernel has no parent-death signal.
func setDeathSignal(*exec.Cmd) {}
