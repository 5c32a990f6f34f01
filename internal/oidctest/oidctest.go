// Package oidctest starts a real OpenID Connect provider in-process on
// 127.0.0.1 for tests: discovery, a JWKS, the authorization code flow with
// PKCE (S256, required by default), a username/password login form that a
// browser fills in, refresh tokens (rotated on every use), userinfo,
// revocation and end_session (RP-initiated logout), with a roles claim per
// user in the ID token and in the JWT access token.
//
// It is a real provider, not a stub: the protocol is served by
// github.com/zitadel/oidc/v3/pkg/op, a certified OpenID Provider library
// (the one ZITADEL is built on), which parses and validates the
// authorization and token requests, checks redirect URIs, PKCE verifiers
// and client credentials, and signs the tokens. This package only supplies
// what a deployment supplies — the users, one client, in-memory storage and
// the login page — so a relying party under test takes the same code paths
// as against Keycloak, Dex or Google: the browser is redirected to
// /authorize, fills in the form, comes back with a code, and the code is
// exchanged and the ID token verified against the published keys.
//
// Typical use, with the supervisor verifying the provider's access tokens:
//
//	idp := oidctest.Start(t, oidctest.User{Name: "alice", Password: "pw", Roles: []string{"viewer"}})
//	supervisorFlags := idp.SupervisorFlags()   // --auth-jwks-url, --auth-jwt-issuer, --auth-jwt-audience, --auth-jwt-roles-claim
//	consoleFlags := idp.ConsoleFlags()         // --oidc-issuer, --oidc-client-id, --oidc-client-secret-file
//
// A Go test signs in without a browser with Provider.Login; a Chromium
// test, once the browser shows the login page, with BrowserLogin (or by
// hand: the form's selectors are LoginForm, LoginUsername, LoginPassword,
// LoginSubmit and LoginError).
package oidctest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"
	"html/template"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/zitadel/oidc/v3/pkg/op"
	"golang.org/x/text/language"
)

// Selectors of the provider's login page, for browser tests.
const (
	LoginForm     = "form#login"
	LoginUsername = "#username"
	LoginPassword = "#password"
	LoginSubmit   = "#sign-in"
	// LoginError holds the reason a sign-in was refused ("wrong username
	// or password").
	LoginError = "#login-error"
)

// User is an account at the provider.
type User struct {
	// Name is the username typed in the login form, and the tokens' sub
	// and preferred_username.
	Name string
	// Password is typed in the login form.
	Password string
	// Roles go into the roles claim (Config.RolesClaim) of the ID token
	// and the access token.
	Roles []string
	// DisplayName is the name claim (scope profile); default: Name.
	DisplayName string
	// Email is the email claim (scope email).
	Email string
}

// Config configures a provider; zero fields take the defaults noted.
type Config struct {
	// Users who can sign in.
	Users []User
	// ClientID of the one registered client (default "planex-console").
	ClientID string
	// ClientSecret of the client (default: random). Public makes the
	// client public (no secret; PKCE only).
	ClientSecret string
	// Public registers a public client (token_endpoint_auth_method none).
	Public bool
	// Audience is added to the tokens' aud next to the client id (default
	// "planex"): the supervisor's --auth-jwt-audience.
	Audience string
	// RolesClaim names the claim carrying the roles (default "roles");
	// dots nest objects ("realm_access.roles", as Keycloak does).
	RolesClaim string
	// AccessTokenLifetime is the lifetime of access and ID tokens
	// (default 5 minutes).
	AccessTokenLifetime time.Duration
	// RefreshTokenLifetime (default 1 hour).
	RefreshTokenLifetime time.Duration
	// OpaqueAccessTokens issues opaque access tokens instead of JWTs (as
	// Google does); a relying party must then forward the ID token.
	OpaqueAccessTokens bool
	// AllowNoPKCE accepts authorization requests without a PKCE
	// challenge; by default they are refused.
	AllowNoPKCE bool
}

// Provider is a running OpenID provider.
type Provider struct {
	// Issuer is the provider's issuer URL (http://127.0.0.1:<port>).
	Issuer string
	// ClientID and ClientSecret are the registered client's ("" secret
	// for a public client); ClientSecretFile holds the secret (the
	// console's --oidc-client-secret-file).
	ClientID, ClientSecret, ClientSecretFile string
	// Audience, in every token's aud: the supervisor's
	// --auth-jwt-audience.
	Audience string
	// RolesClaim is the claim holding roles: the supervisor's
	// --auth-jwt-roles-claim.
	RolesClaim string
	// JWKSURL is the provider's key set: the supervisor's --auth-jwks-url.
	JWKSURL string

	store *storage
}

// Start starts a provider with users and the default configuration; it
// stops when the test ends.
func Start(t testing.TB, users ...User) *Provider {
	t.Helper()
	return StartConfig(t, Config{Users: users})
}

// StartConfig starts a provider configured by cfg; it stops when the test
// ends.
func StartConfig(t testing.TB, cfg Config) *Provider {
	t.Helper()
	p, stop, err := New(cfg, t.TempDir())
	if err != nil {
		t.Fatalf("oidctest: %v", err)
	}
	t.Cleanup(stop)
	return p
}

// New starts a provider outside a test (a demo, a benchmark): the client
// secret file is written to dir. stop shuts it down.
func New(cfg Config, dir string) (p *Provider, stop func(), err error) {
	if cfg.ClientID == "" {
		cfg.ClientID = "planex-console"
	}
	if cfg.Public {
		cfg.ClientSecret = ""
	} else if cfg.ClientSecret == "" {
		cfg.ClientSecret = randomID()
	}
	cfg.Audience = cmpOr(cfg.Audience, "planex")
	cfg.RolesClaim = cmpOr(cfg.RolesClaim, "roles")
	if cfg.AccessTokenLifetime <= 0 {
		cfg.AccessTokenLifetime = 5 * time.Minute
	}
	if cfg.RefreshTokenLifetime <= 0 {
		cfg.RefreshTokenLifetime = time.Hour
	}
	users := map[string]User{}
	for _, u := range cfg.Users {
		if u.Name == "" || u.Password == "" {
			return nil, nil, errors.New("a user needs a Name and a Password")
		}
		if u.DisplayName == "" {
			u.DisplayName = u.Name
		}
		users[u.Name] = u
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	issuer := "http://" + ln.Addr().String()
	store := &storage{cfg: cfg, users: users, key: signingKey{id: randomID()[:12], key: key},
		authRequests: map[string]*authRequest{}, codes: map[string]string{},
		accessTokens: map[string]*accessToken{}, refreshTokens: map[string]*refreshToken{}}
	store.requirePKCE = !cfg.AllowNoPKCE
	var cryptoKey [32]byte
	_, _ = rand.Read(cryptoKey[:])
	provider, err := op.NewProvider(&op.Config{
		CryptoKey:                cryptoKey,
		CryptoKeyId:              "oidctest",
		DefaultLogoutRedirectURI: "/logged-out",
		CodeMethodS256:           true,
		AuthMethodPost:           true,
		GrantTypeRefreshToken:    true,
		SupportedUILocales:       []language.Tag{language.English},
	}, store, op.StaticIssuer(issuer), op.WithAllowInsecure())
	if err != nil {
		ln.Close()
		return nil, nil, fmt.Errorf("provider: %w", err)
	}
	mux := http.NewServeMux()
	login := &loginUI{store: store, callback: op.AuthCallbackURL(provider)}
	intercept := op.NewIssuerInterceptor(provider.IssuerFromRequest)
	mux.HandleFunc("GET /login", login.form)
	mux.Handle("POST /login", intercept.HandlerFunc(login.submit))
	mux.HandleFunc("GET /logged-out", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "signed out of the test provider")
	})
	mux.Handle("/", provider)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()

	p = &Provider{Issuer: issuer, ClientID: cfg.ClientID, ClientSecret: cfg.ClientSecret, Audience: cfg.Audience,
		RolesClaim: cfg.RolesClaim, JWKSURL: issuer + "/keys", store: store}
	if !cfg.Public {
		p.ClientSecretFile = filepath.Join(dir, "oidc-client-secret")
		if err := os.WriteFile(p.ClientSecretFile, []byte(cfg.ClientSecret+"\n"), 0o600); err != nil {
			srv.Close()
			return nil, nil, err
		}
	}
	return p, func() { _ = srv.Close() }, nil
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// SupervisorFlags are the supervisor flags that make it verify this
// provider's access tokens: --auth-jwks-url, --auth-jwt-issuer,
// --auth-jwt-audience and --auth-jwt-roles-claim.
func (p *Provider) SupervisorFlags() []string {
	return []string{"--auth-jwks-url=" + p.JWKSURL, "--auth-jwt-issuer=" + p.Issuer,
		"--auth-jwt-audience=" + p.Audience, "--auth-jwt-roles-claim=" + p.RolesClaim}
}

// ConsoleFlags are the `planex console` flags signing in through this
// provider: --oidc-issuer, --oidc-client-id and (unless the client is
// public) --oidc-client-secret-file.
func (p *Provider) ConsoleFlags() []string {
	f := []string{"--oidc-issuer=" + p.Issuer, "--oidc-client-id=" + p.ClientID}
	if p.ClientSecretFile != "" {
		f = append(f, "--oidc-client-secret-file="+p.ClientSecretFile)
	}
	return f
}

// EndSessions are the users whose session ended at the provider's
// end_session endpoint (RP-initiated logout), in order.
func (p *Provider) EndSessions() []string {
	p.store.mu.Lock()
	defer p.store.mu.Unlock()
	return slices.Clone(p.store.endSessions)
}

// Refreshes counts refresh token grants served.
func (p *Provider) Refreshes() int {
	p.store.mu.Lock()
	defer p.store.mu.Unlock()
	return p.store.refreshes
}

// Revoke revokes every access and refresh token of user (an administrator
// disabling a session): the next refresh fails.
func (p *Provider) Revoke(user string) {
	p.store.mu.Lock()
	defer p.store.mu.Unlock()
	p.store.revokeLocked(user, "")
}

// loginUI is the provider's login page: a username/password form for an
// auth request, whose success sends the browser back to the OP's
// callback, which redirects to the client with a code.
type loginUI struct {
	store    *storage
	callback func(context.Context, string) string
}

var loginPage = template.Must(template.New("login").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sign in · planex test provider</title></head>
<body><main>
<h1>planex test provider</h1>
<form id="login" method="POST" action="/login">
<input type="hidden" name="id" value="{{.ID}}">
<p><label for="username">Username</label> <input id="username" name="username" autocomplete="username" value="{{.Username}}"></p>
<p><label for="password">Password</label> <input id="password" name="password" type="password" autocomplete="current-password"></p>
<p id="login-error" role="alert">{{.Error}}</p>
<button id="sign-in" type="submit">Sign in</button>
</form></main></body></html>`))

func (l *loginUI) render(w http.ResponseWriter, status int, id, username, msg string) {
	var b bytes.Buffer
	if err := loginPage.Execute(&b, struct{ ID, Username, Error string }{id, username, msg}); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

func (l *loginUI) form(w http.ResponseWriter, r *http.Request) {
	l.render(w, http.StatusOK, r.URL.Query().Get("authRequestID"), "", "")
}

func (l *loginUI) submit(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		l.render(w, http.StatusBadRequest, "", "", "bad form: "+err.Error())
		return
	}
	id, name := r.PostFormValue("id"), r.PostFormValue("username")
	if err := l.store.checkLogin(id, name, r.PostFormValue("password")); err != nil {
		l.render(w, http.StatusUnauthorized, id, name, err.Error())
		return
	}
	http.Redirect(w, r, l.callback(r.Context(), id), http.StatusFound)
}

var hiddenID = regexp.MustCompile(`name="id" value="([^"]*)"`)

// Login plays a browser's part in the authorization code flow without a
// browser: it opens authURL (the relying party's redirect to the
// provider) with client, fills in the login form as user, and follows the
// provider's redirects until one leaves the provider. It returns that URL
// (the relying party's redirect URI with code and state, or with error),
// without requesting it. client must not follow redirects itself beyond
// what CheckRedirect allows; its jar, if any, is used.
func (p *Provider) Login(ctx context.Context, client *http.Client, authURL, user, password string) (*url.URL, error) {
	c := *client
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	next, err := url.Parse(authURL)
	if err != nil {
		return nil, fmt.Errorf("auth URL: %w", err)
	}
	var form url.Values
	for range 10 {
		if !strings.HasPrefix(next.String(), p.Issuer+"/") {
			return next, nil
		}
		var req *http.Request
		if form != nil {
			req, err = http.NewRequestWithContext(ctx, http.MethodPost, next.String(), strings.NewReader(form.Encode()))
			if req != nil {
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			}
			form = nil
		} else {
			req, err = http.NewRequestWithContext(ctx, http.MethodGet, next.String(), nil)
		}
		if err != nil {
			return nil, err
		}
		resp, err := c.Do(req)
		if err != nil {
			return nil, err
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		switch {
		case resp.StatusCode >= 300 && resp.StatusCode < 400:
			loc, err := resp.Location()
			if err != nil {
				return nil, fmt.Errorf("redirect from %s: %w", req.URL.Path, err)
			}
			next = loc
		case resp.StatusCode == http.StatusOK && req.URL.Path == "/login":
			m := hiddenID.FindSubmatch(body)
			if m == nil {
				return nil, errors.New("login page without an auth request id")
			}
			form = url.Values{"id": {string(m[1])}, "username": {user}, "password": {password}}
			next = req.URL.ResolveReference(&url.URL{Path: "/login"})
		default:
			msg := string(body)
			if m := regexp.MustCompile(`(?s)id="login-error" role="alert">([^<]*)<`).FindStringSubmatch(msg); m != nil {
				msg = m[1]
			}
			return nil, fmt.Errorf("%s %s: HTTP %d: %s", req.Method, req.URL.Path, resp.StatusCode, strings.TrimSpace(msg))
		}
	}
	return nil, errors.New("too many redirects at the provider")
}

// BrowserLogin fills in the provider's login form in the chromedp tab ctx
// (which has been sent to the provider, e.g. by clicking the relying
// party's "Sign in with …" button) and submits it. The browser then
// follows the provider's redirects back to the relying party.
func BrowserLogin(ctx context.Context, user, password string) error {
	return chromedp.Do(ctx,
		chromedp.WaitVisible(chromedp.CSS(LoginUsername)),
		chromedp.SetValue(chromedp.CSS(LoginUsername), user),
		chromedp.SetValue(chromedp.CSS(LoginPassword), password),
		chromedp.Click(chromedp.CSS(LoginSubmit)),
	)
}
