package oidctest_test

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/oidctest"
)

// TestProviderCodeFlow: a relying party built from coreos/go-oidc and
// x/oauth2 signs in at the provider (discovery, code + PKCE, the login
// form, ID token verification with the nonce), the supervisor's JWT
// verifier accepts the access token with the roles of a nested claim, and
// the refresh token rotates.
func TestProviderCodeFlow(t *testing.T) {
	idp := oidctest.StartConfig(t, oidctest.Config{RolesClaim: "realm_access.roles",
		Users: []oidctest.User{{Name: "olga", Password: "pw", Roles: []string{"operator", "not-a-role"}}}})
	ctx := oidc.ClientContext(t.Context(), http.DefaultClient)
	p, err := oidc.NewProvider(ctx, idp.Issuer)
	if err != nil {
		t.Fatal(err)
	}
	const redirect = "http://127.0.0.1:9/auth/callback"
	conf := oauth2.Config{ClientID: idp.ClientID, ClientSecret: idp.ClientSecret, Endpoint: p.Endpoint(), RedirectURL: redirect,
		Scopes: []string{oidc.ScopeOpenID, "profile", oidc.ScopeOfflineAccess}}
	verifier := oauth2.GenerateVerifier()
	authURL := conf.AuthCodeURL("st", oauth2.S256ChallengeOption(verifier), oidc.Nonce("nn"))

	if _, err := idp.Login(t.Context(), http.DefaultClient, authURL, "olga", "wrong"); err == nil {
		t.Fatal("a wrong password signed in")
	}
	back, err := idp.Login(t.Context(), http.DefaultClient, authURL, "olga", "pw")
	if err != nil {
		t.Fatal(err)
	}
	if back.Query().Get("state") != "st" || back.Query().Get("code") == "" {
		t.Fatalf("redirect back %s", back)
	}
	tok, err := conf.Exchange(ctx, back.Query().Get("code"), oauth2.VerifierOption(verifier))
	if err != nil {
		t.Fatal(err)
	}
	idt, err := p.Verifier(&oidc.Config{ClientID: idp.ClientID}).Verify(ctx, tok.Extra("id_token").(string))
	if err != nil || idt.Nonce != "nn" || idt.Subject != "olga" {
		t.Fatalf("ID token: %v %+v", err, idt)
	}
	v, err := authn.NewJWTVerifier(t.Context(), authn.JWTConfig{JWKSURL: idp.JWKSURL, Issuer: idp.Issuer, Audience: idp.Audience, RolesClaim: idp.RolesClaim})
	if err != nil {
		t.Fatal(err)
	}
	id, err := v.Verify(t.Context(), tok.AccessToken)
	if err != nil || !slices.Equal(id.Roles, []authn.Role{authn.RoleOperator}) {
		t.Fatalf("access token at the supervisor's verifier: %v %+v", err, id)
	}
	if tok.RefreshToken == "" {
		t.Fatal("no refresh token with offline_access")
	}
	next, err := conf.TokenSource(ctx, &oauth2.Token{RefreshToken: tok.RefreshToken, Expiry: time.Now().Add(-time.Minute)}).Token()
	if err != nil || next.RefreshToken == tok.RefreshToken || idp.Refreshes() != 1 {
		t.Fatalf("refresh: %v, rotated %v, %d refreshes", err, next != nil && next.RefreshToken != tok.RefreshToken, idp.Refreshes())
	}
	// The old refresh token is spent.
	if _, err := conf.TokenSource(ctx, &oauth2.Token{RefreshToken: tok.RefreshToken, Expiry: time.Now().Add(-time.Minute)}).Token(); err == nil {
		t.Fatal("a rotated refresh token was accepted again")
	}
}
