package console

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	pemlib "encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc/metadata"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"loopback", Config{HTTPAddr: "127.0.0.1:7480"}, ""},
		{"localhost with jaeger", Config{HTTPAddr: "localhost:0", JaegerURL: "http://127.0.0.1:16686"}, ""},
		{"ipv6 loopback", Config{HTTPAddr: "[::1]:7480"}, ""},
		{"all interfaces without TLS", Config{HTTPAddr: ":7480"}, "--http-addr"},
		{"public address without TLS", Config{HTTPAddr: "192.0.2.1:7480"}, "not a loopback address"},
		{"public address with TLS", Config{HTTPAddr: "0.0.0.0:7480", TLSCertFile: "c.pem", TLSKeyFile: "k.pem"}, ""},
		{"cert without key", Config{HTTPAddr: "127.0.0.1:7480", TLSCertFile: "c.pem"}, "--http-tls-cert-file and --http-tls-key-file"},
		{"no port", Config{HTTPAddr: "127.0.0.1"}, "--http-addr"},
		{"jaeger not http", Config{HTTPAddr: "127.0.0.1:0", JaegerURL: "javascript:alert(1)"}, "--jaeger-url"},
		{"jaeger without host", Config{HTTPAddr: "127.0.0.1:0", JaegerURL: "http://"}, "--jaeger-url"},
		{"allowed hosts", Config{HTTPAddr: "127.0.0.1:0", AllowedHosts: []string{"console.internal", "planex.example.com:8443", "[::1]:7480", "*.example.org"}}, ""},
		{"allowed host as a URL", Config{HTTPAddr: "127.0.0.1:0", AllowedHosts: []string{"http://console.internal/"}}, `--allowed-hosts "http://console.internal/"`},
		{"allowed host empty", Config{HTTPAddr: "127.0.0.1:0", AllowedHosts: []string{" "}}, "--allowed-hosts"},
		{"allowed host bad port", Config{HTTPAddr: "127.0.0.1:0", AllowedHosts: []string{"h:99999"}}, "--allowed-hosts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate: %v, want an error naming %q", err, tt.wantErr)
			}
		})
	}
}

// TestOutgoingToken: exactly one "Bearer <token>" header is forwarded, and
// only over TLS; anything else is refused before the supervisor is called.
func TestOutgoingToken(t *testing.T) {
	tests := []struct {
		name    string
		forward bool
		headers []string
		want    string // forwarded authorization, "" for none
		wantErr bool
	}{
		{"bearer", true, []string{"Bearer planex_abc"}, "Bearer planex_abc", false},
		{"scheme case and spaces", true, []string{"bearer   planex_abc "}, "Bearer planex_abc", false},
		{"no header", true, nil, "", false},
		{"plaintext supervisor never gets a token", false, []string{"Bearer planex_abc"}, "", false},
		{"two headers", true, []string{"Bearer a", "Bearer b"}, "", true},
		{"basic auth", true, []string{"Basic dXNlcjpwdw=="}, "", true},
		{"empty token", true, []string{"Bearer  "}, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &proxy{forwardTokens: tt.forward, logger: slog.Default()}
			h := http.Header{}
			for _, v := range tt.headers {
				h.Add("Authorization", v)
			}
			ctx, err := p.outgoing(t.Context(), h)
			if tt.wantErr {
				if connect.CodeOf(err) != connect.CodeUnauthenticated {
					t.Fatalf("outgoing: %v, want Unauthenticated", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			md, _ := metadata.FromOutgoingContext(ctx)
			got := strings.Join(md.Get("authorization"), ",")
			if got != tt.want {
				t.Fatalf("forwarded %q, want %q", got, tt.want)
			}
		})
	}
}

// TestHandlerServesEmbeddedAssets: the page and its assets come from the
// binary, with a CSP that keeps everything on the console's origin.
func TestHandlerServesEmbeddedAssets(t *testing.T) {
	h, err := Handler(Config{HTTPAddr: "127.0.0.1:0", JaegerURL: "http://127.0.0.1:16686"}, nil, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ path, contains string }{
		{"/", `data-jaeger-url="http://127.0.0.1:16686"`},
		{"/assets/app.js", "WatchRun"},
		{"/assets/dag.js", "layout"},
		{"/assets/connect.js", "application/connect+json"},
		{"/assets/app.css", "prefers-color-scheme: dark"},
	} {
		rec := httptest.NewRecorder()
		req, _ := http.NewRequest(http.MethodGet, tt.path, nil)
		req.Host = "127.0.0.1:7480"
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), tt.contains) {
			t.Errorf("GET %s: %d, body without %q", tt.path, rec.Code, tt.contains)
		}
		if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
			t.Errorf("GET %s: CSP %q", tt.path, csp)
		}
	}
}

// TestRunServesHTTPS: with a certificate the console serves HTTPS and
// offers HTTP/2 (browsers' per-origin connection limit and event streams).
func TestRunServesHTTPS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := writeSelfSigned(t, dir)
	ready := make(chan net.Addr, 1)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{HTTPAddr: "127.0.0.1:0", TLSCertFile: certFile, TLSKeyFile: keyFile,
			OnReady: func(a net.Addr) { ready <- a }}, nil, slog.Default())
	}()
	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	pool := x509.NewCertPool()
	pem, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(pem)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	resp, err := (&http.Client{Transport: tr}).Get("https://" + addr.String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
		t.Errorf("GET /: %d over %s, want 200 over HTTP/2", resp.StatusCode, resp.Proto)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run after cancel: %v", err)
	}
}

// writeSelfSigned writes a certificate for 127.0.0.1 and its key.
func writeSelfSigned(t *testing.T, dir string) (certFile, keyFile string) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "console"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pemlib.EncodeToMemory(&pemlib.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pemlib.EncodeToMemory(&pemlib.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}
