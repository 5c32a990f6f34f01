//go:build unix

package main

import (
	"os/exec"
	"syscall"
)

// setProcessGroup puts cmd in a process group of its own, so that any
// process the server starts is ended with it, and where the system can,
// has it killed when the harness dies.
func setProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	setDeathSignal(cmd.SysProcAttr)
}

// signalGroup sends SIGTERM (or SIGKILL when kill) to cmd's process group.
func signalGroup(cmd *exec.Cmd, kill bool) {
	if cmd.Process == nil {
		return
	}
	sig := syscall.SIGTERM
	if kill {
		sig = syscall.SIGKILL
	}
	_ = syscall.Kill(-cmd.Process.Pid, sig)
}
