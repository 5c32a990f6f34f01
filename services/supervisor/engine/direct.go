package engine

import (
	"context"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/stepsign"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// How long this replica trusts what it found out about a pool's consumer
// on PLANEX_EVENTS: a pool found with one is checked again after
// directRecheck, one found without after directRetry.
const (
	directRecheck = 30 * time.Second
	directRetry   = 5 * time.Second
)

// directPools remembers which pools consume their steps from the run logs
// (bus.DispatchConsumerConfig).
type directPools struct {
	mu sync.Mutex
	m  map[string]directPool
}

type directPool struct {
	ok      bool
	checked time.Time
}

// directDispatch returns the Dispatch that makes tx's commit the request
// of the one step it dispatches, and the end of its dispatch span; nil when
// the decision must go the other way (the log append, then the request on
// PLANEX_STEPS). A decision goes direct when:
//   - the run's log is routed (NATS 2.11+) and direct dispatch is on;
//   - it dispatches exactly one step, whose pool has its consumer on
//     PLANEX_EVENTS (created by the pool's executors; it only delivers what
//     is appended after its creation, so a pool without one gets its
//     requests on PLANEX_STEPS);
//   - its other events are the starts and results of the steps the
//     dispatched step depends on: the pool receives the whole message, so
//     it sees nothing its step could not be given (a chain's next step is
//     the common case; plans, gates and fan-outs go the other way).
func (e *Engine) directDispatch(ctx context.Context, tx *runlog.Tx) (*runlog.Dispatch, func()) {
	st := tx.State()
	if e.cfg.NoDirectDispatch || !st.Routed {
		return nil, nil
	}
	var d *planexv1.StepDispatched
	var others []string
	for _, ev := range tx.Events() {
		switch p := ev.GetPayload().(type) {
		case *planexv1.RunEvent_StepDispatched:
			if d != nil {
				return nil, nil
			}
			d = p.StepDispatched
		case *planexv1.RunEvent_StepStarted:
			others = append(others, p.StepStarted.GetStepId())
		case *planexv1.RunEvent_StepSucceeded:
			others = append(others, p.StepSucceeded.GetStepId())
		default:
			return nil, nil
		}
	}
	if d == nil {
		return nil, nil
	}
	deps := runlog.PlanStep(st.Run, d.GetStepId()).GetDependsOn()
	for _, id := range others {
		if !slices.Contains(deps, id) {
			return nil, nil
		}
	}
	s := st.Step(d.GetStepId())
	pool := bus.PoolOf(d.GetTool())
	if s == nil || !e.poolConsumesLogs(ctx, pool) {
		return nil, nil
	}
	run := st.Run
	sctx, span := e.tracer.Start(e.runContext(ctx, st), "dispatch step",
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithLinks(trace.LinkFromContext(ctx)))
	var attrs []attribute.KeyValue
	if span.IsRecording() { // built only for a span that keeps them: this is every chain step's path
		attrs = []attribute.KeyValue{
			attribute.String("planex.step_id", d.GetStepId()),
			attribute.Int("planex.attempt", int(d.GetAttempt())),
			attribute.Int("planex.plan_revision", int(d.GetPlanRevision())),
			attribute.String("planex.tool", d.GetTool()),
			attribute.String("planex.pool", pool),
			attribute.Bool("planex.retry", s.GetRetries() > 0),
			attribute.Bool("planex.direct", true),
		}
		span.SetAttributes(append(attrs, attribute.String("planex.run_id", run.GetId()))...)
	}
	return &runlog.Dispatch{
		Pool: pool, Ctx: sctx, Attrs: attrs,
		Sign: e.cfg.Signer.SignFunc(signatureExpiry(run, time.Now()),
			stepsign.Approval(run, s, slices.Contains(e.cfg.AutoApprove, s.GetTool()))),
	}, func() { span.End() }
}

// poolConsumesLogs reports whether pool has its consumer on PLANEX_EVENTS
// with the dispatch filter, as last found out (see directRecheck).
func (e *Engine) poolConsumesLogs(ctx context.Context, pool string) bool {
	now := time.Now()
	e.direct.mu.Lock()
	p, known := e.direct.m[pool]
	e.direct.mu.Unlock()
	if known && ((p.ok && now.Sub(p.checked) < directRecheck) || (!p.ok && now.Sub(p.checked) < directRetry)) {
		return p.ok
	}
	ok := false
	if c, err := e.res.JS.Consumer(ctx, bus.StreamEvents, bus.PoolConsumer(pool)); err == nil {
		ok = c.CachedInfo().Config.FilterSubject == bus.DispatchFilter(pool)
	} else if ctx.Err() != nil {
		return false
	}
	e.direct.mu.Lock()
	if e.direct.m == nil {
		e.direct.m = map[string]directPool{}
	}
	e.direct.m[pool] = directPool{ok: ok, checked: now}
	e.direct.mu.Unlock()
	return ok
}
