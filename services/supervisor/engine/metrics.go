package engine

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// lagInterval is how often consumer lag is read for the pending gauge.
const lagInterval = 10 * time.Second

// Histogram bucket boundaries, in seconds: handling and calls (the
// default), time to first step (planning included: up to minutes), gate
// waits (humans: up to a day).
var (
	handleBuckets    = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}
	firstStepBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600}
	gateWaitBuckets  = []float64{0.5, 1, 5, 15, 30, 60, 300, 600, 1800, 3600, 7200, 14400, 28800, 86400}
)

// Reasons of planex.engine.messages.dropped.
const (
	dropBadSubject  = "bad_subject" // the subject names no run or kind
	dropUndecodable = "undecodable" // the payload is not the kind's message
	dropCorruptLog  = "corrupt_log" // the run's log is corrupt: nothing may be appended
	dropUnknownRun  = "unknown_run" // no such run after unknownRunDeliveries
	dropStale       = "stale"       // about an attempt or round the log never showed, after staleDeliveries
)

type metrics struct {
	runsFinished   metric.Int64Counter
	replans        metric.Int64Counter
	escalations    metric.Int64Counter
	dispatched     metric.Int64Counter
	stepsFinished  metric.Int64Counter
	handleDuration metric.Float64Histogram
	plannerCalls   metric.Float64Histogram
	tokens         metric.Int64Counter
	firstStep      metric.Float64Histogram
	gateWait       metric.Float64Histogram
	gatesDecided   metric.Int64Counter
	redriven       metric.Int64Counter
	dropped        metric.Int64Counter
	joined         metric.Int64Counter

	mu      sync.Mutex
	pending map[string]int64 // consumer "stream/name" → pending messages

	// attrs caches the attribute sets of the per-step measurements, keyed
	// by their values: building a set per event allocated and sorted on
	// every decision.
	attrs sync.Map // string → metric.MeasurementOption
}

// with returns the measurement option of the attributes key=value pairs
// kv, cached.
func (m *metrics) with(kv ...string) metric.MeasurementOption {
	key := strings.Join(kv, "\x00")
	if o, ok := m.attrs.Load(key); ok {
		return o.(metric.MeasurementOption)
	}
	as := make([]attribute.KeyValue, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		as = append(as, attribute.String(kv[i], kv[i+1]))
	}
	o, _ := m.attrs.LoadOrStore(key, metric.WithAttributeSet(attribute.NewSet(as...)))
	return o.(metric.MeasurementOption)
}

func newMetrics(m metric.Meter) (*metrics, error) {
	var err error
	out := &metrics{pending: map[string]int64{}}
	ctr := func(name, desc string) metric.Int64Counter {
		c, cerr := m.Int64Counter(name, metric.WithDescription(desc))
		if cerr != nil && err == nil {
			err = cerr
		}
		return c
	}
	hist := func(name, desc string, bounds ...float64) metric.Float64Histogram {
		if len(bounds) == 0 {
			bounds = handleBuckets
		}
		h, herr := m.Float64Histogram(name, metric.WithDescription(desc), metric.WithUnit("s"),
			metric.WithExplicitBucketBoundaries(bounds...))
		if herr != nil && err == nil {
			err = herr
		}
		return h
	}
	out.runsFinished = ctr("planex.runs.finished", "Runs that reached a terminal state, by status and stop reason.")
	out.replans = ctr("planex.replans", "Replans: failed steps sent back to the planner and rejected plans.")
	out.escalations = ctr("planex.escalations", "Runs escalated to a human.")
	out.dispatched = ctr("planex.steps.dispatched", "Step attempts dispatched to executor pools, by tool and pool.")
	out.stepsFinished = ctr("planex.steps.finished", "Step attempts finished, by tool and outcome.")
	out.tokens = ctr("planex.planner.tokens", "Planner tokens spent.")
	out.handleDuration = hist("planex.engine.handle.duration", "Time to handle one engine message, by kind and outcome.")
	out.plannerCalls = hist("planex.planner.call.duration", "Planner call latency, by outcome.")
	out.firstStep = hist("planex.run.first_step.duration", "Time from a run's creation to its first step dispatch (planning included), once per run.", firstStepBuckets...)
	out.gateWait = hist("planex.gate.wait.duration", "Time a gate waited from its opening to its decision (or to its run's end), by kind and decision.", gateWaitBuckets...)
	out.gatesDecided = ctr("planex.gates.decided", "Gates decided, by kind, decision, how (via) and whether within their SLA (within_sla true|false|none).")
	out.redriven = ctr("planex.runs.redriven", "Repair kicks the sweeper published for stranded runs, by cause (stranded|planning).")
	out.dropped = ctr("planex.engine.messages.dropped", "Engine messages dropped without effect, by kind and reason (bad_subject, undecodable, corrupt_log, unknown_run, stale).")
	out.joined = ctr("planex.engine.results.joined", "Step results decided in the transaction of another result of their run (a fan-out's results that arrive together: one append).")
	if err != nil {
		return nil, err
	}
	_, err = m.Int64ObservableGauge("planex.consumer.pending",
		metric.WithDescription("Messages waiting in a JetStream consumer (queue lag), by stream and consumer."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			out.mu.Lock()
			defer out.mu.Unlock()
			for k, v := range out.pending {
				stream, name, _ := strings.Cut(k, "/")
				o.Observe(v, metric.WithAttributes(attribute.String("stream", stream), attribute.String("consumer", name)))
			}
			return nil
		}))
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (m *metrics) handled(ctx context.Context, kind, outcome string, d time.Duration) {
	m.handleDuration.Record(ctx, d.Seconds(), m.with("kind", kind, "outcome", outcome))
}

func (m *metrics) plannerCall(ctx context.Context, d time.Duration, resp *planexv1.PlanResponse, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	m.plannerCalls.Record(ctx, d.Seconds(), metric.WithAttributes(attribute.String("outcome", outcome)))
	if n := resp.GetUsage().GetInputTokens() + resp.GetUsage().GetOutputTokens(); n > 0 {
		m.tokens.Add(ctx, n)
	}
}

// droppedMsg counts an engine message dropped for reason.
func (m *metrics) droppedMsg(ctx context.Context, kind, reason string) {
	if kind == "" {
		kind = "unknown"
	}
	m.dropped.Add(ctx, 1, m.with("kind", kind, "reason", reason))
}

// joinedResults counts n results decided in another result's transaction.
func (m *metrics) joinedResults(ctx context.Context, n int) {
	m.joined.Add(ctx, int64(n))
}

// redrove counts a repair kick the sweeper published.
func (m *metrics) redrove(ctx context.Context, planning bool) {
	cause := "stranded"
	if planning {
		cause = "planning"
	}
	m.redriven.Add(ctx, 1, m.with("cause", cause))
}

// committed counts what the appended events mean. run is the state after
// them. It is called once per append, by the replica whose conditional
// append took the events, and never for events folded from the log
// (loads, replays, repairs): what it records happens once per run or gate.
func (m *metrics) committed(ctx context.Context, run *planexv1.Run, events []*planexv1.RunEvent) {
	// The run's first dispatch: the fold counts every dispatch in
	// usage.steps, so the events' first StepDispatched is the run's first
	// when they hold all of them.
	firstDispatch := int64(run.GetUsage().GetSteps())
	for _, ev := range events {
		if ev.GetStepDispatched() != nil {
			firstDispatch--
		}
	}
	for _, ev := range events {
		switch p := ev.GetPayload().(type) {
		case *planexv1.RunEvent_StepDispatched:
			tool := p.StepDispatched.GetTool()
			m.dispatched.Add(ctx, 1, m.with("tool", tool, "pool", bus.PoolOf(tool)))
			if firstDispatch == 0 && run.GetCreatedAt() != nil {
				m.firstStep.Record(ctx, max(ev.GetTime().AsTime().Sub(run.GetCreatedAt().AsTime()), 0).Seconds())
			}
			firstDispatch = -1
		case *planexv1.RunEvent_GateDecided:
			if g := gateOf(run, p.GateDecided.GetGateId()); g != nil && g.GetDecidedAt() != nil {
				m.gateEnded(ctx, g, ev.GetTime().AsTime())
			}
		case *planexv1.RunEvent_StepSucceeded:
			m.stepsFinished.Add(ctx, 1, m.with("tool", toolOf(run, p.StepSucceeded.GetStepId()), "outcome", "succeeded"))
		case *planexv1.RunEvent_StepFailed:
			m.stepsFinished.Add(ctx, 1, m.with("tool", toolOf(run, p.StepFailed.GetStepId()), "outcome", p.StepFailed.GetError().GetCode().String()))
		case *planexv1.RunEvent_ExpectationFailed:
			m.stepsFinished.Add(ctx, 1, m.with("tool", toolOf(run, p.ExpectationFailed.GetStepId()), "outcome", "expectation_failed"))
		case *planexv1.RunEvent_ReplanRequested:
			m.replans.Add(ctx, 1, metric.WithAttributes(attribute.String("cause", "step_failed")))
		case *planexv1.RunEvent_PlanRejected:
			m.replans.Add(ctx, 1, metric.WithAttributes(attribute.String("cause", "plan_rejected")))
		case *planexv1.RunEvent_Finished:
			m.runsFinished.Add(ctx, 1, metric.WithAttributes(attribute.String("status", p.Finished.GetStatus().String()), attribute.String("stop_reason", p.Finished.GetStopReason().String())))
			if p.Finished.GetStatus() == planexv1.RunStatus_RUN_STATUS_ESCALATED {
				m.escalations.Add(ctx, 1)
			}
			// Gates the run leaves undecided end with it.
			for _, g := range run.GetGates() {
				if g.GetDecision() == planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED {
					m.gateEnded(ctx, g, ev.GetTime().AsTime())
				}
			}
		}
	}
}

// gateEnded records the wait of gate g, decided or ended undecided with
// its run at end, and counts it in planex.gates.decided.
func (m *metrics) gateEnded(ctx context.Context, g *planexv1.Gate, end time.Time) {
	w := gateWaitOf(g, end)
	decision, via, within := "", "", "none"
	switch g.GetDecision() {
	case planexv1.DecisionKind_DECISION_KIND_APPROVE:
		decision = "approved"
	case planexv1.DecisionKind_DECISION_KIND_REJECT:
		decision = "rejected"
	case planexv1.DecisionKind_DECISION_KIND_EDIT:
		decision = "edited"
	case planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED:
		// Undecided when its run ended: past its SLA the run escalated
		// (or a gate's SLA ended it some other way), else the run ended
		// for another reason (cancelled, deadline, another gate).
		decision, via = "abandoned", "run_end"
		if sla := g.GetSlaAt(); sla != nil && !w.end.Before(sla.AsTime()) {
			decision, via, within = "expired", ViaSLA, "false"
		}
	default:
		decision = "other"
	}
	if via == "" {
		switch g.GetDecidedVia() {
		case "":
			via = "api"
		case ViaSLA:
			via = ViaSLA
		case "run --yes":
			via = "run_yes"
		default:
			via = "other"
		}
		if sla := g.GetSlaAt(); sla != nil {
			within = strconv.FormatBool(w.end.Before(sla.AsTime()))
		}
	}
	m.gateWait.Record(ctx, w.end.Sub(w.start).Seconds(), m.with("kind", w.kind, "decision", decision))
	m.gatesDecided.Add(ctx, 1, m.with("kind", w.kind, "decision", decision, "via", via, "within_sla", within))
}

func toolOf(run *planexv1.Run, stepID string) string {
	return runlog.Step(run, stepID).GetTool()
}

// monitorLag reads the pending counts of the engine consumers and of the
// executor pools' consumers until ctx ends.
func (m *metrics) monitorLag(ctx context.Context, js jetstream.JetStream, logger *slog.Logger) {
	t := time.NewTicker(lagInterval)
	defer t.Stop()
	for {
		m.readLag(ctx, js, logger)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// readLag records the current pending counts.
func (m *metrics) readLag(ctx context.Context, js jetstream.JetStream, logger *slog.Logger) {
	{
		pending := map[string]int64{}
		for _, stream := range []string{bus.StreamEngine, bus.StreamSteps} {
			st, err := js.Stream(ctx, stream)
			if err != nil {
				if ctx.Err() == nil {
					logger.Debug("read consumer lag", "stream", stream, "err", err)
				}
				continue
			}
			lister := st.ListConsumers(ctx)
			for ci := range lister.Info() {
				pending[stream+"/"+ci.Name] = int64(ci.NumPending) + int64(ci.NumAckPending)
			}
			if err := lister.Err(); err != nil && ctx.Err() == nil {
				logger.Debug("read consumer lag", "stream", stream, "err", err)
			}
		}
		m.mu.Lock()
		m.pending = pending
		m.mu.Unlock()
	}
}
