package bus

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// ErrEmptyBatch is returned by DecodeRunEvents for a RunEventBatch that
// holds no event (a run log never has one).
var ErrEmptyBatch = errors.New("empty event batch")

// batchType is the content type of a RunEventBatch message.
var batchType = string((&planexv1.RunEventBatch{}).ProtoReflect().Descriptor().FullName())

// DecodeRunEvents decodes one message of a run log: a RunEvent, or the
// events of a RunEventBatch (one decision appended as one message), in
// order.
func DecodeRunEvents(msg *nats.Msg) ([]*planexv1.RunEvent, error) {
	if msg.Header.Get(HeaderContentType) == batchType {
		b := &planexv1.RunEventBatch{}
		if err := Decode(msg, b); err != nil {
			return nil, err
		}
		if len(b.GetEvents()) == 0 {
			return nil, fmt.Errorf("decode %s: %w", msg.Subject, ErrEmptyBatch)
		}
		return b.GetEvents(), nil
	}
	ev := &planexv1.RunEvent{}
	if err := Decode(msg, ev); err != nil {
		return nil, err
	}
	return []*planexv1.RunEvent{ev}, nil
}

// StepRequestOf returns the step request a message consumed by a pool
// carries: the message itself on PLANEX_STEPS and RequestSubject, or the
// one step a routed run's decision on DispatchSubject dispatches (the
// decision is the request, see DispatchConsumerConfig), built from its
// StepDispatched event as the supervisor builds a request: the run and
// the event's step, attempt, revision, tool, resolved arguments, timeouts
// and deadline, and start_by at the event's time plus its
// schedule-to-start timeout.
func StepRequestOf(msg *nats.Msg) (*planexv1.StepRequest, error) {
	runID, pool, ok := ParseDispatchSubject(msg.Subject)
	if !ok {
		req := &planexv1.StepRequest{}
		if err := Decode(msg, req); err != nil {
			return nil, err
		}
		return req, nil
	}
	evs, err := DecodeRunEvents(msg)
	if err != nil {
		return nil, err
	}
	var d *planexv1.StepDispatched
	var at *timestamppb.Timestamp
	for _, ev := range evs {
		if ev.GetRunId() != runID {
			return nil, fmt.Errorf("decode %s: event %d of run %q", msg.Subject, ev.GetSequence(), ev.GetRunId())
		}
		if sd := ev.GetStepDispatched(); sd != nil {
			if d != nil {
				return nil, fmt.Errorf("decode %s: a dispatching decision dispatches two steps", msg.Subject)
			}
			d, at = sd, ev.GetTime()
		}
	}
	if d == nil {
		return nil, errors.New("decode " + msg.Subject + ": the decision dispatches no step")
	}
	if PoolOf(d.GetTool()) != pool {
		return nil, fmt.Errorf("decode %s: tool %q is not of pool %s", msg.Subject, d.GetTool(), pool)
	}
	req := &planexv1.StepRequest{
		RunId: runID, StepId: d.GetStepId(), Attempt: d.GetAttempt(), PlanRevision: d.GetPlanRevision(),
		Tool: d.GetTool(), Args: d.GetResolvedArgs(), Timeout: d.GetStartToCloseTimeout(),
	}
	if dl := d.GetDeadline(); dl != nil && dl.AsTime().Unix() > 0 {
		req.Deadline = dl
	}
	if hb := d.GetHeartbeatTimeout(); hb != nil && hb.AsDuration() > 0 {
		req.HeartbeatTimeout = hb
	}
	if sts := d.GetScheduleToStartTimeout(); sts != nil && sts.AsDuration() > 0 && at != nil {
		req.StartBy = timestamppb.New(at.AsTime().Add(sts.AsDuration()))
	}
	return req, nil
}
