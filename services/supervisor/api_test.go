package supervisor_test

import (
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/supervisor/engine"
)

func TestStartRunValidation(t *testing.T) {
	_, r := setup(t)
	bigInputs := mustStruct(map[string]any{"blob": strings.Repeat("x", 70<<10)})
	tests := []struct {
		name string
		req  *planexv1.StartRunRequest
		want string // in the InvalidArgument message
	}{
		{name: "empty goal", req: &planexv1.StartRunRequest{}, want: "goal: required"},
		{name: "long goal", req: &planexv1.StartRunRequest{Goal: strings.Repeat("g", 4097)}, want: "goal: 4097 bytes"},
		{name: "big inputs", req: &planexv1.StartRunRequest{Goal: "g", Inputs: bigInputs}, want: "inputs:"},
		{name: "bad label key", req: &planexv1.StartRunRequest{Goal: "g", Labels: map[string]string{"Team Name": "x"}}, want: `labels: key "Team Name"`},
		{name: "steps above ceiling", req: &planexv1.StartRunRequest{Goal: "g", Budget: &planexv1.Budget{MaxSteps: 5000}}, want: "budget.max_steps 5000: exceeds the server ceiling 1000"},
		{name: "negative replans", req: &planexv1.StartRunRequest{Goal: "g", Budget: &planexv1.Budget{MaxReplans: -1}}, want: "budget.max_replans -1"},
		{name: "deadline above ceiling", req: &planexv1.StartRunRequest{Goal: "g", Budget: &planexv1.Budget{Deadline: durationpb.New(48 * time.Hour)}}, want: "budget.deadline 48h0m0s"},
		{name: "mode", req: &planexv1.StartRunRequest{Goal: "g", Mode: 7}, want: "mode 7"},
		{name: "idempotency key", req: &planexv1.StartRunRequest{Goal: "g", IdempotencyKey: strings.Repeat("k", 129)}, want: "idempotency_key: 129 bytes"},
		{name: "backend", req: &planexv1.StartRunRequest{Goal: "g", PlannerBackend: "Open AI"}, want: `planner_backend "Open AI"`},
		{name: "secret in goal", req: &planexv1.StartRunRequest{Goal: "Query with api_key=sk-live-0123456789abcdef"}, want: "goal: contains what looks like a secret (credential)"},
		{name: "bearer token in goal", req: &planexv1.StartRunRequest{Goal: "call it with Bearer abcdefghijklmnop0123"}, want: "goal: contains what looks like a secret (bearer)"},
		{name: "card in inputs", req: &planexv1.StartRunRequest{Goal: "g", Inputs: mustStruct(map[string]any{"card": "4111 1111 1111 1111"})}, want: "inputs: contains what looks like a secret (card)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := r.client.StartRun(testCtx(t, 5*time.Second), tt.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.want) {
				t.Fatalf("err = %v, want InvalidArgument mentioning %q", err, tt.want)
			}
			if msg := status.Convert(err).Message(); strings.Contains(msg, "0123456789abcdef") || strings.Contains(msg, "4111") {
				t.Fatalf("error echoes the secret: %q", msg)
			}
		})
	}
	ids, err := r.client.ListRuns(testCtx(t, 5*time.Second), &planexv1.ListRunsRequest{})
	if err != nil || len(ids.GetRuns()) != 0 {
		t.Fatalf("a refused StartRun left a run behind: %v %v", ids, err)
	}
}

func TestGetRunNotFound(t *testing.T) {
	_, r := setup(t)
	_, err := r.client.GetRun(testCtx(t, 5*time.Second), &planexv1.GetRunRequest{RunId: "01NOSUCHRUN"})
	if status.Code(err) != codes.NotFound || !strings.Contains(status.Convert(err).Message(), `"01NOSUCHRUN"`) {
		t.Fatalf("err = %v, want NotFound naming the id", err)
	}
	_, err = r.client.GetRun(testCtx(t, 5*time.Second), &planexv1.GetRunRequest{RunId: "a.b"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("err = %v, want InvalidArgument", err)
	}
}

func TestIdempotentStartRun(t *testing.T) {
	h, r := setup(t)
	h.planner.on("idem", always(step("a", "test.echo", map[string]any{"value": 1})))
	req := &planexv1.StartRunRequest{Goal: "idem", IdempotencyKey: "order 42 / retry-safe ✓"}
	first, err := r.client.StartRun(testCtx(t, 5*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	second, err := r.client.StartRun(testCtx(t, 5*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	if first.GetExisting() || !second.GetExisting() || first.GetRun().GetId() != second.GetRun().GetId() {
		t.Fatalf("first %s existing=%v, second %s existing=%v", first.GetRun().GetId(), first.GetExisting(), second.GetRun().GetId(), second.GetExisting())
	}
	other := start(t, r.client, &planexv1.StartRunRequest{Goal: "idem", IdempotencyKey: "another"})
	if other == first.GetRun().GetId() {
		t.Fatal("a different key returned the same run")
	}
	waitTerminal(t, r.client, first.GetRun().GetId(), 10*time.Second)
	if n := len(h.planner.requests(first.GetRun().GetId())); n != 1 {
		t.Fatalf("planner called %d times for one idempotent run", n)
	}
}

func TestWatchRunResumesAndFollowsLive(t *testing.T) {
	h, r := setup(t)
	id := h.runGoal(t, r, "watch", always(
		step("a", "test.sleep", map[string]any{"ms": 200}),
		step("b", "test.echo", map[string]any{"value": 2}, "a"),
	))
	// Followed live from the start, the stream ends after RunFinished.
	live := watchAll(t, r.client, id, 0)
	all := watchAll(t, r.client, id, 1)
	if len(live) != len(all) {
		t.Fatalf("live watch saw %d events, replay %d", len(live), len(all))
	}
	// Resumed from the middle: exactly the suffix.
	mid := uint64(len(all)/2 + 1)
	resumed := watchAll(t, r.client, id, mid)
	if len(resumed) != len(all)-int(mid)+1 || resumed[0].GetSequence() != mid {
		t.Fatalf("resumed from %d: got %d events starting at %d", mid, len(resumed), resumed[0].GetSequence())
	}
	for i, ev := range resumed {
		if want := all[int(mid)-1+i]; ev.GetSequence() != want.GetSequence() || string(ev.GetHash()) != string(want.GetHash()) {
			t.Fatalf("resumed event %d differs from the replay", ev.GetSequence())
		}
	}
	// The hash chain links every event to the previous one.
	for i := 1; i < len(all); i++ {
		if string(all[i].GetPrevHash()) != string(all[i-1].GetHash()) || len(all[i].GetHash()) != 32 {
			t.Fatalf("event %d does not chain to event %d", all[i].GetSequence(), all[i-1].GetSequence())
		}
	}
	// Past the end: nothing but the end of the stream.
	stream, err := r.client.WatchRun(testCtx(t, 5*time.Second), &planexv1.WatchRunRequest{RunId: id, FromSequence: uint64(len(all) + 5)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("watch past the end: %v, want EOF", err)
	}
	unknown, err := r.client.WatchRun(testCtx(t, 5*time.Second), &planexv1.WatchRunRequest{RunId: "01NOPE"})
	if err == nil {
		_, err = unknown.Recv()
	}
	if status.Code(err) != codes.NotFound {
		t.Fatalf("watch of an unknown run: %v, want NotFound", err)
	}
}

func TestCancelRun(t *testing.T) {
	plan := []*planexv1.Step{
		step("slow", "test.sleep", map[string]any{"ms": 1500}),
		step("after", "test.echo", map[string]any{"value": 1}, "slow"),
	}
	h, r := setup(t)
	id := h.runGoal(t, r, "cancel", always(plan...))
	waitRun(t, r.client, id, 10*time.Second, "running its slow step", func(run *planexv1.Run) bool {
		for _, s := range run.GetSteps() {
			if s.GetStepId() == "slow" && s.GetStatus() == planexv1.StepStatus_STEP_STATUS_RUNNING {
				return true
			}
		}
		return false
	})
	resp, err := r.client.CancelRun(testCtx(t, 10*time.Second), &planexv1.CancelRunRequest{RunId: id, Reason: "changed my mind"})
	if err != nil {
		t.Fatal(err)
	}
	run := resp.GetRun()
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_CANCELLED || run.GetStopReason() != planexv1.StopReason_STOP_REASON_CANCELLED ||
		!strings.Contains(run.GetStopMessage(), "changed my mind") {
		t.Fatalf("after CancelRun: %s %s %q", run.GetStatus(), run.GetStopReason(), run.GetStopMessage())
	}
	// The in-flight step's result arrives later and is ignored.
	waitFor(t, 5*time.Second, "the slow step to report", func() bool { return h.pool.reported(id, "slow", 1) })
	h.waitEngineIdle()
	evs := watchAll(t, r.client, id, 1)
	if count(evs, "step_succeeded:slow") != 0 || count(evs, "step_dispatched:after") != 0 || count(evs, "finished") != 1 {
		t.Fatalf("events after cancel: %v", payloads(evs))
	}
	// Cancelling a finished run returns it unchanged.
	again, err := r.client.CancelRun(testCtx(t, 5*time.Second), &planexv1.CancelRunRequest{RunId: id})
	if err != nil || again.GetRun().GetLastSequence() != run.GetLastSequence() {
		t.Fatalf("second cancel: %v, sequence %d", err, again.GetRun().GetLastSequence())
	}
	if _, err := r.client.CancelRun(testCtx(t, 5*time.Second), &planexv1.CancelRunRequest{RunId: "01NOPE"}); status.Code(err) != codes.NotFound {
		t.Fatalf("cancel of an unknown run: %v", err)
	}
}

func TestListRuns(t *testing.T) {
	h, r := setup(t)
	h.planner.on("list ok", always(step("a", "test.echo", map[string]any{"value": 1})))
	h.planner.on("list fail", func(int, *planexv1.PlanRequest) (*planexv1.PlanResponse, error) { return nil, plannerErr("nope") })
	var ok, failed []string
	for i := range 7 {
		goal, team := "list ok", "blue"
		if i%3 == 0 {
			goal, team = "list fail", "red"
		}
		id := start(t, r.client, &planexv1.StartRunRequest{Goal: goal, Labels: map[string]string{"team": team, "env": "test"}})
		waitTerminal(t, r.client, id, 10*time.Second)
		if goal == "list ok" {
			ok = append(ok, id)
		} else {
			failed = append(failed, id)
		}
	}
	slices.Reverse(ok)
	slices.Reverse(failed)
	var got []string
	token := ""
	pages := 0
	for {
		resp, err := r.client.ListRuns(testCtx(t, 5*time.Second), &planexv1.ListRunsRequest{
			Statuses: []planexv1.RunStatus{planexv1.RunStatus_RUN_STATUS_SUCCEEDED}, Labels: map[string]string{"env": "test"},
			PageSize: 2, PageToken: token,
		})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, run := range resp.GetRuns() {
			got = append(got, run.GetId())
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	if !slices.Equal(got, ok) || pages != 2 {
		t.Fatalf("succeeded runs, newest first, in %d pages: %v, want %v", pages, got, ok)
	}
	resp, err := r.client.ListRuns(testCtx(t, 5*time.Second), &planexv1.ListRunsRequest{Labels: map[string]string{"team": "red"}})
	if err != nil {
		t.Fatal(err)
	}
	var red []string
	for _, run := range resp.GetRuns() {
		red = append(red, run.GetId())
		if run.GetStopReason() != planexv1.StopReason_STOP_REASON_PLANNER_ERROR {
			t.Fatalf("red run %s: %s", run.GetId(), run.GetStopReason())
		}
	}
	if !slices.Equal(red, failed) || resp.GetNextPageToken() != "" {
		t.Fatalf("red runs %v, want %v", red, failed)
	}
	for _, bad := range []*planexv1.ListRunsRequest{{PageToken: "garbage!"}, {PageSize: -1}, {Statuses: []planexv1.RunStatus{42}}} {
		if _, err := r.client.ListRuns(testCtx(t, 5*time.Second), bad); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("ListRuns(%v): %v, want InvalidArgument", bad, err)
		}
	}
}

func TestListTools(t *testing.T) {
	h, r := setup(t)
	if _, err := h.res.Tools.Put(testCtx(t, 5*time.Second), "test.echo.fake-2", mustMarshal(toolSpecs()[0])); err != nil {
		t.Fatal(err)
	}
	resp, err := r.client.ListTools(testCtx(t, 5*time.Second), &planexv1.ListToolsRequest{Pool: "test"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range resp.GetTools() {
		names = append(names, tool.GetSpec().GetName())
		want := []string{"fake-1"}
		if tool.GetSpec().GetName() == "test.echo" {
			want = []string{"fake-1", "fake-2"}
		}
		if !slices.Equal(tool.GetReplicas(), want) {
			t.Fatalf("%s replicas %v, want %v", tool.GetSpec().GetName(), tool.GetReplicas(), want)
		}
	}
	if !slices.IsSorted(names) || len(names) != len(toolSpecs()) {
		t.Fatalf("tools %v", names)
	}
	other, err := r.client.ListTools(testCtx(t, 5*time.Second), &planexv1.ListToolsRequest{Pool: "sql"})
	if err != nil || len(other.GetTools()) != 0 {
		t.Fatalf("pool sql: %v %v", other, err)
	}
}

func TestGates(t *testing.T) {
	h, r := setup(t)
	planned := func() *planexv1.PlanResponse {
		return planOf(
			step("draft", "test.echo", map[string]any{"value": "planned"}),
			step("send", "test.approve", map[string]any{"value": "${{ steps.draft.output.value }}"}, "draft"),
		)
	}
	tests := []struct {
		name     string
		decision planexv1.DecisionKind
		edited   *structpb.Struct
		stop     bool
		status   planexv1.RunStatus
		value    string // echoed by the gated step
	}{
		{name: "approve", decision: planexv1.DecisionKind_DECISION_KIND_APPROVE, status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED, value: "planned"},
		{name: "edit", decision: planexv1.DecisionKind_DECISION_KIND_EDIT, edited: mustStruct(map[string]any{"value": "edited"}), status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED, value: "edited"},
		// A rejection goes back to the planner, whose second plan leaves
		// the gated step out.
		{name: "reject replans", decision: planexv1.DecisionKind_DECISION_KIND_REJECT, status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED},
		{name: "reject and stop", decision: planexv1.DecisionKind_DECISION_KIND_REJECT, stop: true, status: planexv1.RunStatus_RUN_STATUS_FAILED},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			goal := "gate " + tt.name
			id := h.runGoal(t, r, goal, sequence(planned(), withAnswer(planOf(step("note", "test.echo", map[string]any{"value": "left unsent"})), "steps.note.output.value")))
			run := waitRun(t, r.client, id, 10*time.Second, "waiting", func(run *planexv1.Run) bool {
				return run.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING
			})
			if len(run.GetGates()) != 1 || run.GetGates()[0].GetStepId() != "send" || !run.GetGates()[0].GetReplanOnReject() {
				t.Fatalf("gates %v", run.GetGates())
			}
			gate := run.GetGates()[0].GetId()
			if _, ok := h.pool.executions(id)["send/1"]; ok {
				t.Fatal("the gated step ran before a decision")
			}
			if _, err := r.client.Decide(testCtx(t, 5*time.Second), &planexv1.DecideRequest{RunId: id, GateId: gate, Decision: planexv1.DecisionKind_DECISION_KIND_EDIT,
				EditedArgs: mustStruct(map[string]any{"value": 1, "extra": true})}); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("edit with args outside the schema: %v, want InvalidArgument", err)
			}
			if _, err := r.client.Decide(testCtx(t, 5*time.Second), &planexv1.DecideRequest{RunId: id, GateId: gate, Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE, StopRun: true}); status.Code(err) != codes.InvalidArgument ||
				!strings.Contains(status.Convert(err).Message(), "stop_run") {
				t.Fatalf("approve with stop_run: %v, want InvalidArgument naming stop_run", err)
			}
			resp, err := r.client.Decide(testCtx(t, 5*time.Second), &planexv1.DecideRequest{RunId: id, GateId: gate, Decision: tt.decision, EditedArgs: tt.edited, Actor: "alice", Comment: "ok", StopRun: tt.stop})
			if err != nil {
				t.Fatal(err)
			}
			if g := resp.GetRun().GetGates()[0]; g.GetDecision() != tt.decision || g.GetActor() != "alice" || g.GetStopRun() != tt.stop {
				t.Fatalf("gate after Decide: %v", g)
			}
			run = waitTerminal(t, r.client, id, 10*time.Second)
			if run.GetStatus() != tt.status {
				t.Fatalf("status %s %q, want %s", run.GetStatus(), run.GetStopMessage(), tt.status)
			}
			reqs := h.planner.requests(id)
			switch {
			case tt.value != "":
				if got := h.pool.argsOf(id, "send", 1).GetFields()["value"].GetStringValue(); got != tt.value {
					t.Fatalf("gated step ran with value %q, want %q", got, tt.value)
				}
			case tt.stop:
				if run.GetStopReason() != planexv1.StopReason_STOP_REASON_REJECTED || h.pool.argsOf(id, "send", 1) != nil || len(reqs) != 1 ||
					!strings.Contains(run.GetStopMessage(), "rejected by alice: ok; the run was stopped at the decider's request") {
					t.Fatalf("rejected run: %s %q, send args %v, %d planner calls", run.GetStopReason(), run.GetStopMessage(), h.pool.argsOf(id, "send", 1), len(reqs))
				}
			default:
				if h.pool.argsOf(id, "send", 1) != nil || run.GetResult().GetStringValue() != "left unsent" || len(run.GetPlans()) != 2 || len(reqs) != 2 {
					t.Fatalf("replanned run: send args %v, result %v, %d revisions, %d planner calls", h.pool.argsOf(id, "send", 1), run.GetResult(), len(run.GetPlans()), len(reqs))
				}
				var seen bool
				for _, o := range reqs[1].GetHistory().GetSteps() {
					seen = seen || (o.GetStepId() == "send" && o.GetStatus() == planexv1.StepStatus_STEP_STATUS_FAILED &&
						o.GetError().GetCode() == planexv1.ErrorCode_ERROR_CODE_REJECTED && strings.Contains(o.GetError().GetMessage(), "rejected by alice: ok"))
				}
				if !seen || !strings.Contains(reqs[1].GetHistory().GetReplanReason(), "rejected by alice: ok") {
					t.Fatalf("the planner's second request does not carry the rejection: %v", reqs[1].GetHistory())
				}
			}
			if _, err := r.client.Decide(testCtx(t, 5*time.Second), &planexv1.DecideRequest{RunId: id, GateId: gate, Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE}); status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("second decision: %v, want FailedPrecondition", err)
			}
		})
	}
}

func TestLargeOutputsAreStoredByReference(t *testing.T) {
	h, r := setup(t, func(c *engine.Config) { c.InlineOutputBytes = 4096 })
	id := h.runGoal(t, r, "big", sequence(withAnswer(planOf(
		step("big", "test.big", map[string]any{"bytes": 100_000}),
		step("size", "test.echo", map[string]any{"value": "${{ size(steps.big.output.data) }}"}, "big"),
	), "steps.size.output.value")))
	run := waitTerminal(t, r.client, id, 10*time.Second)
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED || run.GetResult().GetNumberValue() != 100_000 {
		t.Fatalf("status %s result %v (%q)", run.GetStatus(), run.GetResult(), run.GetStopMessage())
	}
	for _, s := range run.GetSteps() {
		if s.GetStepId() != "big" {
			continue
		}
		if s.GetOutput() != nil || s.GetOutputRef().GetSize() < 100_000 || s.GetOutputRef().GetBucket() != "planex-outputs" {
			t.Fatalf("big output kept inline or without a reference: ref %v", s.GetOutputRef())
		}
		data, err := h.res.Outputs.GetBytes(testCtx(t, 5*time.Second), s.GetOutputRef().GetName())
		if err != nil || int64(len(data)) != s.GetOutputRef().GetSize() {
			t.Fatalf("stored output: %d bytes, %v", len(data), err)
		}
	}
	for _, ev := range watchAll(t, r.client, id, 1) {
		if n := len(mustMarshal(ev)); n > 8<<10 {
			t.Fatalf("event %d (%s) is %d bytes", ev.GetSequence(), payloadName(ev), n)
		}
	}
}

func TestNextStepMode(t *testing.T) {
	h, r := setup(t)
	h.planner.on("next", func(n int, req *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
		switch n {
		case 0:
			return planOf(step("one", "test.echo", map[string]any{"value": 1})), nil
		case 1:
			// Only the next step; the engine carries "one" over.
			return planOf(step("two", "test.echo", map[string]any{"value": "${{ steps.one.output.value + 1.0 }}"}, "one")), nil
		default:
			last := req.GetHistory().GetSteps()[len(req.GetHistory().GetSteps())-1]
			return &planexv1.PlanResponse{Stop: true, FinalAnswer: last.GetOutput(), StopMessage: "done"}, nil
		}
	})
	id := start(t, r.client, &planexv1.StartRunRequest{Goal: "next", Mode: planexv1.PlanningMode_PLANNING_MODE_NEXT_STEP})
	run := succeeded(t, r, id)
	if got := run.GetResult().GetStructValue().GetFields()["value"].GetNumberValue(); got != 2 {
		t.Fatalf("result %v, want {value: 2}", run.GetResult())
	}
	reqs := h.planner.requests(id)
	if len(reqs) != 3 || len(run.GetPlans()) != 2 || run.GetUsage().GetReplans() != 0 {
		t.Fatalf("planner calls %d, plans %d, replans %d", len(reqs), len(run.GetPlans()), run.GetUsage().GetReplans())
	}
	if reqs[1].GetMode() != planexv1.PlanningMode_PLANNING_MODE_NEXT_STEP || len(reqs[1].GetHistory().GetSteps()) != 1 || reqs[2].GetRevision() != 3 {
		t.Fatalf("second call history %v, third revision %d", reqs[1].GetHistory().GetSteps(), reqs[2].GetRevision())
	}
	if lin := run.GetPlans()[1].GetLineage(); !slices.Equal(lin.GetKept(), []string{"one"}) || !slices.Equal(lin.GetAdded(), []string{"two"}) {
		t.Fatalf("lineage %v", lin)
	}
}

func TestAutoApproveWaivesToolDefaultGateOnly(t *testing.T) {
	h, r := setup(t, func(c *engine.Config) { c.AutoApprove = []string{"test.approve"} })
	id := h.runGoal(t, r, "auto approve", always(
		step("send", "test.approve", map[string]any{"value": "x"}),
	))
	run := waitTerminal(t, r.client, id, 10*time.Second)
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED || len(run.GetGates()) != 0 {
		t.Fatalf("auto-approved tool: status %s, gates %v", run.GetStatus(), run.GetGates())
	}

	// A step that asks for approval itself still waits.
	gated := step("send", "test.approve", map[string]any{"value": "y"})
	gated.RequiresApproval = true
	id = h.runGoal(t, r, "explicit approval", always(gated))
	run = waitRun(t, r.client, id, 10*time.Second, "waiting", func(run *planexv1.Run) bool {
		return run.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING
	})
	if len(run.GetGates()) != 1 {
		t.Fatalf("explicit approval: gates %v", run.GetGates())
	}
}

func TestSensitiveFieldsAreHiddenFromClients(t *testing.T) {
	h, r := setup(t)
	id := h.runGoal(t, r, "secret", always(
		step("s", "test.secret", map[string]any{"value": "alice@example.com"}),
		step("e", "test.echo", map[string]any{"value": "visible"}, "s"),
	))
	run := waitTerminal(t, r.client, id, 10*time.Second)
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("run %s %s", run.GetStatus(), run.GetStopMessage())
	}
	// The executor got the real value.
	if got := h.pool.argsOf(id, "s", 1).GetFields()["value"].GetStringValue(); got != "alice@example.com" {
		t.Fatalf("executor saw %q", got)
	}
	for _, st := range run.GetSteps() {
		switch st.GetStepId() {
		case "s":
			if v := st.GetResolvedArgs().GetFields()["value"].GetStringValue(); v != "[REDACTED]" {
				t.Errorf("GetRun resolved_args.value = %q", v)
			}
			if v := st.GetOutput().GetStructValue().GetFields()["value"].GetStringValue(); v != "[REDACTED]" {
				t.Errorf("GetRun output.value = %q", v)
			}
		case "e":
			if v := st.GetResolvedArgs().GetFields()["value"].GetStringValue(); v != "visible" {
				t.Errorf("non-sensitive tool's args changed: %q", v)
			}
		}
	}
	if v := run.GetPlans()[0].GetSteps()[0].GetArgs().GetFields()["value"].GetStringValue(); v != "[REDACTED]" {
		t.Errorf("plan args.value = %q", v)
	}
	for _, ev := range watchAll(t, r.client, id, 1) {
		b, err := protojson.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "alice@example.com") {
			t.Fatalf("WatchRun event %d leaks the sensitive value: %s", ev.GetSequence(), b)
		}
	}
}
