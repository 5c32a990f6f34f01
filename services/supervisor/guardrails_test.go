package supervisor_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/policy"
	"github.com/planex-dev/planex/services/supervisor/engine"
)

// withPolicy loads policy files (policy.Builtin or YAML texts written to
// files) into the replica's engine.
func withPolicy(t *testing.T, texts ...string) func(*engine.Config) {
	t.Helper()
	var paths []string
	for i, text := range texts {
		if text == policy.Builtin {
			paths = append(paths, text)
			continue
		}
		p := filepath.Join(t.TempDir(), "policy"+string(rune('a'+i))+".yaml")
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	w, err := policy.NewWatcher(natstest.Logger(t), paths...)
	if err != nil {
		t.Fatal(err)
	}
	return func(c *engine.Config) { c.Policies = w }
}

// registerSpec adds a tool spec to the catalog (its pool has no executor:
// the tests only need its gate).
func (h *harness) registerSpec(spec *planexv1.ToolSpec) {
	h.t.Helper()
	if _, err := h.res.Tools.Put(testCtx(h.t, 5*time.Second), bus.ToolKey(spec.GetName(), "fake-2"), mustMarshal(spec)); err != nil {
		h.t.Fatal(err)
	}
}

func waiting(t *testing.T, r *replica, id string, gates int) *planexv1.Run {
	t.Helper()
	return waitRun(t, r.client, id, 10*time.Second, "waiting", func(run *planexv1.Run) bool {
		n := 0
		for _, g := range run.GetGates() {
			if g.GetDecision() == planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED {
				n++
			}
		}
		return run.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING && n == gates
	})
}

func TestDefaultPolicyGatesSideEffectsAndSQLExec(t *testing.T) {
	h, r := setup(t, withPolicy(t, policy.Builtin))
	anyArgs := mustStruct(map[string]any{"type": "object"})
	h.registerSpec(&planexv1.ToolSpec{Name: "sql.exec", Pool: "sql", Description: "runs a statement", ArgsSchema: anyArgs, SideEffect: planexv1.SideEffect_SIDE_EFFECT_WRITE})
	h.registerSpec(&planexv1.ToolSpec{Name: "email.send", Pool: "email", Description: "sends mail", ArgsSchema: anyArgs, SideEffect: planexv1.SideEffect_SIDE_EFFECT_EXTERNAL})
	id := h.runGoal(t, r, "default policy", always(
		step("read", "test.echo", map[string]any{"value": 1}),
		step("exec", "sql.exec", map[string]any{"statement": "delete from invoices"}, "read"),
		step("mail", "email.send", map[string]any{"to": []any{"finance@example.com"}, "subject": "s", "body": "b"}, "read"),
	))
	run := waiting(t, r, id, 2)
	rules := map[string]string{}
	for _, g := range run.GetGates() {
		rules[g.GetStepId()] = g.GetRule()
		if g.GetPolicy() != "default" || !strings.Contains(g.GetReason(), g.GetRule()) {
			t.Errorf("gate %s: policy %q reason %q", g.GetId(), g.GetPolicy(), g.GetReason())
		}
	}
	if rules["exec"] != "sql-exec-needs-approval" || rules["mail"] != "side-effects-need-approval" {
		t.Fatalf("gates by step: %v", rules)
	}
	if got := h.pool.executions(id)["read/1"]; got != 1 {
		t.Fatalf("the read step ran %d times, want 1 (reads are not gated)", got)
	}
}

const denyForbidden = `name: no-forbidden
rules:
  - name: no-forbidden-value
    when: step.tool == "test.echo" && step.args.value == "forbidden"
    action: deny
    reason: the value forbidden may not be echoed
`

func TestPolicyDenyFailsStepBeforeItsPoolAndTellsThePlanner(t *testing.T) {
	h, r := setup(t, withPolicy(t, denyForbidden))
	id := h.runGoal(t, r, "deny", sequence(
		planOf(noRetry(step("a", "test.echo", map[string]any{"value": "forbidden"}))),
		planOf(step("b", "test.echo", map[string]any{"value": "allowed"})),
	))
	succeeded(t, r, id)
	if n, ok := h.pool.executions(id)["a/1"]; ok {
		t.Fatalf("the denied step reached its pool (%d executions)", n)
	}
	reqs := h.planner.requests(id)
	if len(reqs) != 2 {
		t.Fatalf("%d planner calls, want 2", len(reqs))
	}
	var seen bool
	for _, o := range reqs[1].GetHistory().GetSteps() {
		if o.GetStepId() == "a" && o.GetError().GetCode() == planexv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED &&
			strings.Contains(o.GetError().GetMessage(), `policy "no-forbidden" rule "no-forbidden-value": the value forbidden may not be echoed`) {
			seen = true
		}
	}
	if !seen {
		t.Fatalf("the planner's second request does not carry the denial: %v", reqs[1].GetHistory())
	}
}

func TestLowConfidencePlanOpensPlanGate(t *testing.T) {
	h, r := setup(t, withPolicy(t, policy.Builtin))
	low := func(resp *planexv1.PlanResponse) *planexv1.PlanResponse { resp.Plan.Confidence = 0.4; return resp }
	t.Run("approve", func(t *testing.T) {
		id := h.runGoal(t, r, "low confidence approve", sequence(low(planOf(step("a", "test.echo", map[string]any{"value": 1})))))
		run := waiting(t, r, id, 1)
		g := run.GetGates()[0]
		if g.GetKind() != planexv1.GateKind_GATE_KIND_PLAN || g.GetId() != "plan.r1" || g.GetRule() != "low-confidence-plan" {
			t.Fatalf("gate %v, want the plan gate of revision 1", g)
		}
		if len(h.pool.executions(id)) != 0 {
			t.Fatal("a step ran before the plan was approved")
		}
		if _, err := r.client.Decide(testCtx(t, 5*time.Second), &planexv1.DecideRequest{RunId: id, GateId: g.GetId(), Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE, Actor: "bob"}); err != nil {
			t.Fatal(err)
		}
		succeeded(t, r, id)
	})
	t.Run("reject replans", func(t *testing.T) {
		id := h.runGoal(t, r, "low confidence reject", sequence(
			low(planOf(step("a", "test.echo", map[string]any{"value": 1}))),
			planOf(step("b", "test.echo", map[string]any{"value": 2})),
		))
		g := waiting(t, r, id, 1).GetGates()[0]
		if _, err := r.client.Decide(testCtx(t, 5*time.Second), &planexv1.DecideRequest{RunId: id, GateId: g.GetId(), Decision: planexv1.DecisionKind_DECISION_KIND_REJECT, Actor: "bob", Comment: "use step b"}); err != nil {
			t.Fatal(err)
		}
		succeeded(t, r, id)
		reqs := h.planner.requests(id)
		if len(reqs) != 2 || !strings.Contains(reqs[1].GetHistory().GetReplanReason(), "rejected by bob: use step b") {
			t.Fatalf("planner requests %d, replan reason %q", len(reqs), reqs[len(reqs)-1].GetHistory().GetReplanReason())
		}
		if _, ok := h.pool.executions(id)["a/1"]; ok {
			t.Fatal("a step of the rejected plan ran")
		}
	})
}

func TestBatchDecideIsRefusedWholeNamingTheField(t *testing.T) {
	h, r := setup(t)
	id := h.runGoal(t, r, "batch", always(
		step("x", "test.approve", map[string]any{"value": "x"}),
		step("y", "test.approve", map[string]any{"value": "y"}),
	))
	run := waiting(t, r, id, 2)
	gx, gy := run.GetGates()[0].GetId(), run.GetGates()[1].GetId()
	_, err := r.client.Decide(testCtx(t, 5*time.Second), &planexv1.DecideRequest{RunId: id, Actor: "carol", Decisions: []*planexv1.GateDecision{
		{GateId: gx, Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE},
		{GateId: gy, Decision: planexv1.DecisionKind_DECISION_KIND_EDIT, EditedArgs: mustStruct(map[string]any{"value": "y", "extra": true})},
	}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "decisions[1].edited_args") {
		t.Fatalf("batch with an invalid edit: %v, want InvalidArgument naming decisions[1].edited_args", err)
	}
	// Nothing of the refused batch was recorded.
	run = waiting(t, r, id, 2)
	resp, err := r.client.Decide(testCtx(t, 5*time.Second), &planexv1.DecideRequest{RunId: id, Actor: "carol", Decisions: []*planexv1.GateDecision{
		{GateId: gx, Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE, Comment: "fine"},
		{GateId: gy, Decision: planexv1.DecisionKind_DECISION_KIND_EDIT, EditedArgs: mustStruct(map[string]any{"value": "edited"})},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range resp.GetRun().GetGates() {
		if g.GetDecision() == planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED || g.GetActor() != "carol" || g.GetDecidedAt() == nil {
			t.Fatalf("gate after the batch: %v", g)
		}
	}
	succeeded(t, r, id)
	if got := h.pool.argsOf(id, "y", 1).GetFields()["value"].GetStringValue(); got != "edited" {
		t.Fatalf("y ran with %q, want the edited value", got)
	}
	var decided int
	for _, ev := range watchAll(t, r.client, id, 0) {
		if d := ev.GetGateDecided(); d != nil && d.GetActor() == "carol" && ev.GetTime() != nil {
			decided++
		}
	}
	if decided != 2 {
		t.Fatalf("%d GateDecided events by carol, want 2", decided)
	}
}

const slaPolicy = `name: sla
rules:
  - name: approve-echo
    when: step.tool == "test.echo"
    action: require_approval
    reason: echo needs a look
    gate_timeout: 2s
    on_timeout: escalate
`

func TestGateSLAFiresAfterTheReplicaThatArmedItDies(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	a := h.startReplica(withPolicy(t, slaPolicy))
	id := h.runGoal(t, a, "sla", always(step("e", "test.echo", map[string]any{"value": 1})))
	run := waiting(t, a, id, 1)
	if run.GetGates()[0].GetSlaAt() == nil {
		t.Fatalf("gate without SLA: %v", run.GetGates()[0])
	}
	// The replica that opened the gate and armed its timer dies before the
	// SLA expires; the timer waits in the server for another replica.
	escalatedAfterKill(t, h, a, id, run.GetGates()[0])
}

// escalatedAfterKill kills replica a, which armed gate's SLA (failing
// the test if the SLA expired first: it would prove nothing), starts
// another replica with slaPolicy and requires the SLA to escalate run id
// there without running the gated step.
func escalatedAfterKill(t *testing.T, h *harness, a *replica, id string, gate *planexv1.Gate) {
	t.Helper()
	a.kill()
	if time.Now().After(gate.GetSlaAt().AsTime()) {
		t.Fatal("the SLA expired before the replica died; the test proves nothing")
	}
	b := h.startReplica(withPolicy(t, slaPolicy))
	run := waitTerminal(t, b.client, id, 20*time.Second)
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_ESCALATED || !strings.Contains(run.GetStopMessage(), "not decided within its SLA") {
		t.Fatalf("run %s %s %q, want ESCALATED by the SLA", run.GetStatus(), run.GetStopReason(), run.GetStopMessage())
	}
	if len(h.pool.executions(id)) != 0 {
		t.Fatal("the gated step ran")
	}
}

func TestRepeatedFailingPlanStopsStalled(t *testing.T) {
	h, r := setup(t, func(c *engine.Config) { c.StallLimit = 2 })
	h.planner.on("stall", always(noRetry(step("f", "test.fail", map[string]any{"message": "boom"}))))
	id := start(t, r.client, &planexv1.StartRunRequest{Goal: "stall", Budget: &planexv1.Budget{MaxReplans: 10}})
	run := waitTerminal(t, r.client, id, 20*time.Second)
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_ESCALATED || run.GetStopReason() != planexv1.StopReason_STOP_REASON_STALLED {
		t.Fatalf("run %s %s %q, want ESCALATED STALLED", run.GetStatus(), run.GetStopReason(), run.GetStopMessage())
	}
	if got := len(h.planner.requests(id)); got != 3 {
		t.Fatalf("%d planner calls, want 3 (two failing revisions, then the repeat is refused)", got)
	}
	evs := watchAll(t, r.client, id, 0)
	stall := evs[len(evs)-1].GetFinished().GetStall()
	if stall.GetKind() != engine.StallRepeatedFailingStep || len(stall.GetRevisions()) != 3 || stall.GetSteps()[0] != "f (test.fail)" || stall.GetLimit() != 2 {
		t.Fatalf("stall evidence %v", stall)
	}
	if run.GetUsage().GetReplans() >= 10 {
		t.Fatal("the run burnt its replan budget")
	}
}

const criticEmpty = `name: critic
rules:
  - name: non-empty
    on: result
    when: step.tool == "test.echo" && output_empty
    action: deny
    reason: the result is empty
`

func TestCriticRejectingAnEmptyResultReplansOnce(t *testing.T) {
	h, r := setup(t, withPolicy(t, criticEmpty))
	id := h.runGoal(t, r, "critic", sequence(
		planOf(noRetry(step("a", "test.echo", map[string]any{"value": ""}))),
		planOf(step("b", "test.echo", map[string]any{"value": "found"})),
	))
	run := succeeded(t, r, id)
	if run.GetUsage().GetReplans() != 1 || len(h.planner.requests(id)) != 2 {
		t.Fatalf("replans %d, planner calls %d; want one replan", run.GetUsage().GetReplans(), len(h.planner.requests(id)))
	}
	var verdicts []*planexv1.CriticVerdict
	for _, ev := range watchAll(t, r.client, id, 0) {
		if v := ev.GetCriticVerdict(); v != nil {
			verdicts = append(verdicts, v)
		}
	}
	if len(verdicts) != 1 || verdicts[0].GetStepId() != "a" || verdicts[0].GetVerifier() != "policy:critic/non-empty" || verdicts[0].GetAction() != "replan" {
		t.Fatalf("verdicts %v, want one failing verdict on step a", verdicts)
	}
	hist := h.planner.requests(id)[1].GetHistory()
	if !strings.Contains(hist.GetReplanReason(), "the result is empty") {
		t.Fatalf("replan reason %q does not carry the verdict", hist.GetReplanReason())
	}
}

func TestApprovePlansRunOptionGatesEveryRevision(t *testing.T) {
	h, r := setup(t)
	h.planner.on("approve plans", sequence(
		planOf(noRetry(step("a", "test.fail", map[string]any{"message": "boom"}))),
		planOf(step("b", "test.echo", map[string]any{"value": 2})),
	))
	id := start(t, r.client, &planexv1.StartRunRequest{Goal: "approve plans", ApprovePlans: true})
	for rev := 1; rev <= 2; rev++ {
		run := waiting(t, r, id, 1)
		var open *planexv1.Gate
		for _, g := range run.GetGates() {
			if g.GetDecision() == planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED {
				open = g
			}
		}
		if open.GetKind() != planexv1.GateKind_GATE_KIND_PLAN || open.GetPlanRevision() != int32(rev) {
			t.Fatalf("open gate %v, want the plan gate of revision %d", open, rev)
		}
		if _, err := r.client.Decide(testCtx(t, 5*time.Second), &planexv1.DecideRequest{RunId: id, GateId: open.GetId(), Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE}); err != nil {
			t.Fatal(err)
		}
	}
	succeeded(t, r, id)
}

const slaReject = `name: sla
rules:
  - name: approve-echo
    when: step.tool == "test.echo" && step.args.value == 1
    action: require_approval
    reason: echo 1 needs a look
    gate_timeout: 1s
    on_timeout: reject
`

func TestGateSLARejectReplans(t *testing.T) {
	h, r := setup(t, withPolicy(t, slaReject))
	id := h.runGoal(t, r, "sla reject", sequence(
		planOf(step("a", "test.echo", map[string]any{"value": 1})),
		planOf(step("b", "test.echo", map[string]any{"value": 2})),
	))
	run := succeeded(t, r, id)
	g := run.GetGates()[0]
	if g.GetDecision() != planexv1.DecisionKind_DECISION_KIND_REJECT || g.GetDecidedVia() != engine.ViaSLA || g.GetActor() != "planex" {
		t.Fatalf("gate after its SLA: %v", g)
	}
	if reason := h.planner.requests(id)[1].GetHistory().GetReplanReason(); !strings.Contains(reason, "not decided within its SLA") {
		t.Fatalf("replan reason %q", reason)
	}
}
