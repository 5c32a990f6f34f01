// Package rotation tests planex components across a CA roll-over, end to
// end: real servers on loopback read their certificates, keys and CA
// bundles from directories laid out like a mounted Kubernetes Secret, and
// the test replaces those files the way the kubelet does while nothing is
// restarted.
package rotation

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/planex-dev/planex/internal/tlsconfig"
)

// secret is the content of a kubernetes.io/tls Secret as planex mounts it.
type secret struct {
	ca, cert, key []byte
}

// mount is a directory laid out like a Secret volume: each key is a
// symlink into ..data, itself a symlink to a timestamped directory. update
// writes a new timestamped directory and swaps ..data with a rename, as the
// kubelet's AtomicWriter does, so a reader sees either every old file or
// every new one through the key paths.
type mount struct {
	t   *testing.T
	dir string
	gen int
	cur secret
}

func newMount(t *testing.T, s secret) *mount {
	t.Helper()
	m := &mount{t: t, dir: t.TempDir()}
	m.update(s)
	for _, k := range []string{"ca.crt", "tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", k), filepath.Join(m.dir, k)); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// files are the paths planex is configured with (--tls-*-file).
func (m *mount) files() tlsconfig.Files {
	return tlsconfig.Files{
		CertFile: filepath.Join(m.dir, "tls.crt"),
		KeyFile:  filepath.Join(m.dir, "tls.key"),
		CAFile:   filepath.Join(m.dir, "ca.crt"),
	}
}

// update replaces the Secret's content atomically.
func (m *mount) update(s secret) {
	m.t.Helper()
	m.gen++
	ts := fmt.Sprintf("..%s.%09d", time.Now().UTC().Format("2006_01_02_15_04_05"), m.gen)
	tsDir := filepath.Join(m.dir, ts)
	if err := os.Mkdir(tsDir, 0o755); err != nil {
		m.t.Fatal(err)
	}
	for k, v := range map[string][]byte{"ca.crt": s.ca, "tls.crt": s.cert, "tls.key": s.key} {
		if err := os.WriteFile(filepath.Join(tsDir, k), v, 0o440); err != nil {
			m.t.Fatal(err)
		}
	}
	old, _ := os.Readlink(filepath.Join(m.dir, "..data"))
	tmp := filepath.Join(m.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(m.dir, "..data")); err != nil {
		m.t.Fatal(err)
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(m.dir, old)); err != nil {
			m.t.Fatal(err)
		}
	}
	m.cur = s
}

// withCA is the mounted Secret with another CA bundle.
func (m *mount) withCA(ca []byte) secret { s := m.cur; s.ca = ca; return s }

// withLeaf is the mounted Secret with another certificate and key.
func (m *mount) withLeaf(l leaf) secret { s := m.cur; s.cert, s.key = l.cert, l.key; return s }

// leaf is an issued certificate and its key.
type leaf struct {
	cert, key []byte
}

func issue(t *testing.T, ca *tlsconfig.CA, l tlsconfig.Leaf) leaf {
	t.Helper()
	c, k, err := ca.Issue(l)
	if err != nil {
		t.Fatal(err)
	}
	return leaf{cert: c, key: k}
}

// der is the leaf's DER certificate.
func (l leaf) der(t *testing.T) []byte {
	t.Helper()
	b, _ := pem.Decode(l.cert)
	if b == nil {
		t.Fatal("leaf: no PEM")
	}
	return b.Bytes
}

// sha is the hex SHA-256 of the leaf's DER certificate (nats-server's
// cert_sha256).
func (l leaf) sha(t *testing.T) string {
	sum := sha256.Sum256(l.der(t))
	return hex.EncodeToString(sum[:])
}

// is reports whether c is this leaf.
func (l leaf) is(t *testing.T, c *x509.Certificate) bool {
	return c != nil && bytes.Equal(c.Raw, l.der(t))
}

// bundle concatenates CA certificates into a trust bundle.
func bundle(cas ...*tlsconfig.CA) []byte {
	var b []byte
	for _, ca := range cas {
		b = append(b, ca.CertPEM...)
	}
	return b
}

func newCA(t *testing.T, name string) *tlsconfig.CA {
	t.Helper()
	ca, err := tlsconfig.NewCA(name, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// proxy forwards TCP connections to a backend and can cut them, as a
// restarted load balancer or a network blip would: the client reconnects
// and handshakes again, with whatever its files hold by then.
type proxy struct {
	lis     net.Listener
	backend string

	mu       sync.Mutex
	accepted int
	conns    map[net.Conn]struct{}
}

func newProxy(t *testing.T, backend string) *proxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{lis: lis, backend: backend, conns: map[net.Conn]struct{}{}}
	t.Cleanup(func() {
		lis.Close()
		p.cut()
	})
	go p.serve()
	return p
}

func (p *proxy) addr() string { return p.lis.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", p.backend)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.accepted++
		p.conns[c], p.conns[b] = struct{}{}, struct{}{}
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			dst.Close()
			src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		go pipe(b, c)
		go pipe(c, b)
	}
}

// connections is how many connections the proxy has accepted so far.
func (p *proxy) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// cut closes every open connection.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}
