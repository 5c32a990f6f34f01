package rotation

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natsauth"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/tlsconfig"
)

// natsTLS runs an embedded nats-server from a config file whose tls block
// (verify: true) names the files of m, as deploy/k8s's nats.conf names the
// nats-tls Secret; reload re-reads them, as the nats-reloader's SIGHUP
// does.
type natsTLS struct {
	srv *server.Server
	url string
}

func startNATSTLS(t *testing.T, m *mount) *natsTLS {
	t.Helper()
	// nats-server cannot reload a config with port -1: take a free port.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	f := m.files()
	conf := fmt.Sprintf(`listen: "127.0.0.1:%d"
tls {
  cert_file: %q
  key_file: %q
  ca_file: %q
  verify: true
  timeout: 5
}
`, port, f.CertFile, f.KeyFile, f.CAFile)
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	opts.NoLog, opts.NoSigs = true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready within 10s")
	}
	return &natsTLS{srv: srv, url: fmt.Sprintf("tls://127.0.0.1:%d", port)}
}

func (n *natsTLS) reload(t *testing.T) {
	t.Helper()
	if err := n.srv.Reload(); err != nil {
		t.Fatalf("nats-server reload: %v", err)
	}
}

// clientCert is the SHA-256 of the client certificate nats-server holds
// for nc's current connection ("" when there is none).
func (n *natsTLS) clientCert(t *testing.T, nc *nats.Conn) string {
	t.Helper()
	cid, err := nc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	cz, err := n.srv.Connz(&server.ConnzOptions{CID: cid, Username: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cz.Conns {
		if c.Cid == cid && len(c.TLSPeerCerts) > 0 {
			return c.TLSPeerCerts[0].CertSha256
		}
	}
	return ""
}

// connect connects as a planex service does: natsauth's options (the
// --nats-tls-* files) through bus.Connect.
func connect(t *testing.T, url, name string, f tlsconfig.Files) (*nats.Conn, error) {
	t.Helper()
	opts, err := natsauth.Options{TLS: f}.NATSOptions()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return bus.Connect(ctx, url, name, natstest.Logger(t), opts...)
}

// reconnect makes nc reconnect (as after a NATS node restart or a network
// cut) and waits for it to be connected again, event-driven, within 10s.
func reconnect(t *testing.T, nc *nats.Conn, phase string) {
	t.Helper()
	connected := nc.StatusChanged(nats.CONNECTED)
	defer close(connected)
	before := nc.Stats().Reconnects
	if err := nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-connected:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not reconnected within 10s (last error: %v)", phase, nc.LastError())
	}
	if nc.Stats().Reconnects != before+1 {
		t.Fatalf("%s: %d reconnects, want %d", phase, nc.Stats().Reconnects, before+1)
	}
}

// TestCARollOverNATS rolls the CA of a NATS server (TLS, client
// certificates verified) and of a planex service's NATS connection from
// CA1 to CA2, the files replaced as the kubelet does and nothing
// restarted: reloading the server never drops the connection, and each
// reconnect presents and verifies with what the files hold then.
func TestCARollOverNATS(t *testing.T) {
	ca1, ca2 := newCA(t, "planex CA 1"), newCA(t, "planex CA 2")
	both, only1, only2 := bundle(ca1, ca2), bundle(ca1), bundle(ca2)
	natsLeaf := tlsconfig.Leaf{CommonName: "nats", Hosts: []string{"127.0.0.1", "localhost"}, Server: true, Client: true}
	svcLeaf := tlsconfig.Leaf{CommonName: "planex-supervisor", Client: true}
	nats1, nats2 := issue(t, ca1, natsLeaf), issue(t, ca2, natsLeaf)
	svc1, svc2 := issue(t, ca1, svcLeaf), issue(t, ca2, svcLeaf)

	natsM := newMount(t, secret{ca: only1, cert: nats1.cert, key: nats1.key})
	svcM := newMount(t, secret{ca: only1, cert: svc1.cert, key: svc1.key})
	ns := startNATSTLS(t, natsM)

	nc, err := connect(t, ns.url, "planex-supervisor", svcM.files())
	if err != nil {
		t.Fatalf("phase 0: %v", err)
	}
	defer nc.Close()
	// alive checks the connection is up, never reconnected since want,
	// and round-trips a request through the server.
	sub, err := nc.Subscribe("rotation.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	alive := func(phase string, reconnects uint64) {
		t.Helper()
		if _, err := nc.Request("rotation.echo", []byte(phase), 5*time.Second); err != nil {
			t.Fatalf("%s: request over the connection: %v", phase, err)
		}
		if got := nc.Stats().Reconnects; got != reconnects {
			t.Fatalf("%s: the connection reconnected (%d reconnects, want %d): a server reload should not drop it", phase, got, reconnects)
		}
	}
	served := func(phase string, want leaf) {
		t.Helper()
		cs, err := nc.TLSConnectionState()
		if err != nil || len(cs.PeerCertificates) == 0 {
			t.Fatalf("%s: TLS state: %v", phase, err)
		}
		if !want.is(t, cs.PeerCertificates[0]) {
			t.Fatalf("%s: NATS served a leaf of %s, not the mounted one", phase, cs.PeerCertificates[0].Issuer.CommonName)
		}
	}
	presented := func(phase string, want leaf) {
		t.Helper()
		if got := ns.clientCert(t, nc); got != want.sha(t) {
			t.Fatalf("%s: nats-server holds client certificate %.12s…, want the mounted %.12s…", phase, got, want.sha(t))
		}
	}
	served("phase 0", nats1)
	presented("phase 0", svc1)
	alive("phase 0", 0)

	// Phase 1: both bundles trust CA1 and CA2.
	natsM.update(natsM.withCA(both))
	svcM.update(svcM.withCA(both))
	ns.reload(t)
	alive("phase 1", 0)
	reconnect(t, nc, "phase 1")
	alive("phase 1", 1)

	// Phase 2: NATS serves a CA2 leaf; the reconnect verifies it with the
	// bundle the client re-read in phase 1.
	natsM.update(natsM.withLeaf(nats2))
	ns.reload(t)
	alive("phase 2", 1)
	reconnect(t, nc, "phase 2")
	served("phase 2", nats2)
	presented("phase 2", svc1)
	alive("phase 2", 2)

	// Phase 3: the service presents a CA2 leaf from its next reconnect.
	svcM.update(svcM.withLeaf(svc2))
	reconnect(t, nc, "phase 3")
	presented("phase 3", svc2)
	alive("phase 3", 3)

	// Phase 4: CA2 only on both sides.
	natsM.update(natsM.withCA(only2))
	svcM.update(svcM.withCA(only2))
	ns.reload(t)
	alive("phase 4", 3)
	reconnect(t, nc, "phase 4")
	presented("phase 4", svc2)
	alive("phase 4", 4)

	// A CA1 client certificate is refused now, and a client trusting CA1
	// only refuses the CA2 server; the same files with CA2 material pass.
	for _, c := range []struct {
		what string
		s    secret
		want string
	}{
		{"a CA1 client certificate", secret{ca: both, cert: svc1.cert, key: svc1.key}, "tls"},
		{"a client trusting CA1 only", secret{ca: only1, cert: svc2.cert, key: svc2.key}, "certificate signed by unknown authority"},
	} {
		bad, err := connect(t, ns.url, "planex-refused", newMount(t, c.s).files())
		if err == nil {
			bad.Close()
			t.Fatalf("phase 4: %s connected", c.what)
		}
		if !strings.Contains(strings.ToLower(err.Error()), c.want) {
			t.Fatalf("phase 4: %s: %v, want an error mentioning %q", c.what, err, c.want)
		}
	}
	good, err := connect(t, ns.url, "planex-ok", newMount(t, secret{ca: only2, cert: svc2.cert, key: svc2.key}).files())
	if err != nil {
		t.Fatalf("phase 4: a CA2 client: %v", err)
	}
	good.Close()
}
