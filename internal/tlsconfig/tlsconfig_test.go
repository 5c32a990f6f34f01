package tlsconfig_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/planex-dev/planex/internal/tlsconfig"
)

// handshake dials lis with cfg and returns the server's leaf serial.
func handshake(t *testing.T, addr string, cfg *tls.Config) (*big.Int, error) {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber, nil
}

// serve accepts TLS connections with cfg and completes their handshakes.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				_ = c.(*tls.Conn).Handshake()
				_, _ = c.Read(make([]byte, 1))
				c.Close()
			}()
		}
	}()
	return lis.Addr().String()
}

func serialOf(t *testing.T, certFile string) *big.Int {
	t.Helper()
	pemBytes, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		t.Fatalf("%s: no PEM", certFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert.SerialNumber
}

// TestServerCertificateHotReload: rotating the certificate files makes the
// next handshake use the new certificate; a broken rotation keeps the last
// good one; client certificates are verified against the CA file.
func TestServerCertificateHotReload(t *testing.T) {
	dir := t.TempDir()
	ca, err := tlsconfig.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	leaf := tlsconfig.Leaf{CommonName: "server", Hosts: []string{"127.0.0.1"}, Server: true}
	files, err := ca.IssueFiles(dir, "server", caFile, leaf)
	if err != nil {
		t.Fatal(err)
	}
	r, err := tlsconfig.NewReloader(files)
	if err != nil {
		t.Fatal(err)
	}
	scfg, err := tlsconfig.ServerConfig(r, tlsconfig.ClientAuthRequire)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, scfg)

	client, err := ca.IssueFiles(dir, "client", caFile, tlsconfig.Leaf{CommonName: "client", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	cr, err := tlsconfig.NewReloader(client)
	if err != nil {
		t.Fatal(err)
	}
	ccfg := tlsconfig.ClientConfig(cr, "127.0.0.1")
	first := serialOf(t, files.CertFile)
	got, err := handshake(t, addr, ccfg)
	if err != nil {
		t.Fatalf("mTLS handshake: %v", err)
	}
	if got.Cmp(first) != 0 {
		t.Fatalf("served serial %v, want %v", got, first)
	}

	// Rotate: the next handshake uses the new certificate.
	if _, err := ca.IssueFiles(dir, "server", caFile, leaf); err != nil {
		t.Fatal(err)
	}
	second := serialOf(t, files.CertFile)
	if second.Cmp(first) == 0 {
		t.Fatal("rotation issued the same serial")
	}
	if got, err = handshake(t, addr, ccfg); err != nil || got.Cmp(second) != 0 {
		t.Fatalf("after rotation: serial %v, err %v; want %v", got, err, second)
	}

	// A broken rotation (garbage key) keeps serving the last good pair.
	if err := os.WriteFile(files.KeyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err = handshake(t, addr, ccfg); err != nil || got.Cmp(second) != 0 {
		t.Fatalf("after a broken rotation: serial %v, err %v; want the last good %v", got, err, second)
	}
	if r.Err() == nil {
		t.Fatal("a broken rotation is not reported by Err")
	}

	// No client certificate: refused with --tls-client-auth require.
	anon := tlsconfig.ClientConfig(mustReloader(t, tlsconfig.Files{CAFile: caFile}), "127.0.0.1")
	if _, err := handshakeAndRead(t, addr, anon); err == nil {
		t.Fatal("handshake without a client certificate succeeded under require")
	}
	// A certificate from another CA is refused too.
	other, err := tlsconfig.NewCA("other CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	forged, err := other.IssueFiles(dir, "forged", caFile, tlsconfig.Leaf{CommonName: "client", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := handshakeAndRead(t, addr, tlsconfig.ClientConfig(mustReloader(t, forged), "127.0.0.1")); err == nil {
		t.Fatal("handshake with a certificate of another CA succeeded")
	}
	// The client refuses a server whose name does not match.
	if _, err := handshake(t, addr, tlsconfig.ClientConfig(cr, "elsewhere.example")); err == nil {
		t.Fatal("client accepted a server certificate for another name")
	}
}

func mustReloader(t *testing.T, f tlsconfig.Files) *tlsconfig.Reloader {
	t.Helper()
	r, err := tlsconfig.NewReloader(f)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// handshakeAndRead also reads, because in TLS 1.3 the client learns that
// the server refused its certificate only on the first read.
func handshakeAndRead(t *testing.T, addr string, cfg *tls.Config) (*big.Int, error) {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
		return nil, err
	}
	return conn.ConnectionState().PeerCertificates[0].SerialNumber, nil
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
