package engine

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// ViaSLA is GateDecided.via of a gate the engine rejected because its SLA
// expired.
const ViaSLA = "sla"

// onDecision records a decision on an open gate. A rejection goes back to
// the planner with the reason (a replan) unless the gate's rule says
// on_reject: stop, the decider asks to stop the run, or no replan is left:
// then the run stops REJECTED.
func (e *Engine) onDecision(tx *runlog.Tx, d *planexv1.GateDecided) error {
	run := tx.Run()
	g := runlog.Gate(run, d.GetGateId())
	if g == nil {
		return errStale
	}
	if !runlog.GateOpen(run, g) {
		return errIgnore
	}
	input := g.GetKind() == planexv1.GateKind_GATE_KIND_INPUT && d.GetDecision() != planexv1.DecisionKind_DECISION_KIND_REJECT
	if input && (d.GetDecision() != planexv1.DecisionKind_DECISION_KIND_APPROVE || d.GetAnswer() == nil) {
		return errIgnore // the API lets no such decision through
	}
	if err := tx.Emit(Event(d)); err != nil {
		return err
	}
	if input {
		return answerInput(tx, g, d)
	}
	if d.GetDecision() != planexv1.DecisionKind_DECISION_KIND_REJECT {
		return nil
	}
	msg := rejection(g, d)
	switch {
	case d.GetStopRun():
		return finish(tx, planexv1.StopReason_STOP_REASON_REJECTED, msg+"; the run was stopped at the decider's request", nil, 0)
	case stopsOnReject(g):
		why := "; the gate's rule says on_reject: stop"
		if g.GetPolicy() == "" {
			why = "" // a record from before rejections replanned
		}
		return finish(tx, planexv1.StopReason_STOP_REASON_REJECTED, msg+why, nil, 0)
	case run.GetUsage().GetReplans() >= run.GetBudget().GetMaxReplans():
		return finish(tx, planexv1.StopReason_STOP_REASON_REJECTED,
			fmt.Sprintf("%s; no replan left (max_replans %d)", msg, run.GetBudget().GetMaxReplans()), nil, 0)
	}
	return tx.Emit(Event(&planexv1.ReplanRequested{Reason: msg, StepId: g.GetStepId()}))
}

// rejection says who rejected gate g and why, for the planner and the
// run's stop message.
func rejection(g *planexv1.Gate, d *planexv1.GateDecided) string {
	what := fmt.Sprintf("gate %s (plan revision %d)", g.GetId(), g.GetPlanRevision())
	if g.GetKind() != planexv1.GateKind_GATE_KIND_PLAN {
		what = fmt.Sprintf("gate %s (step %q)", g.GetId(), g.GetStepId())
	}
	msg := what + " rejected"
	switch {
	case d.GetVia() == ViaSLA:
		msg = what + " was not decided within its SLA and is rejected"
	case d.GetActor() != "":
		msg += " by " + d.GetActor()
	case d.GetDecidedBy() != "":
		msg += " by " + d.GetDecidedBy()
	}
	if d.GetComment() != "" {
		msg += ": " + d.GetComment()
	}
	return msg
}

// stopsOnReject reports whether rejecting g stops the run whatever the
// decider asks: its rule says on_reject: stop. Gates recorded before
// rejections replanned (no replan_on_reject) decide as they did then:
// stop_on_reject, and step gates without a policy always stopped.
func stopsOnReject(g *planexv1.Gate) bool {
	if g.GetReplanOnReject() {
		return false
	}
	return g.GetStopOnReject() || (g.GetKind() == planexv1.GateKind_GATE_KIND_STEP && g.GetPolicy() == "")
}

// onGateSLA fires a gate's SLA: a gate still open past its sla_at escalates
// the run or is rejected, per the gate. A decision waiting in the engine
// inbox wins over the timer.
func (e *Engine) onGateSLA(ctx context.Context, tx *runlog.Tx, t *planexv1.EngineTimer) error {
	run := tx.Run()
	g := runlog.Gate(run, t.GetGateId())
	if g == nil {
		return errStale
	}
	if !runlog.GateOpen(run, g) || g.GetSlaAt() == nil {
		return errIgnore
	}
	now := e.cfg.Now()
	if due := g.GetSlaAt().AsTime(); now.Before(due) {
		return notYet{due.Sub(now)}
	}
	pending, err := e.scanInbox(ctx, bus.EngineSubject(run.GetId(), bus.KindDecision), func(m *nats.Msg) bool {
		d := &planexv1.GateDecided{}
		return bus.Decode(m, d) == nil && d.GetGateId() == g.GetId()
	})
	if err != nil {
		return err
	}
	if pending {
		return notYet{e.cfg.AckWait}
	}
	e.logger.InfoContext(ctx, "gate SLA expired", "gate_id", g.GetId(), "on_timeout", g.GetOnTimeout().String())
	if g.GetOnTimeout() == planexv1.GateTimeoutAction_GATE_TIMEOUT_ACTION_REJECT {
		return e.onDecision(tx, &planexv1.GateDecided{
			GateId: g.GetId(), Decision: planexv1.DecisionKind_DECISION_KIND_REJECT, Actor: "planex", Via: ViaSLA,
			Comment: fmt.Sprintf("not decided within its SLA (due %s)", g.GetSlaAt().AsTime().UTC().Format("2006-01-02T15:04:05Z")),
		})
	}
	return finish(tx, planexv1.StopReason_STOP_REASON_ESCALATED,
		fmt.Sprintf("gate %s was not decided within its SLA (due %s): %s", g.GetId(), g.GetSlaAt().AsTime().UTC().Format("2006-01-02T15:04:05Z"), g.GetReason()),
		nil, 0)
}

// gateTimers are the SLA timers the committed state calls for: those of the
// gates this transaction opened and, for a state this replica did not
// produce, of every open gate (a repeat is deduplicated or harmless: the
// timer acts only on a gate still open).
func (e *Engine) gateTimers(ctx context.Context, base, next *runlog.State, events []*planexv1.RunEvent) []func() error {
	opened := map[string]bool{}
	for _, ev := range events {
		if g := ev.GetGateOpened().GetGate(); g != nil {
			opened[g.GetId()] = true
		}
	}
	run := next.Run
	var jobs []func() error
	for _, g := range run.GetGates() {
		if g.GetSlaAt() == nil || !(opened[g.GetId()] || !base.Verified) || !runlog.GateOpen(run, g) {
			continue
		}
		t := &planexv1.EngineTimer{RunId: run.GetId(), FireAt: g.GetSlaAt(), Kind: planexv1.EngineTimerKind_ENGINE_TIMER_KIND_GATE_SLA, GateId: g.GetId()}
		jobs = append(jobs, func() error {
			rctx := e.runContext(ctx, next)
			if _, err := bus.Publish(rctx, e.res.JS, heldTimer(rctx, e.res, t, bus.MsgID(run.GetId(), "timer", "gate", g.GetId()),
				attribute.String("planex.run_id", run.GetId()), attribute.String("planex.gate_id", g.GetId()))); err != nil {
				return fmt.Errorf("publish SLA timer of gate %s: %w", g.GetId(), err)
			}
			return nil
		})
	}
	return jobs
}
