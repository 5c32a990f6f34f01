package planner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/plan"
	"github.com/planex-dev/planex/internal/telemetry"
	"github.com/planex-dev/planex/services/planner/llm"
	"github.com/planex-dev/planex/services/planner/playbook"
)

// Backend turns a plan request into a plan answer. Answers are validated
// by the server, not by the backend's caller.
type Backend interface {
	// Name is the backend's name in PlanRequest.backend and
	// PlanResponse.backend.
	Name() string
	// Plan answers one request.
	Plan(ctx context.Context, req *planexv1.PlanRequest) (*planexv1.PlanResponse, error)
}

// examplePlanner is a backend that can be shown a cached plan.
type examplePlanner interface {
	PlanWithExample(ctx context.Context, req *planexv1.PlanRequest, example *planexv1.Plan) (*planexv1.PlanResponse, error)
}

const instrumentation = "github.com/planex-dev/planex/services/planner"

// maxGoalBytes bounds a goal.
const maxGoalBytes = 8 << 10

// Server implements planexv1.PlannerServiceServer over the configured
// backends. It validates every request and every answer, and translates
// errors to gRPC status codes with client-safe messages:
//
//	InvalidArgument     bad request: no goal, no tools, unknown or disallowed backend
//	FailedPrecondition  no playbook matches the goal, a playbook plan invalid for the
//	                    catalog, the provider rejected the request, or it kept failing
//	                    (5xx, 429, timeouts) until the retries, the retry budget or the
//	                    caller's deadline ran out, or the model's answer was cut off at
//	                    the output cap (--planner-max-output-tokens) in the repair
//	                    round too — final, so the run stops PLANNER_ERROR with the
//	                    provider's status and message, or the flag and its value
//	Aborted             the model's answer stayed invalid after the repair round
//	ResourceExhausted   the remaining token budget cannot cover a model call, or
//	                    its answer, cut off twice at what the budget allows
//	DeadlineExceeded    the request's own deadline passed
//
// Errors after tokens were spent carry a planex.v1.TokenUsage status detail.
// A failed step no on_failure branch covers is not an error: Plan answers
// stop with give_up, and the run stops with the step's reason.
type Server struct {
	planexv1.UnimplementedPlannerServiceServer

	logger        *slog.Logger
	backends      map[string]Backend
	def           string
	allowOverride bool
	escalation    Backend
	threshold     float64
	cache         *planCache

	tracer   trace.Tracer
	duration metric.Float64Histogram
	tokens   metric.Int64Counter
}

// NewServer loads the playbooks, builds the backends cfg selects and
// returns the planner service, for callers that serve it on their own gRPC
// server. kv, when not nil, is the plan cache bucket used when
// cfg.PlanCache is not off.
func NewServer(cfg BackendConfig, logger *slog.Logger, kv jetstream.KeyValue) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	bs, err := buildBackends(cfg, logger)
	if err != nil {
		return nil, err
	}
	return newServer(bs, cfg, logger, kv)
}

func newServer(bs *backends, cfg BackendConfig, logger *slog.Logger, kv jetstream.KeyValue) (*Server, error) {
	meter := otel.Meter(instrumentation)
	duration, err := meter.Float64Histogram("planex.planner.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Duration of planner calls by backend, model and outcome"),
		metric.WithExplicitBucketBoundaries(0.005, 0.05, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80))
	if err != nil {
		return nil, fmt.Errorf("planner metrics: %w", err)
	}
	tokens, err := meter.Int64Counter("planex.planner.tokens",
		metric.WithUnit("{token}"),
		metric.WithDescription("Model tokens spent by the planner, by backend, model and type (input, output)"))
	if err != nil {
		return nil, fmt.Errorf("planner metrics: %w", err)
	}
	s := &Server{
		logger:        logger,
		backends:      bs.byName,
		def:           bs.def,
		allowOverride: cfg.AllowOverride,
		escalation:    bs.escalation,
		threshold:     cfg.EscalationThreshold,
		tracer:        otel.Tracer(instrumentation),
		duration:      duration,
		tokens:        tokens,
	}
	if kv != nil && cfg.PlanCache != CacheOff {
		s.cache = &planCache{kv: kv, reuse: cfg.PlanCache == CacheReuse, logger: logger}
	}
	return s, nil
}

// Plan answers a planning request.
func (s *Server) Plan(ctx context.Context, req *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
	ctx = telemetry.WithLogAttrs(ctx, slog.String("run_id", req.GetRunId()))
	if err := checkRequest(req); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	b, err := s.backend(req.GetBackend())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	resp, err := s.plan(ctx, b, req)
	if errors.Is(err, playbook.ErrNoBranch) {
		// Declining to recover from a failed step is an answer, not a
		// planner error: the run stops with the step's own reason.
		s.logger.InfoContext(ctx, "planner gives up on the failure", "backend", b.Name(), "revision", req.GetRevision(), "reason", err)
		return &planexv1.PlanResponse{Stop: true, GiveUp: true, StopMessage: err.Error(), Backend: b.Name()}, nil
	}
	if err != nil {
		st := toStatus(err)
		level := slog.LevelWarn
		var pe *llm.ProviderError
		if (st.Code() == codes.InvalidArgument || st.Code() == codes.FailedPrecondition || st.Code() == codes.Canceled) && !errors.As(err, &pe) && !errors.Is(err, llm.ErrTruncated) {
			level = slog.LevelInfo
		}
		// A provider's failure is an operator's problem (bad key, model,
		// schema, temperature, outage): logged at WARN, with the provider's
		// message. The goal is never logged above DEBUG.
		s.logger.Log(ctx, level, "plan failed", "backend", b.Name(), "revision", req.GetRevision(), "code", st.Code().String(), "err", withoutGoal(err.Error(), req.GetGoal()))
		s.logger.DebugContext(ctx, "plan failed", "goal", req.GetGoal(), "err", err)
		return nil, st.Err()
	}
	s.logger.InfoContext(ctx, "planned", "backend", resp.GetBackend(), "model", resp.GetModel(), "revision", req.GetRevision(),
		"steps", len(resp.GetPlan().GetSteps()), "stop", resp.GetStop(), "escalate", resp.GetEscalate(),
		"input_tokens", resp.GetUsage().GetInputTokens(), "output_tokens", resp.GetUsage().GetOutputTokens())
	return resp, nil
}

// withoutGoal replaces the goal (as written or quoted) in a log message.
func withoutGoal(msg, goal string) string {
	if goal == "" {
		return msg
	}
	msg = strings.ReplaceAll(msg, strconv.Quote(goal), `"<goal>"`)
	return strings.ReplaceAll(msg, goal, "<goal>")
}

// checkRequest rejects requests no backend can answer. A zero revision
// becomes 1 and an unspecified mode full.
func checkRequest(req *planexv1.PlanRequest) error {
	var errs []error
	goal := strings.TrimSpace(req.GetGoal())
	switch {
	case goal == "":
		errs = append(errs, errors.New("goal: required"))
	case len(goal) > maxGoalBytes:
		errs = append(errs, fmt.Errorf("goal: %d bytes, limit is %d", len(goal), maxGoalBytes))
	}
	if len(req.GetTools()) == 0 {
		errs = append(errs, errors.New("tools: the catalog is empty; no plan can use a tool"))
	}
	seen := map[string]bool{}
	for i, t := range req.GetTools() {
		switch name := t.GetName(); {
		case name == "":
			errs = append(errs, fmt.Errorf("tools[%d].name: required", i))
		case seen[name]:
			errs = append(errs, fmt.Errorf("tools[%d].name: duplicate tool %q", i, name))
		default:
			seen[name] = true
		}
	}
	if req.GetRevision() < 0 {
		errs = append(errs, fmt.Errorf("revision: %d, want 1 or more", req.GetRevision()))
	}
	if _, ok := planexv1.PlanningMode_name[int32(req.GetMode())]; !ok {
		errs = append(errs, fmt.Errorf("mode: unknown planning mode %d", req.GetMode()))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if req.Revision == 0 {
		req.Revision = 1
	}
	if req.Mode == planexv1.PlanningMode_PLANNING_MODE_UNSPECIFIED {
		req.Mode = planexv1.PlanningMode_PLANNING_MODE_FULL
	}
	return nil
}

func (s *Server) backend(name string) (Backend, error) {
	if name == "" || name == s.def {
		return s.backends[s.def], nil
	}
	if !s.allowOverride {
		return nil, fmt.Errorf("backend %q: this planner uses %q and does not allow a per-run override (--planner-allow-backend-override)", name, s.def)
	}
	b, ok := s.backends[name]
	if !ok {
		names := make([]string, 0, len(s.backends))
		for n := range s.backends {
			names = append(names, n)
		}
		slices.Sort(names)
		return nil, fmt.Errorf("backend %q: not configured on this planner (available: %s)", name, strings.Join(names, ", "))
	}
	return b, nil
}

func (s *Server) plan(ctx context.Context, b Backend, req *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
	_, isModel := b.(examplePlanner)
	var example *planexv1.Plan
	if s.cache != nil && isModel && firstCall(req) {
		if p := s.cache.lookup(ctx, req); p != nil {
			if s.cache.reuse {
				resp := &planexv1.PlanResponse{Plan: p, Backend: "cache"}
				p.Revision = req.GetRevision()
				p.Rationale = strings.TrimSpace("reused from the plan cache. " + p.GetRationale())
				if err := validatePlan(req, p); err == nil {
					s.observe(ctx, "cache", "", time.Now(), resp, nil)
					return resp, nil
				}
			}
			example = p
		}
	}
	resp, err := s.call(ctx, b, req, example)
	if s.escalation != nil && isModel && escalate(resp, err, s.threshold) {
		first, ferr := resp, err
		resp, err = s.call(ctx, s.escalation, req, example)
		used := llm.UsageOf(ferr)
		if ferr == nil {
			used = first.GetUsage()
		}
		switch {
		case err == nil:
			resp.Usage = addUsage(resp.GetUsage(), used)
		case ferr == nil:
			// The stronger model failed; the first answer was valid, if unsure.
			s.logger.WarnContext(ctx, "escalation failed, keeping the first answer", "err", err)
			spent := llm.UsageOf(err)
			resp, err = first, nil
			resp.Usage = addUsage(resp.GetUsage(), spent)
		}
	}
	if err != nil {
		return nil, err
	}
	if p := resp.GetPlan(); p != nil {
		p.Revision = req.GetRevision()
		if err := validatePlan(req, p); err != nil {
			return nil, &answerError{backend: resp.GetBackend(), model: isModel, err: err}
		}
		if s.cache != nil && isModel && firstCall(req) && resp.GetBackend() != "cache" {
			s.cache.store(ctx, req, p)
		}
	} else if !resp.GetStop() {
		return nil, &answerError{backend: b.Name(), model: isModel, err: errors.New("the answer has neither a plan nor stop")}
	}
	return resp, nil
}

// firstCall reports whether a request has no history: only then is a
// cached plan a fit.
func firstCall(req *planexv1.PlanRequest) bool {
	h := req.GetHistory()
	return len(h.GetRevisions()) == 0 && len(h.GetSteps()) == 0
}

func escalate(resp *planexv1.PlanResponse, err error, threshold float64) bool {
	if err != nil {
		return errors.Is(err, llm.ErrInvalidAnswer)
	}
	return resp.GetPlan() != nil && resp.GetPlan().GetConfidence() < threshold
}

func addUsage(a, b *planexv1.TokenUsage) *planexv1.TokenUsage {
	return &planexv1.TokenUsage{InputTokens: a.GetInputTokens() + b.GetInputTokens(), OutputTokens: a.GetOutputTokens() + b.GetOutputTokens()}
}

// call runs one backend in its own span and records its metrics.
func (s *Server) call(ctx context.Context, b Backend, req *planexv1.PlanRequest, example *planexv1.Plan) (*planexv1.PlanResponse, error) {
	model := ""
	if m, ok := b.(interface{ Model() string }); ok {
		model = m.Model()
	}
	ctx, span := s.tracer.Start(ctx, "planner "+b.Name(), trace.WithAttributes(
		attribute.String("planex.run_id", req.GetRunId()),
		attribute.Int("planex.plan_revision", int(req.GetRevision())),
		attribute.String("planex.backend", b.Name()),
		attribute.String("planex.planning_mode", strings.TrimPrefix(req.GetMode().String(), "PLANNING_MODE_")),
		attribute.String("planex.model", model),
	))
	defer span.End()
	start := time.Now()
	var resp *planexv1.PlanResponse
	var err error
	if ep, ok := b.(examplePlanner); ok && example != nil {
		resp, err = ep.PlanWithExample(ctx, req, example)
	} else {
		resp, err = b.Plan(ctx, req)
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(otelcodes.Error, toStatus(err).Message())
	} else {
		if resp.GetModel() != "" {
			model = resp.GetModel()
		}
		// The model calls under this span carry the gen_ai.* attributes
		// (services/planner/llm); these are the totals of the answer, in
		// planex's names so that token usage is not counted twice.
		span.SetAttributes(
			attribute.String("planex.model", model),
			attribute.Int64("planex.tokens.input", resp.GetUsage().GetInputTokens()),
			attribute.Int64("planex.tokens.output", resp.GetUsage().GetOutputTokens()),
			attribute.Int("planex.plan_steps", len(resp.GetPlan().GetSteps())),
			attribute.Float64("planex.plan_confidence", resp.GetPlan().GetConfidence()),
			attribute.Bool("planex.stop", resp.GetStop()),
		)
		if resp.GetBackend() == "" {
			resp.Backend = b.Name()
		}
	}
	s.observe(ctx, b.Name(), model, start, resp, err)
	return resp, err
}

func (s *Server) observe(ctx context.Context, backend, model string, start time.Time, resp *planexv1.PlanResponse, err error) {
	outcome := "plan"
	switch {
	case resp.GetEscalate():
		outcome = "escalate"
	case resp.GetStop():
		outcome = "stop"
	}
	attrs := []attribute.KeyValue{attribute.String("planex.backend", backend), attribute.String("planex.model", model)}
	s.record(ctx, attrs, start, outcome, resp.GetUsage(), err)
}

// record measures one backend call: its duration by outcome and the tokens
// it spent, both with attrs. A failed call's outcome is error_<code> and
// its tokens are those its error carries.
func (s *Server) record(ctx context.Context, attrs []attribute.KeyValue, start time.Time, outcome string, u *planexv1.TokenUsage, err error) {
	if err != nil {
		outcome = "error_" + strings.ToLower(toStatus(err).Code().String())
		u = llm.UsageOf(err)
	}
	s.duration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(append(attrs, attribute.String("outcome", outcome))...))
	if n := u.GetInputTokens(); n > 0 {
		s.tokens.Add(ctx, n, metric.WithAttributes(append(attrs, attribute.String("type", "input"))...))
	}
	if n := u.GetOutputTokens(); n > 0 {
		s.tokens.Add(ctx, n, metric.WithAttributes(append(attrs, attribute.String("type", "output"))...))
	}
}

// validatePlan is the check every answer passes: the engine's validation
// against the request's catalog, with the request's step limit.
func validatePlan(req *planexv1.PlanRequest, p *planexv1.Plan) error {
	lim := plan.DefaultLimits()
	if m := int(req.GetConstraints().GetMaxSteps()); m > 0 && m < lim.MaxSteps {
		lim.MaxSteps = m
	}
	return plan.Validate(p, plan.NewCatalog(req.GetTools()), lim)
}

// answerError is an answer the server's own validation rejected.
type answerError struct {
	backend string
	model   bool
	err     error
}

func (e *answerError) Error() string {
	return fmt.Sprintf("backend %s answered an invalid plan: %v", e.backend, e.err)
}

func (e *answerError) Unwrap() error { return e.err }

// toStatus translates an error to a gRPC status whose message is safe to
// show a client.
func toStatus(err error) *status.Status {
	var st *status.Status
	var pe *llm.ProviderError
	var ex *llm.ExhaustedError
	var ae *answerError
	if rst, ok := replayStatus(err); ok { // the replay backend's (replay.go)
		return rst
	}
	switch {
	case errors.As(err, &ex):
		st = status.New(codes.FailedPrecondition, "planner: "+ex.Public())
	case errors.Is(err, playbook.ErrNoMatch), errors.Is(err, playbook.ErrNoBranch), errors.Is(err, llm.ErrBudget):
		code := codes.FailedPrecondition
		if errors.Is(err, llm.ErrBudget) {
			code = codes.ResourceExhausted
		}
		st = status.New(code, err.Error())
	case errors.Is(err, llm.ErrTruncated):
		// Final: the same cap cuts the next answer too, so the run stops
		// PLANNER_ERROR naming the flag rather than replanning into its
		// replan budget.
		st = status.New(codes.FailedPrecondition, "planner: "+err.Error())
	case errors.As(err, &pe):
		code := codes.Unavailable
		switch {
		case errors.Is(pe, llm.ErrTimeout):
			code = codes.DeadlineExceeded
		case errors.Is(pe, llm.ErrRejected):
			code = codes.FailedPrecondition
		}
		st = status.New(code, "planner: "+pe.Public())
	case errors.Is(err, llm.ErrInvalidAnswer):
		st = status.New(codes.Aborted, "planner: "+err.Error())
	case errors.As(err, &ae) && ae.model:
		st = status.New(codes.Aborted, "planner: "+err.Error())
	case errors.As(err, &ae):
		st = status.New(codes.FailedPrecondition, "planner: "+err.Error()+" (does the catalog hold every tool the playbook uses?)")
	case errors.Is(err, context.DeadlineExceeded):
		st = status.New(codes.DeadlineExceeded, "planner: deadline exceeded")
	case errors.Is(err, context.Canceled):
		st = status.New(codes.Canceled, "planner: request cancelled")
	default:
		st = status.New(codes.Internal, "planner: internal error")
	}
	if u := llm.UsageOf(err); u != nil {
		if withUsage, derr := st.WithDetails(u); derr == nil {
			return withUsage
		}
	}
	return st
}
