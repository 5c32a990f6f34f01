package authn

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Fixed answers: the reason is logged, never sent to the caller.
var (
	errUnauthenticated = status.Error(codes.Unauthenticated, "authentication required")
	errDenied          = status.Error(codes.PermissionDenied, "permission denied")
)

// Policy maps full gRPC method names ("/planex.v1.SupervisorService/GetRun")
// to the role they require. RoleNone marks a public method. A method not
// in the policy requires RoleAdmin: new methods fail closed.
type Policy map[string]Role

// Config configures authentication of a gRPC server.
type Config struct {
	// Disabled turns authentication off (explicit: --auth=none).
	Disabled bool
	// APIKeysFile enables bearer API keys.
	APIKeysFile string
	// JWT enables bearer JWTs when JWKSFile or JWKSURL is set.
	JWT JWTConfig
	// CertRoles gives every verified client certificate these roles, in
	// addition to role names found in its subject's OU.
	CertRoles []string
}

// RegisterFlags adds --auth, --auth-api-keys-file, --auth-jwks-file,
// --auth-jwks-url, --auth-jwt-issuer, --auth-jwt-audience,
// --auth-jwt-roles-claim, --auth-jwt-tenant-claim and --auth-cert-roles.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&c.Disabled, "auth-disabled", false, "serve without authentication (explicit opt-out; every caller is admin)")
	fs.StringVar(&c.APIKeysFile, "auth-api-keys-file", "", "file of hashed API keys: 'sha256:<hex> <name> <role>[,<role>] [tenant=<tenant>]' per line; re-read on change")
	fs.StringVar(&c.JWT.JWKSFile, "auth-jwks-file", "", "JWKS file verifying bearer JWTs; re-read on change")
	fs.StringVar(&c.JWT.JWKSURL, "auth-jwks-url", "", "JWKS URL verifying bearer JWTs (e.g. the cluster's OIDC issuer's jwks_uri)")
	fs.StringVar(&c.JWT.Issuer, "auth-jwt-issuer", "", "required iss of bearer JWTs")
	fs.StringVar(&c.JWT.Audience, "auth-jwt-audience", "", "required aud of bearer JWTs")
	fs.StringVar(&c.JWT.RolesClaim, "auth-jwt-roles-claim", "roles", "JWT claim holding planex roles (list or space separated; dots walk into objects)")
	fs.StringVar(&c.JWT.TenantClaim, "auth-jwt-tenant-claim", "", "JWT claim naming the caller's tenant (a tenant's name or one of its members.jwt_claim_values); empty: JWT callers belong to the tenant their subject is a member of, else default")
	fs.StringSliceVar(&c.CertRoles, "auth-cert-roles", nil, "roles of every verified client certificate, besides role names in its subject OU (comma separated)")
}

// Validate checks the flags.
func (c Config) Validate() error {
	var errs []error
	if (c.JWT.JWKSFile != "" || c.JWT.JWKSURL != "") && (c.JWT.Issuer == "" || c.JWT.Audience == "") {
		errs = append(errs, errors.New("--auth-jwt-issuer and --auth-jwt-audience: required with --auth-jwks-file or --auth-jwks-url"))
	}
	if c.JWT.JWKSFile != "" && c.JWT.JWKSURL != "" {
		errs = append(errs, errors.New("--auth-jwks-file and --auth-jwks-url: set one"))
	}
	for _, r := range c.CertRoles {
		if _, err := ParseRole(r); err != nil {
			errs = append(errs, fmt.Errorf("--auth-cert-roles: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Authenticator identifies callers and enforces a Policy.
type Authenticator struct {
	disabled  bool
	keys      *APIKeys
	jwt       *JWTVerifier
	certRoles []Role
	logger    *slog.Logger
}

// New builds an Authenticator from c, loading the key file and the JWKS.
func New(ctx context.Context, c Config, logger *slog.Logger) (*Authenticator, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	a := &Authenticator{disabled: c.Disabled, logger: logger}
	for _, r := range c.CertRoles {
		role, _ := ParseRole(r)
		a.certRoles = append(a.certRoles, role)
	}
	if c.APIKeysFile != "" {
		k, err := NewAPIKeys(c.APIKeysFile)
		if err != nil {
			return nil, fmt.Errorf("--auth-api-keys-file: %w", err)
		}
		a.keys = k
	}
	if c.JWT.JWKSFile != "" || c.JWT.JWKSURL != "" {
		v, err := NewJWTVerifier(ctx, c.JWT)
		if err != nil {
			return nil, err
		}
		a.jwt = v
	}
	return a, nil
}

// Authenticate identifies the caller of ctx: a bearer token when one is
// sent (it must then be valid), else a verified client certificate.
func (a *Authenticator) Authenticate(ctx context.Context) (Identity, error) {
	if a.disabled {
		// No subject: without authentication there is no one to record as
		// a run's owner or to hold to the self-approval rule.
		return Identity{Roles: []Role{RoleAdmin}}, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if vals := md.Get("authorization"); len(vals) > 0 {
		if len(vals) > 1 {
			return Identity{}, errors.New("more than one authorization header")
		}
		scheme, token, ok := strings.Cut(vals[0], " ")
		if !ok || !strings.EqualFold(scheme, "bearer") || token == "" {
			return Identity{}, errors.New("authorization: want 'Bearer <token>'")
		}
		token = strings.TrimSpace(token)
		if strings.HasPrefix(token, APIKeyPrefix) || strings.Count(token, ".") != 2 {
			if a.keys == nil {
				return Identity{}, errors.New("API key sent but no --auth-api-keys-file")
			}
			return a.keys.Authenticate(token)
		}
		if a.jwt == nil {
			return Identity{}, errors.New("JWT sent but no JWKS configured")
		}
		return a.jwt.Verify(ctx, token)
	}
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 {
			return certIdentity(ti.State.VerifiedChains[0][0], a.certRoles), nil
		}
	}
	return Identity{}, errors.New("no credentials")
}

// certIdentity names a verified client certificate by its first URI SAN
// (a SPIFFE id) or its common name; roles are the role names in its OU.
func certIdentity(c *x509.Certificate, extra []Role) Identity {
	subject := c.Subject.CommonName
	if len(c.URIs) > 0 {
		subject = c.URIs[0].String()
	}
	roles := rolesFrom(c.Subject.OrganizationalUnit)
	roles = append(roles, extra...)
	return Identity{Subject: SubjectCert + subject, Roles: roles, Method: MethodMTLS}
}

// authorize authenticates the caller of method and checks the policy.
func (a *Authenticator) authorize(ctx context.Context, p Policy, method string) (context.Context, error) {
	need, ok := p[method]
	if !ok {
		need = RoleAdmin
	}
	id, err := a.Authenticate(ctx)
	if err != nil {
		if need == RoleNone {
			return ctx, nil
		}
		a.logger.WarnContext(ctx, "unauthenticated call", "method", method, "reason", err.Error())
		return nil, errUnauthenticated
	}
	if !id.Has(need) {
		a.logger.WarnContext(ctx, "permission denied", "method", method, "subject", id.Subject, "role", id.Role().String(), "needs", need.String())
		return nil, errDenied
	}
	return WithIdentity(ctx, id), nil
}

// AuthenticateCall authenticates the caller of method without a policy
// check: for a method no service serves, which must still not answer
// anonymous callers (an anonymous Unimplemented would let them enumerate
// methods). It answers Unauthenticated ("authentication required") and
// logs the reason, like the interceptors.
func (a *Authenticator) AuthenticateCall(ctx context.Context, method string) (context.Context, error) {
	id, err := a.Authenticate(ctx)
	if err != nil {
		a.logger.WarnContext(ctx, "unauthenticated call", "method", method, "reason", err.Error())
		return nil, errUnauthenticated
	}
	return WithIdentity(ctx, id), nil
}

// UnaryInterceptor enforces p on unary calls.
func (a *Authenticator) UnaryInterceptor(p Policy) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := a.authorize(ctx, p, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor enforces p on streaming calls.
func (a *Authenticator) StreamInterceptor(p Policy) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := a.authorize(ss.Context(), p, info.FullMethod)
		if err != nil {
			return err
		}
		return handler(srv, &identityStream{ServerStream: ss, ctx: ctx})
	}
}

type identityStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *identityStream) Context() context.Context { return s.ctx }

// Denied is the PermissionDenied answer handlers return for a check of
// their own (cancelling another's run, approving one's own).
func Denied() error { return errDenied }
