package supervisor_test

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/engine"
)

// A pull request the server never serves (lost between client and server,
// as seen on a 3-node cluster) does not hold the engine: its consumer
// misses the pull's heartbeats and pulls again within seconds
// (bus.PullHeartbeat), where nats.go's default waited 30 s. The replica
// connects through a proxy that drops its engine consumer's first pull;
// the run it is then given must finish well before 30 s.
func TestLostPullIsPulledAgain(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	proxy := startPullDropper(t, h.srv.URL(), "$JS.API.CONSUMER.MSG.NEXT.PLANEX_ENGINE.supervisor")
	h.natsURL = proxy.url
	r := h.startReplica()
	waitFor(t, 10*time.Second, "the engine's first pull dropped", func() bool { return proxy.dropped.Load() == 1 })

	id := h.runGoal(t, r, "finishes although the first pull was lost", always(step("a", "test.echo", map[string]any{"value": 1})))
	run := waitTerminal(t, r.client, id, 15*time.Second)
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("run %s ended %s, want SUCCEEDED", id, run.GetStatus())
	}
	if n := proxy.dropped.Load(); n != 1 {
		t.Fatalf("the proxy dropped %d pulls, want 1", n)
	}
}

// pullDropper is a TCP proxy in front of a NATS server that drops the
// first client publication to one subject (a pull request) and forwards
// everything else.
type pullDropper struct {
	url     string
	subject string
	dropped atomic.Int32
}

func startPullDropper(t *testing.T, serverURL, subject string) *pullDropper {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pullDropper{url: "nats://" + lis.Addr().String(), subject: subject}
	target := strings.TrimPrefix(serverURL, "nats://")
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = lis.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			client, err := lis.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				_ = client.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, client, server)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(client, server); _ = client.Close() }()
			go func() { defer wg.Done(); p.forward(server, client); _ = server.Close() }()
		}
	}()
	return p
}

// forward copies the client's protocol to the server operation by
// operation, leaving out the first PUB or HPUB to p.subject.
func (p *pullDropper) forward(server io.Writer, client io.Reader) {
	in := bufio.NewReader(client)
	for {
		line, err := in.ReadString('\n')
		if err != nil {
			return
		}
		fields := strings.Fields(line)
		op := ""
		if len(fields) > 0 {
			op = strings.ToUpper(fields[0])
		}
		if (op == "PUB" || op == "HPUB") && len(fields) >= 3 {
			size, err := strconv.Atoi(fields[len(fields)-1])
			if err != nil {
				return
			}
			payload := make([]byte, size+2) // and its CRLF
			if _, err := io.ReadFull(in, payload); err != nil {
				return
			}
			if fields[1] == p.subject && p.dropped.CompareAndSwap(0, 1) {
				continue
			}
			if _, err := server.Write(append([]byte(line), payload...)); err != nil {
				return
			}
			continue
		}
		if _, err := io.WriteString(server, line); err != nil {
			return
		}
	}
}

// The engine's consumers deleted under a running replica (`nats consumer
// rm`, a stream restored) are made again by the replica: nats.go ends a
// Consume whose consumer is deleted, and a replica that only logged it
// would serve its API while no run moved.
func TestDeletedEngineConsumersAreMadeAgain(t *testing.T) {
	h, r := setup(t)
	first := h.runGoal(t, r, "before the consumers' deletion", always(step("a", "test.echo", map[string]any{"value": 1})))
	if run := waitTerminal(t, r.client, first, 15*time.Second); run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("run %s ended %s, want SUCCEEDED", first, run.GetStatus())
	}
	ctx := testCtx(t, 30*time.Second)
	for _, name := range []string{bus.ConsumerEngine, engine.ConsumerTimers} {
		if err := h.res.JS.DeleteConsumer(ctx, bus.StreamEngine, name); err != nil {
			t.Fatalf("delete %s: %v", name, err)
		}
	}
	id := h.runGoal(t, r, "after the consumers' deletion", always(step("a", "test.echo", map[string]any{"value": 2}), step("b", "test.echo", map[string]any{"value": 3}, "a")))
	if run := waitTerminal(t, r.client, id, 20*time.Second); run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("run %s ended %s, want SUCCEEDED", id, run.GetStatus())
	}
	// The timers' consumer may have had no pull waiting when it was
	// deleted: it is found missing after two missed heartbeats (~4 s).
	for _, name := range []string{bus.ConsumerEngine, engine.ConsumerTimers} {
		waitFor(t, 10*time.Second, name+" made again", func() bool {
			_, err := h.res.JS.Consumer(ctx, bus.StreamEngine, name)
			return err == nil
		})
	}
}
