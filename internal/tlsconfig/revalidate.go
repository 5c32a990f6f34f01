package tlsconfig

import (
	"context"
	"crypto/x509"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
)

// RecheckInterval is how often, at most, a gRPC server or client re-reads
// its CA bundle while it holds connections authenticated by a peer
// certificate; a new handshake re-reads it at once.
const RecheckInterval = 10 * time.Second

// revalidating wraps gRPC TLS credentials so that the connections they
// authenticated follow the CA bundle: when the bundle changes, each
// connection's peer certificate is verified again against the new bundle
// (at the time of its handshake, so only trust is re-decided, not
// expiry), and the connections it no longer trusts are closed. Without
// this, removing a CA from the bundle (the last phase of a CA roll-over,
// or retiring a compromised CA) would refuse new connections but leave
// those it had authenticated open and authorised indefinitely. Closed
// clients reconnect with the certificate their files hold by then.
type revalidating struct {
	credentials.TransportCredentials
	w *trustWatch
}

func (c *revalidating) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, ai, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return conn, ai, err
	}
	// Only a client certificate Go verified (against the bundle) is
	// tracked: without one the connection rests on no CA.
	if ti, ok := ai.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 {
		conn = c.w.track(conn, ti.State.PeerCertificates, "")
	}
	c.w.check()
	return conn, ai, nil
}

func (c *revalidating) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, ai, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		return conn, ai, err
	}
	// ClientConfig verifies the server against the bundle (with a CA
	// file); with the system roots there is nothing to follow.
	if ti, ok := ai.(credentials.TLSInfo); ok && c.w.r.files.CAFile != "" && len(ti.State.PeerCertificates) > 0 {
		conn = c.w.track(conn, ti.State.PeerCertificates, ti.State.ServerName)
	}
	c.w.check()
	return conn, ai, nil
}

func (c *revalidating) Clone() credentials.TransportCredentials {
	return &revalidating{TransportCredentials: c.TransportCredentials.Clone(), w: c.w}
}

// trustWatch holds the connections authenticated under a Reloader's CA
// bundle and closes those a new bundle no longer trusts.
type trustWatch struct {
	r     *Reloader
	usage x509.ExtKeyUsage // of the peer: client auth on a server

	mu       sync.Mutex
	interval time.Duration
	gen      uint64 // the Reloader generation the connections were checked at
	conns    map[*trackedConn]struct{}
	polling  bool
}

func newTrustWatch(r *Reloader, usage x509.ExtKeyUsage) *trustWatch {
	_, gen := r.trust()
	return &trustWatch{r: r, usage: usage, interval: RecheckInterval, gen: gen, conns: map[*trackedConn]struct{}{}}
}

// trackedConn is a connection whose peer certificate is re-verified when
// the bundle changes.
type trackedConn struct {
	net.Conn
	w       *trustWatch
	leaf    *x509.Certificate
	inter   *x509.CertPool
	dnsName string
	at      time.Time
}

func (c *trackedConn) Close() error {
	c.w.forget(c)
	return c.Conn.Close()
}

// trusted verifies the connection's peer certificate against pool as at
// its handshake.
func (c *trackedConn) trusted(pool *x509.CertPool, usage x509.ExtKeyUsage) bool {
	if pool == nil {
		return false // never the system roots: only a bundle trusted it
	}
	_, err := c.leaf.Verify(x509.VerifyOptions{
		Roots: pool, Intermediates: c.inter, DNSName: c.dnsName, CurrentTime: c.at,
		KeyUsages: []x509.ExtKeyUsage{usage},
	})
	return err == nil
}

func (w *trustWatch) track(conn net.Conn, peer []*x509.Certificate, dnsName string) net.Conn {
	inter := x509.NewCertPool()
	for _, c := range peer[1:] {
		inter.AddCert(c)
	}
	tc := &trackedConn{Conn: conn, w: w, leaf: peer[0], inter: inter, dnsName: dnsName, at: w.r.now()}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.conns[tc] = struct{}{}
	if !w.polling {
		w.polling = true
		go w.poll()
	}
	return tc
}

func (w *trustWatch) forget(c *trackedConn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.conns, c)
}

// poll re-reads the bundle every interval while connections are tracked
// (a bundle can change while no new connection comes to notice).
func (w *trustWatch) poll() {
	for {
		w.mu.Lock()
		d := w.interval
		w.mu.Unlock()
		time.Sleep(d)
		w.mu.Lock()
		if len(w.conns) == 0 {
			w.polling = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		w.check()
	}
}

// check re-reads the bundle and, when it changed since the last check,
// closes the tracked connections it no longer trusts.
func (w *trustWatch) check() {
	pool, gen := w.r.trust()
	w.mu.Lock()
	if gen == w.gen {
		w.mu.Unlock()
		return
	}
	w.gen = gen
	var untrusted []*trackedConn
	for c := range w.conns {
		if !c.trusted(pool, w.usage) {
			untrusted = append(untrusted, c)
			delete(w.conns, c)
		}
	}
	w.mu.Unlock()
	for _, c := range untrusted {
		_ = c.Conn.Close()
	}
}
