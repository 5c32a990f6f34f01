package api

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

func TestParseSelector(t *testing.T) {
	labels := map[string]string{"env": "prod", "team": "billing", "tier": ""}
	get := func(k string) (string, bool) { v, ok := labels[k]; return v, ok }
	cases := []struct {
		in    string
		match bool
		err   string // "" : parses
	}{
		{"", true, ""},
		{"   ", true, ""},
		{"env=prod", true, ""},
		{"env==prod", true, ""},
		{" env = prod ", true, ""},
		{"env=dev", false, ""},
		{"env!=dev", true, ""},
		{"env!=prod", false, ""},
		{"missing!=x", true, ""},
		{"env in (dev,prod)", true, ""},
		{"env in ( dev , prod )", true, ""},
		{"env in (dev)", false, ""},
		{"missing in (a)", false, ""},
		{"env notin (dev,qa)", true, ""},
		{"env notin (prod)", false, ""},
		{"missing notin (a)", true, ""},
		{"env", true, ""},
		{"missing", false, ""},
		{"!missing", true, ""},
		{"! env", false, ""},
		{"tier=", true, ""},
		{"tier!=", false, ""},
		{"env=prod,team=billing", true, ""},
		{"env=prod, team in (ops), !missing", false, ""},
		{"app.kubernetes.io/name", false, ""},
		{"env=prod,", false, "at position 10: want a label key, found the end"},
		{",env", false, "at position 1: want a label key, found ','"},
		{"env in prod", false, "at position 8: want '(' to open the values, found 'p'"},
		{"env in (a,", false, "at position 11: want a value, found the end"},
		{"env in ()", false, "at position 9: want a value, found ')'"},
		{"env in (a b)", false, "at position 11: want ',' or ')' in the values, found 'b'"},
		{"env=prod team=x", false, "at position 10: want ',' between requirements, found 't'"},
		{"env ~ prod", false, "at position 5: after key \"env\": want '=', '==', '!=', 'in' or 'notin', found \"~\""},
		{"env (", false, "at position 5: after key \"env\": want '=', '==', '!=', 'in', 'notin', ',' or the end, found '('"},
		{"env is prod", false, "at position 5: after key \"env\": want '=', '==', '!=', 'in' or 'notin', found \"is\""},
		{"Env=prod", false, "at position 1: label key \"Env\": want 1 to 63 of [a-z0-9_./-]"},
		{"env=prod,BAD=x", false, "at position 10: label key \"BAD\""},
		{"!=x", false, "at position 1: want a label key before '!='"},
		{"=x", false, "at position 1: want a label key, found '='"},
		{"é=1", false, "at position 1: label key \"é\""},
		{strings.Repeat("a", maxSelectorBytes+1), false, "1025 bytes, at most 1024"},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			sel, err := parseSelector(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("parseSelector(%q) = %v, want error containing %q", tc.in, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseSelector(%q): %v", tc.in, err)
			}
			if got := sel.matches(get); got != tc.match {
				t.Fatalf("%q matches %v: %v, want %v", tc.in, labels, got, tc.match)
			}
		})
	}
}

// TestCompileFilter: every field is validated with an error naming it, and
// a valid filter selects what its doc comment says.
func TestCompileFilter(t *testing.T) {
	bad := []struct {
		f    *planexv1.RunFilter
		want string
	}{
		{&planexv1.RunFilter{Statuses: []planexv1.RunStatus{99}}, "filter.statuses[0]: 99 is not a run status"},
		{&planexv1.RunFilter{Labels: map[string]string{"Bad": "x"}}, `filter.labels: key "Bad"`},
		{&planexv1.RunFilter{LabelSelector: "env=prod,,x"}, "filter.label_selector: at position 10: want a label key, found ','"},
		{&planexv1.RunFilter{GoalContains: strings.Repeat("x", 257)}, "filter.goal_contains: 257 bytes, at most 256"},
		{&planexv1.RunFilter{Tools: []string{"ok.tool", "bad tool"}}, `filter.tools[1] "bad tool"`},
		{&planexv1.RunFilter{StartedBy: strings.Repeat("x", 300)}, "filter.started_by"},
		{&planexv1.RunFilter{CreatedAfter: timestamppb.New(time.Unix(10, 0)), CreatedBefore: timestamppb.New(time.Unix(5, 0))}, "filter.created_after 1970-01-01T00:00:10Z: must be before created_before"},
		{&planexv1.RunFilter{StopReasons: []planexv1.StopReason{planexv1.StopReason_STOP_REASON_UNSPECIFIED}}, "filter.stop_reasons[0]: 0 is not a stop reason"},
		{&planexv1.RunFilter{RunIds: []string{"a.b"}}, `filter.run_ids[0]: run_id "a.b": not a run id`},
		{&planexv1.RunFilter{RunIds: make([]string, 1001)}, "filter.run_ids: 1001 ids, at most 1000"},
		{&planexv1.RunFilter{ForkedFrom: "x y"}, "filter.forked_from"},
	}
	for _, tc := range bad {
		if _, err := compileFilter(tc.f, "filter."); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("compileFilter(%v) = %v, want an error containing %q", tc.f, err, tc.want)
		}
	}

	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	run := &planexv1.Run{
		Id: "01RUN", Goal: "Refund the Acme ORDER", Status: planexv1.RunStatus_RUN_STATUS_WAITING,
		Labels: map[string]string{"env": "prod", "team": "billing"}, StartedBy: "apikey:ci",
		CreatedAt: timestamppb.New(created), ForkedFrom: &planexv1.ForkOrigin{RunId: "01ORIG"},
		Plans: []*planexv1.Plan{{Revision: 1, Steps: []*planexv1.Step{{Id: "a", Tool: "sql.query"}, {Id: "b", Tool: "email.send"}}}},
		Steps: []*planexv1.StepState{{StepId: "a", Status: planexv1.StepStatus_STEP_STATUS_PENDING}},
		Gates: []*planexv1.Gate{{Id: "g1", Kind: planexv1.GateKind_GATE_KIND_PLAN, PlanRevision: 1}},
	}
	match := []struct {
		f    *planexv1.RunFilter
		want bool
	}{
		{&planexv1.RunFilter{}, true},
		{&planexv1.RunFilter{Statuses: []planexv1.RunStatus{planexv1.RunStatus_RUN_STATUS_WAITING}}, true},
		{&planexv1.RunFilter{Statuses: []planexv1.RunStatus{planexv1.RunStatus_RUN_STATUS_RUNNING}}, false},
		{&planexv1.RunFilter{Labels: map[string]string{"env": "prod"}}, true},
		{&planexv1.RunFilter{Labels: map[string]string{"env": "dev"}}, false},
		{&planexv1.RunFilter{LabelSelector: "env in (prod), team!=ops, !x"}, true},
		{&planexv1.RunFilter{LabelSelector: "env notin (prod)"}, false},
		{&planexv1.RunFilter{GoalContains: "acme refund"}, true},
		{&planexv1.RunFilter{GoalContains: "acme invoice"}, false},
		{&planexv1.RunFilter{Tools: []string{"http.get", "email.send"}}, true},
		{&planexv1.RunFilter{Tools: []string{"http.get"}}, false},
		{&planexv1.RunFilter{StartedBy: "apikey:ci"}, true},
		{&planexv1.RunFilter{StartedBy: "apikey:other"}, false},
		{&planexv1.RunFilter{CreatedAfter: timestamppb.New(created)}, true},
		{&planexv1.RunFilter{CreatedBefore: timestamppb.New(created)}, false},
		{&planexv1.RunFilter{CreatedBefore: timestamppb.New(created.Add(time.Second))}, true},
		{&planexv1.RunFilter{StopReasons: []planexv1.StopReason{planexv1.StopReason_STOP_REASON_CANCELLED}}, false},
		{&planexv1.RunFilter{WaitingForDecision: true}, true},
		{&planexv1.RunFilter{RunIds: []string{"01X", "01RUN"}}, true},
		{&planexv1.RunFilter{RunIds: []string{"01X"}}, false},
		{&planexv1.RunFilter{ForkedFrom: "01ORIG"}, true},
		{&planexv1.RunFilter{ForkedFrom: "01OTHER"}, false},
	}
	for _, tc := range match {
		q, err := compileFilter(tc.f, "filter.")
		if err != nil {
			t.Fatalf("compileFilter(%v): %v", tc.f, err)
		}
		if got := q.MatchRun(run); got != tc.want {
			t.Errorf("filter %v on the run: %v, want %v", tc.f, got, tc.want)
		}
	}

	// The legacy statuses and labels are AND-ed with the filter.
	q, err := listQuery(&planexv1.ListRunsRequest{
		Statuses: []planexv1.RunStatus{planexv1.RunStatus_RUN_STATUS_WAITING},
		Labels:   map[string]string{"team": "ops"},
		Filter:   &planexv1.RunFilter{GoalContains: "acme"},
	})
	if err != nil || q.MatchRun(run) {
		t.Fatalf("legacy labels team=ops AND filter: err %v, match %v; want no match", err, q.MatchRun(run))
	}
	q, err = listQuery(&planexv1.ListRunsRequest{
		Statuses: []planexv1.RunStatus{planexv1.RunStatus_RUN_STATUS_WAITING},
		Filter:   &planexv1.RunFilter{Statuses: []planexv1.RunStatus{planexv1.RunStatus_RUN_STATUS_RUNNING}},
	})
	if err != nil || q.MatchRun(run) {
		t.Fatalf("statuses WAITING AND filter.statuses RUNNING: err %v, match %v; want no match", err, q.MatchRun(run))
	}
}

func TestPageTokenNamesTheFilter(t *testing.T) {
	a := &planexv1.ListRunsRequest{Filter: &planexv1.RunFilter{GoalContains: "acme"}}
	b := &planexv1.ListRunsRequest{Filter: &planexv1.RunFilter{GoalContains: "globex"}}
	tok := encodeToken("01RUN", filterHash(a))
	if id, err := parsePageToken(tok, filterHash(a), false); err != nil || id != "01RUN" {
		t.Fatalf("same filter: %q, %v", id, err)
	}
	if _, err := parsePageToken(tok, filterHash(b), false); err == nil || !strings.HasPrefix(err.Error(), "page_token: made for another filter") {
		t.Fatalf("other filter: %v", err)
	}
	legacy := encodeToken("01RUN", "")
	if _, err := parsePageToken(legacy, filterHash(a), true); err != nil {
		t.Fatalf("a token without hash, request without filter: %v", err)
	}
	if _, err := parsePageToken(legacy, filterHash(a), false); err == nil {
		t.Fatal("a token without hash taken with a filter")
	}
	if _, err := parsePageToken("!!", "", true); err == nil || !strings.Contains(err.Error(), "page_token") {
		t.Fatalf("garbage token: %v", err)
	}
}
