package supervisor

import (
	"context"
	"errors"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/schedule"
)

// scheduleServer is one cell's ScheduleService.
type scheduleServer struct {
	planexv1.UnimplementedScheduleServiceServer
	cell   *scheduleCell
	logger *slog.Logger
}

// scheduleRouter is the supervisor's ScheduleService: like router, it
// hands each call to the cell of the caller's tenant.
type scheduleRouter struct {
	planexv1.UnimplementedScheduleServiceServer
	cells  *cells
	logger *slog.Logger
}

func (r *scheduleRouter) target(ctx context.Context) (*scheduleServer, error) {
	name, err := r.cells.tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	c, err := r.cells.cell(name)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return &scheduleServer{cell: c.parts.schedules, logger: r.logger.With("tenant", name)}, nil
}

// scheduleStatus translates a schedule error to a gRPC status once, here;
// errors of the store are logged and answered without their details.
func (s *scheduleServer) status(ctx context.Context, what string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, schedule.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, schedule.ErrNotFound):
		return status.Error(codes.NotFound, "schedule not found")
	case errors.Is(err, schedule.ErrExists):
		return status.Error(codes.AlreadyExists, "a schedule with this id exists")
	case errors.Is(err, schedule.ErrConflict):
		return status.Error(codes.Aborted, "the schedule changed since it was read: read it again (revision)")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	s.logger.ErrorContext(ctx, what, "err", err)
	return status.Error(codes.Unavailable, "the schedule store is unavailable; retry")
}

func subject(ctx context.Context) string {
	id, _ := authn.FromContext(ctx)
	return id.Subject
}

// CreateSchedule implements planexv1.ScheduleServiceServer.
func (s *scheduleServer) CreateSchedule(ctx context.Context, req *planexv1.CreateScheduleRequest) (*planexv1.CreateScheduleResponse, error) {
	sc, err := s.cell.ops.Create(ctx, req.GetSchedule(), subject(ctx))
	if err != nil {
		return nil, s.status(ctx, "create schedule", err)
	}
	s.cell.wake()
	return &planexv1.CreateScheduleResponse{Schedule: sc}, nil
}

// GetSchedule implements planexv1.ScheduleServiceServer.
func (s *scheduleServer) GetSchedule(ctx context.Context, req *planexv1.GetScheduleRequest) (*planexv1.GetScheduleResponse, error) {
	sc, err := s.cell.ops.Get(ctx, req.GetId())
	if err != nil {
		return nil, s.status(ctx, "get schedule", err)
	}
	return &planexv1.GetScheduleResponse{Schedule: sc}, nil
}

// ListSchedules implements planexv1.ScheduleServiceServer.
func (s *scheduleServer) ListSchedules(ctx context.Context, _ *planexv1.ListSchedulesRequest) (*planexv1.ListSchedulesResponse, error) {
	scs, err := s.cell.ops.List(ctx)
	if err != nil {
		return nil, s.status(ctx, "list schedules", err)
	}
	return &planexv1.ListSchedulesResponse{Schedules: scs}, nil
}

// UpdateSchedule implements planexv1.ScheduleServiceServer.
func (s *scheduleServer) UpdateSchedule(ctx context.Context, req *planexv1.UpdateScheduleRequest) (*planexv1.UpdateScheduleResponse, error) {
	sc, err := s.cell.ops.Update(ctx, req.GetSchedule(), req.GetRevision(), subject(ctx))
	if err != nil {
		return nil, s.status(ctx, "update schedule", err)
	}
	s.cell.wake()
	return &planexv1.UpdateScheduleResponse{Schedule: sc}, nil
}

// DeleteSchedule implements planexv1.ScheduleServiceServer.
func (s *scheduleServer) DeleteSchedule(ctx context.Context, req *planexv1.DeleteScheduleRequest) (*planexv1.DeleteScheduleResponse, error) {
	if err := s.cell.ops.Delete(ctx, req.GetId(), req.GetRevision()); err != nil {
		return nil, s.status(ctx, "delete schedule", err)
	}
	return &planexv1.DeleteScheduleResponse{}, nil
}

// PauseSchedule implements planexv1.ScheduleServiceServer.
func (s *scheduleServer) PauseSchedule(ctx context.Context, req *planexv1.PauseScheduleRequest) (*planexv1.PauseScheduleResponse, error) {
	sc, err := s.cell.ops.Pause(ctx, req.GetId(), req.GetNote(), subject(ctx))
	if err != nil {
		return nil, s.status(ctx, "pause schedule", err)
	}
	return &planexv1.PauseScheduleResponse{Schedule: sc}, nil
}

// ResumeSchedule implements planexv1.ScheduleServiceServer.
func (s *scheduleServer) ResumeSchedule(ctx context.Context, req *planexv1.ResumeScheduleRequest) (*planexv1.ResumeScheduleResponse, error) {
	sc, err := s.cell.ops.Resume(ctx, req.GetId(), req.GetNote(), subject(ctx))
	if err != nil {
		return nil, s.status(ctx, "resume schedule", err)
	}
	s.cell.wake()
	return &planexv1.ResumeScheduleResponse{Schedule: sc}, nil
}

// BackfillSchedule implements planexv1.ScheduleServiceServer.
func (s *scheduleServer) BackfillSchedule(ctx context.Context, req *planexv1.BackfillScheduleRequest) (*planexv1.BackfillScheduleResponse, error) {
	var start, end = req.GetStartTime().AsTime(), req.GetEndTime().AsTime()
	if req.GetStartTime() == nil || req.GetEndTime() == nil {
		return nil, status.Error(codes.InvalidArgument, "start_time and end_time: required")
	}
	sc, n, err := s.cell.ops.Backfill(ctx, req.GetId(), start, end, req.GetOverlapPolicy(), subject(ctx))
	if err != nil {
		return nil, s.status(ctx, "backfill schedule", err)
	}
	s.cell.wake()
	return &planexv1.BackfillScheduleResponse{Schedule: sc, Firings: n}, nil
}

// The router's methods hand each call to the caller's tenant's cell.

// CreateSchedule creates a schedule in the caller's tenant.
func (r *scheduleRouter) CreateSchedule(ctx context.Context, req *planexv1.CreateScheduleRequest) (*planexv1.CreateScheduleResponse, error) {
	s, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return s.CreateSchedule(ctx, req)
}

// GetSchedule reads a schedule of the caller's tenant.
func (r *scheduleRouter) GetSchedule(ctx context.Context, req *planexv1.GetScheduleRequest) (*planexv1.GetScheduleResponse, error) {
	s, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return s.GetSchedule(ctx, req)
}

// ListSchedules lists the caller's tenant's schedules.
func (r *scheduleRouter) ListSchedules(ctx context.Context, req *planexv1.ListSchedulesRequest) (*planexv1.ListSchedulesResponse, error) {
	s, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return s.ListSchedules(ctx, req)
}

// UpdateSchedule updates a schedule of the caller's tenant.
func (r *scheduleRouter) UpdateSchedule(ctx context.Context, req *planexv1.UpdateScheduleRequest) (*planexv1.UpdateScheduleResponse, error) {
	s, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return s.UpdateSchedule(ctx, req)
}

// DeleteSchedule deletes a schedule of the caller's tenant.
func (r *scheduleRouter) DeleteSchedule(ctx context.Context, req *planexv1.DeleteScheduleRequest) (*planexv1.DeleteScheduleResponse, error) {
	s, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return s.DeleteSchedule(ctx, req)
}

// PauseSchedule pauses a schedule of the caller's tenant.
func (r *scheduleRouter) PauseSchedule(ctx context.Context, req *planexv1.PauseScheduleRequest) (*planexv1.PauseScheduleResponse, error) {
	s, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return s.PauseSchedule(ctx, req)
}

// ResumeSchedule resumes a schedule of the caller's tenant.
func (r *scheduleRouter) ResumeSchedule(ctx context.Context, req *planexv1.ResumeScheduleRequest) (*planexv1.ResumeScheduleResponse, error) {
	s, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return s.ResumeSchedule(ctx, req)
}

// BackfillSchedule backfills a schedule of the caller's tenant.
func (r *scheduleRouter) BackfillSchedule(ctx context.Context, req *planexv1.BackfillScheduleRequest) (*planexv1.BackfillScheduleResponse, error) {
	s, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return s.BackfillSchedule(ctx, req)
}
