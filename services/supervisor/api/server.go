// Package api implements planex.v1.SupervisorService, the public API, over
// the run log (runlog) and the engine inbox: StartRun appends a run's first
// event and kicks the engine; GetRun, ListRuns and WatchRun read the log and
// its snapshots; CancelRun and Decide publish engine messages and wait
// (bounded) for the engine to record them. Errors become gRPC statuses
// only here, with messages safe to show a client; the full error is logged.
package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/plan"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/engine"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

const instrumentation = "github.com/planex-dev/planex/services/supervisor/api"

// Config tunes the API.
type Config struct {
	// Limits are the budget defaults and ceilings StartRun applies.
	Limits engine.Limits
	// DefaultMode is the planning mode of runs that do not choose one.
	DefaultMode planexv1.PlanningMode
	// Wait bounds how long CancelRun and Decide wait for the engine to
	// record the request (default 5s); they return the run either way.
	Wait time.Duration
	// Tools is the catalog, whose ToolSpec.sensitive_fields are hidden in
	// every run and event the API returns; ListTools and edited arguments
	// read it fresh (Cache.Fresh). Required.
	Tools *catalog.Cache
	// StartGuard is how long after StartRun the start guard timer fires
	// (default 10s).
	StartGuard time.Duration
	// AllowSelfApproval lets the identity that started a run approve its
	// gates (single-user setups such as `planex dev`).
	AllowSelfApproval bool
	// Policies are the guardrail policies edited arguments are checked
	// against (nil: none).
	Policies engine.PolicySource
	// PlanLimits bound the plans ResetRun and ForkRun produce, as the
	// engine bounds a planner's (default plan.DefaultLimits).
	PlanLimits plan.Limits
	// Tenant is the tenant this API serves (empty: the default tenant);
	// it appears in refusals and metrics, never decides access (the
	// supervisor routes each call to its tenant's Server).
	Tenant string
	// AdmitStart, when set, is asked before StartRun creates anything
	// (after the request is validated and an idempotency key found no
	// existing run): an error refuses the call with nothing created — a
	// quota's RESOURCE_EXHAUSTED with a RetryInfo (services/supervisor/quota).
	AdmitStart func(ctx context.Context, req *planexv1.StartRunRequest) error
	// Hooks are test seams (crash points); nil in production.
	Hooks Hooks
}

// Hooks let tests stop the API at a point as a crash would.
type Hooks struct {
	// AfterResetAppend runs once a RunReset is in the log, before the
	// kick that starts the run again; an error ends the call there, as if
	// the process died.
	AfterResetAppend func(runID string) error
	// AfterForkCreate runs once a fork's RunCreated is in the log, before
	// it is linked to its original and kicked; an error ends the call
	// there.
	AfterForkCreate func(forkID string) error
}

// Server implements planexv1.SupervisorServiceServer.
type Server struct {
	planexv1.UnimplementedSupervisorServiceServer

	cfg     Config
	res     *bus.Resources
	log     *runlog.Log
	logger  *slog.Logger
	tracer  trace.Tracer
	started metric.Int64Counter
}

// New returns the API server.
func New(cfg Config, res *bus.Resources, log *runlog.Log, logger *slog.Logger) (*Server, error) {
	if cfg.PlanLimits == (plan.Limits{}) {
		cfg.PlanLimits = plan.DefaultLimits()
	}
	if cfg.Wait <= 0 {
		cfg.Wait = 5 * time.Second
	}
	if cfg.Limits == (engine.Limits{}) {
		cfg.Limits = engine.DefaultLimits()
	}
	if cfg.DefaultMode == planexv1.PlanningMode_PLANNING_MODE_UNSPECIFIED {
		cfg.DefaultMode = planexv1.PlanningMode_PLANNING_MODE_FULL
	}
	started, err := otel.Meter(instrumentation).Int64Counter("planex.runs.started", metric.WithDescription("Runs created by StartRun."))
	if err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, res: res, log: log, logger: logger, tracer: otel.Tracer(instrumentation), started: started}, nil
}

// Register registers the server on a gRPC server.
func (s *Server) Register(g grpc.ServiceRegistrar) { planexv1.RegisterSupervisorServiceServer(g, s) }

// StartRun creates a run and kicks the engine to plan it.
func (s *Server) StartRun(ctx context.Context, req *planexv1.StartRunRequest) (*planexv1.StartRunResponse, error) {
	resp, err := s.startRun(ctx, req)
	if resp != nil {
		resp.Run = s.mask(ctx).run(resp.GetRun())
	}
	return resp, s.status(ctx, "StartRun", err)
}

func (s *Server) startRun(ctx context.Context, req *planexv1.StartRunRequest) (*planexv1.StartRunResponse, error) {
	budget, mode, err := s.validateStart(req)
	if err != nil {
		return nil, err
	}
	runID := ulid.Make().String()
	key := req.GetIdempotencyKey()
	retry := false // the key was claimed by an earlier call
	if key != "" {
		// A key already claimed is a retry: never refused by a quota.
		existing, err := s.lookupKey(ctx, key, fingerprint(req))
		if err != nil {
			return nil, err
		}
		if existing != "" {
			resp, err := s.existingRun(ctx, existing)
			if resp != nil || err != nil {
				return resp, err
			}
			runID, retry = existing, true // the first call died before creating it
		}
	}
	if !retry {
		// Before anything of the run exists (no key claimed, nothing
		// appended).
		release, err := s.admit(ctx, req)
		if err != nil {
			return nil, err
		}
		defer release()
	}
	if key != "" && !retry {
		existing, err := s.claimKey(ctx, key, runID, fingerprint(req))
		if err != nil {
			return nil, err
		}
		if existing != "" {
			// A concurrent call claimed it since the lookup.
			resp, err := s.existingRun(ctx, existing)
			if resp != nil || err != nil {
				return resp, err
			}
			runID = existing
		}
	}

	// The run's root span: a new trace linked to the caller's span, whose
	// context every replica uses as the parent of the run's later spans.
	rctx, span := s.tracer.Start(ctx, "run", trace.WithNewRoot(), trace.WithLinks(trace.LinkFromContext(ctx)),
		trace.WithAttributes(attribute.String("planex.run_id", runID), attribute.String("planex.planning_mode", mode.String())))
	defer span.End()
	tc := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(rctx, tc)

	// The start guard is published before the run's first event: should
	// this call die between the event and the kick below, the guard finds
	// the run pending and kicks it.
	if err := engine.PublishStartGuard(rctx, s.res.JS, runID, s.cfg.StartGuard); err != nil {
		return nil, err
	}
	tx := s.log.Begin(&runlog.State{})
	if err := tx.Emit(withRunID(runID, engine.Event(&planexv1.RunCreated{
		Goal: req.GetGoal(), Inputs: req.GetInputs(), Budget: budget, Labels: req.GetLabels(),
		IdempotencyKey: req.GetIdempotencyKey(), Mode: mode, PlannerBackend: req.GetPlannerBackend(),
		TraceContext: tc, StartedBy: startedBy(ctx), ApprovePlans: req.GetApprovePlans(),
	}))); err != nil {
		return nil, err
	}
	st, err := s.log.Commit(rctx, tx)
	if errors.Is(err, runlog.ErrConflict) {
		// A concurrent call with the same idempotency key created it.
		if st, err = s.log.Load(ctx, runID); err != nil {
			return nil, err
		}
		return &planexv1.StartRunResponse{Run: st.Run, Existing: true}, nil
	}
	if err != nil {
		return nil, err
	}
	if err := s.kick(rctx, st); err != nil {
		return nil, err
	}
	s.started.Add(ctx, 1, metric.WithAttributes(attribute.String("mode", mode.String())))
	s.logger.InfoContext(rctx, "run started", "run_id", runID, "mode", mode.String())
	return &planexv1.StartRunResponse{Run: st.Run}, nil
}

// existingRun answers StartRun for the run an idempotency key maps to
// (kicking it again: the first call may have died before kicking the
// engine), or nil when the run was never created.
func (s *Server) existingRun(ctx context.Context, runID string) (*planexv1.StartRunResponse, error) {
	st, err := s.log.Load(ctx, runID)
	if errors.Is(err, runlog.ErrRunNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if err := s.kick(ctx, st); err != nil {
		return nil, err
	}
	return &planexv1.StartRunResponse{Run: st.Run, Existing: true}, nil
}

// lookupKey returns the run id an idempotency key was claimed for ("" if
// none), refusing a key reused with other parameters like claimKey.
func (s *Server) lookupKey(ctx context.Context, key, fp string) (string, error) {
	sum := sha256.Sum256([]byte(key))
	e, err := s.res.Idempotency.Get(ctx, hex.EncodeToString(sum[:]))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read idempotency key: %w", err)
	}
	existing, prior, _ := strings.Cut(string(e.Value()), " ")
	if prior != "" && prior != fp {
		return "", &preconditionError{msg: fmt.Sprintf("idempotency_key %q was already used for run %s with different parameters; use a new key for a new run", clip(key), existing), reason: ReasonIdempotencyKeyReused}
	}
	return existing, nil
}

// admit asks Config.AdmitStart (when set) to let a run into flight: a new
// run (StartRun, ForkRun) or a finished one re-opened (ResetRun). The
// admission holds its place until release is called, once the run is
// created or the call failed; a refusal is an *admitError.
func (s *Server) admit(ctx context.Context, req *planexv1.StartRunRequest) (release func(), err error) {
	if s.cfg.AdmitStart == nil {
		return func() {}, nil
	}
	actx, cancel := context.WithCancel(ctx)
	if err := s.cfg.AdmitStart(actx, req); err != nil {
		cancel()
		return nil, &admitError{err: err}
	}
	return cancel, nil
}

// admitError is a refusal of Config.AdmitStart: a gRPC status (a quota's
// RESOURCE_EXHAUSTED) returned as it is.
type admitError struct{ err error }

func (e *admitError) Error() string { return e.err.Error() }
func (e *admitError) Unwrap() error { return e.err }

func withRunID(id string, ev *planexv1.RunEvent) *planexv1.RunEvent {
	ev.RunId = id
	return ev
}

// claimKey maps an idempotency key to runID and the request's
// fingerprint, or returns the run id an earlier call mapped it to. A key
// reused with other parameters is refused (FailedPrecondition naming the
// key), as Stripe-style APIs do. Keys are hashed: clients choose them
// freely, KV keys are restricted.
func (s *Server) claimKey(ctx context.Context, key, runID, fp string) (existing string, err error) {
	sum := sha256.Sum256([]byte(key))
	kvKey := hex.EncodeToString(sum[:])
	if _, err := s.res.Idempotency.Create(ctx, kvKey, []byte(runID+" "+fp)); err == nil {
		return "", nil
	} else if !errors.Is(err, jetstream.ErrKeyExists) {
		return "", fmt.Errorf("claim idempotency key: %w", err)
	}
	e, err := s.res.Idempotency.Get(ctx, kvKey)
	if err != nil {
		return "", fmt.Errorf("read idempotency key: %w", err)
	}
	// Values written before fingerprints existed hold the run id alone.
	existing, prior, _ := strings.Cut(string(e.Value()), " ")
	if prior != "" && prior != fp {
		return "", &preconditionError{msg: fmt.Sprintf("idempotency_key %q was already used for run %s with different parameters; use a new key for a new run", clip(key), existing), reason: ReasonIdempotencyKeyReused}
	}
	return existing, nil
}

// fingerprint identifies a StartRun request's parameters (everything but
// the idempotency key).
func fingerprint(req *planexv1.StartRunRequest) string {
	c := proto.Clone(req).(*planexv1.StartRunRequest)
	c.IdempotencyKey = ""
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	if err != nil {
		return "unmarshalable"
	}
	return fingerprintBytes(b)
}

// fingerprintBytes is the hex of the first 16 bytes of b's SHA-256.
func fingerprintBytes(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// kick publishes a pending run's deadline timer and first planning kick
// (deduplicated, so repeating it for an existing run is harmless).
func (s *Server) kick(ctx context.Context, st *runlog.State) error {
	run := st.Run
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_PENDING {
		return nil
	}
	ctx = engine.RunContext(ctx, st.TraceContext)
	if err := engine.PublishDeadline(ctx, s.res, run); err != nil {
		return err
	}
	_, err := bus.Publish(ctx, s.res.JS, bus.Publication{
		Subject: bus.EngineSubject(run.GetId(), bus.KindKick),
		Msg:     &planexv1.EngineKick{RunId: run.GetId(), Reason: "plan revision 1"},
		MsgID:   engine.PlanKickID(run.GetId(), 1, 0),
		Attrs:   []attribute.KeyValue{attribute.String("planex.run_id", run.GetId())},
	})
	if err != nil {
		return fmt.Errorf("kick run %s: %w", run.GetId(), err)
	}
	return nil
}

// GetRun returns a run's current state, folded from its log.
func (s *Server) GetRun(ctx context.Context, req *planexv1.GetRunRequest) (*planexv1.GetRunResponse, error) {
	if err := validRunID(req.GetRunId()); err != nil {
		return nil, s.status(ctx, "GetRun", err)
	}
	st, err := s.load(ctx, req.GetRunId())
	if err != nil {
		return nil, s.status(ctx, "GetRun", err)
	}
	return &planexv1.GetRunResponse{Run: s.mask(ctx).run(s.withResult(ctx, st.Run))}, nil
}

// WatchRun streams a run's events from a sequence and ends after the last.
func (s *Server) WatchRun(req *planexv1.WatchRunRequest, stream grpc.ServerStreamingServer[planexv1.WatchRunResponse]) error {
	ctx := stream.Context()
	if err := validRunID(req.GetRunId()); err != nil {
		return s.status(ctx, "WatchRun", err)
	}
	st, err := s.load(ctx, req.GetRunId())
	if err != nil {
		return s.status(ctx, "WatchRun", err)
	}
	mask := s.mask(ctx)
	toolOf := map[string]string{}
	for _, step := range st.Run.GetSteps() {
		toolOf[step.GetStepId()] = step.GetTool()
	}
	err = s.log.Watch(ctx, req.GetRunId(), req.GetFromSequence(), func(ev *planexv1.RunEvent) error {
		if err := stream.Send(&planexv1.WatchRunResponse{Event: mask.event(ev, toolOf)}); err != nil {
			return fmt.Errorf("%w: %w", errClientGone, err)
		}
		return nil
	})
	return s.status(ctx, "WatchRun", err)
}

var errClientGone = errors.New("send to client")

// CancelRun asks the engine to cancel a run and waits, bounded, until it
// did.
func (s *Server) CancelRun(ctx context.Context, req *planexv1.CancelRunRequest) (*planexv1.CancelRunResponse, error) {
	run, err := s.cancelRun(ctx, req)
	return &planexv1.CancelRunResponse{Run: s.mask(ctx).run(run)}, s.status(ctx, "CancelRun", err)
}

func (s *Server) cancelRun(ctx context.Context, req *planexv1.CancelRunRequest) (*planexv1.Run, error) {
	if err := validRunID(req.GetRunId()); err != nil {
		return nil, err
	}
	if err := checkText("reason", req.GetReason(), maxReasonBytes); err != nil {
		return nil, err
	}
	st, err := s.load(ctx, req.GetRunId())
	if err != nil {
		return nil, err
	}
	if err := checkCancel(ctx, st.Run); err != nil {
		return nil, err
	}
	if runlog.Terminal(st.Run.GetStatus()) {
		return st.Run, nil
	}
	_, err = bus.Publish(engine.RunContext(ctx, st.TraceContext), s.res.JS, bus.Publication{
		Subject: bus.EngineSubject(req.GetRunId(), bus.KindKick),
		Msg:     &planexv1.EngineKick{RunId: req.GetRunId(), Reason: "cancel", Cancel: true, CancelReason: req.GetReason()},
		MsgID:   bus.MsgID(req.GetRunId(), "cancel"),
		Attrs:   []attribute.KeyValue{attribute.String("planex.run_id", req.GetRunId())},
	})
	if err != nil {
		return nil, fmt.Errorf("publish cancel of run %s: %w", req.GetRunId(), err)
	}
	return s.waitFor(ctx, req.GetRunId(), func(run *planexv1.Run) bool { return runlog.Terminal(run.GetStatus()) })
}

// waitFor polls the run until cond holds or the wait bound passes, and
// returns the last state seen.
func (s *Server) waitFor(ctx context.Context, runID string, cond func(*planexv1.Run) bool) (*planexv1.Run, error) {
	deadline := time.Now().Add(s.cfg.Wait)
	delay := 10 * time.Millisecond
	for {
		st, err := s.log.Load(ctx, runID)
		if err != nil {
			return nil, err
		}
		if cond(st.Run) || time.Now().After(deadline) {
			return st.Run, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
}

// ListTools lists the catalog executors registered in planex-tools.
func (s *Server) ListTools(ctx context.Context, req *planexv1.ListToolsRequest) (*planexv1.ListToolsResponse, error) {
	if p := req.GetPool(); p != "" && !bus.ValidToken(p) {
		return nil, s.status(ctx, "ListTools", invalid("pool %q: want a pool name like \"sql\"", clip(p)))
	}
	cat, err := s.cfg.Tools.Fresh(ctx)
	if err != nil {
		return nil, s.status(ctx, "ListTools", err)
	}
	return &planexv1.ListToolsResponse{Tools: cat.Registered(req.GetPool())}, nil
}

// invalidError is a request error a client can fix; its message names the
// field and the value.
type invalidError struct{ msg string }

func (e *invalidError) Error() string { return e.msg }

func invalid(format string, args ...any) error {
	return &invalidError{msg: fmt.Sprintf(format, args...)}
}

// preconditionError is a request that does not fit the run's state.
type preconditionError struct {
	msg string
	// reason, when set, is sent as an errdetails.ErrorInfo (domain
	// ErrorDomain) for callers to match on instead of the message.
	reason string
}

// ErrorDomain is the domain of the errdetails.ErrorInfo planex attaches
// to errors a caller may want to tell apart.
const ErrorDomain = "planex.dev"

// ReasonIdempotencyKeyReused is the ErrorInfo reason of a StartRun whose
// idempotency_key started another run with different parameters
// (FAILED_PRECONDITION).
const ReasonIdempotencyKeyReused = "IDEMPOTENCY_KEY_REUSED"

func (e *preconditionError) Error() string { return e.msg }

// notFoundError names something missing.
type notFoundError struct{ msg string }

func (e *notFoundError) Error() string { return e.msg }

// status translates err into a gRPC status with a client-safe message,
// logging errors the client cannot fix. A run whose log is corrupt is
// DataLoss, naming the run, the broken entry and how to inspect it.
func (s *Server) status(ctx context.Context, method string, err error) error {
	if err == nil {
		return nil
	}
	var (
		inv     *invalidError
		pre     *preconditionError
		nf      *notFoundError
		den     *deniedError
		corrupt *runlog.BrokenEventError
	)
	var admit *admitError
	switch {
	case errors.As(err, &admit):
		if st, ok := status.FromError(admit.err); ok && st.Code() != codes.Unknown {
			s.logger.InfoContext(ctx, "supervisor API: start refused", "method", method, "code", st.Code(), "reason", st.Message())
			return st.Err()
		}
		if errors.Is(admit.err, context.Canceled) || errors.Is(admit.err, context.DeadlineExceeded) {
			return s.status(ctx, method, admit.err)
		}
		s.logger.ErrorContext(ctx, "supervisor API: start admission failed", "method", method, "err", admit.err)
		return status.Error(codes.Unavailable, "the tenant's quotas could not be checked, retry later")
	case errors.As(err, &den):
		s.logger.WarnContext(ctx, "supervisor API: permission denied", "method", method, "reason", den.msg)
		if den.public != "" {
			return status.Error(codes.PermissionDenied, "permission denied: "+den.public)
		}
		return status.Error(codes.PermissionDenied, "permission denied")
	case errors.As(err, &inv):
		return status.Error(codes.InvalidArgument, inv.msg)
	case errors.As(err, &pre):
		st := status.New(codes.FailedPrecondition, pre.msg)
		if pre.reason != "" {
			if d, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: pre.reason, Domain: ErrorDomain}); derr == nil {
				st = d
			}
		}
		return st.Err()
	case errors.As(err, &nf):
		return status.Error(codes.NotFound, nf.msg)
	case errors.As(err, &corrupt) && corrupt.StreamSeq > 0:
		// The message names the run, the entry and what to do; it holds no
		// event content. The run log logged it once at ERROR.
		return status.Error(codes.DataLoss, corrupt.Advice())
	case errors.Is(err, runlog.ErrBrokenChain):
		s.logger.ErrorContext(ctx, "supervisor API: run log incomplete", "method", method, "err", err)
		return status.Error(codes.DataLoss, "the run's log is incomplete or corrupt: inspect it with `planex audit verify RUN_ID`")
	case errors.Is(err, runlog.ErrRunNotFound):
		return status.Error(codes.NotFound, "run not found")
	case errors.Is(err, errClientGone), errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "request cancelled")
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "deadline exceeded")
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrTimeout), errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrNoResponders):
		s.logger.WarnContext(ctx, "supervisor API: run store unavailable", "method", method, "err", err)
		return status.Error(codes.Unavailable, "the run store is unavailable, retry later")
	}
	s.logger.ErrorContext(ctx, "supervisor API failed", "method", method, "err", err)
	return status.Error(codes.Internal, "internal error")
}
