package reload

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planex-dev/planex/internal/freeport"
)

// testCA issues leaf certificates for 127.0.0.1.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "reload test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// leaf returns the PEM certificate and key of a new server leaf.
func (ca *testCA) leaf(t *testing.T, serial int64) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "nats"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// secretVolume mimics a Kubernetes Secret volume: the files are symlinks
// through ..data to a timestamped directory, and an update swaps ..data
// atomically to a new directory.
type secretVolume struct {
	dir string
	gen int
}

func (v *secretVolume) update(t *testing.T, files map[string][]byte) {
	t.Helper()
	v.gen++
	gen := filepath.Join(v.dir, fmt.Sprintf("..gen_%d", v.gen))
	if err := os.Mkdir(gen, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(gen, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(gen), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(v.dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			t.Fatal(err)
		}
	}
	if v.gen > 1 {
		if err := os.RemoveAll(filepath.Join(v.dir, fmt.Sprintf("..gen_%d", v.gen-1))); err != nil {
			t.Fatal(err)
		}
	}
}

// servedSerial connects to a NATS server, reads its plaintext INFO line,
// upgrades to TLS as a NATS client does and returns the serial number of
// the certificate the server presents.
func servedSerial(addr string, roots *x509.CertPool) (*big.Int, error) {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("read INFO: %w", err)
	}
	if !strings.HasPrefix(line, "INFO ") {
		return nil, fmt.Errorf("want INFO, got %q", line)
	}
	tc := tls.Client(conn, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
	if err := tc.Handshake(); err != nil {
		return nil, fmt.Errorf("TLS handshake: %w", err)
	}
	return tc.ConnectionState().PeerCertificates[0].SerialNumber, nil
}

// TestNATSServerReloadsRotatedLeaf runs the real nats-server with TLS and a
// pid file, rotates its leaf the way a cert-manager renewal updates a
// Secret volume, and requires new handshakes to see the new certificate
// within a minute while a connected client never disconnects.
func TestNATSServerReloadsRotatedLeaf(t *testing.T) {
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		t.Skip("nats-server binary not on PATH (Debian: apt-get install nats-server); this test needs the real server process to signal")
	}
	ca := newTestCA(t)
	crt1, key1 := ca.leaf(t, 1001)
	crt2, key2 := ca.leaf(t, 2002)

	dir := t.TempDir()
	tlsDir := filepath.Join(dir, "tls")
	if err := os.Mkdir(tlsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	vol := &secretVolume{dir: tlsDir}
	vol.update(t, map[string][]byte{"tls.crt": crt1, "tls.key": key1, "ca.crt": ca.pem})

	port := freeport.Port(t)
	pidFile := filepath.Join(dir, "nats.pid")
	conf := filepath.Join(dir, "nats.conf")
	write(t, conf, fmt.Sprintf(`listen: 127.0.0.1:%d
pid_file: %q
tls {
  cert_file: %q
  key_file: %q
  ca_file: %q
  timeout: 2
}
`, port, pidFile, filepath.Join(tlsDir, "tls.crt"), filepath.Join(tlsDir, "tls.key"), filepath.Join(tlsDir, "ca.crt")))

	logFile, err := os.Create(filepath.Join(dir, "nats-server.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	srv := exec.Command(bin, "-c", conf)
	srv.Stdout, srv.Stderr = logFile, logFile
	if err := srv.Start(); err != nil {
		t.Fatalf("start nats-server: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	t.Cleanup(func() {
		_ = srv.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = srv.Process.Kill()
			<-exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			t.Logf("nats-server log:\n%s", b)
		}
	})

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.pem)
	addr := "127.0.0.1:" + strconv.Itoa(port)

	// Wait for the server: pid file written and the first leaf served.
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, perr := os.ReadFile(pidFile)
		serial, serr := servedSerial(addr, roots)
		if perr == nil && strings.TrimSpace(string(b)) == strconv.Itoa(srv.Process.Pid) && serr == nil {
			if serial.Int64() != 1001 {
				t.Fatalf("served serial %s at start, want 1001", serial)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats-server not ready: pid file %v, handshake %v", perr, serr)
		}
		select {
		case err := <-exited:
			t.Fatalf("nats-server exited: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}

	var disconnects atomic.Int32
	nc, err := nats.Connect("tls://"+addr,
		nats.Secure(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { disconnects.Add(1) }),
	)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("rotate.check")
	if err != nil {
		t.Fatal(err)
	}

	logs := &syncBuffer{}
	r, err := New(Config{
		PidFile:  pidFile,
		Files:    []string{filepath.Join(tlsDir, "tls.crt"), filepath.Join(tlsDir, "tls.key"), filepath.Join(tlsDir, "ca.crt")},
		Interval: 200 * time.Millisecond,
	}, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	for !strings.Contains(logs.String(), "watching files") {
		if time.Now().After(deadline) {
			t.Fatalf("reloader did not start:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}

	rotated := time.Now()
	vol.update(t, map[string][]byte{"tls.crt": crt2, "tls.key": key2, "ca.crt": ca.pem})

	deadline = rotated.Add(time.Minute)
	for {
		serial, err := servedSerial(addr, roots)
		if err == nil && serial.Int64() == 2002 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("new leaf not served within a minute of the rotation: serial %v, err %v\nreloader log:\n%s", serial, err, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("new certificate served %s after the rotation", time.Since(rotated).Round(time.Millisecond))

	// The client connected before the rotation is still connected and works.
	if err := nc.Publish("rotate.check", []byte("after")); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("message after rotation: %v", err)
	}
	if !nc.IsConnected() || disconnects.Load() != 0 {
		t.Fatalf("client connected=%v with %d disconnects, want no disconnect", nc.IsConnected(), disconnects.Load())
	}

	out := logs.String()
	if !strings.Contains(out, "tls.crt") || !strings.Contains(out, "tls.key") {
		t.Errorf("reloader log does not name the changed files:\n%s", out)
	}
	if strings.Contains(out, "PRIVATE KEY") || strings.Contains(out, "CERTIFICATE") {
		t.Errorf("reloader log prints file contents:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "signalled to reload") && strings.Contains(line, "ca.crt") {
			t.Errorf("reloader log names the unchanged ca.crt as changed: %s", line)
		}
	}
}
