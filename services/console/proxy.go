package console

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/gen/planex/v1/planexv1connect"
)

// proxy serves SupervisorService over Connect by forwarding every call to
// the supervisor's gRPC API with the caller's bearer token.
type proxy struct {
	planexv1connect.UnimplementedSupervisorServiceHandler
	client        planexv1.SupervisorServiceClient
	forwardTokens bool
	logger        *slog.Logger
}

// unary forwards one unary call.
func unary[Req, Resp any](p *proxy, ctx context.Context, req *connect.Request[Req],
	call func(context.Context, *Req, ...grpc.CallOption) (*Resp, error)) (*connect.Response[Resp], error) {
	ctx, err := p.outgoing(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	resp, err := call(ctx, req.Msg)
	if err != nil {
		return nil, p.connectError(req.Spec().Procedure, err)
	}
	return connect.NewResponse(resp), nil
}

// outgoing carries the browser's Authorization header to the supervisor.
// Exactly one "Bearer <token>" header is accepted; the supervisor judges
// the token.
func (p *proxy) outgoing(ctx context.Context, h http.Header) (context.Context, error) {
	vals := h.Values("Authorization")
	if len(vals) == 0 || !p.forwardTokens {
		return ctx, nil
	}
	if len(vals) > 1 {
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("more than one Authorization header"))
	}
	scheme, token, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(token) == "" {
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("authorization: want 'Bearer <token>'"))
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+strings.TrimSpace(token)), nil
}

// connectError passes the supervisor's status on unchanged (the codes are
// the same numbers; the message is already safe to show a client), with
// its details.
func (p *proxy) connectError(procedure string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		p.logger.Warn("console: supervisor call", "procedure", procedure, "err", err)
		return connect.NewError(connect.CodeUnavailable, errors.New("supervisor unavailable"))
	}
	cerr := connect.NewError(connect.Code(st.Code()), errors.New(st.Message()))
	for _, d := range st.Proto().GetDetails() {
		if detail, derr := connect.NewErrorDetail(d); derr == nil {
			cerr.AddDetail(detail)
		}
	}
	return cerr
}

// StartRun implements planexv1connect.SupervisorServiceHandler.
func (p *proxy) StartRun(ctx context.Context, req *connect.Request[planexv1.StartRunRequest]) (*connect.Response[planexv1.StartRunResponse], error) {
	return unary(p, ctx, req, p.client.StartRun)
}

// GetRun implements planexv1connect.SupervisorServiceHandler.
func (p *proxy) GetRun(ctx context.Context, req *connect.Request[planexv1.GetRunRequest]) (*connect.Response[planexv1.GetRunResponse], error) {
	return unary(p, ctx, req, p.client.GetRun)
}

// ListRuns implements planexv1connect.SupervisorServiceHandler.
func (p *proxy) ListRuns(ctx context.Context, req *connect.Request[planexv1.ListRunsRequest]) (*connect.Response[planexv1.ListRunsResponse], error) {
	return unary(p, ctx, req, p.client.ListRuns)
}

// Decide implements planexv1connect.SupervisorServiceHandler.
func (p *proxy) Decide(ctx context.Context, req *connect.Request[planexv1.DecideRequest]) (*connect.Response[planexv1.DecideResponse], error) {
	return unary(p, ctx, req, p.client.Decide)
}

// ListGates implements planexv1connect.SupervisorServiceHandler.
func (p *proxy) ListGates(ctx context.Context, req *connect.Request[planexv1.ListGatesRequest]) (*connect.Response[planexv1.ListGatesResponse], error) {
	return unary(p, ctx, req, p.client.ListGates)
}

// CancelRun implements planexv1connect.SupervisorServiceHandler.
func (p *proxy) CancelRun(ctx context.Context, req *connect.Request[planexv1.CancelRunRequest]) (*connect.Response[planexv1.CancelRunResponse], error) {
	return unary(p, ctx, req, p.client.CancelRun)
}

// ListTools implements planexv1connect.SupervisorServiceHandler.
func (p *proxy) ListTools(ctx context.Context, req *connect.Request[planexv1.ListToolsRequest]) (*connect.Response[planexv1.ListToolsResponse], error) {
	return unary(p, ctx, req, p.client.ListTools)
}

// ResetRun implements planexv1connect.SupervisorServiceHandler.
func (p *proxy) ResetRun(ctx context.Context, req *connect.Request[planexv1.ResetRunRequest]) (*connect.Response[planexv1.ResetRunResponse], error) {
	return unary(p, ctx, req, p.client.ResetRun)
}

// ForkRun implements planexv1connect.SupervisorServiceHandler.
func (p *proxy) ForkRun(ctx context.Context, req *connect.Request[planexv1.ForkRunRequest]) (*connect.Response[planexv1.ForkRunResponse], error) {
	return unary(p, ctx, req, p.client.ForkRun)
}

// WatchRun implements planexv1connect.SupervisorServiceHandler: the
// supervisor's event stream is relayed message by message until it ends or
// the browser goes away.
func (p *proxy) WatchRun(ctx context.Context, req *connect.Request[planexv1.WatchRunRequest], out *connect.ServerStream[planexv1.WatchRunResponse]) error {
	return serverStream(p, ctx, req, out, p.client.WatchRun)
}

// RunBatch implements planexv1connect.SupervisorServiceHandler: the
// batch's progress messages are relayed as they come. A browser that goes
// away cancels the call; the supervisor decides what a cancelled batch
// still finishes.
func (p *proxy) RunBatch(ctx context.Context, req *connect.Request[planexv1.RunBatchRequest], out *connect.ServerStream[planexv1.RunBatchResponse]) error {
	return serverStream(p, ctx, req, out, p.client.RunBatch)
}

// serverStream forwards one server-streaming call: the supervisor's
// messages are relayed one by one until its stream ends or the browser
// goes away.
func serverStream[Req, Resp any](p *proxy, ctx context.Context, req *connect.Request[Req], out *connect.ServerStream[Resp],
	call func(context.Context, *Req, ...grpc.CallOption) (grpc.ServerStreamingClient[Resp], error)) error {
	ctx, err := p.outgoing(ctx, req.Header())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	in, err := call(ctx, req.Msg)
	if err != nil {
		return p.connectError(req.Spec().Procedure, err)
	}
	for {
		msg, err := in.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return p.connectError(req.Spec().Procedure, err)
		}
		if err := out.Send(msg); err != nil {
			return err
		}
	}
}

// scheduleProxy serves ScheduleService over Connect like proxy serves
// SupervisorService: every call forwarded with the caller's bearer token.
type scheduleProxy struct {
	planexv1connect.UnimplementedScheduleServiceHandler
	p      *proxy
	client planexv1.ScheduleServiceClient
}

// CreateSchedule implements planexv1connect.ScheduleServiceHandler.
func (s *scheduleProxy) CreateSchedule(ctx context.Context, req *connect.Request[planexv1.CreateScheduleRequest]) (*connect.Response[planexv1.CreateScheduleResponse], error) {
	return unary(s.p, ctx, req, s.client.CreateSchedule)
}

// GetSchedule implements planexv1connect.ScheduleServiceHandler.
func (s *scheduleProxy) GetSchedule(ctx context.Context, req *connect.Request[planexv1.GetScheduleRequest]) (*connect.Response[planexv1.GetScheduleResponse], error) {
	return unary(s.p, ctx, req, s.client.GetSchedule)
}

// ListSchedules implements planexv1connect.ScheduleServiceHandler.
func (s *scheduleProxy) ListSchedules(ctx context.Context, req *connect.Request[planexv1.ListSchedulesRequest]) (*connect.Response[planexv1.ListSchedulesResponse], error) {
	return unary(s.p, ctx, req, s.client.ListSchedules)
}

// UpdateSchedule implements planexv1connect.ScheduleServiceHandler.
func (s *scheduleProxy) UpdateSchedule(ctx context.Context, req *connect.Request[planexv1.UpdateScheduleRequest]) (*connect.Response[planexv1.UpdateScheduleResponse], error) {
	return unary(s.p, ctx, req, s.client.UpdateSchedule)
}

// DeleteSchedule implements planexv1connect.ScheduleServiceHandler.
func (s *scheduleProxy) DeleteSchedule(ctx context.Context, req *connect.Request[planexv1.DeleteScheduleRequest]) (*connect.Response[planexv1.DeleteScheduleResponse], error) {
	return unary(s.p, ctx, req, s.client.DeleteSchedule)
}

// PauseSchedule implements planexv1connect.ScheduleServiceHandler.
func (s *scheduleProxy) PauseSchedule(ctx context.Context, req *connect.Request[planexv1.PauseScheduleRequest]) (*connect.Response[planexv1.PauseScheduleResponse], error) {
	return unary(s.p, ctx, req, s.client.PauseSchedule)
}

// ResumeSchedule implements planexv1connect.ScheduleServiceHandler.
func (s *scheduleProxy) ResumeSchedule(ctx context.Context, req *connect.Request[planexv1.ResumeScheduleRequest]) (*connect.Response[planexv1.ResumeScheduleResponse], error) {
	return unary(s.p, ctx, req, s.client.ResumeSchedule)
}

// BackfillSchedule implements planexv1connect.ScheduleServiceHandler.
func (s *scheduleProxy) BackfillSchedule(ctx context.Context, req *connect.Request[planexv1.BackfillScheduleRequest]) (*connect.Response[planexv1.BackfillScheduleResponse], error) {
	return unary(s.p, ctx, req, s.client.BackfillSchedule)
}
