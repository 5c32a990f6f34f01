// Package mcpserver serves planex to Model Context Protocol clients: the
// same tools, resources and progress notifications over stdio (`planex
// mcp`, backed by a gRPC client of the supervisor) and over streamable
// HTTP on the supervisor itself (Handler, behind the gRPC API's
// authentication and roles).
package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// StatusError is the default tool error for a failed API call: the
// status message for client mistakes (a bad argument, an unknown run),
// the code alone otherwise, so no server detail reaches the client.
func StatusError(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition, codes.AlreadyExists, codes.OutOfRange, codes.ResourceExhausted:
		return errors.New(st.Message())
	case codes.Unauthenticated:
		return errors.New("authentication required")
	case codes.PermissionDenied:
		return errors.New("permission denied")
	case codes.Canceled:
		return context.Canceled
	}
	return fmt.Errorf("the supervisor answered %s", strings.ToLower(strings.ReplaceAll(st.Code().String(), "_", " ")))
}

// Options tune a server.
type Options struct {
	// Error translates an error of the SupervisorService client into the
	// text of a tool error; the default names the gRPC code only, never
	// the server's details.
	Error func(error) error
	// Actor is recorded with decisions when the API knows no identity
	// (authentication disabled); default "mcp".
	Actor string
	// Fold applies one event to a run (the supervisor's runlog.Fold; a nil
	// run is the run before its first event). With it, each progress
	// notification of start_run tells the run's status at its event;
	// without it (or when an event cannot be folded) the run is read at
	// each event, which tells the status it has reached since.
	Fold func(run *planexv1.Run, ev *planexv1.RunEvent) (*planexv1.Run, error)
	// Schedules, when set, adds the tools list_schedules, create_schedule
	// and pause_schedule over this ScheduleService client (schedules.go).
	Schedules planexv1.ScheduleServiceClient
	// ScheduleServer, for Handler: each request's Schedules is
	// LocalSchedules(ScheduleServer, the request's identity).
	ScheduleServer planexv1.ScheduleServiceServer
}

// schemas caches the tools' JSON schemas: the HTTP endpoint builds a
// server per request, and reflecting the argument types each time would
// cost about a millisecond (BenchmarkNew).
var schemas = mcp.NewSchemaCache()

// server adapts the supervisor API to MCP tools.
type server struct {
	client planexv1.SupervisorServiceClient
	opts   Options
}

type startRunIn struct {
	Goal        string         `json:"goal" jsonschema:"what the run should achieve, in plain language"`
	Inputs      map[string]any `json:"inputs,omitempty" jsonschema:"named inputs the planner and playbooks may use"`
	Wait        *bool          `json:"wait,omitempty" jsonschema:"follow the run with progress notifications until it ends or waits for a decision (default true)"`
	WaitSeconds int            `json:"wait_seconds,omitempty" jsonschema:"longest time to follow the run (default 300)"`
}

type runIDIn struct {
	RunID string `json:"run_id" jsonschema:"the run id returned by start_run or list_runs"`
}

type listRunsIn struct {
	Status   string `json:"status,omitempty" jsonschema:"only runs in this status: pending, planning, running, waiting, succeeded, failed, escalated or cancelled"`
	PageSize int    `json:"page_size,omitempty" jsonschema:"runs per page (default 20)"`
	Page     string `json:"page_token,omitempty" jsonschema:"next_page_token of the previous answer (with the same filter)"`
	View     string `json:"view,omitempty" jsonschema:"full (default: every field of each run) or basic (id, goal, status, stop reason, labels, times, step counts: from the supervisor's run index, fast over many runs)"`
	runFilterIn
}

// runFilterIn are the run filter arguments of list_runs and batch_runs
// (planex.v1.RunFilter); every one given must hold.
type runFilterIn struct {
	Statuses      []string          `json:"statuses,omitempty" jsonschema:"only runs in one of these statuses (pending, planning, running, waiting, succeeded, failed, escalated, cancelled)"`
	Labels        map[string]string `json:"labels,omitempty" jsonschema:"only runs carrying all these labels with these values"`
	LabelSelector string            `json:"label_selector,omitempty" jsonschema:"Kubernetes-style label selector: key=value, key!=value, key in (a,b), key notin (a,b), key, !key; comma separated, all must hold"`
	Goal          string            `json:"goal_contains,omitempty" jsonschema:"words that must all appear in the goal (case-insensitive)"`
	Tools         []string          `json:"tools,omitempty" jsonschema:"only runs whose plans call one of these tools"`
	StartedBy     string            `json:"started_by,omitempty" jsonschema:"only runs started by this identity (e.g. apikey:ci)"`
	CreatedAfter  string            `json:"created_after,omitempty" jsonschema:"only runs created at or after this RFC 3339 time"`
	CreatedBefore string            `json:"created_before,omitempty" jsonschema:"only runs created before this RFC 3339 time"`
	StopReasons   []string          `json:"stop_reasons,omitempty" jsonschema:"only finished runs with one of these stop reasons (succeeded, failed, step_failed, cancelled, rejected, deadline, ...)"`
	Waiting       bool              `json:"waiting_for_decision,omitempty" jsonschema:"only runs waiting at an open gate"`
	RunIDs        []string          `json:"run_ids,omitempty" jsonschema:"only these runs"`
	ForkedFrom    string            `json:"forked_from,omitempty" jsonschema:"only forks of this run"`
}

// filter converts the arguments to a RunFilter, naming a bad one.
func (in runFilterIn) filter() (*planexv1.RunFilter, error) {
	f := &planexv1.RunFilter{
		Labels: in.Labels, LabelSelector: in.LabelSelector, GoalContains: in.Goal, Tools: in.Tools, StartedBy: in.StartedBy,
		WaitingForDecision: in.Waiting, RunIds: in.RunIDs, ForkedFrom: in.ForkedFrom,
	}
	for _, st := range in.Statuses {
		v, ok := planexv1.RunStatus_value["RUN_STATUS_"+strings.ToUpper(st)]
		if !ok || v == 0 {
			return nil, fmt.Errorf("statuses: %q: want pending, planning, running, waiting, succeeded, failed, escalated or cancelled", st)
		}
		f.Statuses = append(f.Statuses, planexv1.RunStatus(v))
	}
	for _, r := range in.StopReasons {
		v, ok := planexv1.StopReason_value["STOP_REASON_"+strings.ToUpper(r)]
		if !ok || v == 0 {
			return nil, fmt.Errorf("stop_reasons: %q is not a stop reason (succeeded, failed, step_failed, cancelled, rejected, deadline, ...)", r)
		}
		f.StopReasons = append(f.StopReasons, planexv1.StopReason(v))
	}
	for _, t := range []struct {
		field, v string
		to       **timestamppb.Timestamp
	}{{"created_after", in.CreatedAfter, &f.CreatedAfter}, {"created_before", in.CreatedBefore, &f.CreatedBefore}} {
		if t.v == "" {
			continue
		}
		at, err := time.Parse(time.RFC3339, t.v)
		if err != nil {
			return nil, fmt.Errorf("%s %q: want an RFC 3339 time like 2026-01-02T15:04:05Z", t.field, t.v)
		}
		*t.to = timestamppb.New(at)
	}
	return f, nil
}

type batchRunsIn struct {
	Operation     string `json:"operation" jsonschema:"cancel, approve, reject or reset"`
	DryRun        bool   `json:"dry_run,omitempty" jsonschema:"only count the runs and return a sample; do this first"`
	ExpectedCount int64  `json:"expected_count,omitempty" jsonschema:"required unless dry_run: the matched count of the dry run (the batch is refused if the filter now selects another number)"`
	Reason        string `json:"reason,omitempty" jsonschema:"why; required unless dry_run, recorded in each run's log"`
	BatchID       string `json:"batch_id,omitempty" jsonschema:"id of the batch ([A-Za-z0-9_-], at most 64); the same id again skips what it already did"`
	Stop          bool   `json:"stop,omitempty" jsonschema:"with reject: stop the runs instead of sending them back to the planner"`
	Replan        bool   `json:"replan,omitempty" jsonschema:"with reset: send the runs back to the planner"`
	runFilterIn
}

type cancelRunIn struct {
	RunID  string `json:"run_id" jsonschema:"the run to cancel"`
	Reason string `json:"reason,omitempty" jsonschema:"why, recorded in the run log"`
}

type decideIn struct {
	RunID    string `json:"run_id" jsonschema:"the run waiting for a decision"`
	GateID   string `json:"gate_id" jsonschema:"the open gate (run.gates[].id)"`
	Decision string `json:"decision" jsonschema:"approve or reject"`
	Comment  string `json:"comment,omitempty" jsonschema:"recorded with the decision; a rejection's reason goes to the planner"`
	Stop     bool   `json:"stop,omitempty" jsonschema:"with reject: stop the run (REJECTED) instead of sending it back to the planner with the comment"`
}

type listToolsIn struct {
	Pool string `json:"pool,omitempty" jsonschema:"only tools of this executor pool"`
}

// New builds the MCP server over client: the tools start_run, get_run,
// list_runs, cancel_run, decide and list_tools, progress notifications
// while start_run follows a run, and the resource template
// planex://runs/{run_id}/events. Each tool maps to one SupervisorService
// method, so the client's authentication and the API's policy (viewer,
// runner, approver) apply unchanged.
func New(client planexv1.SupervisorServiceClient, opts Options) *mcp.Server {
	if opts.Error == nil {
		opts.Error = StatusError
	}
	if opts.Actor == "" {
		opts.Actor = "mcp"
	}
	m := &server{client: client, opts: opts}
	s := mcp.NewServer(&mcp.Implementation{Name: "planex", Title: "planex", Version: "v1"}, &mcp.ServerOptions{
		SchemaCache: schemas,
		Instructions: "planex runs goals as validated, approved, retried and audited plans of tool calls. " +
			"Start a run with start_run; when it waits for a decision, approve or reject the open gate with decide; " +
			"when it asks a question (a gate of kind GATE_KIND_INPUT, with input.question and input.schema), answer it with answer_input.",
	})
	yes, no := true, false
	mcp.AddTool(s, &mcp.Tool{Name: "start_run", Description: "Start a planex run for a goal; by default follow it (with progress notifications) until it ends or waits for a decision, and return the run.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &yes}}, m.startRun)
	mcp.AddTool(s, &mcp.Tool{Name: "get_run", Description: "Get a run: status, plan steps with outputs and errors, open gates, result.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no}}, m.getRun)
	mcp.AddTool(s, &mcp.Tool{Name: "list_runs", Description: "List runs, newest first, optionally filtered (status, labels or a label selector, goal words, tools, owner, creation time, stop reasons, waiting for a decision, forks).",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no}}, m.listRuns)
	mcp.AddTool(s, &mcp.Tool{Name: "batch_runs", Description: "Cancel, approve, reject or reset every run a filter selects (at least one filter argument). First call it with dry_run to get the matched count and a sample and show them to the user; then call it again with expected_count set to that count and a reason. Returns the outcome of each run. Requires the operator role.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &yes, IdempotentHint: true, OpenWorldHint: &no}}, m.batchRuns)
	mcp.AddTool(s, &mcp.Tool{Name: "cancel_run", Description: "Cancel a run that has not ended.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &yes, IdempotentHint: true, OpenWorldHint: &no}}, m.cancelRun)
	mcp.AddTool(s, &mcp.Tool{Name: "decide", Description: "Approve or reject an open approval gate of a waiting run. A rejection sends the run back to the planner with the comment (a new plan revision), unless stop is set or the gate's policy says to stop.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &yes, OpenWorldHint: &no}}, m.decide)
	mcp.AddTool(s, &mcp.Tool{Name: "list_tools", Description: "List the tools planex can plan with, with their argument schemas and side effects.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no}}, m.listTools)
	m.addSurgeryTools(s)
	m.addInputTools(s)
	if opts.Schedules != nil {
		m.addScheduleTools(s)
	}
	s.AddResourceTemplate(&mcp.ResourceTemplate{
		Name: "run-events", Title: "Run events", MIMEType: "application/json",
		URITemplate: RunEventsPrefix + "{run_id}/events",
		Description: "The hash-chained event log of a run so far, as a JSON array of planex.v1.RunEvent.",
	}, m.readEvents)
	return s
}

// RunEventsPrefix starts the URI of a run's events resource
// (planex://runs/<run_id>/events).
const RunEventsPrefix = "planex://runs/"

// readEvents reads a run's events up to its last sequence at the time of
// the request.
func (m *server) readEvents(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	id, ok := strings.CutPrefix(uri, RunEventsPrefix)
	id, ok2 := strings.CutSuffix(id, "/events")
	if !ok || !ok2 || id == "" || strings.Contains(id, "/") {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	got, err := m.client.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
	if err != nil {
		return nil, m.opts.Error(err)
	}
	last := got.GetRun().GetLastSequence()
	events := []json.RawMessage{}
	if last > 0 {
		err := m.watch(ctx, id, func(ev *planexv1.RunEvent) (bool, error) {
			data, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(ev)
			if err != nil {
				return false, fmt.Errorf("encode event: %w", err)
			}
			events = append(events, data)
			return ev.GetSequence() >= last, nil
		})
		if err != nil {
			return nil, err
		}
	}
	text, err := json.Marshal(events)
	if err != nil {
		return nil, fmt.Errorf("encode events: %w", err)
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "application/json", Text: string(text)}}}, nil
}

// result renders a response as structured content plus its JSON as text.
func result(msg proto.Message) (*mcp.CallToolResult, any, error) {
	data, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(msg)
	if err != nil {
		return nil, nil, fmt.Errorf("encode %T: %w", msg, err)
	}
	var v map[string]any
	if err := json.Unmarshal(data, &v); err != nil {
		return nil, nil, fmt.Errorf("encode %T: %w", msg, err)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(data)}}, StructuredContent: v}, nil, nil
}

func (m *server) startRun(ctx context.Context, req *mcp.CallToolRequest, in startRunIn) (*mcp.CallToolResult, any, error) {
	if strings.TrimSpace(in.Goal) == "" {
		return nil, nil, errors.New("goal: must not be empty")
	}
	sr := &planexv1.StartRunRequest{Goal: in.Goal}
	if len(in.Inputs) > 0 {
		inputs, err := structpb.NewStruct(in.Inputs)
		if err != nil {
			return nil, nil, fmt.Errorf("inputs: %w", err)
		}
		sr.Inputs = inputs
	}
	started, err := m.client.StartRun(ctx, sr)
	if err != nil {
		return nil, nil, m.opts.Error(err)
	}
	run := started.GetRun()
	if in.Wait == nil || *in.Wait {
		wait := 300 * time.Second
		if in.WaitSeconds > 0 {
			wait = time.Duration(in.WaitSeconds) * time.Second
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		followed, err := m.followAnswering(wctx, req, run.GetId())
		switch {
		case err == nil:
			run = followed
		case wctx.Err() != nil && ctx.Err() == nil:
			// Still running after wait_seconds: report where it is.
			got, gerr := m.client.GetRun(ctx, &planexv1.GetRunRequest{RunId: run.GetId()})
			if gerr != nil {
				return nil, nil, m.opts.Error(gerr)
			}
			run = got.GetRun()
		default:
			return nil, nil, err
		}
	}
	return result(run)
}

// watch calls fn with each of the run's events, from the first, until fn
// says stop, fails, or the run's log ends.
func (m *server) watch(ctx context.Context, id string, fn func(*planexv1.RunEvent) (stop bool, err error)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := m.client.WatchRun(ctx, &planexv1.WatchRunRequest{RunId: id})
	if err != nil {
		return m.opts.Error(err)
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return m.opts.Error(err)
		}
		if stop, err := fn(resp.GetEvent()); stop || err != nil {
			return err
		}
	}
}

// follow watches the run's events, sending a progress notification for
// each, until the event that ends the run or opens the gate it waits at.
// With Options.Fold each notification tells the run's status at its event,
// folded from the events so far, not the status the run has reached by the
// time the notification is sent (a fast run is done before its first
// events are followed); otherwise the run is read at each event.
func (m *server) follow(ctx context.Context, req *mcp.CallToolRequest, id string) (*planexv1.Run, error) {
	token := req.Params.GetProgressToken()
	var (
		folded   *planexv1.Run
		foldable = m.opts.Fold != nil
	)
	err := m.watch(ctx, id, func(ev *planexv1.RunEvent) (bool, error) {
		if foldable {
			next, err := m.opts.Fold(folded, ev)
			if err != nil {
				foldable = false
			} else {
				folded = next
			}
		}
		at := folded
		if !foldable {
			got, err := m.client.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
			if err != nil {
				return false, m.opts.Error(err)
			}
			at = got.GetRun()
		}
		if token != nil {
			done := 0
			for _, s := range at.GetSteps() {
				switch s.GetStatus() {
				case planexv1.StepStatus_STEP_STATUS_SUCCEEDED, planexv1.StepStatus_STEP_STATUS_FAILED,
					planexv1.StepStatus_STEP_STATUS_SKIPPED, planexv1.StepStatus_STEP_STATUS_OUTCOME_UNKNOWN:
					done++
				}
			}
			// Progress is the event sequence: it only grows, as MCP requires.
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
				ProgressToken: token,
				Progress:      float64(ev.GetSequence()),
				Message: fmt.Sprintf("%s: %s (%d of %d steps done)", strings.ToLower(strings.TrimPrefix(at.GetStatus().String(), "RUN_STATUS_")),
					eventName(ev), done, len(at.GetSteps())),
			})
		}
		// Stop on the event that ends the run or makes it wait: every
		// event up to there gets its notification.
		return ev.GetFinished() != nil || (ev.GetGateOpened() != nil && at.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING), nil
	})
	if err != nil {
		return nil, err
	}
	// The run as it is now: after the event followed last, or where it is
	// when the log ended without a final state.
	got, err := m.client.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
	if err != nil {
		return nil, m.opts.Error(err)
	}
	return got.GetRun(), nil
}

// RunEnded reports whether s is a final run status.
func RunEnded(s planexv1.RunStatus) bool {
	switch s {
	case planexv1.RunStatus_RUN_STATUS_SUCCEEDED, planexv1.RunStatus_RUN_STATUS_FAILED,
		planexv1.RunStatus_RUN_STATUS_ESCALATED, planexv1.RunStatus_RUN_STATUS_CANCELLED:
		return true
	}
	return false
}

// eventName is the payload kind of an event ("step_succeeded").
func eventName(ev *planexv1.RunEvent) string {
	if ev == nil {
		return "event"
	}
	od := ev.ProtoReflect().Descriptor().Oneofs().ByName("payload")
	if fd := ev.ProtoReflect().WhichOneof(od); fd != nil {
		return string(fd.Name())
	}
	return "event"
}

func (m *server) getRun(ctx context.Context, _ *mcp.CallToolRequest, in runIDIn) (*mcp.CallToolResult, any, error) {
	got, err := m.client.GetRun(ctx, &planexv1.GetRunRequest{RunId: in.RunID})
	if err != nil {
		return nil, nil, m.opts.Error(err)
	}
	return result(got.GetRun())
}

func (m *server) listRuns(ctx context.Context, _ *mcp.CallToolRequest, in listRunsIn) (*mcp.CallToolResult, any, error) {
	lr := &planexv1.ListRunsRequest{PageSize: int32(min(max(in.PageSize, 0), 1000)), PageToken: in.Page}
	if lr.PageSize == 0 {
		lr.PageSize = 20
	}
	if in.Status != "" {
		v, ok := planexv1.RunStatus_value["RUN_STATUS_"+strings.ToUpper(in.Status)]
		if !ok || v == 0 {
			return nil, nil, fmt.Errorf("status %q: want pending, planning, running, waiting, succeeded, failed, escalated or cancelled", in.Status)
		}
		lr.Statuses = []planexv1.RunStatus{planexv1.RunStatus(v)}
	}
	switch strings.ToLower(in.View) {
	case "", "full":
	case "basic":
		lr.View = planexv1.RunView_RUN_VIEW_BASIC
	default:
		return nil, nil, fmt.Errorf("view %q: want basic or full", in.View)
	}
	f, err := in.filter()
	if err != nil {
		return nil, nil, err
	}
	if proto.Size(f) > 0 {
		lr.Filter = f
	}
	got, err := m.client.ListRuns(ctx, lr)
	if err != nil {
		return nil, nil, m.opts.Error(err)
	}
	return result(got)
}

// batchRuns runs RunBatch and returns its last message with every run's
// outcome (the progress messages' items gathered).
func (m *server) batchRuns(ctx context.Context, _ *mcp.CallToolRequest, in batchRunsIn) (*mcp.CallToolResult, any, error) {
	f, err := in.filter()
	if err != nil {
		return nil, nil, err
	}
	req := &planexv1.RunBatchRequest{Filter: f, DryRun: in.DryRun, ExpectedCount: in.ExpectedCount, Reason: in.Reason, BatchId: in.BatchID, Actor: m.opts.Actor}
	switch strings.ToLower(in.Operation) {
	case "cancel":
		req.Operation = &planexv1.RunBatchRequest_Cancel{Cancel: &planexv1.BatchCancel{}}
	case "approve":
		req.Operation = &planexv1.RunBatchRequest_Decide{Decide: &planexv1.BatchDecide{Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE}}
	case "reject":
		req.Operation = &planexv1.RunBatchRequest_Decide{Decide: &planexv1.BatchDecide{Decision: planexv1.DecisionKind_DECISION_KIND_REJECT, StopRun: in.Stop}}
	case "reset":
		req.Operation = &planexv1.RunBatchRequest_Reset_{Reset_: &planexv1.BatchReset{Replan: in.Replan}}
	default:
		return nil, nil, fmt.Errorf("operation %q: want cancel, approve, reject or reset", in.Operation)
	}
	if !in.DryRun && in.ExpectedCount == 0 {
		return nil, nil, fmt.Errorf("expected_count: required: call batch_runs with dry_run first and pass its matched count")
	}
	stream, err := m.client.RunBatch(ctx, req)
	if err != nil {
		return nil, nil, m.opts.Error(err)
	}
	out := &planexv1.RunBatchResponse{}
	var items []*planexv1.BatchItem
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, m.opts.Error(err)
		}
		items = append(items, msg.GetItems()...)
		out = msg
	}
	out.Items = items
	return result(out)
}

func (m *server) cancelRun(ctx context.Context, _ *mcp.CallToolRequest, in cancelRunIn) (*mcp.CallToolResult, any, error) {
	got, err := m.client.CancelRun(ctx, &planexv1.CancelRunRequest{RunId: in.RunID, Reason: in.Reason})
	if err != nil {
		return nil, nil, m.opts.Error(err)
	}
	return result(got.GetRun())
}

func (m *server) decide(ctx context.Context, _ *mcp.CallToolRequest, in decideIn) (*mcp.CallToolResult, any, error) {
	var d planexv1.DecisionKind
	switch strings.ToLower(in.Decision) {
	case "approve":
		d = planexv1.DecisionKind_DECISION_KIND_APPROVE
	case "reject":
		d = planexv1.DecisionKind_DECISION_KIND_REJECT
	default:
		return nil, nil, fmt.Errorf("decision %q: want approve or reject", in.Decision)
	}
	if in.Stop && d != planexv1.DecisionKind_DECISION_KIND_REJECT {
		return nil, nil, fmt.Errorf("stop: only with decision reject")
	}
	got, err := m.client.Decide(ctx, &planexv1.DecideRequest{RunId: in.RunID, GateId: in.GateID, Decision: d, Comment: in.Comment, Actor: m.opts.Actor, StopRun: in.Stop})
	if err != nil {
		return nil, nil, m.opts.Error(err)
	}
	return result(got.GetRun())
}

func (m *server) listTools(ctx context.Context, _ *mcp.CallToolRequest, in listToolsIn) (*mcp.CallToolResult, any, error) {
	got, err := m.client.ListTools(ctx, &planexv1.ListToolsRequest{Pool: in.Pool})
	if err != nil {
		return nil, nil, m.opts.Error(err)
	}
	return result(got)
}
