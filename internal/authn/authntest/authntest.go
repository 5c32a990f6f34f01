// Package authntest makes the credentials tests need to talk to planex
// services with authentication on: a CA, a server certificate for
// 127.0.0.1, client certificates per role, an API key file and a JWKS file
// with tokens signed for it — all real, written to t.TempDir().
package authntest

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/tlsconfig"
)

// Issuer and Audience of the tokens Fixture.Token signs.
const (
	Issuer   = "https://issuer.test"
	Audience = "planex"
)

// Fixture holds generated credentials.
type Fixture struct {
	t   testing.TB
	Dir string
	// CA issues every certificate; CAFile is its bundle.
	CA     *tlsconfig.CA
	CAFile string
	// Server is the server certificate for 127.0.0.1 and localhost.
	Server tlsconfig.Files
	// APIKeysFile holds the hashed keys of APIKeys.
	APIKeysFile string
	// APIKeys maps a role name (viewer, runner, approver, admin) to a key.
	APIKeys map[string]string
	// JWKSFile holds the public key tokens are verified with.
	JWKSFile string

	jwk jose.JSONWebKey
}

// New generates a fixture.
func New(t testing.TB) *Fixture {
	t.Helper()
	f := &Fixture{t: t, Dir: t.TempDir(), APIKeys: map[string]string{}}
	ca, err := tlsconfig.NewCA("planex test CA", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f.CA = ca
	f.CAFile = filepath.Join(f.Dir, "ca.pem")
	if err := os.WriteFile(f.CAFile, ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	f.Server = f.Cert("server", tlsconfig.Leaf{CommonName: "planex-server", Hosts: []string{"127.0.0.1", "localhost"}, Server: true, Client: true, OrganizationalUnits: []string{"admin"}})

	var lines []string
	for _, r := range []authn.Role{authn.RoleViewer, authn.RoleRunner, authn.RoleApprover, authn.RoleAdmin} {
		key, line, err := authn.GenerateAPIKey(r.String()+"-key", r)
		if err != nil {
			t.Fatal(err)
		}
		f.APIKeys[r.String()] = key
		lines = append(lines, line)
	}
	f.APIKeysFile = filepath.Join(f.Dir, "api-keys")
	if err := os.WriteFile(f.APIKeysFile, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	f.jwk = jose.JSONWebKey{Key: priv, KeyID: "test-1", Algorithm: string(jose.EdDSA), Use: "sig"}
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{f.jwk.Public()}}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	f.JWKSFile = filepath.Join(f.Dir, "jwks.json")
	if err := os.WriteFile(f.JWKSFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// Cert issues a certificate and writes it as <name>.pem/<name>-key.pem.
func (f *Fixture) Cert(name string, l tlsconfig.Leaf) tlsconfig.Files {
	f.t.Helper()
	files, err := f.CA.IssueFiles(f.Dir, name, f.CAFile, l)
	if err != nil {
		f.t.Fatal(err)
	}
	return files
}

// ClientCert issues a client certificate for subject with roles in its OU.
func (f *Fixture) ClientCert(subject string, roles ...string) tlsconfig.Files {
	return f.Cert("client-"+subject, tlsconfig.Leaf{CommonName: subject, OrganizationalUnits: roles, Client: true})
}

// Token signs a JWT for subject with roles, valid for an hour. With a
// non-nil key it is signed by that key instead (a forged token).
func (f *Fixture) Token(subject string, roles []string, forgedKey ed25519.PrivateKey) string {
	f.t.Helper()
	key := f.jwk
	if forgedKey != nil {
		key = jose.JSONWebKey{Key: forgedKey, KeyID: f.jwk.KeyID}
	}
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", f.jwk.KeyID))
	if err != nil {
		f.t.Fatal(err)
	}
	now := time.Now()
	claims := jwt.Claims{Issuer: Issuer, Audience: jwt.Audience{Audience}, Subject: subject,
		IssuedAt: jwt.NewNumericDate(now), NotBefore: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(now.Add(time.Hour))}
	tok, err := jwt.Signed(sig).Claims(claims).Claims(map[string]any{"roles": roles}).Serialize()
	if err != nil {
		f.t.Fatal(err)
	}
	return tok
}

// ServerArgs are the service flags for TLS with client certificates, API
// keys and JWTs.
func (f *Fixture) ServerArgs() []string {
	return []string{
		"--tls-cert-file", f.Server.CertFile, "--tls-key-file", f.Server.KeyFile, "--tls-ca-file", f.CAFile,
		"--auth-api-keys-file", f.APIKeysFile, "--auth-jwks-file", f.JWKSFile,
		"--auth-jwt-issuer", Issuer, "--auth-jwt-audience", Audience,
	}
}

// Dial connects to addr over TLS verified by the fixture's CA, presenting
// client (when not zero) and sending token (when not empty).
func (f *Fixture) Dial(addr string, client tlsconfig.Files, token string) *grpc.ClientConn {
	f.t.Helper()
	client.CAFile = f.CAFile
	r, err := tlsconfig.NewReloader(client)
	if err != nil {
		f.t.Fatal(err)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsconfig.ClientConfig(r, "")))}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(authn.Bearer(token)))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { conn.Close() })
	return conn
}
