//go:build unix && !linux

package main

import "syscall"

// setDeathSignal does nothing where there is no parent-death signal: a
// harness killed with SIGKILL leaves its dev server running.
func setDeathSignal(*syscall.SysProcAttr) {}
