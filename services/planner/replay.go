package planner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

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
	if obj, ok := m.(map[string]any); ok {
		if tools, ok := obj["tools"].([]any); ok {
			kept := tools[:0]
			for _, t := range tools {
				tm, _ := t.(map[string]any)
				if name, _ := tm["name"].(string); !supervisorTools[name] {
					kept = append(kept, t)
				}
			}
			obj["tools"] = kept
		}
	}
	return cassette.Key(cassette.KindPlan, req.GetGoal(), m, planVolatile...)
}

// supervisorTools are the tools the supervisor serves itself (its
// catalog's built-ins: human.input, run.child), left out of a plan
// request's cassette key like the volatile fields: a recording made before
// one existed still answers the same requests.
var supervisorTools = map[string]bool{"human.input": true, "run.child": true}

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

// replayedStatus is a recorded answer the server gave as a gRPC status:
// it is answered again as it was.
type replayedStatus struct{ st *status.Status }

func (e *replayedStatus) Error() string { return e.st.Message() }

// replayStatus is the answer of a replayed error: a recorded status as
// recorded, a cassette miss as FailedPrecondition naming the request.
func replayStatus(err error) (*status.Status, bool) {
	var rs *replayedStatus
	var miss *cassette.MissError
	switch {
	case errors.As(err, &rs):
		return rs.st, true
	case errors.As(err, &miss):
		return status.New(codes.FailedPrecondition, "planner: "+miss.Error()), true
	}
	return nil, false
}

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
		// What the server answers (code and public message); a sentinel
		// error is kept as itself, for the server's own handling.
		st := toStatus(err)
		f := &cassette.Failure{Code: st.Code().String(), Message: st.Message()}
		for name, s := range sentinels {
			if errors.Is(err, s) {
				f.Code, f.Message = name, err.Error()
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
		return nil, err // a *cassette.MissError naming the request
	}
	if f := e.Error; f != nil {
		if s, ok := sentinels[f.Code]; ok {
			return nil, &replayedError{msg: f.Message, sentinel: s}
		}
		return nil, &replayedStatus{st: status.New(codeNamed(f.Code), f.Message)}
	}
	resp := &planexv1.PlanResponse{}
	if err := protojson.Unmarshal(e.Response, resp); err != nil {
		return nil, fmt.Errorf("cassette %s: plan answer %s: %w", r.cas.Dir(), e.Key[:16], err)
	}
	return resp, nil
}

// codeNamed is the gRPC code a cassette records by name (codes.Code's
// String), Internal for a name it does not know.
func codeNamed(name string) codes.Code {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if c.String() == name {
			return c
		}
	}
	return codes.Internal
}

// validateReplay checks the replay flags: --replay is the replay
// backend's, and a live miss needs a configured backend.
func (c BackendConfig) validateReplay() error {
	var errs []error
	switch {
	case c.Backend == BackendReplay && c.Replay == "":
		errs = append(errs, errors.New("--replay: required with --planner-backend replay (a cassette directory)"))
	case c.Backend != BackendReplay && c.Replay != "":
		errs = append(errs, fmt.Errorf("--replay %s: needs --planner-backend replay", c.Replay))
	}
	if c.Record != "" && c.Backend == BackendReplay {
		errs = append(errs, fmt.Errorf("--record %s: the replay backend answers from a cassette; record a live backend (playbook, openai or anthropic)", c.Record))
	}
	if c.ReplayMiss != "" && c.ReplayMiss != ReplayMissError && c.ReplayMiss != ReplayMissLive { // "": error
		errs = append(errs, fmt.Errorf("--replay-miss %q: want error or live", c.ReplayMiss))
	}
	if c.Backend == BackendReplay && c.ReplayMiss == ReplayMissLive {
		switch c.ReplayLiveBackend {
		case BackendPlaybook:
		case BackendOpenAI:
			if c.OpenAI.Model == "" {
				errs = append(errs, errors.New("--openai-model: required with --replay-live-backend openai"))
			}
		case BackendAnthropic:
			if c.Anthropic.Model == "" {
				errs = append(errs, errors.New("--anthropic-model: required with --replay-live-backend anthropic"))
			}
		default:
			errs = append(errs, fmt.Errorf("--replay-live-backend %q: want playbook, openai or anthropic", c.ReplayLiveBackend))
		}
	}
	return errors.Join(errs...)
}

// replayFrom builds the replay backend of cfg: the cassette in --replay
// (which must exist: replaying an empty directory answers nothing) and,
// with --replay-miss live, the backend misses go to.
func replayFrom(cfg BackendConfig, bs *backends) (Backend, error) {
	if fi, err := os.Stat(cfg.Replay); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("--replay %s: not a cassette directory (record one with planex eval --dev --record or planex dev --record)", cfg.Replay)
	}
	cas, err := cassette.Open(cfg.Replay, nil)
	if err != nil {
		return nil, fmt.Errorf("--replay: %w", err)
	}
	var live Backend
	if cfg.ReplayMiss == ReplayMissLive {
		if cfg.ReplayLiveBackend == BackendPlaybook {
			live = bs.byName[BackendPlaybook]
			if live == nil {
				return nil, errors.New("--replay-live-backend playbook: no playbooks loaded (--playbooks)")
			}
		} else if live, err = modelBackend(cfg, cfg.ReplayLiveBackend, ""); err != nil {
			return nil, fmt.Errorf("--replay-live-backend: %w", err)
		}
	}
	return ReplayBackend(cas, live), nil
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
