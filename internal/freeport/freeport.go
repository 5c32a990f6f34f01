// Package freeport hands tests loopback ports to give to the servers and
// processes they start.
//
// A port is picked below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range): the usual trick of listening
// on port 0 and closing returns an ephemeral port, which the kernel may
// give to the next listener on port 0 or to a client connection's local
// end before the process told to use it binds it — a flaky "address
// already in use". Ports below the range are only taken by those who ask
// for them by number. A process never gets the same port twice.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// span is how many ports below the ephemeral range are picked from.
const span = 12000

var (
	mu         sync.Mutex
	handedOut  = map[int]bool{}
	rangeStart = ephemeralStart()
)

// ephemeralStart is the first port of the kernel's ephemeral range, or
// Linux's default where it cannot be read.
func ephemeralStart() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 1024 {
				return n
			}
		}
	}
	return 32768
}

// Port returns a loopback port nobody listened on when it was checked,
// below the ephemeral range and not returned before in this process. It
// fails the test if none is found.
func Port(t testing.TB) int {
	t.Helper()
	base := max(rangeStart-span, 1024)
	return pick(t, func() int { return base + rand.IntN(rangeStart-base) })
}

// pick tries the ports candidate proposes: the first not handed out
// before and bindable is handed out.
func pick(t testing.TB, candidate func() int) int {
	t.Helper()
	for range 1000 {
		port := candidate()
		mu.Lock()
		taken := handedOut[port]
		handedOut[port] = true
		mu.Unlock()
		if taken {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // someone listens on it: stays marked, never tried again
		}
		l.Close()
		return port
	}
	t.Fatalf("freeport: no free loopback port below %d after 1000 tries", rangeStart)
	return 0
}

// Addr returns "127.0.0.1:<Port>".
func Addr(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", Port(t))
}
