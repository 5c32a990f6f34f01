package mcppool

import "syscall"

// SetCallHook sets the hook called just before tools/call is sent.
func SetCallHook(f func(tool string)) { testHookCallSent = f }

// KillServer kills the stdio process of server name with SIGKILL.
func (p *Pool) KillServer(name string) error {
	for _, s := range p.servers {
		if s.name == name {
			s.mu.Lock()
			cmd := s.proc
			s.mu.Unlock()
			return cmd.Process.Signal(syscall.SIGKILL)
		}
	}
	return nil
}
