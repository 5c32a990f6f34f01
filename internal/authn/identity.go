// Package authn authenticates and authorises gRPC callers of planex
// services. A caller is identified by a verified mTLS client certificate
// or by a bearer token — a JWT verified against a JWKS (file or URL, for
// example the cluster's OIDC issuer) or a static API key stored hashed in
// a file — and is allowed a method when one of its roles reaches the role
// the method's Policy requires. Failures are reported as Unauthenticated
// or PermissionDenied with a fixed message; the reason is logged
// server-side only.
package authn

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// Role is a level of access; each role includes the ones below it.
type Role int

const (
	// RoleNone is no access; Public methods need no role.
	RoleNone Role = iota
	// RoleViewer reads runs and tools (GetRun, ListRuns, WatchRun,
	// ListTools).
	RoleViewer
	// RoleRunner also starts runs and cancels its own.
	RoleRunner
	// RoleApprover also decides gates of runs.
	RoleApprover
	// RoleOperator also repairs runs: resets and forks any run, and
	// cancels, decides or resets runs in batches selected by a filter.
	RoleOperator
	// RoleAdmin may do everything, on every run of its tenant.
	RoleAdmin
	// RolePlatformAdmin also manages tenants (TenantService) and reads
	// every tenant's usage. Only an identity of the default tenant holds
	// it: a tenant's credential naming it is an admin of its tenant.
	RolePlatformAdmin
	// RoleDisabled is required by methods turned off by configuration:
	// no identity reaches it.
	RoleDisabled Role = 1 << 20
)

var roleNames = map[Role]string{RoleViewer: "viewer", RoleRunner: "runner", RoleApprover: "approver", RoleOperator: "operator", RoleAdmin: "admin", RolePlatformAdmin: "platform-admin"}

// String returns the role's name.
func (r Role) String() string {
	if n, ok := roleNames[r]; ok {
		return n
	}
	return "none"
}

// ParseRole parses viewer, runner, approver, operator, admin or
// platform-admin.
func ParseRole(s string) (Role, error) {
	for r, n := range roleNames {
		if strings.EqualFold(strings.TrimSpace(s), n) {
			return r, nil
		}
	}
	return RoleNone, fmt.Errorf("role %q: want viewer, runner, approver, operator, admin or platform-admin", s)
}

// Method says how an identity was established.
type Method string

const (
	// MethodMTLS is a verified client certificate.
	MethodMTLS Method = "mtls"
	// MethodJWT is a bearer JWT verified against the JWKS.
	MethodJWT Method = "jwt"
	// MethodAPIKey is a bearer API key found in the key file.
	MethodAPIKey Method = "api-key"
)

// Subject prefixes. Every authenticator names its callers under its own
// prefix and no other, so no credential of one kind can claim a subject
// of another kind: a JWT whose sub is "apikey:ci" is
// "jwt:<issuer>:apikey:ci", never the API key "ci".
const (
	// SubjectAPIKey prefixes API key subjects: "apikey:<name>".
	SubjectAPIKey = "apikey:"
	// SubjectCert prefixes client certificate subjects: "cert:<URI SAN or CN>".
	SubjectCert = "cert:"
	// SubjectJWT prefixes JWT subjects: "jwt:<iss>:<sub>".
	SubjectJWT = "jwt:"
	// SubjectRole is not a subject: in a gate's approvers list,
	// "role:<role>" names every identity holding that role or a higher one.
	SubjectRole = "role:"
)

// Namespaced reports whether subject starts with one of the reserved
// prefixes (apikey:, cert:, jwt:, role:). A subject recorded without one
// (started_by of a run, an approver in a policy) is a JWT's bare sub from
// before subjects were namespaced.
func Namespaced(subject string) bool {
	for _, p := range []string{SubjectAPIKey, SubjectCert, SubjectJWT, SubjectRole} {
		if strings.HasPrefix(subject, p) {
			return true
		}
	}
	return false
}

// Identity is an authenticated caller.
type Identity struct {
	// Subject names the caller, namespaced by how it was authenticated:
	// "cert:<URI SAN or common name>", "jwt:<iss>:<sub>" or
	// "apikey:<name>". It is what runs record as started_by and gates as
	// decided_by.
	Subject string
	// LegacySubject is the name the caller had before subjects were
	// namespaced: a JWT's bare sub ("" for other methods). Owners and
	// approvers recorded in that form still match the caller (Matches),
	// unless they carry a reserved prefix.
	LegacySubject string
	// Roles the caller holds.
	Roles []Role
	// Method is how the caller was authenticated.
	Method Method
	// Tenant is the tenant the credential names: the fourth field of its
	// API key line, or the value of a JWT's tenant claim (which the
	// supervisor maps to a tenant). Empty: the credential names none, and
	// the tenant registry's members (or the default tenant) decide.
	Tenant string
}

// Matches reports whether subject (a run's started_by, a gate approver)
// names this identity: the namespaced subject itself, or — for a JWT
// caller — its bare sub when subject has no reserved prefix (runs started
// and policies written before subjects were namespaced; API keys and
// certificates were already prefixed then, so a bare subject can only have
// been a JWT's). A JWT never matches an "apikey:" or "cert:" subject,
// whatever its sub. The empty subject matches no one.
func (id Identity) Matches(subject string) bool {
	switch {
	case subject == "":
		return false
	case subject == id.Subject:
		return true
	default:
		return id.Method == MethodJWT && id.LegacySubject != "" && subject == id.LegacySubject && !Namespaced(subject)
	}
}

// Role is the highest role the identity holds. A credential that names
// a tenant other than the default one never reaches RolePlatformAdmin:
// it is an admin of its tenant.
func (id Identity) Role() Role {
	r := RoleNone
	for _, x := range id.Roles {
		r = max(r, x)
	}
	if r == RolePlatformAdmin && id.Tenant != "" && id.Tenant != DefaultTenant {
		r = RoleAdmin
	}
	return r
}

// DefaultTenant is the implicit tenant of callers that belong to no other:
// the installation as it was before tenants.
const DefaultTenant = "default"

// Has reports whether the identity reaches role.
func (id Identity) Has(role Role) bool { return id.Role() >= role }

// String is "<subject> (<method>, <role>)" for logs.
func (id Identity) String() string {
	if id.Tenant != "" {
		return fmt.Sprintf("%s (%s, %s, tenant %s)", id.Subject, id.Method, id.Role(), id.Tenant)
	}
	return fmt.Sprintf("%s (%s, %s)", id.Subject, id.Method, id.Role())
}

type ctxKey struct{}

// WithIdentity returns ctx carrying id.
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// FromContext returns the caller's identity, when the call was
// authenticated.
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(ctxKey{}).(Identity)
	return id, ok
}

// rolesFrom parses the role names it knows in names and ignores others
// (an OIDC token carries groups of other applications too).
func rolesFrom(names []string) []Role {
	var out []Role
	for _, n := range names {
		if r, err := ParseRole(n); err == nil && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

// Bearer is a client's bearer token (API key or JWT), sent on every call
// as "authorization: Bearer <token>"; only over TLS.
type Bearer string

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b Bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials: a
// token never travels in plaintext.
func (Bearer) RequireTransportSecurity() bool { return true }

// ValidTenant checks a tenant name: lower-case letters, digits and '-',
// starting with a letter, at most 31 characters.
func ValidTenant(name string) error {
	if name == "" || len(name) > 31 || name[0] < 'a' || name[0] > 'z' {
		return fmt.Errorf("tenant %q: want lower-case letters, digits and '-', starting with a letter, at most 31 characters", name)
	}
	for _, c := range name {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return fmt.Errorf("tenant %q: want lower-case letters, digits and '-', starting with a letter, at most 31 characters", name)
		}
	}
	return nil
}
