package rotation

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/tlsconfig"
	"github.com/planex-dev/planex/services/planner"
	"github.com/planex-dev/planex/services/supervisor"
)

// runService runs a service's Run in the background until the test ends
// and returns its gRPC address once it is SERVING.
func runService(t *testing.T, name string, run func(ctx context.Context, ready func(net.Addr)) error) string {
	t.Helper()
	ready := make(chan net.Addr, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, func(a net.Addr) { ready <- a }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: Run: %v", name, err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("%s did not stop within 15s", name)
		}
	})
	select {
	case a := <-ready:
		return a.String()
	case err := <-done:
		t.Fatalf("%s did not start: %v", name, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("%s not SERVING within 30s", name)
	}
	return ""
}

// tlsArgs are a service's --tls-* flags for files.
func tlsArgs(f tlsconfig.Files, clientAuth tlsconfig.ClientAuth) []string {
	return []string{"--tls-cert-file", f.CertFile, "--tls-key-file", f.KeyFile, "--tls-ca-file", f.CAFile, "--tls-client-auth", string(clientAuth)}
}

func parseFlags(t *testing.T, register func(*pflag.FlagSet), args []string) {
	t.Helper()
	fs := pflag.NewFlagSet("rotation", pflag.ContinueOnError)
	register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
}

// dial opens a client connection to addr as planex's own clients do
// (tlsconfig.ClientConfig over a Reloader of files).
func dial(t *testing.T, addr string, f tlsconfig.Files) *grpc.ClientConn {
	t.Helper()
	r, err := tlsconfig.NewReloader(f)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsconfig.ClientConfig(r, ""))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// servedLeaf calls ListRuns on conn and returns the server certificate of
// the connection that carried the call.
func servedLeaf(ctx context.Context, conn *grpc.ClientConn) (*x509.Certificate, error) {
	var p peer.Peer
	if _, err := planexv1.NewSupervisorServiceClient(conn).ListRuns(ctx, &planexv1.ListRunsRequest{}, grpc.Peer(&p)); err != nil {
		return nil, err
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return nil, errors.New("no TLS peer certificate")
	}
	return ti.State.PeerCertificates[0], nil
}

// planThrough starts a run and waits (event-driven: WatchRun ends with the
// run) until it finishes. No executor pool runs and the planner has no
// playbooks here, so the planner refuses every request — for an empty
// tool catalog, or, since the supervisor's built-in tools (human.input,
// run.child) are always in it, because no playbook matches the goal (its
// own answers, services/planner): a run that finishes with that answer
// proves the supervisor reached the planner over mTLS. A run the supervisor
// cannot plan (the planner refused or unreachable) stays in planning and
// the wait fails at its deadline.
func planThrough(ctx context.Context, api planexv1.SupervisorServiceClient, goal string) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	started, err := api.StartRun(ctx, &planexv1.StartRunRequest{Goal: goal})
	if err != nil {
		return fmt.Errorf("StartRun: %w", err)
	}
	w, err := api.WatchRun(ctx, &planexv1.WatchRunRequest{RunId: started.GetRun().GetId()})
	if err != nil {
		return fmt.Errorf("WatchRun: %w", err)
	}
	for {
		resp, err := w.Recv()
		if err != nil {
			return fmt.Errorf("run %s did not finish (the supervisor could not reach the planner?): %w", started.GetRun().GetId(), err)
		}
		if fin := resp.GetEvent().GetFinished(); fin != nil {
			if msg := fin.GetMessage(); !strings.Contains(msg, "the catalog is empty") && !strings.Contains(msg, "no playbook matches goal") {
				return fmt.Errorf("run %s finished %s: %q, want the planner's refusal (no playbook matches, or an empty catalog)", started.GetRun().GetId(), fin.GetStatus(), msg)
			}
			return nil
		}
	}
}

// TestCARollOverGRPC rolls the CA of a supervisor (public API, mTLS), its
// planner (mTLS, admin certificate required) and an API client from CA1 to
// CA2 in the four phases of a roll-over, replacing the mounted Secrets as
// the kubelet does, without restarting anything:
//
//  0. everything from CA1;
//  1. every trust bundle becomes CA1+CA2;
//  2. the servers' leaves become CA2-signed;
//  3. the clients' leaves become CA2-signed;
//  4. every trust bundle becomes CA2 only.
//
// Each phase's change must be used by the very next handshake (no polling
// delay) and connections opened before it must carry on; in phase 4 a
// connection authenticated by a CA1 leaf is closed, a CA1 client is
// refused by every server and a CA2 server by a client that trusts only
// CA1.
func TestCARollOverGRPC(t *testing.T) {
	ctx := context.Background()
	ca1, ca2 := newCA(t, "planex CA 1"), newCA(t, "planex CA 2")
	both, only1, only2 := bundle(ca1, ca2), bundle(ca1), bundle(ca2)
	hosts := []string{"127.0.0.1", "localhost"}
	// The supervisor's certificate carries admin: it calls the planner.
	supLeaf := tlsconfig.Leaf{CommonName: "planex-supervisor", Hosts: hosts, Server: true, Client: true, OrganizationalUnits: []string{"admin"}}
	plnLeaf := tlsconfig.Leaf{CommonName: "planex-planner", Hosts: hosts, Server: true, Client: true}
	cliLeaf := tlsconfig.Leaf{CommonName: "ops", Client: true, OrganizationalUnits: []string{"runner"}}
	sup1, sup2 := issue(t, ca1, supLeaf), issue(t, ca2, supLeaf)
	pln1, pln2 := issue(t, ca1, plnLeaf), issue(t, ca2, plnLeaf)
	cli1, cli2 := issue(t, ca1, cliLeaf), issue(t, ca2, cliLeaf)

	supM := newMount(t, secret{ca: only1, cert: sup1.cert, key: sup1.key})
	plnM := newMount(t, secret{ca: only1, cert: pln1.cert, key: pln1.key})
	cliM := newMount(t, secret{ca: only1, cert: cli1.cert, key: cli1.key})

	nats := natstest.Start(t)
	common := []string{"--grpc-addr", "127.0.0.1:0", "--nats-url", nats.URL(), "--shutdown-grace", "2s", "--log-level", "error"}

	var pcfg planner.Config
	parseFlags(t, pcfg.RegisterFlags, append(common, tlsArgs(plnM.files(), tlsconfig.ClientAuthRequire)...))
	plannerAddr := runService(t, "planner", func(ctx context.Context, ready func(net.Addr)) error {
		pcfg.OnReady = ready
		return planner.Run(ctx, pcfg, natstest.Logger(t), nil)
	})
	// The supervisor reaches the planner through a proxy that can cut the
	// connection, so that it must dial (and handshake) again.
	toPlanner := newProxy(t, plannerAddr)
	var scfg supervisor.Config
	parseFlags(t, scfg.RegisterFlags, append(append(common, "--planner-addr", toPlanner.addr(), "--planner-timeout", "3s"),
		tlsArgs(supM.files(), tlsconfig.ClientAuthVerifyIfGiven)...))
	supAddr := runService(t, "supervisor", func(ctx context.Context, ready func(net.Addr)) error {
		scfg.OnReady = ready
		return supervisor.Run(ctx, scfg, natstest.Logger(t), nil)
	})

	// A long-lived client connection, opened in phase 0 with the CA1 leaf,
	// holding a health Watch stream (as a load balancer or an operator's
	// `planex runs watch` would) for the whole roll-over.
	old := dial(t, supAddr, cliM.files())
	oldAPI := planexv1.NewSupervisorServiceClient(old)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watch, err := healthpb.NewHealthClient(old).Watch(watchCtx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatalf("health watch: %v", err)
	}
	watchEnded := make(chan error, 1)
	go func() {
		for {
			if _, err := watch.Recv(); err != nil {
				watchEnded <- err
				return
			}
		}
	}()
	oldLeaf, err := servedLeaf(ctx, old)
	if err != nil {
		t.Fatalf("phase 0: %v", err)
	}
	if !sup1.is(t, oldLeaf) {
		t.Fatal("phase 0: the supervisor does not serve its CA1 leaf")
	}

	// stillOpen checks that the phase-0 connection and its stream carry on:
	// a call on it succeeds and is served on the same TLS session (the CA1
	// leaf the supervisor served in phase 0, whatever it serves now).
	stillOpen := func(phase string) {
		t.Helper()
		select {
		case err := <-watchEnded:
			t.Fatalf("%s: the long-lived health watch ended: %v", phase, err)
		default:
		}
		got, err := servedLeaf(ctx, old)
		if err != nil {
			t.Fatalf("%s: call on the phase-0 connection: %v", phase, err)
		}
		if !got.Equal(oldLeaf) {
			t.Fatalf("%s: the phase-0 connection was re-established (now served %s); it should have carried on", phase, got.Issuer.CommonName)
		}
	}
	// fresh checks that a new connection works at once and is served want.
	fresh := func(phase string, want leaf) {
		t.Helper()
		got, err := servedLeaf(ctx, dial(t, supAddr, cliM.files()))
		if err != nil {
			t.Fatalf("%s: new connection with the mounted client files: %v", phase, err)
		}
		if !want.is(t, got) {
			t.Fatalf("%s: the first handshake after the swap was served a leaf of %s, not the mounted one", phase, got.Issuer.CommonName)
		}
	}
	// plans checks the supervisor → planner hop twice: over the connection
	// it holds, then over a new one after the proxy cut it.
	plans := func(phase string) {
		t.Helper()
		before := toPlanner.connections()
		if err := planThrough(ctx, oldAPI, phase+": existing planner connection"); err != nil {
			t.Fatalf("%s: over the supervisor's existing planner connection: %v", phase, err)
		}
		if n := toPlanner.connections(); n != before {
			t.Fatalf("%s: the supervisor dialled the planner again (%d → %d connections); the existing connection should carry on", phase, before, n)
		}
		toPlanner.cut()
		if err := planThrough(ctx, oldAPI, phase+": new planner connection"); err != nil {
			t.Fatalf("%s: after the planner connection was cut (new handshake with the mounted files): %v", phase, err)
		}
		if n := toPlanner.connections(); n <= before {
			t.Fatalf("%s: no new planner connection after the cut", phase)
		}
	}

	// Phase 0: everything from CA1. (The supervisor dials the planner on
	// its first call.)
	fresh("phase 0", sup1)
	if err := planThrough(ctx, oldAPI, "phase 0: first planner call"); err != nil {
		t.Fatalf("phase 0: %v", err)
	}
	plans("phase 0")

	// Phase 1: every bundle trusts CA1 and CA2.
	for _, m := range []*mount{supM, plnM, cliM} {
		m.update(m.withCA(both))
	}
	stillOpen("phase 1")
	fresh("phase 1", sup1)
	plans("phase 1")

	// Phase 2: the servers serve CA2 leaves. Clients still holding CA1
	// leaves work; the supervisor's next planner handshake verifies the
	// planner's CA2 leaf with the bundle it re-read in phase 1.
	supM.update(supM.withLeaf(sup2))
	plnM.update(plnM.withLeaf(pln2))
	stillOpen("phase 2")
	fresh("phase 2", sup2)
	plans("phase 2")

	// Phase 3: the clients present CA2 leaves (the supervisor's is also its
	// planner client certificate, swapped in phase 2; the API client's
	// now).
	cliM.update(cliM.withLeaf(cli2))
	stillOpen("phase 3")
	fresh("phase 3", sup2)
	plans("phase 3")

	// Phase 4: CA2 only. The supervisor must now present its CA2 leaf to
	// the planner after a cut, and a CA1 leaf is refused everywhere.
	for _, m := range []*mount{supM, plnM, cliM} {
		m.update(m.withCA(only2))
	}
	fresh("phase 4", sup2)
	// The phase-0 connection was authenticated by the client's CA1 leaf,
	// which no bundle trusts now: the supervisor closes it at the first
	// handshake after the swap (the one above; without handshakes, within
	// tlsconfig.RecheckInterval), rather than keep it authorised. The
	// client dials again, with its CA2 leaf.
	select {
	case err := <-watchEnded:
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("phase 4: the health watch on the CA1-authenticated connection ended with %v, want Unavailable (closed)", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("phase 4: the connection authenticated by a CA1 client leaf is still open 5s after CA1 left every bundle (and after a new handshake)")
	}
	if got, err := servedLeaf(ctx, old); err != nil || !sup2.is(t, got) {
		t.Fatalf("phase 4: the client's reconnection with its CA2 leaf: err %v", err)
	}
	plans("phase 4")

	refused := func(what, addr string, s secret) {
		t.Helper()
		m := newMount(t, s)
		_, err := planexv1.NewSupervisorServiceClient(dial(t, addr, m.files())).ListRuns(ctx, &planexv1.ListRunsRequest{})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("phase 4: %s: ListRuns = %v, want the handshake refused (Unavailable)", what, err)
		}
	}
	refused("supervisor, a CA1 client leaf (trusting both CAs)", supAddr, secret{ca: both, cert: cli1.cert, key: cli1.key})
	refused("planner, the supervisor's CA1 leaf (admin)", plannerAddr, secret{ca: both, cert: sup1.cert, key: sup1.key})
	refused("a client trusting CA1 only, facing the CA2 supervisor", supAddr, secret{ca: only1, cert: cli2.cert, key: cli2.key})
	// The same client files with a CA2 leaf and bundle are served: the
	// refusals above are the CA's doing.
	if _, err := planexv1.NewSupervisorServiceClient(dial(t, supAddr, newMount(t, secret{ca: only2, cert: cli2.cert, key: cli2.key}).files())).ListRuns(ctx, &planexv1.ListRunsRequest{}); err != nil {
		t.Fatalf("phase 4: a CA2 client: %v", err)
	}
}
