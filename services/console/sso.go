package console

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/spf13/pflag"
	"golang.org/x/oauth2"

	"github.com/planex-dev/planex/internal/authn"
)

// OIDCConfig configures single sign-on with an OpenID Connect provider
// (authorization code flow with PKCE). An empty Issuer turns it off.
type OIDCConfig struct {
	// Issuer is the provider's issuer URL (discovery at
	// <issuer>/.well-known/openid-configuration).
	Issuer string
	// ClientID is the console's client id at the provider.
	ClientID string
	// ClientSecretFile holds the client secret; empty: a public client
	// (PKCE only).
	ClientSecretFile string
	// RedirectURL is the console's callback registered at the provider;
	// empty: <the URL the browser reached the console by>/auth/callback.
	RedirectURL string
	// Scopes requested; they must include openid.
	Scopes []string
	// Audience, when set, is sent as the audience parameter of the
	// authorization request (providers such as Auth0 issue a JWT access
	// token for that API only when asked).
	Audience string
	// RolesClaim is the claim /auth/me reads roles from (the supervisor's
	// --auth-jwt-roles-claim; the supervisor decides, the page shows).
	RolesClaim string
	// ProviderName is shown on the sign-in button ("Sign in with …");
	// empty: the issuer's host name.
	ProviderName string
	// ForwardToken says which token the console sends the supervisor:
	// "access" (the access token, which must be a JWT for the
	// supervisor's audience), "id" (the ID token: audience = client id)
	// or "auto" (the access token when it is a JWT, else the ID token).
	ForwardToken string
	// SessionMaxAge ends a session this long after sign-in, refresh tokens
	// or not.
	SessionMaxAge time.Duration
}

// Enabled reports whether single sign-on is configured.
func (c OIDCConfig) Enabled() bool { return c.Issuer != "" }

// registerFlags adds the --oidc-* flags.
func (c *OIDCConfig) registerFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Issuer, "oidc-issuer", "", "OpenID Connect issuer URL for single sign-on (authorization code flow with PKCE); empty: bearer-token sign-in only")
	fs.StringVar(&c.ClientID, "oidc-client-id", "", "the console's client id at --oidc-issuer")
	fs.StringVar(&c.ClientSecretFile, "oidc-client-secret-file", "", "file holding the client secret (unset: a public client, PKCE only)")
	fs.StringVar(&c.RedirectURL, "oidc-redirect-url", "", "callback URL registered at the provider (default: the console's own URL + /auth/callback, from the Host the browser used)")
	fs.StringSliceVar(&c.Scopes, "oidc-scopes", []string{"openid", "profile", "email", "offline_access"}, "scopes to request (must include openid; offline_access gets a refresh token; add the provider's roles/groups scope if it needs one)")
	fs.StringVar(&c.Audience, "oidc-audience", "", "audience parameter of the authorization request, for providers that issue a JWT access token per API (Auth0)")
	fs.StringVar(&c.RolesClaim, "oidc-roles-claim", "roles", "claim holding planex roles, shown on the page (set it like the supervisor's --auth-jwt-roles-claim)")
	fs.StringVar(&c.ProviderName, "oidc-provider-name", "", `name on the sign-in button, "Sign in with <name>" (default: the issuer's host)`)
	fs.StringVar(&c.ForwardToken, "oidc-forward-token", "auto", "token forwarded to the supervisor: access (a JWT for the supervisor's audience), id (the ID token) or auto (the access token when it is a JWT, else the ID token)")
	fs.DurationVar(&c.SessionMaxAge, "oidc-session-max-age", 12*time.Hour, "a signed-in session ends this long after sign-in, even while its tokens refresh")
}

// validate checks the single sign-on flags; errors name the flag.
func (c OIDCConfig) validate(forwardTokens bool) error {
	if !c.Enabled() {
		for flag, v := range map[string]string{"--oidc-client-id": c.ClientID, "--oidc-client-secret-file": c.ClientSecretFile,
			"--oidc-redirect-url": c.RedirectURL, "--oidc-audience": c.Audience} {
			if v != "" {
				return fmt.Errorf("%s: needs --oidc-issuer", flag)
			}
		}
		return nil
	}
	u, err := url.Parse(c.Issuer)
	if err != nil || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || (u.Scheme != "https" && u.Scheme != "http") {
		return fmt.Errorf("--oidc-issuer %q: want an https URL without query or fragment", c.Issuer)
	}
	if u.Scheme == "http" && !loopback(u.Hostname()) {
		return fmt.Errorf("--oidc-issuer %q: http only for a provider on loopback; use https", c.Issuer)
	}
	if c.ClientID == "" {
		return errors.New("--oidc-client-id: required with --oidc-issuer")
	}
	if c.ClientSecretFile != "" {
		if _, err := readSecretFile(c.ClientSecretFile); err != nil {
			return fmt.Errorf("--oidc-client-secret-file: %w", err)
		}
	}
	if c.RedirectURL != "" {
		r, err := url.Parse(c.RedirectURL)
		if err != nil || r.Host == "" || r.Fragment != "" || (r.Scheme != "https" && r.Scheme != "http") {
			return fmt.Errorf("--oidc-redirect-url %q: want an absolute http(s) URL", c.RedirectURL)
		}
		if r.Scheme == "http" && !loopback(r.Hostname()) {
			return fmt.Errorf("--oidc-redirect-url %q: http only on loopback; use https", c.RedirectURL)
		}
		if r.Path != "/auth/callback" {
			return fmt.Errorf("--oidc-redirect-url %q: the console's callback path is /auth/callback", c.RedirectURL)
		}
	}
	if !slices.Contains(c.Scopes, oidc.ScopeOpenID) {
		return fmt.Errorf("--oidc-scopes %q: must include openid", strings.Join(c.Scopes, ","))
	}
	switch c.ForwardToken {
	case "auto", "access", "id":
	default:
		return fmt.Errorf("--oidc-forward-token %q: want auto, access or id", c.ForwardToken)
	}
	if c.SessionMaxAge <= 0 {
		return fmt.Errorf("--oidc-session-max-age %s: want a positive duration", c.SessionMaxAge)
	}
	if !forwardTokens {
		return errors.New("--oidc-issuer: the supervisor connection is --plaintext, and tokens are only forwarded over TLS")
	}
	return nil
}

// readSecretFile reads a non-empty secret, trimmed of surrounding space.
func readSecretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", errors.New("empty")
	}
	return s, nil
}

// csrfHeader carries the session's CSRF token on every state-changing
// request the page authenticates with the session cookie.
const csrfHeader = "X-CSRF-Token"

// loginTTL bounds a sign-in from /auth/login to /auth/callback.
const loginTTL = 10 * time.Minute

// sso serves /auth/* and authenticates cookie-carrying API requests with
// the session's token.
type sso struct {
	cfg           OIDCConfig
	clientSecret  string
	secure        bool   // cookies Secure with the __Host- prefix
	scheme        string // of the console's own URL
	sessionCookie string
	loginCookie   string
	aead          cipher.AEAD // seals the login cookie
	store         *sessionStore
	logger        *slog.Logger
	httpClient    *http.Client
	now           func() time.Time

	mu         sync.Mutex
	provider   *oidc.Provider
	verifier   *oidc.IDTokenVerifier
	endSession string
}

// newSSO prepares single sign-on; the provider is discovered on first use,
// so the console starts while the provider is still coming up.
func newSSO(cfg Config, logger *slog.Logger) (*sso, error) {
	c := cfg.OIDC
	s := &sso{cfg: c, logger: logger, now: time.Now, scheme: "http",
		store:      newSessionStore(10000),
		httpClient: &http.Client{Timeout: 15 * time.Second}}
	if c.ClientSecretFile != "" {
		secret, err := readSecretFile(c.ClientSecretFile)
		if err != nil {
			return nil, fmt.Errorf("--oidc-client-secret-file: %w", err)
		}
		s.clientSecret = secret
	}
	if cfg.TLSCertFile != "" {
		s.scheme = "https"
	}
	// Cookies are Secure (and __Host-) whenever browsers reach the console
	// over https; only a console on plain-HTTP loopback (the only place
	// Validate lets it serve HTTP) uses unprefixed, non-Secure cookies,
	// which browsers would otherwise drop.
	s.secure = s.scheme == "https" || strings.HasPrefix(c.RedirectURL, "https://")
	s.sessionCookie, s.loginCookie = "planex_session", "planex_login"
	if s.secure {
		s.sessionCookie, s.loginCookie = "__Host-planex_session", "__Host-planex_login"
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	if s.aead, err = cipher.NewGCM(block); err != nil {
		return nil, err
	}
	return s, nil
}

// discover fetches the provider's metadata once (retried on the next use
// after a failure).
func (s *sso) discover(ctx context.Context) (*oidc.Provider, *oidc.IDTokenVerifier, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.provider != nil {
		return s.provider, s.verifier, nil
	}
	ctx, cancel := context.WithTimeout(oidc.ClientContext(context.WithoutCancel(ctx), s.httpClient), 15*time.Second)
	defer cancel()
	p, err := oidc.NewProvider(ctx, s.cfg.Issuer)
	if err != nil {
		return nil, nil, fmt.Errorf("OIDC discovery at %s: %w", s.cfg.Issuer, err)
	}
	var meta struct {
		EndSession string `json:"end_session_endpoint"`
	}
	_ = p.Claims(&meta)
	s.provider, s.endSession = p, meta.EndSession
	s.verifier = p.VerifierContext(oidc.ClientContext(context.Background(), s.httpClient), &oidc.Config{ClientID: s.cfg.ClientID})
	return s.provider, s.verifier, nil
}

// oauthConfig is the client configuration for redirectURL.
func (s *sso) oauthConfig(p *oidc.Provider, redirectURL string) *oauth2.Config {
	ep := p.Endpoint()
	if s.clientSecret == "" {
		ep.AuthStyle = oauth2.AuthStyleInParams // a public client sends only client_id
	}
	return &oauth2.Config{ClientID: s.cfg.ClientID, ClientSecret: s.clientSecret, Endpoint: ep,
		RedirectURL: redirectURL, Scopes: s.cfg.Scopes}
}

// baseURL is the console's URL as the browser reached it (r.Host passed
// the host check), or that of --oidc-redirect-url.
func (s *sso) baseURL(r *http.Request) string {
	if s.cfg.RedirectURL != "" {
		u, _ := url.Parse(s.cfg.RedirectURL)
		return u.Scheme + "://" + u.Host
	}
	return s.scheme + "://" + r.Host
}

func (s *sso) redirectURL(r *http.Request) string {
	if s.cfg.RedirectURL != "" {
		return s.cfg.RedirectURL
	}
	return s.baseURL(r) + "/auth/callback"
}

func (s *sso) httpCtx(ctx context.Context) context.Context {
	return oidc.ClientContext(ctx, s.httpClient)
}

// routes adds the /auth/ endpoints to mux.
func (s *sso) routes(mux *http.ServeMux) {
	mux.HandleFunc("GET /auth/login", s.login)
	mux.HandleFunc("GET /auth/callback", s.callback)
	mux.HandleFunc("POST /auth/logout", s.logout)
	mux.HandleFunc("GET /auth/me", s.me)
}

// loginState is what the login cookie carries from /auth/login to
// /auth/callback, sealed (AES-GCM with a key of this process: encrypted
// and authenticated).
type loginState struct {
	State    string    `json:"s"`
	Nonce    string    `json:"n"`
	Verifier string    `json:"v"`
	Redirect string    `json:"r"`
	Next     string    `json:"x,omitempty"`
	Expires  time.Time `json:"e"`
}

func (s *sso) seal(ls loginState) (string, error) {
	b, err := json.Marshal(ls)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(s.aead.Seal(nonce, nonce, b, []byte(s.loginCookie))), nil
}

func (s *sso) open(v string) (loginState, error) {
	var ls loginState
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil || len(b) < s.aead.NonceSize() {
		return ls, errors.New("malformed")
	}
	plain, err := s.aead.Open(nil, b[:s.aead.NonceSize()], b[s.aead.NonceSize():], []byte(s.loginCookie))
	if err != nil {
		return ls, errors.New("not sealed by this console")
	}
	if err := json.Unmarshal(plain, &ls); err != nil {
		return ls, errors.New("malformed")
	}
	if s.now().After(ls.Expires) {
		return ls, errors.New("expired")
	}
	return ls, nil
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// nextRoute is a page route to land on after sign-in ("#/gates?run=…").
var nextRoute = regexp.MustCompile(`^#/[A-Za-z0-9/_?=&%.,:+-]{0,200}$`)

func (s *sso) setCookie(w http.ResponseWriter, name, value string, maxAge int, sameSite http.SameSite) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: value, Path: "/", MaxAge: maxAge, HttpOnly: true, Secure: s.secure, SameSite: sameSite})
}

// login starts the authorization code flow: state, nonce and the PKCE
// verifier go into a short-lived sealed cookie, the browser to the
// provider.
func (s *sso) login(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	p, _, err := s.discover(r.Context())
	if err != nil {
		s.logger.Warn("console: sign-in", "err", err)
		http.Error(w, "console: the sign-in provider is unreachable: "+err.Error(), http.StatusBadGateway)
		return
	}
	ls := loginState{State: randomToken(), Nonce: randomToken(), Verifier: oauth2.GenerateVerifier(),
		Redirect: s.redirectURL(r), Expires: s.now().Add(loginTTL)}
	if next := r.URL.Query().Get("next"); nextRoute.MatchString(next) {
		ls.Next = next
	}
	sealed, err := s.seal(ls)
	if err != nil {
		http.Error(w, "console: sign-in: "+err.Error(), http.StatusInternalServerError)
		return
	}
	// Lax, not Strict: the provider sends the browser back with a
	// cross-site top-level GET, which must carry this cookie.
	s.setCookie(w, s.loginCookie, sealed, int(loginTTL/time.Second), http.SameSiteLaxMode)
	opts := []oauth2.AuthCodeOption{oauth2.S256ChallengeOption(ls.Verifier), oidc.Nonce(ls.Nonce)}
	if s.cfg.Audience != "" {
		opts = append(opts, oauth2.SetAuthURLParam("audience", s.cfg.Audience))
	}
	http.Redirect(w, r, s.oauthConfig(p, ls.Redirect).AuthCodeURL(ls.State, opts...), http.StatusFound)
}

// refuse answers a failed sign-in with a plain page naming why.
func (s *sso) refuse(w http.ResponseWriter, code int, why string) {
	s.logger.Warn("console: sign-in refused", "why", why)
	http.Error(w, "console: sign-in refused: "+why+"\nStart again from the console's sign-in page.", code)
}

// callback completes the flow: the state must match the login cookie's,
// the code is exchanged with the PKCE verifier, the ID token verified
// (issuer, audience, expiry, signature) and its nonce checked; then a
// server-side session is created and its id set in the session cookie.
func (s *sso) callback(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	c, err := r.Cookie(s.loginCookie)
	if err != nil {
		s.refuse(w, http.StatusBadRequest, "no sign-in in progress in this browser (the sign-in cookie is missing)")
		return
	}
	s.setCookie(w, s.loginCookie, "", -1, http.SameSiteLaxMode) // one use
	ls, err := s.open(c.Value)
	if err != nil {
		s.refuse(w, http.StatusBadRequest, "the sign-in cookie is "+err.Error())
		return
	}
	q := r.URL.Query()
	if e := q.Get("error"); e != "" {
		s.refuse(w, http.StatusForbidden, "the provider answered "+e+": "+q.Get("error_description"))
		return
	}
	if subtle.ConstantTimeCompare([]byte(q.Get("state")), []byte(ls.State)) != 1 {
		s.refuse(w, http.StatusBadRequest, "state does not match this browser's sign-in")
		return
	}
	code := q.Get("code")
	if code == "" || ls.Verifier == "" || ls.Nonce == "" {
		s.refuse(w, http.StatusBadRequest, "no code, or the sign-in cookie lacks the PKCE verifier or nonce")
		return
	}
	p, verifier, err := s.discover(r.Context())
	if err != nil {
		http.Error(w, "console: the sign-in provider is unreachable: "+err.Error(), http.StatusBadGateway)
		return
	}
	ctx, cancel := context.WithTimeout(s.httpCtx(context.WithoutCancel(r.Context())), 15*time.Second)
	defer cancel()
	tok, err := s.oauthConfig(p, ls.Redirect).Exchange(ctx, code, oauth2.VerifierOption(ls.Verifier))
	if err != nil {
		s.refuse(w, http.StatusBadRequest, "the provider did not accept the code: "+oauthError(err))
		return
	}
	rawID, _ := tok.Extra("id_token").(string)
	if rawID == "" {
		s.refuse(w, http.StatusBadGateway, "the provider returned no ID token (is openid among --oidc-scopes?)")
		return
	}
	idt, err := verifier.Verify(ctx, rawID)
	if err != nil {
		s.refuse(w, http.StatusBadRequest, "ID token: "+err.Error())
		return
	}
	if subtle.ConstantTimeCompare([]byte(idt.Nonce), []byte(ls.Nonce)) != 1 {
		s.refuse(w, http.StatusBadRequest, "the ID token's nonce does not match this browser's sign-in")
		return
	}
	if idt.AccessTokenHash != "" {
		if err := idt.VerifyAccessToken(tok.AccessToken); err != nil {
			s.refuse(w, http.StatusBadRequest, "ID token: "+err.Error())
			return
		}
	}
	sess := &session{id: randomToken(), csrf: randomToken(), created: s.now()}
	if err := s.apply(sess, tok, rawID, idt); err != nil {
		s.refuse(w, http.StatusBadGateway, err.Error())
		return
	}
	s.store.put(sess, s.now(), s.cfg.SessionMaxAge)
	s.setCookie(w, s.sessionCookie, sess.id, 0, http.SameSiteStrictMode)
	s.logger.Info("console: signed in", "subject", sess.subject, "roles", sess.roles)
	http.Redirect(w, r, "/"+cmpOr(ls.Next, "#/runs"), http.StatusSeeOther)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// oauthError describes a token endpoint error without the response body
// (which could echo a token).
func oauthError(err error) string {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		if re.ErrorCode != "" {
			return strings.TrimSpace(re.ErrorCode + ": " + re.ErrorDescription)
		}
		return "HTTP " + re.Response.Status
	}
	return err.Error()
}

// apply stores tokens in sess: the ID token's identity, the token to
// forward and its expiry and roles. idt is the verified rawID.
func (s *sso) apply(sess *session, tok *oauth2.Token, rawID string, idt *oidc.IDToken) error {
	var claims struct {
		Name              string `json:"name"`
		PreferredUsername string `json:"preferred_username"`
		Email             string `json:"email"`
	}
	if idt != nil {
		if sess.subject != "" && idt.Subject != sess.subject {
			return errors.New("the refreshed ID token names another subject")
		}
		_ = idt.Claims(&claims)
		sess.subject, sess.idToken, sess.idExpiry = idt.Subject, rawID, idt.Expiry
		sess.name = cmpOr(cmpOr(claims.Name, claims.PreferredUsername), cmpOr(claims.Email, idt.Subject))
		sess.email = claims.Email
	}
	sess.accessToken = tok.AccessToken
	if tok.RefreshToken != "" {
		sess.refreshToken = tok.RefreshToken
	}
	accessJWT := jwtPayload(tok.AccessToken) != nil
	switch {
	case s.cfg.ForwardToken == "access" && !accessJWT:
		return errors.New("the provider's access token is not a JWT, which --oidc-forward-token=access needs (use id or auto)")
	case s.cfg.ForwardToken == "access" || (s.cfg.ForwardToken == "auto" && accessJWT):
		sess.forward, sess.forwardKind = tok.AccessToken, "access"
	default:
		sess.forward, sess.forwardKind = sess.idToken, "id"
	}
	payload := jwtPayload(sess.forward)
	sess.expiry = tok.Expiry
	if exp, ok := payload["exp"].(float64); ok {
		sess.expiry = time.Unix(int64(exp), 0)
	} else if sess.forwardKind == "id" {
		sess.expiry = sess.idExpiry
	}
	if sess.expiry.IsZero() {
		return errors.New("the forwarded token has no expiry")
	}
	sess.roles = rolesOf(payload, s.cfg.RolesClaim)
	sess.issued = s.now()
	return nil
}

// jwtPayload decodes a JWT's claims without verifying them (the console
// only reads what it shows; the supervisor verifies), nil if tok is not
// a JWT.
func jwtPayload(tok string) map[string]any {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return nil
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil
	}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	return m
}

// rolesOf reads the planex roles of claim (dots walk into objects; a list
// or a space-separated string), as the supervisor does.
func rolesOf(claims map[string]any, claim string) []string {
	var cur any = claims
	for _, p := range strings.Split(claim, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[p]
	}
	var names []string
	switch v := cur.(type) {
	case string:
		names = strings.Fields(v)
	case []any:
		for _, x := range v {
			if s, ok := x.(string); ok {
				names = append(names, s)
			}
		}
	}
	var out []string
	for _, n := range names {
		if r, err := authn.ParseRole(n); err == nil && !slices.Contains(out, r.String()) {
			out = append(out, r.String())
		}
	}
	return out
}

// errSessionEnded: the session is unknown, expired or past its maximum
// age; the page signs in again.
var errSessionEnded = errors.New("the sign-in session ended; sign in again")

// active returns the cookie's session, refreshing its tokens shortly
// before they expire; a session that cannot be refreshed past its expiry
// is ended.
func (s *sso) active(ctx context.Context, id string) (sessionView, error) {
	sess := s.store.get(id)
	if sess == nil {
		return sessionView{}, errSessionEnded
	}
	sess.mu.Lock()
	defer sess.mu.Unlock()
	now := s.now()
	if now.After(sess.created.Add(s.cfg.SessionMaxAge)) {
		s.store.remove(id)
		return sessionView{}, errSessionEnded
	}
	margin := min(time.Minute, sess.expiry.Sub(sess.issued)/2)
	if now.Add(margin).Before(sess.expiry) {
		return sess.view(), nil
	}
	if sess.refreshToken != "" {
		err := s.refresh(ctx, sess)
		if err == nil {
			return sess.view(), nil
		}
		s.logger.Warn("console: token refresh failed", "subject", sess.subject, "err", err)
	}
	if now.Before(sess.expiry) {
		return sess.view(), nil // still valid; refreshing again on the next request
	}
	s.store.remove(id)
	return sessionView{}, errSessionEnded
}

// refresh redeems the session's refresh token (sess.mu held).
func (s *sso) refresh(ctx context.Context, sess *session) error {
	p, verifier, err := s.discover(ctx)
	if err != nil {
		return err
	}
	// Not cancelled with the request: a rotated refresh token must not be
	// lost because the browser went away mid-call.
	ctx, cancel := context.WithTimeout(s.httpCtx(context.WithoutCancel(ctx)), 15*time.Second)
	defer cancel()
	tok, err := s.oauthConfig(p, "").TokenSource(ctx, &oauth2.Token{RefreshToken: sess.refreshToken}).Token()
	if err != nil {
		return errors.New(oauthError(err))
	}
	rawID, _ := tok.Extra("id_token").(string)
	var idt *oidc.IDToken
	if rawID != "" {
		if idt, err = verifier.Verify(ctx, rawID); err != nil {
			return fmt.Errorf("refreshed ID token: %w", err)
		}
	}
	return s.apply(sess, tok, rawID, idt)
}

// sessionOf returns the request's session cookie value, "" if none.
func (s *sso) sessionOf(r *http.Request) string {
	c, err := r.Cookie(s.sessionCookie)
	if err != nil {
		return ""
	}
	return c.Value
}

func (s *sso) clearSession(w http.ResponseWriter) {
	s.setCookie(w, s.sessionCookie, "", -1, http.SameSiteStrictMode)
}

// csrfOK reports whether r carries the CSRF token csrf.
func csrfOK(r *http.Request, csrf string) bool {
	got := r.Header.Get(csrfHeader)
	return got != "" && csrf != "" && subtle.ConstantTimeCompare([]byte(got), []byte(csrf)) == 1
}

// meResponse is /auth/me: whether SSO is configured and who is signed in.
type meResponse struct {
	SSO       *ssoInfo `json:"sso"`
	SignedIn  bool     `json:"signedIn"`
	Subject   string   `json:"subject,omitempty"`
	Name      string   `json:"name,omitempty"`
	Email     string   `json:"email,omitempty"`
	Roles     []string `json:"roles,omitempty"`
	ExpiresAt string   `json:"expiresAt,omitempty"`
	// Forwarded says which token goes to the supervisor: "access" or "id".
	Forwarded string `json:"forwardedToken,omitempty"`
	CSRFToken string `json:"csrfToken,omitempty"`
}

type ssoInfo struct {
	Provider string `json:"provider"`
	LoginURL string `json:"loginURL"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *sso) providerName() string {
	if s.cfg.ProviderName != "" {
		return s.cfg.ProviderName
	}
	u, _ := url.Parse(s.cfg.Issuer)
	return u.Host
}

// me tells the page whether SSO is configured and who is signed in, with
// the session's CSRF token (a cross-origin page cannot read it: no CORS).
func (s *sso) me(w http.ResponseWriter, r *http.Request) {
	resp := meResponse{SSO: &ssoInfo{Provider: s.providerName(), LoginURL: "/auth/login"}}
	if id := s.sessionOf(r); id != "" {
		sess, err := s.active(r.Context(), id)
		if err != nil {
			s.clearSession(w)
		} else {
			resp.SignedIn, resp.Subject, resp.Name, resp.Email, resp.CSRFToken = true, sess.subject, sess.name, sess.email, sess.csrf
			resp.Roles, resp.ExpiresAt, resp.Forwarded = sess.roles, sess.expiry.UTC().Format(time.RFC3339), sess.forwardKind
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

// logout ends the session (CSRF-checked) and tells the page where to end
// it at the provider too, when the provider has an end_session_endpoint.
func (s *sso) logout(w http.ResponseWriter, r *http.Request) {
	id := s.sessionOf(r)
	sess := s.store.get(id)
	if sess == nil {
		s.clearSession(w)
		writeJSON(w, http.StatusOK, map[string]string{})
		return
	}
	if !csrfOK(r, sess.csrf) {
		http.Error(w, "console: "+csrfHeader+" missing or wrong", http.StatusForbidden)
		return
	}
	sess.mu.Lock()
	idToken, subject := sess.idToken, sess.subject
	sess.mu.Unlock()
	s.store.remove(id)
	s.clearSession(w)
	s.logger.Info("console: signed out", "subject", subject)
	out := map[string]string{}
	if _, _, err := s.discover(r.Context()); err == nil && s.endSession != "" {
		u, err := url.Parse(s.endSession)
		if err == nil {
			q := u.Query()
			q.Set("client_id", s.cfg.ClientID)
			q.Set("id_token_hint", idToken)
			q.Set("post_logout_redirect_uri", s.baseURL(r)+"/")
			u.RawQuery = q.Encode()
			out["endSessionURL"] = u.String()
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// connectContentType reports whether ct is one of the API's content
// types: none is CORS-simple, so a cross-site page cannot send one without
// a preflight (which the console never grants).
func connectContentType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || mt == "application/proto" || strings.HasPrefix(mt, "application/connect+") ||
		strings.HasPrefix(mt, "application/grpc")
}

// writeConnectError writes a Connect-protocol error (unary JSON form,
// which the page's client also reads for streams that fail before
// starting).
func writeConnectError(w http.ResponseWriter, httpCode int, code, msg string) {
	writeJSON(w, httpCode, map[string]string{"code": code, "message": msg})
}

// wrapAPI authenticates an API request that carries the session cookie
// and no Authorization header: it must carry the session's CSRF token and
// a Connect content type (fail closed: 403), and is forwarded with the
// session's token. Requests with an Authorization header (the pasted
// bearer token, the CLI) pass unchanged.
func (s *sso) wrapAPI(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := s.sessionOf(r)
		if id == "" || r.Header.Get("Authorization") != "" {
			next.ServeHTTP(w, r)
			return
		}
		sess, err := s.active(r.Context(), id)
		if err != nil {
			s.clearSession(w)
			writeConnectError(w, http.StatusUnauthorized, "unauthenticated", "console: "+err.Error())
			return
		}
		if !csrfOK(r, sess.csrf) {
			s.logger.Warn("console: API request without the session's CSRF token refused", "path", r.URL.Path)
			writeConnectError(w, http.StatusForbidden, "permission_denied", "console: "+csrfHeader+" missing or wrong")
			return
		}
		if !connectContentType(r.Header.Get("Content-Type")) {
			writeConnectError(w, http.StatusForbidden, "permission_denied", "console: not a Connect content type")
			return
		}
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+sess.forward)
		next.ServeHTTP(w, r)
	})
}
