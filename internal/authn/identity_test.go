package authn_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"google.golang.org/grpc/metadata"

	"github.com/planex-dev/planex/internal/authn"
)

// TestSubjectsAreNamespaced reproduces issue 26: a JWT whose sub is
// "apikey:<name>" acted as that API key. Every authenticator names its
// callers under its own prefix, so a token's sub can never claim another
// kind's subject.
func TestSubjectsAreNamespaced(t *testing.T) {
	dir := t.TempDir()
	key, line, err := authn.GenerateAPIKey("ci", authn.RoleRunner)
	if err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(dir, "keys")
	if err := os.WriteFile(keys, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	set, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: pub, KeyID: "k1", Algorithm: string(jose.EdDSA)}}})
	jwks := filepath.Join(dir, "jwks.json")
	if err := os.WriteFile(jwks, set, 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := authn.New(context.Background(), authn.Config{APIKeysFile: keys,
		JWT: authn.JWTConfig{JWKSFile: jwks, Issuer: "https://idp", Audience: "planex", RolesClaim: "roles"}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	auth := func(token string) authn.Identity {
		t.Helper()
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+token))
		id, err := a.Authenticate(ctx)
		if err != nil {
			t.Fatalf("Authenticate: %v", err)
		}
		return id
	}
	token := func(sub string) string {
		return sign(t, priv, "k1", jwt.Claims{Issuer: "https://idp", Audience: jwt.Audience{"planex"}, Subject: sub,
			Expiry: jwt.NewNumericDate(time.Now().Add(time.Hour))}, map[string]any{"roles": []any{"admin"}})
	}

	apiKey := auth(key)
	if apiKey.Subject != "apikey:ci" || apiKey.Method != authn.MethodAPIKey {
		t.Fatalf("API key identity: %+v", apiKey)
	}
	for _, sub := range []string{"apikey:ci", "cert:planex-server", "jwt:https://idp:alice", "role:admin"} {
		id := auth(token(sub))
		if want := "jwt:https://idp:" + sub; id.Subject != want {
			t.Errorf("JWT sub %q: subject %q, want %q", sub, id.Subject, want)
		}
		if id.Matches(sub) {
			t.Errorf("JWT sub %q matches the subject %q it claims", sub, sub)
		}
		if id.Subject == apiKey.Subject || !strings.HasPrefix(id.Subject, authn.SubjectJWT) {
			t.Errorf("JWT sub %q: subject %q outside the jwt: namespace", sub, id.Subject)
		}
	}
}

func TestIdentityMatches(t *testing.T) {
	jwtAlice := authn.Identity{Subject: "jwt:https://idp:alice", LegacySubject: "alice", Method: authn.MethodJWT}
	jwtKey := authn.Identity{Subject: "jwt:https://idp:apikey:ci", LegacySubject: "apikey:ci", Method: authn.MethodJWT}
	key := authn.Identity{Subject: "apikey:ci", Method: authn.MethodAPIKey}
	cert := authn.Identity{Subject: "cert:abe", Method: authn.MethodMTLS}
	for _, tc := range []struct {
		name    string
		id      authn.Identity
		subject string
		want    bool
	}{
		{"own namespaced subject", jwtAlice, "jwt:https://idp:alice", true},
		{"legacy bare sub of a JWT", jwtAlice, "alice", true},
		{"another bare sub", jwtAlice, "bob", false},
		{"empty owner", jwtAlice, "", false},
		{"JWT claiming an API key", jwtKey, "apikey:ci", false},
		{"JWT of another issuer", jwtAlice, "jwt:https://other:alice", false},
		{"API key", key, "apikey:ci", true},
		{"API key name bare", key, "ci", false},
		{"certificate", cert, "cert:abe", true},
		{"certificate CN bare", cert, "abe", false},
		{"legacy subject on a non-JWT identity", authn.Identity{Subject: "apikey:x", LegacySubject: "x", Method: authn.MethodAPIKey}, "x", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.id.Matches(tc.subject); got != tc.want {
				t.Errorf("%s Matches(%q) = %v, want %v", tc.id.Subject, tc.subject, got, tc.want)
			}
		})
	}
}
