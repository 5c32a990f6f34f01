package planner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/cassette"
	"github.com/planex-dev/planex/services/planner/llm"
	"github.com/planex-dev/planex/services/planner/playbook"
)

// BackendReplay is the name of the backend that answers from a cassette.
const BackendReplay = "replay"

// planVolatile are the request fields left out of a plan request's
// cassette key: they change from run to run (ids, budgets left, attempt
// numbers and the texts that quote them) without changing what a planner
// is asked.
var planVolatile = []string{"run_id", "constraints", "attempt", "replan_reason", "validation_errors", "retries"}

// planKey is the cassette key of a plan request.
func planKey(req *planexv1.PlanRequest) (string, []byte, error) {
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(req)
	if err != nil {
		return "", nil, fmt.Errorf("encode plan request: %w", err)
	}
	var m any
	if err := json.Unmarshal(b, &m); err != nil {
		return "", nil, fmt.Errorf("encode plan request: %w", err)
	}
	return cassette.Key(cassette.KindPlan, req.GetGoal(), m, planVolatile...)
}

// sentinels are the backend errors the server treats specially; a
// recorded one is replayed as itself.
var sentinels = map[string]error{
	"no_match":       playbook.ErrNoMatch,
	"no_branch":      playbook.ErrNoBranch,
	"budget":         llm.ErrBudget,
	"invalid_answer": llm.ErrInvalidAnswer,
}

// replayedError is a recorded backend error: its message, matching the
// sentinel it was recorded from.
type replayedError struct {
	msg      string
	sentinel error
}

func (e *replayedError) Error() string { return e.msg }
func (e *replayedError) Unwrap() error { return e.sentinel }

// recordBackend records every answer of b.
type recordBackend struct {
	b   Backend
	cas *cassette.Cassette
}

// RecordBackend wraps b so that every answer (plan, stop or error) is
// recorded in cas, keyed by the canonical request.
func RecordBackend(b Backend, cas *cassette.Cassette) Backend { return &recordBackend{b: b, cas: cas} }

func (r *recordBackend) Name() string { return r.b.Name() }

func (r *recordBackend) Plan(ctx context.Context, req *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
	resp, err := r.b.Plan(ctx, req)
	key, canon, kerr := planKey(req)
	if kerr != nil {
		return resp, err
	}
	e := cassette.Entry{Kind: cassette.KindPlan, Name: req.GetGoal(), Key: key, Request: canon}
	if err != nil {
		f := &cassette.Failure{Code: toStatus(err).Code().String(), Message: err.Error()}
		for name, s := range sentinels {
			if errors.Is(err, s) {
				f.Code = name
			}
		}
		if f.Code == codes.Unavailable.String() || f.Code == codes.DeadlineExceeded.String() {
			return resp, err // transient: the retried call records the answer
		}
		e.Error = f
	} else {
		data, merr := protojson.Marshal(resp)
		if merr != nil {
			return resp, err
		}
		e.Response = data
	}
	if perr := r.cas.Put(e); perr != nil {
		return nil, fmt.Errorf("record plan answer: %w", perr)
	}
	return resp, err
}

// replayBackend answers from a cassette.
type replayBackend struct {
	cas  *cassette.Cassette
	live Backend
}

// ReplayBackend answers plan requests from cas, without a model. A request
// without a recording fails with FailedPrecondition naming it, unless live
// is set, which then answers it.
func ReplayBackend(cas *cassette.Cassette, live Backend) Backend {
	return &replayBackend{cas: cas, live: live}
}

func (r *replayBackend) Name() string { return BackendReplay }

func (r *replayBackend) Plan(ctx context.Context, req *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
	key, canon, err := planKey(req)
	if err != nil {
		return nil, err
	}
	e, err := r.cas.Get(cassette.KindPlan, req.GetGoal(), key, canon)
	if err != nil {
		if r.live != nil {
			return r.live.Plan(ctx, req)
		}
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	if f := e.Error; f != nil {
		if s, ok := sentinels[f.Code]; ok {
			return nil, &replayedError{msg: f.Message, sentinel: s}
		}
		code := codes.Internal
		for c := codes.OK; c <= codes.Unauthenticated; c++ {
			if c.String() == f.Code {
				code = c
			}
		}
		return nil, status.Error(code, f.Message)
	}
	resp := &planexv1.PlanResponse{}
	if err := protojson.Unmarshal(e.Response, resp); err != nil {
		return nil, fmt.Errorf("cassette %s: plan answer %s: %w", r.cas.Dir(), e.Key[:16], err)
	}
	return resp, nil
}

// faultBackend answers some calls with an invalid answer.
type faultBackend struct {
	b       Backend
	invalid func(req *planexv1.PlanRequest) bool
}

// InvalidPlanFault wraps b so that the calls invalid selects fail as a
// model's answer that stays invalid after its repair round does
// (llm.ErrInvalidAnswer, Aborted on the wire): the engine rejects the
// answer and asks again, as a replan.
func InvalidPlanFault(b Backend, invalid func(req *planexv1.PlanRequest) bool) Backend {
	return &faultBackend{b: b, invalid: invalid}
}

func (f *faultBackend) Name() string { return f.b.Name() }

func (f *faultBackend) Plan(ctx context.Context, req *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
	if !f.invalid(req) {
		return f.b.Plan(ctx, req)
	}
	return nil, fmt.Errorf("%w: injected by an evaluation fault (planner_invalid)", llm.ErrInvalidAnswer)
}
