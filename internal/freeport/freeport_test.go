package freeport

import (
	"net"
	"strconv"
	"testing"
)

// Ports are below the ephemeral range, bindable, and never handed out
// twice — also while the earlier ones are bound (the case of a test
// that starts processes one after another).
func TestPortsAreDistinctAndBelowTheEphemeralRange(t *testing.T) {
	seen := map[int]bool{}
	for range 200 {
		p := Port(t)
		if p >= rangeStart || p < 1024 {
			t.Fatalf("port %d outside %d-%d", p, max(rangeStart-span, 1024), rangeStart-1)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d handed out but not bindable: %v", p, err)
		}
		defer l.Close()
	}
}

// A port on which something listens is never handed out, nor one
// handed out before: the next candidate is.
func TestPickSkipsTakenAndHandedOutPorts(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0") // listened on by someone else
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	listened := l.Addr().(*net.TCPAddr).Port
	handed := Port(t)
	free := Port(t)
	mu.Lock()
	delete(handedOut, free) // as if never handed out
	mu.Unlock()
	candidates := []int{listened, handed, free}
	got := pick(t, func() int { c := candidates[0]; candidates = candidates[1:]; return c })
	if got != free {
		t.Fatalf("picked %d from [listened %d, handed out %d, free %d], want %d", got, listened, handed, free, free)
	}
}
