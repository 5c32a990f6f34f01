package supervisor_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// fakeKey is an OpenAI-shaped key, assembled so no scanner flags the file.
var fakeKey = "sk-" + strings.Repeat("Zq9x", 6)

// TestStartRunRefusesSecretsEverywhere covers issue 11's leaks: inputs
// with NaN or ±Inf next to a key (protojson cannot render them, so the
// check used to be skipped), labels and idempotency keys, and the new
// patterns; none is stored and no message echoes the secret.
func TestStartRunRefusesSecretsEverywhere(t *testing.T) {
	_, r := setup(t)
	withNum := func(n float64, key string, v *structpb.Value) *structpb.Struct {
		return &structpb.Struct{Fields: map[string]*structpb.Value{"x": structpb.NewNumberValue(n), key: v}}
	}
	aws := "AKIA" + "IOSFODNN7EXAMPLE"
	tests := []struct {
		name string
		req  *planexv1.StartRunRequest
		want string
	}{
		{name: "NaN and a key", req: &planexv1.StartRunRequest{Goal: "g", Inputs: withNum(math.NaN(), "key", structpb.NewStringValue(fakeKey))}, want: "inputs: contains what looks like a secret (openai_key)"},
		{name: "+Inf and a key", req: &planexv1.StartRunRequest{Goal: "g", Inputs: withNum(math.Inf(1), "key", structpb.NewStringValue(fakeKey))}, want: "inputs: contains what looks like a secret"},
		{name: "-Inf and a bearer", req: &planexv1.StartRunRequest{Goal: "g", Inputs: withNum(math.Inf(-1), "auth", structpb.NewStringValue("Bearer Zq9xZq9x1234abcd"))}, want: "(bearer)"},
		{name: "password next to its key", req: &planexv1.StartRunRequest{Goal: "g", Inputs: withNum(1, "password", structpb.NewStringValue("hunter22"))}, want: "(credential)"},
		{name: "card as a number", req: &planexv1.StartRunRequest{Goal: "g", Inputs: withNum(1, "pan", structpb.NewNumberValue(4111111111111111))}, want: "(card)"},
		{name: "aws key in goal", req: &planexv1.StartRunRequest{Goal: "list buckets with " + aws}, want: "goal: contains what looks like a secret (aws_access_key)"},
		{name: "github token in goal", req: &planexv1.StartRunRequest{Goal: "clone with ghp_" + strings.Repeat("a1B2", 9)}, want: "(github_token)"},
		{name: "card with dots", req: &planexv1.StartRunRequest{Goal: "refund 4111.1111.1111.1111"}, want: "(card)"},
		{name: "secret in a label", req: &planexv1.StartRunRequest{Goal: "g", Labels: map[string]string{"team": fakeKey}}, want: `labels["team"]: contains what looks like a secret`},
		{name: "secret in the idempotency key", req: &planexv1.StartRunRequest{Goal: "g", IdempotencyKey: fakeKey}, want: "idempotency_key: contains what looks like a secret"},
		{name: "whitespace goal", req: &planexv1.StartRunRequest{Goal: " \t\n "}, want: "goal: required"},
		{name: "long run id is not echoed in full", req: &planexv1.StartRunRequest{Goal: "g", PlannerBackend: strings.Repeat("B", 10000)}, want: `planner_backend "BBBB`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := r.client.StartRun(testCtx(t, 5*time.Second), tt.req)
			msg := status.Convert(err).Message()
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(msg, tt.want) {
				t.Fatalf("err = %v, want InvalidArgument mentioning %q", err, tt.want)
			}
			for _, leak := range []string{fakeKey, aws, "hunter22", "4111", "Zq9xZq9x1234abcd"} {
				if strings.Contains(msg, leak) {
					t.Fatalf("error echoes the secret: %q", msg)
				}
			}
			if len(msg) > 400 {
				t.Fatalf("error message of %d bytes echoes the input uncapped", len(msg))
			}
		})
	}
	list, err := r.client.ListRuns(testCtx(t, 5*time.Second), &planexv1.ListRunsRequest{})
	if err != nil || len(list.GetRuns()) != 0 {
		t.Fatalf("a refused StartRun left a run behind: %v %v", list, err)
	}
}

// TestLegitimateGoalsAreAccepted: issue 11's false positives start runs.
func TestLegitimateGoalsAreAccepted(t *testing.T) {
	h, r := setup(t)
	for _, goal := range []string{
		"Find the runbook on bearer authentication for the API gateway",
		"Compare revenue for 2022 2023 2024 2025",
		"Look up order 1234567890123456",
		"Why did the login fail with token: expired",
	} {
		h.planner.on(goal, always(step("a", "test.echo", map[string]any{"value": 1})))
		id := start(t, r.client, &planexv1.StartRunRequest{Goal: goal, Labels: map[string]string{"kind": "token rotation"}, IdempotencyKey: "retry " + goal})
		if run := succeeded(t, r, id); run.GetGoal() != goal {
			t.Fatalf("stored goal %q, want %q", run.GetGoal(), goal)
		}
	}
}

func TestOtherRequestsRefuseSecretsAndCapEchoes(t *testing.T) {
	h, r := setup(t)
	id := h.runGoal(t, r, "gate secret", always(step("send", "test.approve", map[string]any{"value": "x"})))
	waitRun(t, r.client, id, 10*time.Second, "waiting", func(run *planexv1.Run) bool {
		return run.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING
	})
	gate := "" // read it back below
	run, err := r.client.GetRun(testCtx(t, 5*time.Second), &planexv1.GetRunRequest{RunId: id})
	if err != nil {
		t.Fatal(err)
	}
	gate = run.GetRun().GetGates()[0].GetId()
	checks := []struct {
		name string
		call func() error
		code codes.Code
		want string
	}{
		{name: "decide comment", code: codes.InvalidArgument, want: "comment: contains what looks like a secret", call: func() error {
			_, err := r.client.Decide(testCtx(t, 5*time.Second), &planexv1.DecideRequest{RunId: id, GateId: gate, Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE, Comment: "use " + fakeKey})
			return err
		}},
		{name: "decide edited args", code: codes.InvalidArgument, want: "edited_args: contains what looks like a secret", call: func() error {
			_, err := r.client.Decide(testCtx(t, 5*time.Second), &planexv1.DecideRequest{RunId: id, GateId: gate, Decision: planexv1.DecisionKind_DECISION_KIND_EDIT,
				EditedArgs: mustStruct(map[string]any{"value": fakeKey})})
			return err
		}},
		{name: "cancel reason", code: codes.InvalidArgument, want: "reason: contains what looks like a secret", call: func() error {
			_, err := r.client.CancelRun(testCtx(t, 5*time.Second), &planexv1.CancelRunRequest{RunId: id, Reason: "leaked " + fakeKey})
			return err
		}},
		{name: "long gate id", code: codes.NotFound, want: "…", call: func() error {
			_, err := r.client.Decide(testCtx(t, 5*time.Second), &planexv1.DecideRequest{RunId: id, GateId: strings.Repeat("g", 10000), Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE})
			return err
		}},
		{name: "long run id", code: codes.InvalidArgument, want: "…", call: func() error {
			_, err := r.client.GetRun(testCtx(t, 5*time.Second), &planexv1.GetRunRequest{RunId: strings.Repeat("9", 10000) + "."})
			return err
		}},
		{name: "long page token", code: codes.InvalidArgument, want: "…", call: func() error {
			_, err := r.client.ListRuns(testCtx(t, 5*time.Second), &planexv1.ListRunsRequest{PageToken: strings.Repeat("t", 10000)})
			return err
		}},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			msg := status.Convert(err).Message()
			if status.Code(err) != c.code || !strings.Contains(msg, c.want) {
				t.Fatalf("err = %v, want %s mentioning %q", err, c.code, c.want)
			}
			if strings.Contains(msg, fakeKey) || len(msg) > 400 {
				t.Fatalf("message echoes the input: %q", msg)
			}
		})
	}
	// None of the refused calls changed the run.
	after, err := r.client.GetRun(testCtx(t, 5*time.Second), &planexv1.GetRunRequest{RunId: id})
	if err != nil || after.GetRun().GetStatus() != planexv1.RunStatus_RUN_STATUS_WAITING || after.GetRun().GetLastSequence() != run.GetRun().GetLastSequence() {
		t.Fatalf("refused calls changed the run: %v %v", after, err)
	}
}

func TestIdempotencyKeyReusedWithOtherParameters(t *testing.T) {
	h, r := setup(t)
	h.planner.on("idem a", always(step("a", "test.echo", map[string]any{"value": 1})))
	first := start(t, r.client, &planexv1.StartRunRequest{Goal: "idem a", IdempotencyKey: "k-1"})
	for _, req := range []*planexv1.StartRunRequest{
		{Goal: "idem b", IdempotencyKey: "k-1"},
		{Goal: "idem a", IdempotencyKey: "k-1", Labels: map[string]string{"team": "x"}},
		{Goal: "idem a", IdempotencyKey: "k-1", Inputs: mustStruct(map[string]any{"n": 1})},
	} {
		_, err := r.client.StartRun(testCtx(t, 5*time.Second), req)
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), `idempotency_key "k-1"`) {
			t.Fatalf("reuse with other parameters: %v, want FailedPrecondition naming the key", err)
		}
	}
	again, err := r.client.StartRun(testCtx(t, 5*time.Second), &planexv1.StartRunRequest{Goal: "idem a", IdempotencyKey: "k-1"})
	if err != nil || !again.GetExisting() || again.GetRun().GetId() != first {
		t.Fatalf("same parameters: %v %v, want the first run", again, err)
	}
}

// TestSensitiveFieldsAreHiddenInResults: a sensitive output that becomes
// the run's result is masked in GetRun, ListRuns and WatchRun.
func TestSensitiveFieldsAreHiddenInResults(t *testing.T) {
	h, r := setup(t)
	id := h.runGoal(t, r, "secret result", always(step("draft", "test.secret", map[string]any{"value": "alice@example.com"})))
	run := succeeded(t, r, id)
	if run.GetResult() == nil {
		t.Fatal("no result")
	}
	check := func(where string, b []byte, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "alice@example.com") {
			t.Fatalf("%s leaks the sensitive value: %s", where, b)
		}
	}
	b, err := protojson.Marshal(run.GetResult())
	check("GetRun result", b, err)
	if !strings.Contains(string(b), "[REDACTED]") {
		t.Fatalf("GetRun result %s, want the field masked", b)
	}
	list, err := r.client.ListRuns(testCtx(t, 5*time.Second), &planexv1.ListRunsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	b, err = protojson.Marshal(list)
	check("ListRuns", b, err)
	for _, ev := range watchAll(t, r.client, id, 1) {
		b, err := protojson.Marshal(ev)
		check("WatchRun", b, err)
	}
}
