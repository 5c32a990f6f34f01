package authn_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/tlsconfig"
)

// TestAuthenticateHTTP identifies HTTP callers like gRPC callers: a valid
// API key, a client certificate verified by the TLS handshake (roles from
// its OU), and nothing else.
func TestAuthenticateHTTP(t *testing.T) {
	key, line, err := authn.GenerateAPIKey("rita", authn.RoleRunner)
	if err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := authn.New(context.Background(), authn.Config{APIKeysFile: keys}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := tlsconfig.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srvCert, srvKey, err := ca.Issue(tlsconfig.Leaf{Hosts: []string{"127.0.0.1"}, Server: true, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cliCert, cliKey, err := ca.Issue(tlsconfig.Leaf{CommonName: "abe", OrganizationalUnits: []string{"approver"}, Client: true, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM)
	sc, err := tls.X509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		id  authn.Identity
		err error
	}
	got := make(chan answer, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := a.AuthenticateHTTP(r)
		got <- answer{id, err}
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{sc}, ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	defer srv.Close()

	cc, err := tls.X509KeyPair(cliCert, cliKey)
	if err != nil {
		t.Fatal(err)
	}
	call := func(certs []tls.Certificate, header string) answer {
		t.Helper()
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: certs, MinVersion: tls.VersionTLS12}}
		defer tr.CloseIdleConnections()
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		if header != "" {
			req.Header.Set("Authorization", header)
		}
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return <-got
	}

	if r := call(nil, "Bearer "+key); r.err != nil || r.id.Method != authn.MethodAPIKey || !r.id.Has(authn.RoleRunner) || r.id.Has(authn.RoleApprover) {
		t.Errorf("API key: %+v %v", r.id, r.err)
	}
	if r := call([]tls.Certificate{cc}, ""); r.err != nil || r.id.Method != authn.MethodMTLS || r.id.Subject != "cert:abe" || !r.id.Has(authn.RoleApprover) {
		t.Errorf("client certificate: %+v %v", r.id, r.err)
	}
	// A bearer token, when sent, must be valid, even with a certificate.
	if r := call([]tls.Certificate{cc}, "Bearer pxk_wrong"); r.err == nil {
		t.Errorf("a wrong API key with a valid certificate: %+v", r.id)
	}
	if r := call(nil, ""); r.err == nil {
		t.Errorf("no credentials: %+v", r.id)
	}
	if r := call(nil, "Basic cml0YTpwdw=="); r.err == nil {
		t.Errorf("basic auth: %+v", r.id)
	}
}
