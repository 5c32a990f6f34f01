package oidctest

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// storage is the provider's in-memory op.Storage: its users, one client,
// auth requests, codes, access and refresh tokens and a signing key.
type storage struct {
	cfg         Config
	key         signingKey
	requirePKCE bool

	mu            sync.Mutex
	users         map[string]User // by name
	authRequests  map[string]*authRequest
	codes         map[string]string // code → auth request id
	accessTokens  map[string]*accessToken
	refreshTokens map[string]*refreshToken
	endSessions   []string // user names whose session was ended, in order
	refreshes     int
}

type accessToken struct {
	id, subject, clientID, refreshToken string
	audience, scopes                    []string
	expiration                          time.Time
}

type refreshToken struct {
	token, subject, clientID, accessTokenID string
	audience, scopes, amr                   []string
	authTime, expiration                    time.Time
}

func randomID() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// authRequest implements op.AuthRequest.
type authRequest struct {
	id, clientID, redirectURI, state, nonce, userName string
	scopes                                            []string
	audience                                          []string
	responseType                                      oidc.ResponseType
	responseMode                                      oidc.ResponseMode
	challenge                                         *oidc.CodeChallenge
	done                                              bool
	authTime                                          time.Time
}

func (a *authRequest) GetID() string                         { return a.id }
func (a *authRequest) GetACR() string                        { return "" }
func (a *authRequest) GetAudience() []string                 { return a.audience }
func (a *authRequest) GetAuthTime() time.Time                { return a.authTime }
func (a *authRequest) GetClientID() string                   { return a.clientID }
func (a *authRequest) GetCodeChallenge() *oidc.CodeChallenge { return a.challenge }
func (a *authRequest) GetNonce() string                      { return a.nonce }
func (a *authRequest) GetRedirectURI() string                { return a.redirectURI }
func (a *authRequest) GetResponseType() oidc.ResponseType    { return a.responseType }
func (a *authRequest) GetResponseMode() oidc.ResponseMode    { return a.responseMode }
func (a *authRequest) GetScopes() []string                   { return a.scopes }
func (a *authRequest) GetState() string                      { return a.state }
func (a *authRequest) GetSubject() string                    { return a.userName }
func (a *authRequest) Done() bool                            { return a.done }
func (a *authRequest) GetAMR() []string {
	if a.done {
		return []string{"pwd"}
	}
	return nil
}
func (r *refreshRequest) GetAMR() []string                        { return r.amr }
func (r *refreshRequest) GetAudience() []string                   { return r.audience }
func (r *refreshRequest) GetAuthTime() time.Time                  { return r.authTime }
func (r *refreshRequest) GetClientID() string                     { return r.clientID }
func (r *refreshRequest) GetScopes() []string                     { return r.scopes }
func (r *refreshRequest) GetSubject() string                      { return r.subject }
func (r *refreshRequest) SetCurrentScopes(scopes []string)        { r.scopes = scopes }
func (k *signingKey) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.ES256 }
func (k *signingKey) Key() any                                    { return k.key }
func (k *signingKey) ID() string                                  { return k.id }
func (k publicKey) ID() string                                    { return k.id }
func (k publicKey) Algorithm() jose.SignatureAlgorithm            { return jose.ES256 }
func (k publicKey) Use() string                                   { return "sig" }
func (k publicKey) Key() any                                      { return &k.key.PublicKey }

// refreshRequest implements op.RefreshTokenRequest.
type refreshRequest struct{ refreshToken }

type signingKey struct {
	id  string
	key *ecdsa.PrivateKey
}

type publicKey struct{ *signingKey }

// client implements op.Client and op.HasRedirectGlobs: a web client
// (client_secret_basic or _post) or a public one (PKCE only), whose
// redirect and post-logout URIs may be any loopback port.
type client struct {
	id, secret       string
	redirectGlobs    []string
	postLogoutGlobs  []string
	idTokenLife      time.Duration
	opaqueAccessToks bool
}

func (c *client) GetID() string                    { return c.id }
func (c *client) RedirectURIs() []string           { return nil }
func (c *client) PostLogoutRedirectURIs() []string { return nil }
func (c *client) ApplicationType() op.ApplicationType {
	if c.secret == "" {
		return op.ApplicationTypeUserAgent
	}
	return op.ApplicationTypeWeb
}
func (c *client) AuthMethod() oidc.AuthMethod {
	if c.secret == "" {
		return oidc.AuthMethodNone
	}
	return oidc.AuthMethodBasic
}
func (c *client) ResponseTypes() []oidc.ResponseType {
	return []oidc.ResponseType{oidc.ResponseTypeCode}
}
func (c *client) GrantTypes() []oidc.GrantType {
	return []oidc.GrantType{oidc.GrantTypeCode, oidc.GrantTypeRefreshToken}
}
func (c *client) LoginURL(id string) string { return "/login?authRequestID=" + id }
func (c *client) AccessTokenType() op.AccessTokenType {
	if c.opaqueAccessToks {
		return op.AccessTokenTypeBearer
	}
	return op.AccessTokenTypeJWT
}
func (c *client) IDTokenLifetime() time.Duration { return c.idTokenLife }

// DevMode allows http redirect URIs (the console on loopback).
func (c *client) DevMode() bool { return true }
func (c *client) RestrictAdditionalIdTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *client) RestrictAdditionalAccessTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *client) IsScopeAllowed(string) bool { return false }

// IDTokenUserinfoClaimsAssertion puts name and email in the ID token even
// when an access token is issued too (many providers do).
func (c *client) IDTokenUserinfoClaimsAssertion() bool { return true }
func (c *client) ClockSkew() time.Duration             { return 0 }
func (c *client) RedirectURIGlobs() []string           { return c.redirectGlobs }
func (c *client) PostLogoutRedirectURIGlobs() []string { return c.postLogoutGlobs }

var (
	_ op.Storage                        = (*storage)(nil)
	_ op.CanSetUserinfoFromRequest      = (*storage)(nil)
	_ op.CanGetPrivateClaimsFromRequest = (*storage)(nil)
	_ op.HasRedirectGlobs               = (*client)(nil)
)

func (s *storage) client() *client {
	return &client{id: s.cfg.ClientID, secret: s.cfg.ClientSecret,
		redirectGlobs:   []string{"http://127.0.0.1:*/auth/callback", "http://localhost:*/auth/callback", "https://127.0.0.1:*/auth/callback", "https://localhost:*/auth/callback"},
		postLogoutGlobs: []string{"http://127.0.0.1:*/", "http://localhost:*/", "https://127.0.0.1:*/", "https://localhost:*/"},
		idTokenLife:     s.cfg.AccessTokenLifetime, opaqueAccessToks: s.cfg.OpaqueAccessTokens}
}

// checkLogin signs the auth request id in as name when password is right.
func (s *storage) checkLogin(id, name, password string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	req, ok := s.authRequests[id]
	if !ok {
		return errors.New("this sign-in request expired; start again from the application")
	}
	u, ok := s.users[name]
	if !ok || u.Password != password {
		return errors.New("wrong username or password")
	}
	req.userName, req.done, req.authTime = name, true, time.Now()
	return nil
}

// CreateAuthRequest implements op.Storage. Without a PKCE challenge (when
// Config.AllowNoPKCE) the request is refused.
func (s *storage) CreateAuthRequest(_ context.Context, r *oidc.AuthRequest, _ string) (op.AuthRequest, error) {
	if len(r.Prompt) == 1 && r.Prompt[0] == oidc.PromptNone {
		return nil, oidc.ErrLoginRequired()
	}
	if s.requirePKCE && r.CodeChallenge == "" {
		return nil, oidc.ErrInvalidRequest().WithDescription("code_challenge required (PKCE)")
	}
	var ch *oidc.CodeChallenge
	if r.CodeChallenge != "" {
		ch = &oidc.CodeChallenge{Challenge: r.CodeChallenge, Method: r.CodeChallengeMethod}
	}
	req := &authRequest{id: randomID(), clientID: r.ClientID, redirectURI: r.RedirectURI, state: r.State, nonce: r.Nonce,
		scopes: r.Scopes, responseType: r.ResponseType, responseMode: r.ResponseMode, challenge: ch,
		audience: []string{r.ClientID, s.cfg.Audience}}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.authRequests[req.id] = req
	return req, nil
}

// AuthRequestByID implements op.Storage.
func (s *storage) AuthRequestByID(_ context.Context, id string) (op.AuthRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.authRequests[id]; ok {
		return r, nil
	}
	return nil, errors.New("auth request not found")
}

// AuthRequestByCode implements op.Storage.
func (s *storage) AuthRequestByCode(ctx context.Context, code string) (op.AuthRequest, error) {
	s.mu.Lock()
	id, ok := s.codes[code]
	s.mu.Unlock()
	if !ok {
		return nil, errors.New("code invalid or expired")
	}
	return s.AuthRequestByID(ctx, id)
}

// SaveAuthCode implements op.Storage.
func (s *storage) SaveAuthCode(_ context.Context, id, code string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.codes[code] = id
	return nil
}

// DeleteAuthRequest implements op.Storage: a code is used once.
func (s *storage) DeleteAuthRequest(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.authRequests, id)
	for code, rid := range s.codes {
		if rid == id {
			delete(s.codes, code)
		}
	}
	return nil
}

func (s *storage) newAccessToken(clientID, subject, refresh string, audience, scopes []string) *accessToken {
	t := &accessToken{id: randomID(), clientID: clientID, subject: subject, refreshToken: refresh,
		audience: audience, scopes: scopes, expiration: time.Now().Add(s.cfg.AccessTokenLifetime)}
	s.accessTokens[t.id] = t
	return t
}

// CreateAccessToken implements op.Storage.
func (s *storage) CreateAccessToken(_ context.Context, r op.TokenRequest) (string, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	clientID := ""
	if a, ok := r.(*authRequest); ok {
		clientID = a.clientID
	}
	t := s.newAccessToken(clientID, r.GetSubject(), "", r.GetAudience(), r.GetScopes())
	return t.id, t.expiration, nil
}

// CreateAccessAndRefreshTokens implements op.Storage, rotating the refresh
// token on every refresh.
func (s *storage) CreateAccessAndRefreshTokens(_ context.Context, r op.TokenRequest, current string) (string, string, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rt := refreshToken{token: randomID(), subject: r.GetSubject(), audience: r.GetAudience(), scopes: r.GetScopes(),
		expiration: time.Now().Add(s.cfg.RefreshTokenLifetime)}
	switch req := r.(type) {
	case *authRequest:
		rt.clientID, rt.authTime, rt.amr = req.clientID, req.authTime, req.GetAMR()
	case *refreshRequest:
		rt.clientID, rt.authTime, rt.amr = req.clientID, req.authTime, req.amr
	}
	if current != "" {
		old, ok := s.refreshTokens[current]
		if !ok || time.Now().After(old.expiration) {
			return "", "", time.Time{}, op.ErrInvalidRefreshToken
		}
		delete(s.refreshTokens, current)
		delete(s.accessTokens, old.accessTokenID)
		s.refreshes++
	}
	at := s.newAccessToken(rt.clientID, rt.subject, rt.token, rt.audience, rt.scopes)
	rt.accessTokenID = at.id
	s.refreshTokens[rt.token] = &rt
	return at.id, rt.token, at.expiration, nil
}

// TokenRequestByRefreshToken implements op.Storage.
func (s *storage) TokenRequestByRefreshToken(_ context.Context, token string) (op.RefreshTokenRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rt, ok := s.refreshTokens[token]
	if !ok || time.Now().After(rt.expiration) {
		return nil, op.ErrInvalidRefreshToken
	}
	return &refreshRequest{*rt}, nil
}

// TerminateSession implements op.Storage (end_session): the user's tokens
// of the client are revoked.
func (s *storage) TerminateSession(_ context.Context, userID, clientID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endSessions = append(s.endSessions, userID)
	s.revokeLocked(userID, clientID)
	return nil
}

func (s *storage) revokeLocked(userID, clientID string) {
	for id, t := range s.accessTokens {
		if t.subject == userID && (clientID == "" || t.clientID == clientID) {
			delete(s.accessTokens, id)
		}
	}
	for id, t := range s.refreshTokens {
		if t.subject == userID && (clientID == "" || t.clientID == clientID) {
			delete(s.refreshTokens, id)
		}
	}
}

// GetRefreshTokenInfo implements op.Storage.
func (s *storage) GetRefreshTokenInfo(_ context.Context, _ string, token string) (string, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rt, ok := s.refreshTokens[token]
	if !ok {
		return "", "", op.ErrInvalidRefreshToken
	}
	return rt.subject, rt.token, nil
}

// RevokeToken implements op.Storage (the revocation endpoint).
func (s *storage) RevokeToken(_ context.Context, tokenOrID, _, clientID string) *oidc.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.accessTokens[tokenOrID]; ok {
		if t.clientID != clientID {
			return oidc.ErrInvalidClient().WithDescription("token was not issued to this client")
		}
		delete(s.accessTokens, tokenOrID)
		return nil
	}
	if rt, ok := s.refreshTokens[tokenOrID]; ok {
		if rt.clientID != clientID {
			return oidc.ErrInvalidClient().WithDescription("token was not issued to this client")
		}
		delete(s.refreshTokens, tokenOrID)
		delete(s.accessTokens, rt.accessTokenID)
	}
	return nil
}

// SigningKey implements op.Storage.
func (s *storage) SigningKey(context.Context) (op.SigningKey, error) { return &s.key, nil }

// SignatureAlgorithms implements op.Storage.
func (s *storage) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.ES256}, nil
}

// KeySet implements op.Storage (the JWKS).
func (s *storage) KeySet(context.Context) ([]op.Key, error) { return []op.Key{publicKey{&s.key}}, nil }

// GetClientByClientID implements op.Storage.
func (s *storage) GetClientByClientID(_ context.Context, id string) (op.Client, error) {
	if id != s.cfg.ClientID {
		return nil, fmt.Errorf("client %q not found", id)
	}
	return s.client(), nil
}

// AuthorizeClientIDSecret implements op.Storage.
func (s *storage) AuthorizeClientIDSecret(_ context.Context, id, secret string) error {
	if id != s.cfg.ClientID || secret != s.cfg.ClientSecret {
		return errors.New("wrong client id or secret")
	}
	return nil
}

// SetUserinfoFromScopes implements op.Storage (deprecated; see
// SetUserinfoFromRequest).
func (s *storage) SetUserinfoFromScopes(context.Context, *oidc.UserInfo, string, string, []string) error {
	return nil
}

// SetUserinfoFromRequest implements op.CanSetUserinfoFromRequest: the ID
// token's claims, with the roles claim.
func (s *storage) SetUserinfoFromRequest(_ context.Context, info *oidc.UserInfo, r op.IDTokenRequest, scopes []string) error {
	return s.userinfo(info, r.GetSubject(), scopes)
}

// SetUserinfoFromToken implements op.Storage (the userinfo endpoint).
func (s *storage) SetUserinfoFromToken(_ context.Context, info *oidc.UserInfo, tokenID, subject, _ string) error {
	s.mu.Lock()
	t, ok := s.accessTokens[tokenID]
	s.mu.Unlock()
	if !ok || time.Now().After(t.expiration) {
		return errors.New("token invalid or expired")
	}
	return s.userinfo(info, t.subject, t.scopes)
}

func (s *storage) userinfo(info *oidc.UserInfo, name string, scopes []string) error {
	s.mu.Lock()
	u, ok := s.users[name]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("user %q not found", name)
	}
	info.Subject = u.Name
	for _, sc := range scopes {
		switch sc {
		case oidc.ScopeProfile:
			info.PreferredUsername = u.Name
			info.Name = u.DisplayName
		case oidc.ScopeEmail:
			info.Email = u.Email
			info.EmailVerified = oidc.Bool(u.Email != "")
		}
	}
	for k, v := range s.roleClaim(u) {
		info.AppendClaims(k, v)
	}
	return nil
}

// roleClaim is the user's roles under Config.RolesClaim; dots nest objects
// ("realm_access.roles" → {"realm_access": {"roles": [...]}}).
func (s *storage) roleClaim(u User) map[string]any {
	parts := strings.Split(s.cfg.RolesClaim, ".")
	var v any = slices.Clone(u.Roles)
	if u.Roles == nil {
		v = []string{}
	}
	for i := len(parts) - 1; i > 0; i-- {
		v = map[string]any{parts[i]: v}
	}
	return map[string]any{parts[0]: v}
}

// SetIntrospectionFromToken implements op.Storage.
func (s *storage) SetIntrospectionFromToken(_ context.Context, resp *oidc.IntrospectionResponse, tokenID, subject, clientID string) error {
	s.mu.Lock()
	t, ok := s.accessTokens[tokenID]
	s.mu.Unlock()
	if !ok || time.Now().After(t.expiration) || !slices.Contains(t.audience, clientID) {
		return errors.New("token invalid or expired")
	}
	info := new(oidc.UserInfo)
	if err := s.userinfo(info, subject, t.scopes); err != nil {
		return err
	}
	resp.SetUserInfo(info)
	resp.Scope, resp.ClientID, resp.Expiration = t.scopes, t.clientID, oidc.FromTime(t.expiration)
	return nil
}

// GetPrivateClaimsFromScopes implements op.Storage.
func (s *storage) GetPrivateClaimsFromScopes(_ context.Context, userID, _ string, _ []string) (map[string]any, error) {
	s.mu.Lock()
	u, ok := s.users[userID]
	s.mu.Unlock()
	if !ok {
		return nil, nil
	}
	return s.roleClaim(u), nil
}

// GetPrivateClaimsFromRequest implements op.CanGetPrivateClaimsFromRequest:
// the JWT access token carries the roles claim.
func (s *storage) GetPrivateClaimsFromRequest(ctx context.Context, r op.TokenRequest, scopes []string) (map[string]any, error) {
	return s.GetPrivateClaimsFromScopes(ctx, r.GetSubject(), "", scopes)
}

// GetKeyByIDAndClientID implements op.Storage (JWT profile grants: none).
func (s *storage) GetKeyByIDAndClientID(context.Context, string, string) (*jose.JSONWebKey, error) {
	return nil, errors.New("no client keys")
}

// ValidateJWTProfileScopes implements op.Storage.
func (s *storage) ValidateJWTProfileScopes(context.Context, string, []string) ([]string, error) {
	return nil, errors.New("JWT profile grant not supported")
}

// Health implements op.Storage.
func (s *storage) Health(context.Context) error { return nil }
