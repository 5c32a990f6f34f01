package planner

import (
	"context"
	"encoding/json"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/cassette"
)

// critiqueVolatile are the critique request fields left out of its
// cassette key: the run id, the critic's budget left, and the backend
// asked (an offline replay asks the replay backend what the recording
// asked a model).
var critiqueVolatile = []string{"run_id", "remaining_tokens", "backend"}

// critiqueKey is the cassette key of a critique request, named by the
// judged step's tool.
func critiqueKey(req *planexv1.CritiqueRequest) (string, []byte, error) {
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(req)
	if err != nil {
		return "", nil, fmt.Errorf("encode critique request: %w", err)
	}
	var m any
	if err := json.Unmarshal(b, &m); err != nil {
		return "", nil, fmt.Errorf("encode critique request: %w", err)
	}
	return cassette.Key(cassette.KindCritique, req.GetTool().GetName(), m, critiqueVolatile...)
}

// critiqueWith judges with b: its model critic when it has one, else the
// deterministic verdict the server gives a backend without one. Wrappers
// (record, replay, faults) answer Critique through it, so wrapping a
// backend never turns its model critic into the "not empty" check.
func critiqueWith(ctx context.Context, b Backend, req *planexv1.CritiqueRequest) (*planexv1.CritiqueResponse, error) {
	if c, ok := b.(critic); ok {
		return c.Critique(ctx, req)
	}
	return deterministicVerdict(b.Name(), req.GetOutput()), nil
}

// Critique judges with the wrapped backend and records the verdict (or
// the error the server answers) in the cassette.
func (r *recordBackend) Critique(ctx context.Context, req *planexv1.CritiqueRequest) (*planexv1.CritiqueResponse, error) {
	resp, err := critiqueWith(ctx, r.b, req)
	key, canon, kerr := critiqueKey(req)
	if kerr != nil {
		return resp, err
	}
	e := cassette.Entry{Kind: cassette.KindCritique, Name: req.GetTool().GetName(), Key: key, Request: canon}
	if err != nil {
		st := toStatus(err)
		if st.Code() == codes.Unavailable || st.Code() == codes.DeadlineExceeded {
			return resp, err // transient: the engine asks again and that answer is recorded
		}
		e.Error = &cassette.Failure{Code: st.Code().String(), Message: st.Message()}
	} else {
		data, merr := protojson.Marshal(resp)
		if merr != nil {
			return resp, err
		}
		e.Response = data
	}
	if perr := r.cas.Put(e); perr != nil {
		return nil, fmt.Errorf("record critique of step %s: %w", req.GetStepId(), perr)
	}
	return resp, err
}

// Critique answers from the cassette; a miss goes to the live backend
// when there is one, else fails naming the request (FailedPrecondition:
// the engine escalates the run rather than let the result pass unjudged).
func (r *replayBackend) Critique(ctx context.Context, req *planexv1.CritiqueRequest) (*planexv1.CritiqueResponse, error) {
	key, canon, err := critiqueKey(req)
	if err != nil {
		return nil, err
	}
	e, err := r.cas.Get(cassette.KindCritique, req.GetTool().GetName(), key, canon)
	if err != nil {
		if r.live != nil {
			return critiqueWith(ctx, r.live, req)
		}
		return nil, err // a *cassette.MissError naming the request
	}
	if f := e.Error; f != nil {
		return nil, &replayedStatus{st: status.New(codeNamed(f.Code), f.Message)}
	}
	resp := &planexv1.CritiqueResponse{}
	if err := protojson.Unmarshal(e.Response, resp); err != nil {
		return nil, fmt.Errorf("cassette %s: critique answer %s: %w", r.cas.Dir(), e.Key[:16], err)
	}
	return resp, nil
}

// Critique passes through: faults hit plan answers only.
func (f *faultBackend) Critique(ctx context.Context, req *planexv1.CritiqueRequest) (*planexv1.CritiqueResponse, error) {
	return critiqueWith(ctx, f.b, req)
}
