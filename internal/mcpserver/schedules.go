package mcpserver

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
)

type listSchedulesIn struct{}

type createScheduleIn struct {
	ID           string            `json:"id" jsonschema:"schedule id: 1 to 63 of [a-z0-9_-]"`
	Goal         string            `json:"goal" jsonschema:"goal of every run the schedule starts"`
	Cron         string            `json:"cron,omitempty" jsonschema:"cron expression (5 fields, or 6 with seconds first, or @daily...); set cron or every"`
	TimeZone     string            `json:"time_zone,omitempty" jsonschema:"IANA time zone of cron (default UTC)"`
	Every        string            `json:"every,omitempty" jsonschema:"interval instead of cron, a Go duration like 15m (at least 1s)"`
	Jitter       string            `json:"jitter,omitempty" jsonschema:"delay each firing by a stable pseudo-random duration below this (Go duration)"`
	Overlap      string            `json:"overlap,omitempty" jsonschema:"skip (default), buffer-one, allow-all or cancel-other: what a firing does while the previous run has not finished"`
	CatchUp      string            `json:"catch_up_window,omitempty" jsonschema:"after downtime fire missed times at most this late (Go duration, default 1m)"`
	Inputs       map[string]any    `json:"inputs,omitempty" jsonschema:"inputs of every run"`
	Labels       map[string]string `json:"labels,omitempty" jsonschema:"labels of every run"`
	Description  string            `json:"description,omitempty" jsonschema:"free text shown in listings"`
	StartsPaused bool              `json:"paused,omitempty" jsonschema:"create it paused"`
}

type pauseScheduleIn struct {
	ID     string `json:"id" jsonschema:"the schedule"`
	Resume bool   `json:"resume,omitempty" jsonschema:"resume instead of pause"`
	Note   string `json:"note,omitempty" jsonschema:"why, shown with the schedule"`
}

// addScheduleTools registers list_schedules, create_schedule and
// pause_schedule (ScheduleService; viewer to list, runner to change).
func (m *server) addScheduleTools(s *mcp.Server) {
	yes, no := true, false
	mcp.AddTool(s, &mcp.Tool{Name: "list_schedules", Description: "List the schedules that start runs by themselves (cron or interval), with their next and recent firings.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no}}, m.listSchedules)
	mcp.AddTool(s, &mcp.Tool{Name: "create_schedule", Description: "Create a schedule that starts a run of a goal at the times of a cron expression or at an interval, exactly once per time. Needs the runner role.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &yes}}, m.createSchedule)
	mcp.AddTool(s, &mcp.Tool{Name: "pause_schedule", Description: "Pause a schedule (it fires nothing until resumed), or resume it with resume=true. Needs the runner role.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &yes, IdempotentHint: true, OpenWorldHint: &no}}, m.pauseSchedule)
}

func (m *server) listSchedules(ctx context.Context, _ *mcp.CallToolRequest, _ listSchedulesIn) (*mcp.CallToolResult, any, error) {
	got, err := m.opts.Schedules.ListSchedules(ctx, &planexv1.ListSchedulesRequest{})
	if err != nil {
		return nil, nil, m.opts.Error(err)
	}
	return result(got)
}

func durationArg(field, s string) (*durationpb.Duration, error) {
	if s == "" {
		return nil, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return nil, fmt.Errorf("%s %q: want a duration like 30s or 15m", field, s)
	}
	return durationpb.New(d), nil
}

func (m *server) createSchedule(ctx context.Context, _ *mcp.CallToolRequest, in createScheduleIn) (*mcp.CallToolResult, any, error) {
	sc := &planexv1.Schedule{Id: in.ID, Description: in.Description, Paused: in.StartsPaused,
		Spec:   &planexv1.ScheduleSpec{Cron: in.Cron, TimeZone: in.TimeZone},
		Action: &planexv1.ScheduleAction{Goal: in.Goal, Labels: in.Labels}}
	var err error
	if sc.Spec.Interval, err = durationArg("every", in.Every); err != nil {
		return nil, nil, err
	}
	if sc.Spec.Jitter, err = durationArg("jitter", in.Jitter); err != nil {
		return nil, nil, err
	}
	if sc.CatchUpWindow, err = durationArg("catch_up_window", in.CatchUp); err != nil {
		return nil, nil, err
	}
	if in.Overlap != "" {
		v, ok := planexv1.ScheduleOverlapPolicy_value["SCHEDULE_OVERLAP_POLICY_"+strings.ToUpper(strings.ReplaceAll(in.Overlap, "-", "_"))]
		if !ok || v == 0 {
			return nil, nil, fmt.Errorf("overlap %q: want skip, buffer-one, allow-all or cancel-other", in.Overlap)
		}
		sc.OverlapPolicy = planexv1.ScheduleOverlapPolicy(v)
	}
	if len(in.Inputs) > 0 {
		if sc.Action.Inputs, err = structpb.NewStruct(in.Inputs); err != nil {
			return nil, nil, fmt.Errorf("inputs: %v", err)
		}
	}
	got, err := m.opts.Schedules.CreateSchedule(ctx, &planexv1.CreateScheduleRequest{Schedule: sc})
	if err != nil {
		return nil, nil, m.opts.Error(err)
	}
	return result(got)
}

func (m *server) pauseSchedule(ctx context.Context, _ *mcp.CallToolRequest, in pauseScheduleIn) (*mcp.CallToolResult, any, error) {
	if in.Resume {
		got, err := m.opts.Schedules.ResumeSchedule(ctx, &planexv1.ResumeScheduleRequest{Id: in.ID, Note: in.Note})
		if err != nil {
			return nil, nil, m.opts.Error(err)
		}
		return result(got)
	}
	got, err := m.opts.Schedules.PauseSchedule(ctx, &planexv1.PauseScheduleRequest{Id: in.ID, Note: in.Note})
	if err != nil {
		return nil, nil, m.opts.Error(err)
	}
	return result(got)
}

// LocalSchedules is a ScheduleService client that calls srv in the same
// process as id, enforcing authn.SchedulePolicy as Local enforces the
// SupervisorService's (the supervisor's HTTP MCP endpoint uses it).
func LocalSchedules(srv planexv1.ScheduleServiceServer, id authn.Identity) planexv1.ScheduleServiceClient {
	return &localSchedules{srv: srv, id: id}
}

type localSchedules struct {
	srv planexv1.ScheduleServiceServer
	id  authn.Identity
}

func (l *localSchedules) authorize(ctx context.Context, method string) (context.Context, error) {
	need, ok := authn.SchedulePolicy[method]
	if !ok {
		need = authn.RoleAdmin
	}
	if !l.id.Has(need) {
		return nil, authn.Denied()
	}
	return authn.WithIdentity(ctx, l.id), nil
}

func (l *localSchedules) CreateSchedule(ctx context.Context, in *planexv1.CreateScheduleRequest, _ ...grpc.CallOption) (*planexv1.CreateScheduleResponse, error) {
	ctx, err := l.authorize(ctx, planexv1.ScheduleService_CreateSchedule_FullMethodName)
	if err != nil {
		return nil, err
	}
	return l.srv.CreateSchedule(ctx, in)
}

func (l *localSchedules) GetSchedule(ctx context.Context, in *planexv1.GetScheduleRequest, _ ...grpc.CallOption) (*planexv1.GetScheduleResponse, error) {
	ctx, err := l.authorize(ctx, planexv1.ScheduleService_GetSchedule_FullMethodName)
	if err != nil {
		return nil, err
	}
	return l.srv.GetSchedule(ctx, in)
}

func (l *localSchedules) ListSchedules(ctx context.Context, in *planexv1.ListSchedulesRequest, _ ...grpc.CallOption) (*planexv1.ListSchedulesResponse, error) {
	ctx, err := l.authorize(ctx, planexv1.ScheduleService_ListSchedules_FullMethodName)
	if err != nil {
		return nil, err
	}
	return l.srv.ListSchedules(ctx, in)
}

func (l *localSchedules) UpdateSchedule(ctx context.Context, in *planexv1.UpdateScheduleRequest, _ ...grpc.CallOption) (*planexv1.UpdateScheduleResponse, error) {
	ctx, err := l.authorize(ctx, planexv1.ScheduleService_UpdateSchedule_FullMethodName)
	if err != nil {
		return nil, err
	}
	return l.srv.UpdateSchedule(ctx, in)
}

func (l *localSchedules) DeleteSchedule(ctx context.Context, in *planexv1.DeleteScheduleRequest, _ ...grpc.CallOption) (*planexv1.DeleteScheduleResponse, error) {
	ctx, err := l.authorize(ctx, planexv1.ScheduleService_DeleteSchedule_FullMethodName)
	if err != nil {
		return nil, err
	}
	return l.srv.DeleteSchedule(ctx, in)
}

func (l *localSchedules) PauseSchedule(ctx context.Context, in *planexv1.PauseScheduleRequest, _ ...grpc.CallOption) (*planexv1.PauseScheduleResponse, error) {
	ctx, err := l.authorize(ctx, planexv1.ScheduleService_PauseSchedule_FullMethodName)
	if err != nil {
		return nil, err
	}
	return l.srv.PauseSchedule(ctx, in)
}

func (l *localSchedules) ResumeSchedule(ctx context.Context, in *planexv1.ResumeScheduleRequest, _ ...grpc.CallOption) (*planexv1.ResumeScheduleResponse, error) {
	ctx, err := l.authorize(ctx, planexv1.ScheduleService_ResumeSchedule_FullMethodName)
	if err != nil {
		return nil, err
	}
	return l.srv.ResumeSchedule(ctx, in)
}

func (l *localSchedules) BackfillSchedule(ctx context.Context, in *planexv1.BackfillScheduleRequest, _ ...grpc.CallOption) (*planexv1.BackfillScheduleResponse, error) {
	ctx, err := l.authorize(ctx, planexv1.ScheduleService_BackfillSchedule_FullMethodName)
	if err != nil {
		return nil, err
	}
	return l.srv.BackfillSchedule(ctx, in)
}
