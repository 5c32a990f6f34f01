//go:build linux

package main

import "syscall"

// setDeathSignal has the child killed when the harness dies, even by
// SIGKILL, so no dev server outlives a measurement.
func setDeathSignal(attr *syscall.SysProcAttr) {
	attr.Pdeathsig = syscall.SIGKILL
}
