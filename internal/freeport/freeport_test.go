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

// A port on which something listens is never handed out.
func TestPortSkipsATakenPort(t *testing.T) {
	held := Port(t)
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(held)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	mu.Lock()
	delete(handedOut, held) // as if another process had taken it
	mu.Unlock()
	for range 500 {
		if p := Port(t); p == held {
			t.Fatalf("port %d handed out while it is listened on", p)
		}
	}
}
