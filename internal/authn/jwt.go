package authn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// JWTConfig configures bearer JWT verification.
type JWTConfig struct {
	// JWKSFile is a JSON Web Key Set file, re-read when it changes.
	JWKSFile string
	// JWKSURL is fetched (and re-fetched every RefreshInterval, or when a
	// token names an unknown key id, at most once a minute).
	JWKSURL string
	// Issuer must match the token's iss.
	Issuer string
	// Audience must be among the token's aud.
	Audience string
	// RolesClaim is the claim holding planex role names: a list or a
	// space-separated string; dots walk into objects
	// ("realm_access.roles").
	RolesClaim string
	// TenantClaim, when set, is the claim naming the caller's tenant (a
	// string; dots walk into objects): its value becomes Identity.Tenant,
	// which the supervisor maps to a tenant (TenantMembers.jwt_claim_values
	// or the tenant's name).
	TenantClaim string
	// Leeway tolerates clock skew on exp, nbf and iat.
	Leeway time.Duration
	// RefreshInterval of JWKSURL (default 5 minutes).
	RefreshInterval time.Duration
	// HTTPClient fetches JWKSURL (default: a client with a 10s timeout).
	HTTPClient *http.Client
	// Now is the clock (tests).
	Now func() time.Time
}

// algorithms accepted in tokens; "none" and HMAC (a shared secret is not
// a public key set) never are.
var algorithms = []jose.SignatureAlgorithm{jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512, jose.ES256, jose.ES384, jose.ES512, jose.EdDSA}

// JWTVerifier verifies bearer JWTs against a JWKS.
type JWTVerifier struct {
	cfg JWTConfig

	mu        sync.Mutex
	set       jose.JSONWebKeySet
	stamp     string
	fetchedAt time.Time
}

// NewJWTVerifier loads the key set once and fails when it is unusable.
func NewJWTVerifier(ctx context.Context, cfg JWTConfig) (*JWTVerifier, error) {
	if (cfg.JWKSFile == "") == (cfg.JWKSURL == "") {
		return nil, errors.New("--auth-jwks-file or --auth-jwks-url: set exactly one")
	}
	if cfg.Issuer == "" || cfg.Audience == "" {
		return nil, errors.New("--auth-jwt-issuer and --auth-jwt-audience: required with a JWKS")
	}
	if cfg.RolesClaim == "" {
		cfg.RolesClaim = "roles"
	}
	if cfg.Leeway == 0 {
		cfg.Leeway = time.Minute
	}
	if cfg.RefreshInterval <= 0 {
		cfg.RefreshInterval = 5 * time.Minute
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	v := &JWTVerifier{cfg: cfg}
	if err := v.refresh(ctx, true); err != nil {
		return nil, err
	}
	return v, nil
}

// refresh reloads the key set: the file when it changed, the URL when the
// interval passed (or force and a minute passed).
func (v *JWTVerifier) refresh(ctx context.Context, force bool) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	var data []byte
	if v.cfg.JWKSFile != "" {
		stamp := statStamp(v.cfg.JWKSFile)
		if stamp == v.stamp {
			return nil
		}
		b, err := os.ReadFile(v.cfg.JWKSFile)
		if err != nil {
			return fmt.Errorf("read --auth-jwks-file: %w", err)
		}
		data, v.stamp = b, stamp
	} else {
		age := v.cfg.Now().Sub(v.fetchedAt)
		if !v.fetchedAt.IsZero() && age < v.cfg.RefreshInterval && (!force || age < time.Minute) {
			return nil
		}
		v.fetchedAt = v.cfg.Now()
		b, err := v.fetch(ctx)
		if err != nil {
			return err
		}
		data = b
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(data, &set); err != nil {
		return fmt.Errorf("JWKS: %w", err)
	}
	for _, k := range set.Keys {
		if !k.IsPublic() {
			return fmt.Errorf("JWKS: key %q is not a public key", k.KeyID)
		}
	}
	v.set = set
	return nil
}

func (v *JWTVerifier) fetch(ctx context.Context) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.cfg.JWKSURL, nil)
	if err != nil {
		return nil, fmt.Errorf("--auth-jwks-url: %w", err)
	}
	resp, err := v.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch JWKS: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch JWKS: HTTP %d", resp.StatusCode)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 1<<20))
}

func (v *JWTVerifier) key(kid string) (jose.JSONWebKey, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	var keys []jose.JSONWebKey
	if kid == "" {
		keys = v.set.Keys
	} else {
		keys = v.set.Key(kid)
	}
	if len(keys) != 1 {
		return jose.JSONWebKey{}, false
	}
	return keys[0], true
}

// Verify checks the token's signature, issuer, audience and times and
// returns the caller's identity, subject "jwt:<iss>:<sub>" (LegacySubject
// the bare sub): whatever its sub, a token never names an API key or a
// certificate.
func (v *JWTVerifier) Verify(ctx context.Context, token string) (Identity, error) {
	tok, err := jwt.ParseSigned(token, algorithms)
	if err != nil {
		return Identity{}, fmt.Errorf("parse JWT: %w", err)
	}
	if len(tok.Headers) != 1 {
		return Identity{}, errors.New("JWT: want one signature")
	}
	kid := tok.Headers[0].KeyID
	if err := v.refresh(ctx, false); err != nil {
		return Identity{}, err
	}
	key, ok := v.key(kid)
	if !ok {
		// A rotated issuer key: refetch (rate limited) and try again.
		if err := v.refresh(ctx, true); err != nil {
			return Identity{}, err
		}
		if key, ok = v.key(kid); !ok {
			return Identity{}, fmt.Errorf("JWT: no key %q in the JWKS", kid)
		}
	}
	var std jwt.Claims
	var raw map[string]any
	if err := tok.Claims(key.Key, &std, &raw); err != nil {
		return Identity{}, fmt.Errorf("JWT: %w", err)
	}
	if std.Expiry == nil {
		return Identity{}, errors.New("JWT: exp required")
	}
	exp := jwt.Expected{Issuer: v.cfg.Issuer, AnyAudience: jwt.Audience{v.cfg.Audience}, Time: v.cfg.Now()}
	if err := std.ValidateWithLeeway(exp, v.cfg.Leeway); err != nil {
		return Identity{}, fmt.Errorf("JWT: %w", err)
	}
	if std.Subject == "" {
		return Identity{}, errors.New("JWT: sub required")
	}
	id := Identity{Subject: SubjectJWT + std.Issuer + ":" + std.Subject, LegacySubject: std.Subject,
		Roles: rolesFrom(claimStrings(raw, v.cfg.RolesClaim)), Method: MethodJWT}
	if v.cfg.TenantClaim != "" {
		vals := claimStrings(raw, v.cfg.TenantClaim)
		if len(vals) > 1 {
			return Identity{}, fmt.Errorf("JWT: claim %q names %d tenants: want one", v.cfg.TenantClaim, len(vals))
		}
		if len(vals) == 1 {
			id.Tenant = vals[0]
		}
	}
	return id, nil
}

// claimStrings reads a claim (dots walk into objects) as a list of
// strings: a JSON array of strings, or a space-separated string.
func claimStrings(claims map[string]any, path string) []string {
	var cur any = claims
	for _, p := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[p]
	}
	switch v := cur.(type) {
	case string:
		return strings.Fields(v)
	case []any:
		var out []string
		for _, x := range v {
			if s, ok := x.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}
