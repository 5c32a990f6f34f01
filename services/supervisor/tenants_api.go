package supervisor

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/natsauth"
	"github.com/planex-dev/planex/internal/tenant"
	"github.com/planex-dev/planex/services/supervisor/quota"
)

// tenantService is planex.v1.TenantService over the tenant registry (the
// planex-tenants bucket of the default account) and the supervisor's
// cells (readiness, unfinished runs, usage). authn.TenantPolicy requires
// the platform-admin role for everything but GetUsage.
type tenantService struct {
	planexv1.UnimplementedTenantServiceServer
	cells  *cells
	logger *slog.Logger
}

// globalAccount is the NATS account of the default tenant.
const globalAccount = "$G"

// registryWait bounds how long a write waits for the registry's cache
// (and so the routing and the next List) to see it.
const registryWait = 5 * time.Second

// CreateTenant registers a tenant.
func (s *tenantService) CreateTenant(ctx context.Context, req *planexv1.CreateTenantRequest) (*planexv1.CreateTenantResponse, error) {
	if err := s.platformAdmin(ctx); err != nil {
		return nil, err
	}
	if err := tenant.Validate(req.GetTenant()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	t, err := s.cells.reg.Create(ctx, req.GetTenant())
	if err != nil {
		return nil, s.status(ctx, "CreateTenant", err)
	}
	s.awaitCache(ctx, t.GetName(), t.GetRevision())
	s.cells.awaitCell(ctx, t)
	s.logger.InfoContext(ctx, "tenant created", "tenant", t.GetName(), "by", caller(ctx))
	return &planexv1.CreateTenantResponse{Tenant: s.fill(t)}, nil
}

// GetTenant returns one tenant.
func (s *tenantService) GetTenant(ctx context.Context, req *planexv1.GetTenantRequest) (*planexv1.GetTenantResponse, error) {
	if err := s.platformAdmin(ctx); err != nil {
		return nil, err
	}
	if req.GetName() == tenant.Default {
		return &planexv1.GetTenantResponse{Tenant: s.fill(&planexv1.Tenant{Name: tenant.Default})}, nil
	}
	if err := tenant.ValidName(req.GetName()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "name: %v", err)
	}
	t, err := s.cells.reg.Get(ctx, req.GetName())
	if err != nil {
		return nil, s.status(ctx, "GetTenant", err)
	}
	return &planexv1.GetTenantResponse{Tenant: s.fill(t)}, nil
}

// ListTenants lists "default", then every registered tenant by name.
func (s *tenantService) ListTenants(ctx context.Context, _ *planexv1.ListTenantsRequest) (*planexv1.ListTenantsResponse, error) {
	if err := s.platformAdmin(ctx); err != nil {
		return nil, err
	}
	out := []*planexv1.Tenant{s.fill(&planexv1.Tenant{Name: tenant.Default, Description: "the implicit tenant"})}
	for _, t := range s.cells.reg.List() {
		out = append(out, s.fill(t))
	}
	return &planexv1.ListTenantsResponse{Tenants: out}, nil
}

// UpdateTenant replaces a tenant's spec (compare-and-set on revision).
func (s *tenantService) UpdateTenant(ctx context.Context, req *planexv1.UpdateTenantRequest) (*planexv1.UpdateTenantResponse, error) {
	if err := s.platformAdmin(ctx); err != nil {
		return nil, err
	}
	if err := tenant.Validate(req.GetTenant()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	t, err := s.cells.reg.Update(ctx, req.GetTenant())
	if err != nil {
		return nil, s.status(ctx, "UpdateTenant", err)
	}
	s.awaitCache(ctx, t.GetName(), t.GetRevision())
	s.cells.awaitCell(ctx, t)
	s.logger.InfoContext(ctx, "tenant updated", "tenant", t.GetName(), "revision", t.GetRevision(), "by", caller(ctx))
	return &planexv1.UpdateTenantResponse{Tenant: s.fill(t)}, nil
}

// DeleteTenant removes a tenant; refused while it has unfinished runs
// unless force.
func (s *tenantService) DeleteTenant(ctx context.Context, req *planexv1.DeleteTenantRequest) (*planexv1.DeleteTenantResponse, error) {
	if err := s.platformAdmin(ctx); err != nil {
		return nil, err
	}
	name := req.GetName()
	if name == tenant.Default {
		return nil, status.Errorf(codes.InvalidArgument, "name: %q is the implicit tenant: it cannot be deleted", tenant.Default)
	}
	if err := tenant.ValidName(name); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "name: %v", err)
	}
	if _, err := s.cells.reg.Get(ctx, name); err != nil {
		return nil, s.status(ctx, "DeleteTenant", err)
	}
	if !req.GetForce() {
		n, err := s.unfinished(ctx, name)
		if err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "tenant %s: cannot count its unfinished runs (%v): delete with force to stop serving them anyway", name, err)
		}
		if n > 0 {
			return nil, status.Errorf(codes.FailedPrecondition, "tenant %s has %d runs that have not finished: wait for them, cancel them, or delete with force (they stop being served)", name, n)
		}
	}
	if err := s.cells.reg.Delete(ctx, name); err != nil {
		return nil, s.status(ctx, "DeleteTenant", err)
	}
	s.awaitCache(ctx, name, 0)
	s.logger.InfoContext(ctx, "tenant deleted", "tenant", name, "force", req.GetForce(), "by", caller(ctx))
	return &planexv1.DeleteTenantResponse{}, nil
}

// unfinished counts a tenant's runs that have not finished, from its
// cell's run index.
func (s *tenantService) unfinished(ctx context.Context, name string) (int, error) {
	c, err := s.cells.cell(name)
	if err != nil {
		return 0, err
	}
	log := c.parts.log
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := log.WaitIndexed(wctx); err != nil {
		return 0, err
	}
	// Not a run whose last snapshot has not reached the index yet (a
	// delete right after the tenant's last run finished): up to a thousand
	// are read from their logs.
	return log.CountUnfinished(ctx, 1000)
}

// GetUsage reports a tenant's usage: the caller's own, or any tenant's
// for a platform admin.
func (s *tenantService) GetUsage(ctx context.Context, req *planexv1.GetUsageRequest) (*planexv1.GetUsageResponse, error) {
	own, err := s.cells.tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	name := req.GetTenant()
	if name == "" {
		name = own
	}
	if name != own {
		if id, ok := authn.FromContext(ctx); ok && !id.Has(authn.RolePlatformAdmin) {
			return nil, status.Errorf(codes.PermissionDenied, "usage of tenant %q: only a platform admin reads another tenant's usage", name)
		}
	}
	if name != tenant.Default {
		if err := tenant.ValidName(name); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "tenant: %v", err)
		}
		if s.cells.reg.Cached(name) == nil {
			return nil, status.Errorf(codes.NotFound, "tenant %q: no such tenant", name)
		}
	}
	for _, d := range []struct{ field, v string }{{"from_day", req.GetFromDay()}, {"to_day", req.GetToDay()}} {
		if d.v != "" {
			if _, err := time.Parse(time.DateOnly, d.v); err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "%s %q: want YYYY-MM-DD", d.field, d.v)
			}
		}
	}
	c, err := s.cells.cell(name)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if c.parts.quota == nil {
		return nil, status.Errorf(codes.Unavailable, "tenant %s: usage is not kept", name)
	}
	resp, err := c.parts.quota.Usage(ctx, req.GetFromDay(), req.GetToDay())
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, s.status(ctx, "GetUsage", err)
	}
	return resp, nil
}

// platformAdmin refuses a caller of a tenant other than the default one:
// authn.TenantPolicy checked the role, and a platform admin is one of the
// default tenant (a credential naming a tenant never reaches the role; a
// member subject of a tenant does not either).
func (s *tenantService) platformAdmin(ctx context.Context) error {
	own, err := s.cells.tenantOf(ctx)
	if err != nil {
		return err
	}
	if own != tenant.Default {
		return status.Errorf(codes.PermissionDenied, "managing tenants needs the platform-admin role of the default tenant; the caller belongs to tenant %s", own)
	}
	return nil
}

// fill sets a tenant's output-only fields the supervisor knows.
func (s *tenantService) fill(t *planexv1.Tenant) *planexv1.Tenant {
	t = proto.Clone(t).(*planexv1.Tenant)
	t.Ready, t.NotReadyReason = s.cells.status(t.GetName())
	if t.GetName() == tenant.Default {
		t.NatsAccount = globalAccount
	} else {
		t.NatsAccount = natsauth.TenantAccount(t.GetName())
	}
	return t
}

// awaitCache waits (bounded) until the registry's cache holds revision
// rev of the tenant (0: holds it no more), so that the caller's next call
// — a List, a call of the new tenant — sees the write.
func (s *tenantService) awaitCache(ctx context.Context, name string, rev uint64) {
	deadline := time.Now().Add(registryWait)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		t := s.cells.reg.Cached(name)
		if (rev == 0 && t == nil) || (rev != 0 && t.GetRevision() >= rev) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// status translates a registry error, once, to a gRPC status safe to
// show; other errors are logged and reported as Internal.
func (s *tenantService) status(ctx context.Context, method string, err error) error {
	var bad *quota.BadRequestError
	switch {
	case errors.As(err, &bad):
		return status.Error(codes.InvalidArgument, bad.Msg)
	case errors.Is(err, tenant.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, tenant.ErrExists):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, tenant.ErrConflict):
		return status.Error(codes.Aborted, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	s.logger.ErrorContext(ctx, "tenant service", "method", method, "err", err)
	return status.Errorf(codes.Internal, "%s: the tenant registry failed; see the supervisor's log", method)
}

// caller names the caller in logs.
func caller(ctx context.Context) string {
	if id, ok := authn.FromContext(ctx); ok {
		return id.Subject
	}
	return "anonymous"
}
