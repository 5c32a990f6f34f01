package planner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/telemetry"
)

// critic is a backend that judges step results (the model backends).
type critic interface {
	Critique(ctx context.Context, req *planexv1.CritiqueRequest) (*planexv1.CritiqueResponse, error)
}

// Critique judges one step result with the requested backend: a model
// backend asks its model for a structured verdict (validated, with one
// repair round, like a plan); the playbook backend is deterministic: it
// fails an empty result (null, "", [], {} or only such values) and passes
// anything else. Errors translate like Plan's.
func (s *Server) Critique(ctx context.Context, req *planexv1.CritiqueRequest) (*planexv1.CritiqueResponse, error) {
	ctx = telemetry.WithLogAttrs(ctx, slog.String("run_id", req.GetRunId()))
	if err := checkCritique(req); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	b, err := s.backend(req.GetBackend())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	ctx, span := s.tracer.Start(ctx, "critique")
	defer span.End()
	span.SetAttributes(attribute.String("planex.backend", b.Name()), attribute.String("planex.step_id", req.GetStepId()))
	start := time.Now()
	var resp *planexv1.CritiqueResponse
	if c, ok := b.(critic); ok {
		resp, err = c.Critique(ctx, req)
	} else {
		resp = deterministicVerdict(b.Name(), req.GetOutput())
	}
	s.observeCritique(ctx, b.Name(), start, resp, err)
	if err != nil {
		st := toStatus(err)
		s.logger.WarnContext(ctx, "critique failed", "backend", b.Name(), "step_id", req.GetStepId(), "code", st.Code().String(), "err", withoutGoal(err.Error(), req.GetGoal()))
		return nil, st.Err()
	}
	span.SetAttributes(attribute.Bool("planex.critic.passed", resp.GetPassed()))
	s.logger.InfoContext(ctx, "critiqued", "backend", resp.GetBackend(), "model", resp.GetModel(), "step_id", req.GetStepId(),
		"passed", resp.GetPassed(), "input_tokens", resp.GetUsage().GetInputTokens(), "output_tokens", resp.GetUsage().GetOutputTokens())
	return resp, nil
}

// checkCritique rejects requests no critic can judge, naming the field.
func checkCritique(req *planexv1.CritiqueRequest) error {
	var errs []error
	if strings.TrimSpace(req.GetGoal()) == "" {
		errs = append(errs, errors.New("goal: required"))
	} else if len(req.GetGoal()) > maxGoalBytes {
		errs = append(errs, fmt.Errorf("goal: %d bytes, limit is %d", len(req.GetGoal()), maxGoalBytes))
	}
	if req.GetStepId() == "" {
		errs = append(errs, errors.New("step_id: required"))
	}
	if req.GetTool().GetName() == "" {
		errs = append(errs, errors.New("tool.name: required"))
	}
	if req.GetAttempt() < 1 {
		errs = append(errs, fmt.Errorf("attempt: %d, want 1 or more", req.GetAttempt()))
	}
	if req.GetRemainingTokens() < 0 {
		errs = append(errs, fmt.Errorf("remaining_tokens: %d, want 0 (unlimited) or more", req.GetRemainingTokens()))
	}
	return errors.Join(errs...)
}

// deterministicVerdict is the playbook backend's critic: an empty result
// fails, anything else passes. It spends no tokens.
func deterministicVerdict(backend string, out *structpb.Value) *planexv1.CritiqueResponse {
	if empty(out) {
		return &planexv1.CritiqueResponse{Backend: backend, Reason: "the result is empty"}
	}
	return &planexv1.CritiqueResponse{Backend: backend, Passed: true, Reason: "the result is not empty"}
}

// empty reports whether v carries nothing: unset, null, "", [], {} or only
// such values.
func empty(v *structpb.Value) bool {
	switch k := v.GetKind().(type) {
	case nil, *structpb.Value_NullValue:
		return true
	case *structpb.Value_StringValue:
		return strings.TrimSpace(k.StringValue) == ""
	case *structpb.Value_ListValue:
		for _, x := range k.ListValue.GetValues() {
			if !empty(x) {
				return false
			}
		}
		return true
	case *structpb.Value_StructValue:
		for _, x := range k.StructValue.GetFields() {
			if !empty(x) {
				return false
			}
		}
		return true
	}
	return false
}

func (s *Server) observeCritique(ctx context.Context, backend string, start time.Time, resp *planexv1.CritiqueResponse, err error) {
	outcome := "pass"
	if !resp.GetPassed() {
		outcome = "fail"
	}
	attrs := []attribute.KeyValue{attribute.String("planex.backend", backend), attribute.String("planex.model", resp.GetModel()), attribute.String("call", "critique")}
	s.record(ctx, attrs, start, outcome, resp.GetUsage(), err)
}
