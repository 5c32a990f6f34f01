package bus

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
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
	d, at, err := scanDispatch(msg, runID)
	if errors.Is(err, errUnscannable) {
		d, at, err = decodeDispatch(msg, runID)
	}
	if err != nil {
		return nil, err
	}
	if PoolOf(d.GetTool()) != pool {
		return nil, fmt.Errorf("decode %s: tool %q is not of pool %s", msg.Subject, d.GetTool(), pool)
	}
	return requestOf(runID, d, at), nil
}

// requestOf is the request of a dispatch of a run's step at time at.
func requestOf(runID string, d *planexv1.StepDispatched, at *timestamppb.Timestamp) *planexv1.StepRequest {
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
	return req
}

// decodeDispatch decodes a dispatching decision whole and returns its one
// StepDispatched and that event's time.
func decodeDispatch(msg *nats.Msg, runID string) (*planexv1.StepDispatched, *timestamppb.Timestamp, error) {
	evs, err := DecodeRunEvents(msg)
	if err != nil {
		return nil, nil, err
	}
	var d *planexv1.StepDispatched
	var at *timestamppb.Timestamp
	for _, ev := range evs {
		if ev.GetRunId() != runID {
			return nil, nil, fmt.Errorf("decode %s: event %d of run %q", msg.Subject, ev.GetSequence(), ev.GetRunId())
		}
		if sd := ev.GetStepDispatched(); sd != nil {
			if d != nil {
				return nil, nil, fmt.Errorf("decode %s: a dispatching decision dispatches two steps", msg.Subject)
			}
			d, at = sd, ev.GetTime()
		}
	}
	if d == nil {
		return nil, nil, errors.New("decode " + msg.Subject + ": the decision dispatches no step")
	}
	return d, at, nil
}

// errUnscannable is scanDispatch's answer for an encoding it does not
// read itself (a field of an unexpected wire type, say): decodeDispatch
// then decodes it whole, with protobuf's own rules.
var errUnscannable = errors.New("not scanned")

// Field numbers scanDispatch reads.
var (
	batchEventsField   = fieldNumber(&planexv1.RunEventBatch{}, "events")
	eventRunIDField    = fieldNumber(&planexv1.RunEvent{}, "run_id")
	eventTimeField     = fieldNumber(&planexv1.RunEvent{}, "time")
	eventDispatchField = fieldNumber(&planexv1.RunEvent{}, "step_dispatched")
)

func fieldNumber(m proto.Message, name protoreflect.Name) protowire.Number {
	return m.ProtoReflect().Descriptor().Fields().ByName(name).Number()
}

// eachField calls fn with the number of every field of the message
// encoded in b, its wire type and, for a length-delimited one, its bytes
// (nil for the others). A malformed encoding is errUnscannable; fn's
// error stops the walk.
func eachField(b []byte, fn func(num protowire.Number, typ protowire.Type, v []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errUnscannable
		}
		b = b[n:]
		var v []byte
		if typ == protowire.BytesType {
			v, n = protowire.ConsumeBytes(b)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return errUnscannable
		}
		b = b[n:]
		if err := fn(num, typ, v); err != nil {
			return err
		}
	}
	return nil
}

// scanDispatch is decodeDispatch without decoding what a request does not
// need: it reads the run id of every event of the decision, and decodes
// only the one StepDispatched and its event's time (an executor receives a
// decision with the previous step's result in it, output included).
func scanDispatch(msg *nats.Msg, runID string) (*planexv1.StepDispatched, *timestamppb.Timestamp, error) {
	var d, at []byte
	found := false
	event := func(b []byte) error {
		var id, evAt, evD []byte
		hasID, hasD := false, false
		err := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
			switch num {
			case eventRunIDField, eventTimeField, eventDispatchField:
			default:
				return nil
			}
			switch {
			case typ != protowire.BytesType:
				return errUnscannable
			case num == eventRunIDField:
				id, hasID = v, true
			case num == eventTimeField && evAt == nil:
				evAt = v
			case num == eventDispatchField && !hasD:
				evD, hasD = v, true
			default:
				return errUnscannable // a repeated message field: merged by protobuf
			}
			return nil
		})
		if err != nil {
			return err
		}
		if !hasID || string(id) != runID {
			return errUnscannable // decodeDispatch names the event
		}
		if hasD {
			if found {
				return fmt.Errorf("decode %s: a dispatching decision dispatches two steps", msg.Subject)
			}
			found, d, at = true, evD, evAt
		}
		return nil
	}
	if msg.Header.Get(HeaderContentType) == batchType {
		events := 0
		err := eachField(msg.Data, func(num protowire.Number, typ protowire.Type, v []byte) error {
			if num != batchEventsField {
				return nil
			}
			if typ != protowire.BytesType {
				return errUnscannable
			}
			events++
			return event(v)
		})
		if err != nil {
			return nil, nil, err
		}
		if events == 0 {
			return nil, nil, errUnscannable
		}
	} else if err := event(msg.Data); err != nil {
		return nil, nil, err
	}
	if !found {
		return nil, nil, errors.New("decode " + msg.Subject + ": the decision dispatches no step")
	}
	sd := &planexv1.StepDispatched{}
	if err := proto.Unmarshal(d, sd); err != nil {
		return nil, nil, fmt.Errorf("decode %s: %w", msg.Subject, err)
	}
	var ts *timestamppb.Timestamp
	if at != nil {
		ts = &timestamppb.Timestamp{}
		if err := proto.Unmarshal(at, ts); err != nil {
			return nil, nil, fmt.Errorf("decode %s: %w", msg.Subject, err)
		}
	}
	return sd, ts, nil
}
