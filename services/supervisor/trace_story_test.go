package supervisor_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/telemetry"
	"github.com/planex-dev/planex/internal/telemetry/otlptest"
)

// exportTo installs telemetry.Setup's providers exporting over OTLP/gRPC
// to recv, as a planex process with OTEL_EXPORTER_OTLP_ENDPOINT does, and
// returns the flush. Not for parallel tests: it swaps the global
// providers (restored at cleanup).
func exportTo(t *testing.T, recv *otlptest.Receiver) (flush func()) {
	t.Helper()
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	prevTP, prevMP, prevProp := otel.GetTracerProvider(), otel.GetMeterProvider(), otel.GetTextMapPropagator()
	tel, err := telemetry.Setup(testCtx(t, 5*time.Second), telemetry.Config{ServiceName: "planex-supervisor", OTLPEndpoint: recv.Addr, Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = tel.Shutdown(context.Background())
		otel.SetTracerProvider(prevTP)
		otel.SetMeterProvider(prevMP)
		otel.SetTextMapPropagator(prevProp)
	})
	return func() {
		if err := tel.TracerProvider.ForceFlush(testCtx(t, 5*time.Second)); err != nil {
			t.Fatalf("flush spans: %v", err)
		}
	}
}

// A gated, retried, replanned run read back from an OTLP receiver tells
// its story: the root span covers the run, the gate's span lasts exactly
// its wait and names the decider, every step attempt has a span with its
// timers and retry as events, the timers' handling is linked to the trace
// rather than stretching it, nothing ends after the root, and every
// execution hangs under its dispatch.
func TestRunTraceTellsTheStory(t *testing.T) {
	recv := otlptest.Start(t)
	flush := exportTo(t, recv)
	h := newHarness(t)
	r := h.startReplica()

	fetch := fastRetry(flaky("fetch", "test.flaky", 1, "UNAVAILABLE"), 2)
	check := noRetry(step("check", "test.fail", map[string]any{"message": "not yet"}, "fetch"))
	send := step("send", "test.approve", map[string]any{"value": 1}, "fetch")
	id := h.runGoal(t, r, "a traced story", sequence(planOf(fetch, check), planOf(fetch, send)))

	open := waitRun(t, r.client, id, 15*time.Second, "waiting at a gate", func(run *planexv1.Run) bool {
		return slices.ContainsFunc(run.GetGates(), func(g *planexv1.Gate) bool { return g.GetStepId() == "send" })
	})
	gateID := open.GetGates()[len(open.GetGates())-1].GetId()
	const wait = 300 * time.Millisecond // a person reading the request
	time.Sleep(wait)
	if _, err := r.client.Decide(testCtx(t, 5*time.Second), &planexv1.DecideRequest{
		RunId: id, GateId: gateID, Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE, Actor: "alice", Comment: "fine",
	}); err != nil {
		t.Fatalf("Decide: %v", err)
	}
	run := waitTerminal(t, r.client, id, 15*time.Second)
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED || run.GetUsage().GetReplans() != 1 {
		t.Fatalf("run %s: %s %s %q, %d replans; want SUCCEEDED after one replan", id, run.GetStatus(), run.GetStopReason(), run.GetStopMessage(), run.GetUsage().GetReplans())
	}
	recv.WaitTrace(t, run.GetTraceId(), 10*time.Second, "the root span", func(spans []otlptest.Span) bool {
		return slices.ContainsFunc(spans, func(s otlptest.Span) bool { return s.Name == "run" })
	})
	flush()
	spans := recv.Trace(run.GetTraceId())

	byID := map[string]otlptest.Span{}
	named := map[string][]otlptest.Span{}
	for _, s := range spans {
		byID[s.SpanID] = s
		named[s.Name] = append(named[s.Name], s)
	}
	roots := named["run"]
	if len(roots) != 1 || roots[0].ParentSpanID != "" {
		t.Fatalf("want one root span \"run\", got %d: %v", len(roots), names(spans))
	}
	root := roots[0]
	if root.Attrs["planex.run.status"] != "SUCCEEDED" || root.Attrs["planex.run_id"] != id {
		t.Errorf("root attributes %v", root.Attrs)
	}
	const slack = 50 * time.Millisecond
	if d := root.Start.Sub(run.GetCreatedAt().AsTime()); d < -slack || d > slack {
		t.Errorf("root starts %s from the run's creation", d)
	}
	if d := root.End.Sub(run.GetFinishedAt().AsTime()); d < -slack || d > slack {
		t.Errorf("root ends %s from the run's end", d)
	}
	for _, s := range spans {
		if s.SpanID != root.SpanID && s.ParentSpanID == "" {
			t.Errorf("second root %s/%q in the run's trace", s.Service, s.Name)
		}
		if s.ParentSpanID != "" && byID[s.ParentSpanID].SpanID == "" {
			t.Errorf("span %q names a parent %s the trace lacks", s.Name, s.ParentSpanID)
		}
		// The executor's publish of the last result (and its handling
		// span around it) ends when the server's ack reaches it, which
		// may be after the engine already finished the run on that
		// result: within the slack. A timer's handling would end long
		// after (it is linked, not parented: checked below).
		if s.End.After(root.End.Add(slack)) {
			t.Errorf("span %q ends %s after the root", s.Name, s.End.Sub(root.End))
		}
		if strings.HasPrefix(s.Name, "process planex.timers") {
			t.Errorf("a timer's handling is part of the run's trace: %q", s.Name)
		}
	}
	if starts := named["start run"]; len(starts) != 1 || starts[0].ParentSpanID != root.SpanID {
		t.Errorf("StartRun's span: %d spans named \"start run\" under the root", len(starts))
	}
	if n := len(named["plan revision"]); n != 2 {
		t.Errorf("%d planning round spans, want 2", n)
	}

	// The gate: its wait, its rule, its decider.
	gates := named["gate send"]
	if len(gates) != 1 {
		t.Fatalf("%d gate spans, want 1: %v", len(gates), names(spans))
	}
	g := gates[0]
	var rec *planexv1.Gate
	for _, x := range run.GetGates() {
		if x.GetId() == gateID {
			rec = x
		}
	}
	if want := rec.GetDecidedAt().AsTime().Sub(rec.GetOpenedAt().AsTime()); g.Duration() != want || g.Duration() < wait {
		t.Errorf("gate span lasts %s; the gate waited %s (at least %s)", g.Duration(), want, wait)
	}
	for k, want := range map[string]any{
		"planex.gate_id": gateID, "planex.gate.kind": "step", "planex.step_id": "send", "planex.gate.decision": "approve",
		"planex.gate.decider": "alice", "planex.run_id": id,
	} {
		if g.Attrs[k] != want {
			t.Errorf("gate span %s = %v, want %v", k, g.Attrs[k], want)
		}
	}
	if g.ParentSpanID != root.SpanID || len(g.Links) == 0 {
		t.Errorf("gate span: parent %s (root %s), %d links (want the decision's handling)", g.ParentSpanID, root.SpanID, len(g.Links))
	}

	// Step attempts: one span each, timers and the retry as events.
	attempts := map[string]otlptest.Span{}
	for _, s := range spans {
		if strings.HasPrefix(s.Name, "step ") {
			attempts[fmt.Sprintf("%v/%v", s.Attrs["planex.step_id"], s.Attrs["planex.attempt"])] = s
		}
	}
	for key, outcome := range map[string]string{"fetch/1": "failed", "fetch/2": "succeeded", "check/1": "failed", "send/1": "succeeded"} {
		s, ok := attempts[key]
		if !ok {
			t.Errorf("no span for attempt %s; have %v", key, names(spans))
			continue
		}
		if s.Attrs["planex.step.outcome"] != outcome || s.ParentSpanID != root.SpanID {
			t.Errorf("attempt %s: outcome %v, parent %s; want %s under the root", key, s.Attrs["planex.step.outcome"], s.ParentSpanID, outcome)
		}
		if !hasEvent(s, "timer set", "planex.timer", "step_timeout") {
			t.Errorf("attempt %s: no start-to-close timer event: %+v", key, s.Events)
		}
	}
	if len(attempts) != 4 {
		t.Errorf("%d attempt spans, want 4", len(attempts))
	}
	if !hasEvent(attempts["fetch/1"], "retry scheduled", "planex.retry", int64(1)) {
		t.Errorf("the retried attempt has no retry event: %+v", attempts["fetch/1"].Events)
	}

	// Each execution hangs under the dispatch of its attempt.
	dispatched := map[string]bool{}
	executions := 0
	for _, s := range spans {
		if !strings.HasPrefix(s.Name, "process planex.steps.") && !strings.HasPrefix(s.Name, "process planex.events.") {
			continue
		}
		executions++
		var disp otlptest.Span
		for cur := s; cur.ParentSpanID != ""; cur = byID[cur.ParentSpanID] {
			if cur.Name == "dispatch step" {
				disp = cur
				break
			}
		}
		if disp.SpanID == "" {
			t.Errorf("execution %q has no dispatch span among its ancestors", s.Name)
			continue
		}
		dispatched[fmt.Sprintf("%v/%v", disp.Attrs["planex.step_id"], disp.Attrs["planex.attempt"])] = true
	}
	if executions != 4 || len(dispatched) != 4 {
		t.Errorf("%d executions under %d distinct dispatches, want 4 and 4", executions, len(dispatched))
	}

	// Timers fired in traces of their own, linked to the run's.
	linked := false
	for _, s := range recv.Spans() {
		if strings.HasPrefix(s.Name, "process planex.timers") && s.TraceID != run.GetTraceId() {
			for _, l := range s.Links {
				linked = linked || l.TraceID == run.GetTraceId()
			}
		}
	}
	if !linked {
		t.Error("no timer handling span links the run's trace (the retry timer fired)")
	}
}

func hasEvent(s otlptest.Span, name, key string, value any) bool {
	return slices.ContainsFunc(s.Events, func(e otlptest.Event) bool { return e.Name == name && e.Attrs[key] == value })
}

func names(spans []otlptest.Span) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name
	}
	return out
}
