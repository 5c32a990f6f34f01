package supervisor

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/tenant"
	"github.com/planex-dev/planex/services/supervisor/api"
)

// router is the supervisor's SupervisorService: it resolves the caller's
// tenant and hands the call to that tenant's API. A run id of another
// tenant names nothing in the caller's account: NotFound, with no
// existence leak, by construction.
type router struct {
	planexv1.UnimplementedSupervisorServiceServer
	cells *cells
}

// tenantOf is the caller's tenant: resolved from its identity against the
// registry, or the default tenant when authentication is off.
func (s *cells) tenantOf(ctx context.Context) (string, error) {
	id, ok := authn.FromContext(ctx)
	if !ok {
		return tenant.Default, nil
	}
	name, err := s.reg.Resolve(id)
	if errors.Is(err, tenant.ErrUnknownTenant) {
		return "", status.Errorf(codes.PermissionDenied, "the credential names tenant %q, which is not registered: ask a platform admin to create it", id.Tenant)
	}
	if err != nil {
		return "", status.Error(codes.PermissionDenied, "the caller's tenant cannot be resolved")
	}
	return name, nil
}

// target is the cell of the caller's tenant, or the status refusing the
// call.
func (r *router) target(ctx context.Context) (*api.Server, error) {
	name, err := r.cells.tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	c, err := r.cells.cell(name)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return c.apiOf(), nil
}

// StartRun starts a run in the caller's tenant.
func (r *router) StartRun(ctx context.Context, req *planexv1.StartRunRequest) (*planexv1.StartRunResponse, error) {
	s, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return s.StartRun(ctx, req)
}

// GetRun reads a run of the caller's tenant.
func (r *router) GetRun(ctx context.Context, req *planexv1.GetRunRequest) (*planexv1.GetRunResponse, error) {
	s, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return s.GetRun(ctx, req)
}

// ListRuns lists the caller's tenant's runs.
func (r *router) ListRuns(ctx context.Context, req *planexv1.ListRunsRequest) (*planexv1.ListRunsResponse, error) {
	s, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return s.ListRuns(ctx, req)
}

// WatchRun streams a run of the caller's tenant.
func (r *router) WatchRun(req *planexv1.WatchRunRequest, stream grpc.ServerStreamingServer[planexv1.WatchRunResponse]) error {
	s, err := r.target(stream.Context())
	if err != nil {
		return err
	}
	return s.WatchRun(req, stream)
}

// Decide decides a gate of a run of the caller's tenant.
func (r *router) Decide(ctx context.Context, req *planexv1.DecideRequest) (*planexv1.DecideResponse, error) {
	s, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return s.Decide(ctx, req)
}

// ListGates lists the caller's tenant's gates.
func (r *router) ListGates(ctx context.Context, req *planexv1.ListGatesRequest) (*planexv1.ListGatesResponse, error) {
	s, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return s.ListGates(ctx, req)
}

// CancelRun cancels a run of the caller's tenant.
func (r *router) CancelRun(ctx context.Context, req *planexv1.CancelRunRequest) (*planexv1.CancelRunResponse, error) {
	s, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return s.CancelRun(ctx, req)
}

// ListTools lists the tools of the caller's tenant's account.
func (r *router) ListTools(ctx context.Context, req *planexv1.ListToolsRequest) (*planexv1.ListToolsResponse, error) {
	s, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return s.ListTools(ctx, req)
}

// ResetRun resets a run of the caller's tenant.
func (r *router) ResetRun(ctx context.Context, req *planexv1.ResetRunRequest) (*planexv1.ResetRunResponse, error) {
	s, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return s.ResetRun(ctx, req)
}

// ForkRun forks a run of the caller's tenant (into the same tenant).
func (r *router) ForkRun(ctx context.Context, req *planexv1.ForkRunRequest) (*planexv1.ForkRunResponse, error) {
	s, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return s.ForkRun(ctx, req)
}

// RunBatch runs a batch over the caller's tenant's runs.
func (r *router) RunBatch(req *planexv1.RunBatchRequest, stream grpc.ServerStreamingServer[planexv1.RunBatchResponse]) error {
	s, err := r.target(stream.Context())
	if err != nil {
		return err
	}
	return s.RunBatch(req, stream)
}
