package supervisor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/supervisor/engine"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// meters is a meter provider the test's replicas share, as if their
// counters were summed by Prometheus: what one replica counted and
// another counts again shows.
type meters struct {
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newMeters(t *testing.T) *meters {
	r := sdkmetric.NewManualReader()
	m := &meters{reader: r, mp: sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))}
	t.Cleanup(func() { _ = m.mp.Shutdown(context.Background()) })
	return m
}

// use is a replica option that records the engine's metrics in m.
func (m *meters) use(c *engine.Config) { c.MeterProvider = m.mp }

// point is one data point: a counter's value or a histogram's count and
// sum.
type point struct {
	attrs map[string]string
	value int64
	sum   float64
}

// points returns the data points of the named instrument.
func (m *meters) points(t *testing.T, name string) []point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	attrs := func(s attribute.Set) map[string]string {
		out := map[string]string{}
		for _, kv := range s.ToSlice() {
			out[string(kv.Key)] = kv.Value.Emit()
		}
		return out
	}
	var out []point
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name != name {
				continue
			}
			switch d := mt.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					out = append(out, point{attrs: attrs(dp.Attributes), value: dp.Value})
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					out = append(out, point{attrs: attrs(dp.Attributes), value: int64(dp.Count), sum: dp.Sum})
				}
			default:
				t.Fatalf("%s: unexpected data %T", name, mt.Data)
			}
		}
	}
	return out
}

// total sums the values (histogram counts) of the points of name that
// carry every label of want.
func (m *meters) total(t *testing.T, name string, want map[string]string) int64 {
	t.Helper()
	var n int64
next:
	for _, p := range m.points(t, name) {
		for k, v := range want {
			if p.attrs[k] != v {
				continue next
			}
		}
		n += p.value
	}
	return n
}

// waitTotal waits until total(name, want) is n, then checks it stays n
// while the engine settles (a second count would come from the same
// handling or a redelivery).
func (m *meters) waitTotal(t *testing.T, name string, want map[string]string, n int64) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for m.total(t, name, want) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%s%v = %d, want %d (points %v)", name, want, m.total(t, name, want), n, m.points(t, name))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A gate decided on a replica that dies right after appending the
// decision, before its side effects: the replica taking over repairs the
// run from the log, and neither the run's first step nor the gate is
// counted twice. A third replica reading the finished run counts nothing.
func TestMetricsCountFirstStepAndGateOnceAcrossACrash(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	m := newMeters(t)
	var (
		victim  *replica
		once    sync.Once
		crashed = make(chan struct{})
	)
	a := h.startReplica(m.use, func(c *engine.Config) {
		c.Hooks.AfterAppend = func(_ string, evs []*planexv1.RunEvent) {
			for _, ev := range evs {
				if ev.GetGateDecided() != nil {
					once.Do(func() {
						victim.nc.Close() // kill -9 after the append: no side effect, no ack
						close(crashed)
					})
				}
			}
		}
	})
	victim = a
	id := h.runGoal(t, a, "metrics gate", always(
		step("draft", "test.echo", map[string]any{"value": "x"}),
		step("send", "test.approve", map[string]any{"value": "${{ steps.draft.output.value }}"}, "draft"),
	))
	run := waitRun(t, a.client, id, 10*time.Second, "waiting", func(run *planexv1.Run) bool {
		return run.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING
	})
	m.waitTotal(t, "planex.run.first_step.duration", nil, 1)
	if n := m.total(t, "planex.gates.decided", nil); n != 0 {
		t.Fatalf("planex.gates.decided = %d before any decision", n)
	}
	dctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	go func() {
		// Answered or not: the replica dies while it waits.
		_, _ = a.client.Decide(dctx, &planexv1.DecideRequest{RunId: id, GateId: run.GetGates()[0].GetId(), Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE})
	}()
	select {
	case <-crashed:
	case <-time.After(15 * time.Second):
		t.Fatal("the replica never appended the decision")
	}
	a.kill()
	b := h.startReplica(m.use)
	run = succeeded(t, b, id)
	c := h.startReplica(m.use)
	if _, err := c.client.GetRun(testCtx(t, 5*time.Second), &planexv1.GetRunRequest{RunId: id}); err != nil {
		t.Fatal(err)
	}
	assertOnce(t, h, id, watchAll(t, b.client, id, 1))

	m.waitTotal(t, "planex.gates.decided", map[string]string{"kind": "step", "decision": "approved", "via": "api", "within_sla": "none"}, 1)
	m.waitTotal(t, "planex.gates.decided", nil, 1)
	m.waitTotal(t, "planex.gate.wait.duration", map[string]string{"kind": "step", "decision": "approved"}, 1)
	m.waitTotal(t, "planex.run.first_step.duration", nil, 1)
	g := run.GetGates()[0]
	wait := g.GetDecidedAt().AsTime().Sub(g.GetOpenedAt().AsTime()).Seconds()
	if p := m.points(t, "planex.gate.wait.duration"); len(p) != 1 || p[0].sum != wait {
		t.Fatalf("gate wait points %v, want one of %gs (opened to decided, as recorded)", p, wait)
	}
	var first float64
	for _, s := range run.GetSteps() {
		if s.GetStepId() == "draft" {
			first = s.GetDispatchedAt().AsTime().Sub(run.GetCreatedAt().AsTime()).Seconds()
		}
	}
	if p := m.points(t, "planex.run.first_step.duration"); len(p) != 1 || p[0].sum != first || first <= 0 {
		t.Fatalf("first step points %v, want one of %gs (created to draft's dispatch)", p, first)
	}
}

// Gates whose SLA passes: one rejected by the engine (via sla) and one
// that escalates its run undecided (expired). Both are outside their SLA.
func TestMetricsGateSLA(t *testing.T) {
	t.Parallel()
	t.Run("rejected", func(t *testing.T) {
		m := newMeters(t)
		h, r := setup(t, withPolicy(t, slaReject), m.use)
		id := h.runGoal(t, r, "metrics sla reject", sequence(
			planOf(step("a", "test.echo", map[string]any{"value": 1})),
			planOf(step("b", "test.echo", map[string]any{"value": 2})),
		))
		succeeded(t, r, id)
		m.waitTotal(t, "planex.gates.decided", map[string]string{"kind": "step", "decision": "rejected", "via": "sla", "within_sla": "false"}, 1)
		m.waitTotal(t, "planex.gates.decided", nil, 1)
		m.waitTotal(t, "planex.gate.wait.duration", map[string]string{"kind": "step", "decision": "rejected"}, 1)
		// a never ran: b's dispatch after the replan is the run's first.
		m.waitTotal(t, "planex.run.first_step.duration", nil, 1)
	})
	t.Run("expired", func(t *testing.T) {
		m := newMeters(t)
		h, r := setup(t, withPolicy(t, slaPolicy), m.use)
		id := h.runGoal(t, r, "metrics sla escalate", always(step("e", "test.echo", map[string]any{"value": 1})))
		run := waitTerminal(t, r.client, id, 20*time.Second)
		if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_ESCALATED {
			t.Fatalf("run %s %q, want ESCALATED", run.GetStatus(), run.GetStopMessage())
		}
		m.waitTotal(t, "planex.gates.decided", map[string]string{"kind": "step", "decision": "expired", "via": "sla", "within_sla": "false"}, 1)
		m.waitTotal(t, "planex.gates.decided", nil, 1)
		m.waitTotal(t, "planex.gate.wait.duration", map[string]string{"kind": "step", "decision": "expired"}, 1)
		// No step was ever dispatched.
		if n := m.total(t, "planex.run.first_step.duration", nil); n != 0 {
			t.Fatalf("planex.run.first_step.duration counted %d for a run that dispatched nothing", n)
		}
	})
}

// A stranded planning run whose first step was dispatched by an earlier
// supervisor: the sweeper counts one repair kick (cause planning), and the
// dispatch after the replan is not the run's first step.
func TestMetricsRedrivenOnceAndNoFirstStepAfterReplay(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	m := newMeters(t)
	ctx := testCtx(t, 30*time.Second)
	log, err := runlog.New(ctx, h.res, natstest.Logger(t), runlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const runID = "01METRICSSTRANDED"
	h.planner.on("metrics stranded", always(step("b", "test.echo", map[string]any{"value": "recovered"})))
	evs := createdRun(t, runID, "metrics stranded", planOf(step("a", "test.fail", map[string]any{"message": "boom"})).GetPlan())
	evs = append(evs,
		engine.Event(&planexv1.StepDispatched{StepId: "a", Attempt: 1, PlanRevision: 1, Tool: "test.fail",
			ResolvedArgs: mustStruct(map[string]any{"message": "boom"}), Deadline: timestamppb.New(time.Now().Add(time.Minute))}),
		engine.Event(&planexv1.StepFailed{StepId: "a", Attempt: 1, Error: &planexv1.StepError{Code: planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED, Message: "tool failed: boom"}}),
		engine.Event(&planexv1.ReplanRequested{Reason: "step a failed", StepId: "a"}),
	)
	commitEvents(t, h, log, &runlog.State{}, evs...)
	sweep := func(c *engine.Config) {
		c.SweepInterval = 200 * time.Millisecond
		c.StrandedAfter = 500 * time.Millisecond
	}
	// Two sweeping replicas send the same repair kick: one is counted.
	r := h.startReplica(m.use, sweep)
	h.startReplica(m.use, sweep)
	if run := waitTerminal(t, r.client, runID, 20*time.Second); run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("stranded run: %s %q", run.GetStatus(), run.GetStopMessage())
	}
	m.waitTotal(t, "planex.runs.redriven", map[string]string{"cause": "planning"}, 1)
	m.waitTotal(t, "planex.runs.redriven", nil, 1)
	m.waitTotal(t, "planex.steps.dispatched", nil, 1) // b
	if n := m.total(t, "planex.run.first_step.duration", nil); n != 0 {
		t.Fatalf("planex.run.first_step.duration counted %d: the run's first step was dispatched before (in its log)", n)
	}
}

// Engine messages the engine drops are counted by kind and reason: an
// undecodable result (terminated at once) and a kick for a run that does
// not exist (dropped after its retries).
func TestMetricsDroppedEngineMessages(t *testing.T) {
	m := newMeters(t)
	h, _ := setup(t, m.use, func(c *engine.Config) { c.SweepInterval = -1 })
	ctx := testCtx(t, 20*time.Second)
	garbage := nats.NewMsg(bus.EngineSubject("01NOSUCHRUNRESULT", bus.KindResult))
	garbage.Data = []byte("\xff\xff not a StepResult")
	if _, err := h.res.JS.PublishMsg(ctx, garbage); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Publish(ctx, h.res.JS, bus.Publication{
		Subject: bus.EngineSubject("01NOSUCHRUNKICK", bus.KindKick), Msg: &planexv1.EngineKick{RunId: "01NOSUCHRUNKICK", Reason: "test"},
		MsgID: "metrics-unknown-run",
	}); err != nil {
		t.Fatal(err)
	}
	m.waitTotal(t, "planex.engine.messages.dropped", map[string]string{"kind": bus.KindResult, "reason": "undecodable"}, 1)
	m.waitTotal(t, "planex.engine.messages.dropped", map[string]string{"kind": bus.KindKick, "reason": "unknown_run"}, 1)
	m.waitTotal(t, "planex.engine.messages.dropped", nil, 2)
}
