package authn_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/planex-dev/planex/internal/authn"
)

func sign(t *testing.T, key ed25519.PrivateKey, kid string, claims jwt.Claims, extra map[string]any) string {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(s).Claims(claims).Claims(extra).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestJWTFromJWKSURL verifies tokens against a JWKS served over HTTP,
// refetching it when a token names a new key id (issuer key rotation),
// and refuses expired, wrong-audience, wrong-issuer and unsigned tokens.
func TestJWTFromJWKSURL(t *testing.T) {
	pub1, key1, _ := ed25519.GenerateKey(rand.Reader)
	pub2, key2, _ := ed25519.GenerateKey(rand.Reader)
	var rotated atomic.Bool
	var fetches atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fetches.Add(1)
		set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: pub1, KeyID: "k1", Algorithm: string(jose.EdDSA)}}}
		if rotated.Load() {
			set.Keys = append(set.Keys, jose.JSONWebKey{Key: pub2, KeyID: "k2", Algorithm: string(jose.EdDSA)})
		}
		_ = json.NewEncoder(w).Encode(set)
	}))
	defer srv.Close()
	now := time.Now()
	clock := func() time.Time { return now }
	v, err := authn.NewJWTVerifier(context.Background(), authn.JWTConfig{JWKSURL: srv.URL, Issuer: "https://idp", Audience: "planex",
		RolesClaim: "realm_access.roles", Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	ok := jwt.Claims{Issuer: "https://idp", Audience: jwt.Audience{"planex"}, Subject: "alice", Expiry: jwt.NewNumericDate(now.Add(time.Hour))}
	roles := map[string]any{"realm_access": map[string]any{"roles": []any{"approver", "unrelated"}}}
	id, err := v.Verify(context.Background(), sign(t, key1, "k1", ok, roles))
	if err != nil || id.Subject != "jwt:https://idp:alice" || id.LegacySubject != "alice" || id.Role() != authn.RoleApprover {
		t.Fatalf("valid token: %+v %v", id, err)
	}
	// The issuer rotates to k2: the verifier refetches once (rate limited
	// to once a minute).
	rotated.Store(true)
	now = now.Add(2 * time.Minute)
	if _, err := v.Verify(context.Background(), sign(t, key2, "k2", ok, roles)); err != nil {
		t.Fatalf("token of a rotated key: %v", err)
	}
	bad := map[string]jwt.Claims{
		"expired":        {Issuer: "https://idp", Audience: jwt.Audience{"planex"}, Subject: "alice", Expiry: jwt.NewNumericDate(now.Add(-time.Hour))},
		"other audience": {Issuer: "https://idp", Audience: jwt.Audience{"other"}, Subject: "alice", Expiry: jwt.NewNumericDate(now.Add(time.Hour))},
		"other issuer":   {Issuer: "https://evil", Audience: jwt.Audience{"planex"}, Subject: "alice", Expiry: jwt.NewNumericDate(now.Add(time.Hour))},
		"no expiry":      {Issuer: "https://idp", Audience: jwt.Audience{"planex"}, Subject: "alice"},
	}
	for name, c := range bad {
		if _, err := v.Verify(context.Background(), sign(t, key1, "k1", c, roles)); err == nil {
			t.Errorf("%s token accepted", name)
		}
	}
	// Signed by a key the issuer never published, under a known key id.
	_, forged, _ := ed25519.GenerateKey(rand.Reader)
	if _, err := v.Verify(context.Background(), sign(t, forged, "k1", ok, roles)); err == nil {
		t.Error("forged token accepted")
	}
	// alg "none" is never accepted.
	parts := strings.Split(sign(t, key1, "k1", ok, roles), ".")
	if _, err := v.Verify(context.Background(), "eyJhbGciOiJub25lIn0."+parts[1]+"."); err == nil {
		t.Error("alg none accepted")
	}
	if n := fetches.Load(); n > 3 {
		t.Errorf("JWKS fetched %d times", n)
	}
}

// TestAPIKeyFile: keys are stored hashed; a plaintext key in the file is
// refused with the line number; revoking a key takes effect without a
// restart.
func TestAPIKeyFile(t *testing.T) {
	dir := t.TempDir()
	key, line, err := authn.GenerateAPIKey("ci", authn.RoleRunner)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(line, key) {
		t.Fatal("the key file line contains the key itself")
	}
	path := filepath.Join(dir, "keys")
	if err := os.WriteFile(path, []byte("# comment\n"+line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := authn.NewAPIKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	id, err := k.Authenticate(key)
	if err != nil || id.Subject != "apikey:ci" || id.Role() != authn.RoleRunner {
		t.Fatalf("Authenticate: %+v %v", id, err)
	}
	if _, err := k.Authenticate(key + "x"); err == nil {
		t.Fatal("a wrong key authenticated")
	}
	// Revoke: the file changes, the key stops working.
	// (the stamp is size and mtime: the shorter file is seen as changed)
	if err := os.WriteFile(path, []byte("# all revoked\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Authenticate(key); err == nil {
		t.Fatal("a revoked key still authenticates")
	}
	if err := os.WriteFile(path, []byte(key+" ci runner\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := authn.NewAPIKeys(path); err == nil || !strings.Contains(err.Error(), "line 1") || strings.Contains(err.Error(), key) {
		t.Fatalf("plaintext key in the file: %v", err)
	}
}
