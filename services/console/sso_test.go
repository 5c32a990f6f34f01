package console

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/oauth2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/oidctest"
)

// verifyingSupervisor stands in for the supervisor's API: it verifies the
// forwarded bearer token with the supervisor's own JWT verifier (against
// the provider's JWKS) and records who called.
type verifyingSupervisor struct {
	planexv1.SupervisorServiceClient
	v *authn.JWTVerifier

	mu     sync.Mutex
	tokens []string
	ids    []authn.Identity
}

func (s *verifyingSupervisor) ListRuns(ctx context.Context, _ *planexv1.ListRunsRequest, _ ...grpc.CallOption) (*planexv1.ListRunsResponse, error) {
	md, _ := metadata.FromOutgoingContext(ctx)
	auth := md.Get("authorization")
	if len(auth) != 1 {
		return nil, status.Error(codes.Unauthenticated, "no bearer token")
	}
	tok := strings.TrimPrefix(auth[0], "Bearer ")
	id, err := s.v.Verify(ctx, tok)
	if err != nil {
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens = append(s.tokens, tok)
	s.ids = append(s.ids, id)
	return &planexv1.ListRunsResponse{}, nil
}

func (s *verifyingSupervisor) last() (string, authn.Identity) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ids) == 0 {
		return "", authn.Identity{}
	}
	return s.tokens[len(s.tokens)-1], s.ids[len(s.ids)-1]
}

// ssoFixture is a console with single sign-on in front of a verifying
// supervisor, and a real provider.
type ssoFixture struct {
	t    *testing.T
	idp  *oidctest.Provider
	sso  *sso
	sup  *verifyingSupervisor
	base string
	mu   sync.Mutex
	now  time.Time // the console's clock, once set
}

var alice = oidctest.User{Name: "alice", Password: "wonderland", Roles: []string{"viewer"}, DisplayName: "Alice Liddell", Email: "alice@example.com"}

func newSSOFixture(t *testing.T, icfg oidctest.Config, edit func(*OIDCConfig)) *ssoFixture {
	t.Helper()
	if icfg.Users == nil {
		icfg.Users = []oidctest.User{alice}
	}
	idp := oidctest.StartConfig(t, icfg)
	v, err := authn.NewJWTVerifier(t.Context(), authn.JWTConfig{JWKSURL: idp.JWKSURL, Issuer: idp.Issuer, Audience: idp.Audience, RolesClaim: idp.RolesClaim})
	if err != nil {
		t.Fatal(err)
	}
	sup := &verifyingSupervisor{v: v}
	cfg := Config{HTTPAddr: "127.0.0.1:0", ForwardTokens: true, OIDC: defaultOIDC()}
	cfg.OIDC.Issuer, cfg.OIDC.ClientID, cfg.OIDC.ClientSecretFile = idp.Issuer, idp.ClientID, idp.ClientSecretFile
	if edit != nil {
		edit(&cfg.OIDC)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	h, s, err := handler(cfg, sup, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	f := &ssoFixture{t: t, idp: idp, sso: s, sup: sup, base: srv.URL}
	s.now = func() time.Time {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.now.IsZero() {
			return time.Now()
		}
		return f.now
	}
	return f
}

// setNow sets the console's clock.
func (f *ssoFixture) setNow(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = t
}

// defaultOIDC is OIDCConfig with the flag defaults.
func defaultOIDC() OIDCConfig {
	var c Config
	c.RegisterFlags(newFlagSet())
	return c.OIDC
}

// browser is an HTTP client with a cookie jar that does not follow
// redirects (each is checked).
func browser(t *testing.T) *http.Client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, Timeout: 20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func (f *ssoFixture) get(c *http.Client, u string) *http.Response {
	f.t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		f.t.Fatal(err)
	}
	return resp
}

// startLogin opens /auth/login and returns the provider URL it redirects
// to and the response.
func (f *ssoFixture) startLogin(c *http.Client) (*url.URL, *http.Response) {
	f.t.Helper()
	resp := f.get(c, f.base+"/auth/login?next="+url.QueryEscape("#/gates"))
	resp.Body.Close()
	loc, err := resp.Location()
	if resp.StatusCode != http.StatusFound || err != nil || !strings.HasPrefix(loc.String(), f.idp.Issuer+"/") {
		f.f("GET /auth/login: %d to %v, want a redirect to the provider", resp.StatusCode, loc)
	}
	return loc, resp
}

func (f *ssoFixture) f(format string, args ...any) { f.t.Helper(); f.t.Fatalf(format, args...) }

// signIn signs the browser in as alice and returns /auth/me.
func (f *ssoFixture) signIn(c *http.Client) meResponse {
	f.t.Helper()
	loc, _ := f.startLogin(c)
	back, err := f.idp.Login(f.t.Context(), c, loc.String(), alice.Name, alice.Password)
	if err != nil {
		f.f("login at the provider: %v", err)
	}
	resp := f.get(c, back.String())
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/#/gates" {
		f.f("callback: %d to %q, want 303 to /#/gates\n%s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	me := f.me(c)
	if !me.SignedIn {
		f.f("/auth/me after sign-in: %+v", me)
	}
	return me
}

func (f *ssoFixture) me(c *http.Client) meResponse {
	f.t.Helper()
	resp := f.get(c, f.base+"/auth/me")
	defer resp.Body.Close()
	var me meResponse
	if err := json.NewDecoder(resp.Body).Decode(&me); err != nil {
		f.f("/auth/me: %v", err)
	}
	return me
}

// listRuns posts ListRuns as the page does; header edits the request.
func (f *ssoFixture) listRuns(c *http.Client, header func(http.Header)) (int, string) {
	f.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.base+"/planex.v1.SupervisorService/ListRuns", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("Origin", f.base)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	if header != nil {
		header(req.Header)
	}
	resp, err := c.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func withCSRF(tok string) func(http.Header) {
	return func(h http.Header) { h.Set(csrfHeader, tok) }
}

// sessionCookie is the browser's session cookie value.
func (f *ssoFixture) sessionCookie(c *http.Client) string {
	u, _ := url.Parse(f.base)
	for _, k := range c.Jar.Cookies(u) {
		if k.Name == f.sso.sessionCookie {
			return k.Value
		}
	}
	return ""
}

// TestSSOSignInAndForward: the browser signs in through the provider's
// login form, /auth/me names the user, roles and expiry, the cookies have
// the documented flags, and API calls are forwarded with a token the
// supervisor's verifier accepts, carrying the provider's role.
func TestSSOSignInAndForward(t *testing.T) {
	f := newSSOFixture(t, oidctest.Config{}, nil)
	c := browser(t)

	// Not signed in: /auth/me offers the provider.
	me := f.me(c)
	if me.SignedIn || me.SSO == nil || me.SSO.LoginURL != "/auth/login" || !strings.HasPrefix(f.idp.Issuer, "http://"+me.SSO.Provider) {
		t.Fatalf("/auth/me before sign-in: %+v", me)
	}

	loc, resp := f.startLogin(c)
	q := loc.Query()
	if q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "" || q.Get("nonce") == "" || q.Get("state") == "" {
		t.Fatalf("authorization request without PKCE S256, nonce or state: %s", loc)
	}
	login := findCookie(resp, "planex_login")
	if login == nil || !login.HttpOnly || login.SameSite != http.SameSiteLaxMode || login.Path != "/" || login.MaxAge <= 0 || login.MaxAge > 600 || login.Secure {
		t.Fatalf("login cookie %+v: want HttpOnly, SameSite=Lax, Path=/, short-lived, not Secure on loopback http", login)
	}
	if strings.Contains(login.Value, q.Get("state")) {
		t.Fatal("the login cookie shows the state in clear")
	}
	back, err := f.idp.Login(t.Context(), c, loc.String(), alice.Name, alice.Password)
	if err != nil {
		t.Fatal(err)
	}
	resp = f.get(c, back.String())
	resp.Body.Close()
	sc := findCookie(resp, "planex_session")
	if sc == nil || !sc.HttpOnly || sc.SameSite != http.SameSiteStrictMode || sc.Path != "/" || sc.Secure || sc.MaxAge != 0 {
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, Path=/, a browser-session cookie, not Secure on loopback http", sc)
	}
	if strings.Count(sc.Value, ".") == 2 || len(sc.Value) < 40 {
		t.Fatalf("session cookie %q: want a random id, not a token", sc.Value)
	}
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/#/gates" {
		t.Fatalf("callback: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}

	me = f.me(c)
	exp, err := time.Parse(time.RFC3339, me.ExpiresAt)
	if !me.SignedIn || me.Subject != "alice" || me.Name != "Alice Liddell" || me.Email != "alice@example.com" ||
		!slices.Equal(me.Roles, []string{"viewer"}) || me.CSRFToken == "" || err != nil || time.Until(exp) < time.Minute || me.Forwarded != "access" {
		t.Fatalf("/auth/me: %+v", me)
	}

	code, body := f.listRuns(c, withCSRF(me.CSRFToken))
	if code != http.StatusOK {
		t.Fatalf("ListRuns with the session: %d %s", code, body)
	}
	tok, id := f.sup.last()
	if id.Subject != "jwt:"+f.idp.Issuer+":alice" || len(id.Roles) != 1 || id.Roles[0] != authn.RoleViewer {
		t.Fatalf("the supervisor saw %+v, want alice as viewer", id)
	}
	if jwtPayload(tok)["at_hash"] != nil {
		t.Error("the forwarded token is the ID token; the provider's access token is a JWT for the supervisor and is the one to forward")
	}

	// The pasted bearer token still works, and wins over the cookie.
	code, _ = f.listRuns(c, func(h http.Header) { h.Set("Authorization", "Bearer "+tok) })
	if code != http.StatusOK {
		t.Fatalf("ListRuns with a bearer token and the cookie: %d", code)
	}
	code, body = f.listRuns(c, func(h http.Header) { h.Set("Authorization", "Bearer not-a-jwt") })
	if code != http.StatusUnauthorized || !strings.Contains(body, "unauthenticated") {
		t.Fatalf("a wrong bearer token with a valid cookie: %d %s, want the supervisor's unauthenticated", code, body)
	}
}

func findCookie(resp *http.Response, name string) *http.Cookie {
	for _, c := range resp.Cookies() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// TestSSOCSRF: a cookie-authenticated API call or logout without the
// session's CSRF token, with a wrong one, or with a CORS-simple content
// type is refused with 403, before the supervisor is called.
func TestSSOCSRF(t *testing.T) {
	f := newSSOFixture(t, oidctest.Config{}, nil)
	c := browser(t)
	me := f.signIn(c)
	for _, tt := range []struct {
		name string
		edit func(http.Header)
	}{
		{"no CSRF token", nil},
		{"wrong CSRF token", withCSRF("x" + me.CSRFToken)},
		{"empty CSRF token", withCSRF("")},
		{"form content type", func(h http.Header) {
			h.Set(csrfHeader, me.CSRFToken)
			h.Set("Content-Type", "application/x-www-form-urlencoded")
		}},
		{"text/plain", func(h http.Header) { h.Set(csrfHeader, me.CSRFToken); h.Set("Content-Type", "text/plain") }},
	} {
		code, body := f.listRuns(c, tt.edit)
		if code != http.StatusForbidden || !strings.Contains(body, "permission_denied") {
			t.Errorf("%s: %d %s, want 403", tt.name, code, body)
		}
	}
	if tok, _ := f.sup.last(); tok != "" {
		t.Fatal("a refused request reached the supervisor")
	}
	// Another origin is refused by the origin check even with the token.
	code, _ := f.listRuns(c, func(h http.Header) { h.Set(csrfHeader, me.CSRFToken); h.Set("Origin", "https://evil.example") })
	if code != http.StatusForbidden {
		t.Errorf("cross-origin with the CSRF token: %d, want 403", code)
	}
	for _, tok := range []string{"", "wrong"} {
		req, _ := http.NewRequest(http.MethodPost, f.base+"/auth/logout", nil)
		if tok != "" {
			req.Header.Set(csrfHeader, tok)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("logout with CSRF token %q: %d, want 403", tok, resp.StatusCode)
		}
	}
	if !f.me(c).SignedIn {
		t.Fatal("a refused logout ended the session")
	}
	if code, body := f.listRuns(c, withCSRF(me.CSRFToken)); code != http.StatusOK {
		t.Fatalf("with the CSRF token: %d %s", code, body)
	}
}

// TestSSOCallbackRefusals: a callback whose state is not this browser's,
// whose ID token carries another nonce, or whose code comes without the
// PKCE verifier it was issued for is refused, and no session is made.
func TestSSOCallbackRefusals(t *testing.T) {
	f := newSSOFixture(t, oidctest.Config{}, nil)
	ctx := t.Context()

	callback := func(c *http.Client, u *url.URL) (int, string) {
		t.Helper()
		resp := f.get(c, u.String())
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if sc := findCookie(resp, "planex_session"); resp.StatusCode != http.StatusSeeOther && sc != nil && sc.MaxAge >= 0 {
			t.Errorf("a refused callback set a session cookie")
		}
		return resp.StatusCode, string(b)
	}

	t.Run("state mismatch", func(t *testing.T) {
		c := browser(t)
		loc, _ := f.startLogin(c)
		back, err := f.idp.Login(ctx, c, loc.String(), alice.Name, alice.Password)
		if err != nil {
			t.Fatal(err)
		}
		q := back.Query()
		q.Set("state", "forged-"+q.Get("state"))
		back.RawQuery = q.Encode()
		if code, body := callback(c, back); code != http.StatusBadRequest || !strings.Contains(body, "state does not match") {
			t.Fatalf("forged state: %d %s", code, body)
		}
	})

	t.Run("no login cookie", func(t *testing.T) {
		c := browser(t)
		loc, _ := f.startLogin(c)
		back, err := f.idp.Login(ctx, c, loc.String(), alice.Name, alice.Password)
		if err != nil {
			t.Fatal(err)
		}
		// Another browser (an attacker's link) brings the code back.
		if code, body := callback(browser(t), back); code != http.StatusBadRequest || !strings.Contains(body, "cookie is missing") {
			t.Fatalf("callback in another browser: %d %s", code, body)
		}
	})

	// crafted sends the browser to the provider with our own state, nonce
	// and verifier, and plants a login cookie saying what the console
	// would have remembered (cookieNonce, cookieVerifier).
	crafted := func(c *http.Client, nonce, cookieNonce, cookieVerifier string) *url.URL {
		t.Helper()
		p, _, err := f.sso.discover(ctx)
		if err != nil {
			t.Fatal(err)
		}
		state, verifier := randomToken(), oauth2.GenerateVerifier()
		redirect := f.base + "/auth/callback"
		authURL := f.sso.oauthConfig(p, redirect).AuthCodeURL(state, oauth2.S256ChallengeOption(verifier), oauth2.SetAuthURLParam("nonce", nonce))
		if cookieVerifier == "" {
			cookieVerifier = verifier
		}
		sealed, err := f.sso.seal(loginState{State: state, Nonce: cookieNonce, Verifier: cookieVerifier, Redirect: redirect, Expires: time.Now().Add(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		u, _ := url.Parse(f.base)
		c.Jar.SetCookies(u, []*http.Cookie{{Name: f.sso.loginCookie, Value: sealed, Path: "/"}})
		back, err := f.idp.Login(ctx, c, authURL, alice.Name, alice.Password)
		if err != nil {
			t.Fatal(err)
		}
		return back
	}

	t.Run("nonce mismatch", func(t *testing.T) {
		c := browser(t)
		back := crafted(c, "nonce-the-provider-saw", "nonce-this-browser-sent", "")
		if code, body := callback(c, back); code != http.StatusBadRequest || !strings.Contains(body, "nonce does not match") {
			t.Fatalf("nonce mismatch: %d %s", code, body)
		}
	})

	t.Run("control: the crafted flow itself signs in", func(t *testing.T) {
		c := browser(t)
		back := crafted(c, "n1", "n1", "")
		if code, body := callback(c, back); code != http.StatusSeeOther {
			t.Fatalf("crafted flow with matching nonce: %d %s", code, body)
		}
	})

	t.Run("PKCE verifier required", func(t *testing.T) {
		c := browser(t)
		back := crafted(c, "n2", "n2", oauth2.GenerateVerifier())
		if code, body := callback(c, back); code != http.StatusBadRequest || !strings.Contains(body, "invalid_grant") {
			t.Fatalf("wrong PKCE verifier: %d %s", code, body)
		}
		// And a code exchanged without any verifier is refused by the
		// provider (the console always sends one).
		c = browser(t)
		loc, _ := f.startLogin(c)
		back, err := f.idp.Login(ctx, c, loc.String(), alice.Name, alice.Password)
		if err != nil {
			t.Fatal(err)
		}
		p, _, _ := f.sso.discover(ctx)
		_, err = f.sso.oauthConfig(p, f.base+"/auth/callback").Exchange(ctx, back.Query().Get("code"))
		if err == nil || !strings.Contains(oauthError(err), "invalid") {
			t.Fatalf("code exchanged without a verifier: %v", err)
		}
		// An authorization request without a challenge is refused.
		noPKCE := f.sso.oauthConfig(p, f.base+"/auth/callback").AuthCodeURL("s", oauth2.SetAuthURLParam("nonce", "n"))
		back, err = f.idp.Login(ctx, c, noPKCE, alice.Name, alice.Password)
		if err != nil || back.Query().Get("error") != "invalid_request" {
			t.Fatalf("authorization request without PKCE: %v %v, want the provider to refuse it", back, err)
		}
	})

	t.Run("provider error", func(t *testing.T) {
		c := browser(t)
		loc, _ := f.startLogin(c)
		u, _ := url.Parse(f.base + "/auth/callback")
		u.RawQuery = url.Values{"error": {"access_denied"}, "state": {loc.Query().Get("state")}}.Encode()
		if code, body := callback(c, u); code != http.StatusForbidden || !strings.Contains(body, "access_denied") {
			t.Fatalf("provider error: %d %s", code, body)
		}
	})

	t.Run("wrong password stays at the provider", func(t *testing.T) {
		c := browser(t)
		loc, _ := f.startLogin(c)
		if _, err := f.idp.Login(ctx, c, loc.String(), alice.Name, "nope"); err == nil || !strings.Contains(err.Error(), "wrong username or password") {
			t.Fatalf("wrong password: %v", err)
		}
	})
	if n := f.sso.store.len(); n != 1 {
		t.Fatalf("%d sessions after the refusals, want only the control's", n)
	}
}

// TestSSOLogout: logout (with the CSRF token) ends the session at the
// console — its id no longer authenticates — and returns the provider's
// end_session URL, which ends it there too.
func TestSSOLogout(t *testing.T) {
	f := newSSOFixture(t, oidctest.Config{}, nil)
	c := browser(t)
	me := f.signIn(c)
	old := f.sessionCookie(c)

	req, _ := http.NewRequest(http.MethodPost, f.base+"/auth/logout", nil)
	req.Header.Set(csrfHeader, me.CSRFToken)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		EndSessionURL string `json:"endSessionURL"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(out.EndSessionURL, f.idp.Issuer+"/") {
		t.Fatalf("logout: %d %+v", resp.StatusCode, out)
	}
	if sc := findCookie(resp, "planex_session"); sc == nil || sc.MaxAge >= 0 {
		t.Fatalf("logout did not clear the session cookie: %+v", sc)
	}
	if f.me(c).SignedIn || f.sessionCookie(c) != "" {
		t.Fatal("still signed in after logout")
	}
	code, body := f.listRuns(c, func(h http.Header) {
		h.Set("Cookie", "planex_session="+old)
		h.Set(csrfHeader, me.CSRFToken)
	})
	if code != http.StatusUnauthorized || !strings.Contains(body, "unauthenticated") {
		t.Fatalf("the old session id after logout: %d %s", code, body)
	}

	// The browser follows the end_session URL: the provider ends its
	// session and sends it back to the console.
	end, _ := url.Parse(out.EndSessionURL)
	if end.Query().Get("id_token_hint") == "" || end.Query().Get("post_logout_redirect_uri") != f.base+"/" {
		t.Fatalf("end_session URL %s", end)
	}
	resp = f.get(c, end.String())
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusFound || loc != f.base+"/" {
		t.Fatalf("end_session: %d to %q, want back to the console", resp.StatusCode, loc)
	}
	if got := f.idp.EndSessions(); !slices.Equal(got, []string{"alice"}) {
		t.Fatalf("provider sessions ended: %v", got)
	}
}

// TestSSORefreshAndExpiry: shortly before the forwarded token expires the
// console refreshes it with the refresh token; when refreshing fails and
// the token has expired, or the session is older than its maximum age,
// the session ends and API calls are answered Unauthenticated.
func TestSSORefreshAndExpiry(t *testing.T) {
	f := newSSOFixture(t, oidctest.Config{}, nil)
	c := browser(t)
	me := f.signIn(c)
	if code, _ := f.listRuns(c, withCSRF(me.CSRFToken)); code != http.StatusOK {
		t.Fatal("ListRuns after sign-in")
	}
	first, _ := f.sup.last()
	exp, _ := time.Parse(time.RFC3339, me.ExpiresAt)

	// 30s before expiry: refreshed.
	f.setNow(exp.Add(-30 * time.Second))
	if code, body := f.listRuns(c, withCSRF(me.CSRFToken)); code != http.StatusOK {
		t.Fatalf("ListRuns near expiry: %d %s", code, body)
	}
	second, id := f.sup.last()
	if f.idp.Refreshes() != 1 || second == first || id.LegacySubject != "alice" {
		t.Fatalf("near expiry: %d refreshes, token changed %v, caller %+v; want one refresh and a new token", f.idp.Refreshes(), second != first, id)
	}
	if got := f.me(c); got.CSRFToken != me.CSRFToken || !got.SignedIn {
		t.Fatalf("after a refresh /auth/me: %+v, want the same session", got)
	}

	// The provider revokes the tokens: the refresh fails, and once the
	// token has expired the session ends.
	f.idp.Revoke("alice")
	me2 := f.me(c)
	exp2, _ := time.Parse(time.RFC3339, me2.ExpiresAt)
	f.setNow(exp2.Add(time.Second))
	code, body := f.listRuns(c, withCSRF(me.CSRFToken))
	if code != http.StatusUnauthorized || !strings.Contains(body, `"code":"unauthenticated"`) {
		t.Fatalf("expired, unrefreshable session: %d %s, want unauthenticated", code, body)
	}
	if f.me(c).SignedIn || f.sso.store.len() != 0 {
		t.Fatal("the expired session is still there")
	}

	// Maximum age: a fresh session ends after --oidc-session-max-age even
	// though its tokens would refresh.
	f.setNow(time.Time{})
	me = f.signIn(c)
	f.setNow(time.Now().Add(12*time.Hour + time.Minute))
	if code, _ := f.listRuns(c, withCSRF(me.CSRFToken)); code != http.StatusUnauthorized {
		t.Fatalf("session past its maximum age: %d, want 401", code)
	}
}

// TestSSOPublicClientAndIDToken: a public client (no secret, PKCE only)
// signs in; with a provider issuing opaque access tokens, auto forwards the
// ID token instead (audience: the client id, here also the API's).
func TestSSOPublicClientAndIDToken(t *testing.T) {
	f := newSSOFixture(t, oidctest.Config{Public: true, OpaqueAccessTokens: true}, func(c *OIDCConfig) { c.ClientSecretFile = "" })
	c := browser(t)
	me := f.signIn(c)
	if code, body := f.listRuns(c, withCSRF(me.CSRFToken)); code != http.StatusOK {
		t.Fatalf("ListRuns: %d %s", code, body)
	}
	tok, id := f.sup.last()
	if f.me(c).Forwarded != "id" || jwtPayload(tok)["nonce"] == nil || id.LegacySubject != "alice" {
		t.Fatalf("forwarded %v as %+v, want alice's ID token", jwtPayload(tok), id)
	}

	// access insists on a JWT access token: the sign-in fails clearly.
	f2 := newSSOFixture(t, oidctest.Config{OpaqueAccessTokens: true}, func(c *OIDCConfig) { c.ForwardToken = "access" })
	c2 := browser(t)
	loc, _ := f2.startLogin(c2)
	back, err := f2.idp.Login(t.Context(), c2, loc.String(), alice.Name, alice.Password)
	if err != nil {
		t.Fatal(err)
	}
	resp := f2.get(c2, back.String())
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), "not a JWT") {
		t.Fatalf("--oidc-forward-token=access with an opaque access token: %d %s", resp.StatusCode, b)
	}
}

// TestSSOCookiesOverHTTPS: a console served over HTTPS (or behind an https
// --oidc-redirect-url) uses __Host- cookies with Secure.
func TestSSOCookiesOverHTTPS(t *testing.T) {
	for _, cfg := range []Config{
		{TLSCertFile: "c.pem", TLSKeyFile: "k.pem", OIDC: OIDCConfig{Issuer: "https://id.example.com"}},
		{OIDC: OIDCConfig{Issuer: "https://id.example.com", RedirectURL: "https://console.example.com/auth/callback"}},
	} {
		s, err := newSSO(cfg, slog.Default())
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		s.setCookie(rec, s.sessionCookie, "id", 0, http.SameSiteStrictMode)
		c := (&http.Response{Header: rec.Header()}).Cookies()[0]
		if c.Name != "__Host-planex_session" || !c.Secure || !c.HttpOnly || c.Path != "/" || c.Domain != "" || c.SameSite != http.SameSiteStrictMode {
			t.Errorf("%+v: session cookie %+v", cfg.OIDC, c)
		}
		if s.loginCookie != "__Host-planex_login" {
			t.Errorf("login cookie %s", s.loginCookie)
		}
	}
}

// TestSSOFlagErrors: bad single sign-on flags name the flag.
func TestSSOFlagErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ok := func(edit func(*OIDCConfig)) OIDCConfig {
		c := defaultOIDC()
		c.Issuer, c.ClientID = "https://id.example.com/realms/planex", "console"
		if edit != nil {
			edit(&c)
		}
		return c
	}
	for _, tt := range []struct {
		name    string
		oidc    OIDCConfig
		forward bool
		want    string
	}{
		{"valid", ok(nil), true, ""},
		{"loopback http issuer", ok(func(c *OIDCConfig) { c.Issuer = "http://127.0.0.1:5556" }), true, ""},
		{"http issuer elsewhere", ok(func(c *OIDCConfig) { c.Issuer = "http://id.example.com" }), true, "--oidc-issuer"},
		{"issuer not a URL", ok(func(c *OIDCConfig) { c.Issuer = "id.example.com" }), true, "--oidc-issuer"},
		{"no client id", ok(func(c *OIDCConfig) { c.ClientID = "" }), true, "--oidc-client-id"},
		{"client id without issuer", OIDCConfig{ClientID: "x"}, true, "--oidc-client-id: needs --oidc-issuer"},
		{"missing secret file", ok(func(c *OIDCConfig) { c.ClientSecretFile = filepath.Join(dir, "nope") }), true, "--oidc-client-secret-file"},
		{"empty secret file", ok(func(c *OIDCConfig) { c.ClientSecretFile = empty }), true, "--oidc-client-secret-file"},
		{"redirect not the callback", ok(func(c *OIDCConfig) { c.RedirectURL = "https://console.example.com/cb" }), true, "--oidc-redirect-url"},
		{"redirect http elsewhere", ok(func(c *OIDCConfig) { c.RedirectURL = "http://console.example.com/auth/callback" }), true, "--oidc-redirect-url"},
		{"scopes without openid", ok(func(c *OIDCConfig) { c.Scopes = []string{"profile"} }), true, "--oidc-scopes"},
		{"forward token", ok(func(c *OIDCConfig) { c.ForwardToken = "refresh" }), true, "--oidc-forward-token"},
		{"max age", ok(func(c *OIDCConfig) { c.SessionMaxAge = 0 }), true, "--oidc-session-max-age"},
		{"plaintext supervisor", ok(nil), false, "--plaintext"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := (Config{HTTPAddr: "127.0.0.1:0", ForwardTokens: tt.forward, OIDC: tt.oidc}).Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate: %v, want an error naming %s", err, tt.want)
			}
		})
	}
}

// TestSSOOff: without --oidc-issuer /auth/me says so and nothing else
// under /auth/ is served; the Connect client works with a bearer token as
// before.
func TestSSOOff(t *testing.T) {
	h, err := Handler(Config{HTTPAddr: "127.0.0.1:0"}, nil, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/auth/me")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(b)) != `{"sso":null,"signedIn":false}` {
		t.Fatalf("/auth/me without SSO: %d %s", resp.StatusCode, b)
	}
	resp, err = http.Get(srv.URL + "/auth/login")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("/auth/login without SSO: %d", resp.StatusCode)
	}
	resp, err = http.Get(srv.URL + "/assets/sso.js")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "X-CSRF-Token") {
		t.Fatalf("/assets/sso.js: %d", resp.StatusCode)
	}
}

func newFlagSet() *pflag.FlagSet { return pflag.NewFlagSet("console", pflag.ContinueOnError) }
