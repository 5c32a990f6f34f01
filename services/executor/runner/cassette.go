package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/cassette"
)

// toolKey is the cassette key of a call: the tool and its arguments (not
// the run, step or attempt, which change from run to run).
func toolKey(name string, c Call) (string, []byte, error) {
	return cassette.Key(cassette.KindTool, name, map[string]any{"tool": name, "args": c.Args.AsMap()})
}

// RecordTool wraps t so that every call's result (output or failure) is
// recorded in cas, keyed by the tool and its arguments.
func RecordTool(t Tool, cas *cassette.Cassette) Tool {
	name := t.Spec().GetName()
	return NewTool(t.Spec(), func(ctx context.Context, c Call) (any, error) {
		out, err := t.Run(ctx, c)
		key, canon, kerr := toolKey(name, c)
		if kerr != nil {
			return out, err
		}
		e := cassette.Entry{Kind: cassette.KindTool, Name: name, Key: key, Request: canon}
		var te *Error
		switch {
		case err == nil:
			resp, merr := json.Marshal(out)
			if merr != nil {
				return out, err
			}
			e.Response = resp
		case errors.As(err, &te) && !te.Retryable:
			e.Error = &cassette.Failure{Code: te.Code.String(), Message: te.Message, Field: te.Field}
		default:
			// Transient and internal failures are not worth replaying: the
			// next call records the answer.
			return out, err
		}
		if perr := cas.Put(e); perr != nil {
			return nil, fmt.Errorf("record %s: %w", name, perr)
		}
		return out, err
	})
}

// ReplayTool answers calls of the tool spec describes from cas. A call
// without a recording fails (TOOL_FAILED, naming the request) unless live
// is set, which then answers it.
func ReplayTool(spec *planexv1.ToolSpec, cas *cassette.Cassette, live Tool) Tool {
	name := spec.GetName()
	return NewTool(spec, func(ctx context.Context, c Call) (any, error) {
		key, canon, err := toolKey(name, c)
		if err != nil {
			return nil, err
		}
		e, err := cas.Get(cassette.KindTool, name, key, canon)
		if err != nil {
			if live != nil {
				return live.Run(ctx, c)
			}
			return nil, &Error{Code: planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED, Message: err.Error(), Err: err}
		}
		if f := e.Error; f != nil {
			return nil, &Error{Code: planexv1.ErrorCode(planexv1.ErrorCode_value[f.Code]), Message: f.Message, Field: f.Field}
		}
		return e.Response, nil
	})
}

// Fault is what FaultTool does to one call; the zero Fault does nothing.
type Fault struct {
	// Err fails the call (after Delay) without running the tool.
	Err *Error
	// Delay holds the call before it runs (or fails).
	Delay time.Duration
	// Drop loses the call's result: the tool runs (its effect happens and
	// is recorded), but the runner acknowledges the step without publishing
	// the result, so the supervisor must notice the loss itself (the
	// attempt's start-to-close or heartbeat timeout) and retry or fail per
	// the tool's retry policy.
	Drop bool
}

// FaultTool wraps t with injected faults: fault tells, for each call, what
// to do (evaluation suites fail a tool on a given attempt, slow it down,
// or lose its result).
func FaultTool(t Tool, fault func(Call) Fault) Tool {
	return NewTool(t.Spec(), func(ctx context.Context, c Call) (any, error) {
		f := fault(c)
		if f.Delay > 0 {
			select {
			case <-time.After(f.Delay):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if f.Err != nil {
			return nil, f.Err
		}
		if f.Drop {
			if slot, ok := ctx.Value(dropKey{}).(*atomic.Bool); ok {
				slot.Store(true)
			}
		}
		return t.Run(ctx, c)
	})
}

// dropKey is the context key of a delivery's drop slot.
type dropKey struct{}

// withDropSlot gives a delivery's context a slot in which FaultTool marks
// the attempt's result as lost.
func withDropSlot(ctx context.Context) (context.Context, *atomic.Bool) {
	slot := &atomic.Bool{}
	return context.WithValue(ctx, dropKey{}, slot), slot
}

// dropResult loses the result of a delivery FaultTool marked: the step is
// acknowledged and nothing is published, as when the executor's publish
// was lost after it recorded the effect. It reports whether it did.
func (r *Runner) dropResult(ctx context.Context, slot *atomic.Bool, msg jetstream.Msg, req *planexv1.StepRequest, stopHB func(), notice *startNotice) bool {
	if !slot.Load() {
		return false
	}
	r.logger.WarnContext(ctx, "dropping the step result (injected fault)", "tool", req.GetTool(), "attempt", req.GetAttempt())
	// The supervisor learns of the start (a fast step would report it
	// with the result that is now lost), so the lost result is found by
	// the attempt's start-to-close timeout, as a real loss would be.
	notice.report(ctx)
	stopHB()
	if err := msg.Ack(); err != nil {
		r.logger.WarnContext(ctx, "ack step", "err", err)
	}
	return true
}
