package playbook_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/demo"
	"github.com/planex-dev/planex/internal/plan"
	"github.com/planex-dev/planex/services/planner/internal/plannertest"
	"github.com/planex-dev/planex/services/planner/playbook"
)

// demoCatalog is the test catalog with the search pool's current tools:
// search.query with min_score, min_coverage and require_all_terms, and
// search.get.
func demoCatalog(t testing.TB) []*planexv1.ToolSpec {
	t.Helper()
	tools := plannertest.Catalog(t)
	for _, spec := range tools {
		if spec.GetName() == "search.query" {
			props := spec.GetArgsSchema().GetFields()["properties"].GetStructValue()
			props.Fields["min_score"] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"type": structpb.NewStringValue("number")}})
			props.Fields["min_coverage"] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"type": structpb.NewStringValue("number")}})
			props.Fields["require_all_terms"] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"type": structpb.NewStringValue("boolean")}})
		}
	}
	args, err := structpb.NewStruct(map[string]any{
		"type": "object", "required": []any{"id"}, "additionalProperties": false,
		"properties": map[string]any{"id": map[string]any{"type": "string", "minLength": 1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return append(tools, &planexv1.ToolSpec{Name: "search.get", Pool: "search", Description: "Get a document by id", ArgsSchema: args,
		SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ, Idempotent: true})
}

func demoSet(t testing.TB) *playbook.Set {
	t.Helper()
	set, err := playbook.Load(playbook.Source{FS: playbook.DemoFS, Name: "builtin"})
	if err != nil {
		t.Fatalf("load demo playbooks: %v", err)
	}
	return set
}

// TestDemoGoals plans every demo goal, word for word and paraphrased, and
// checks the plan is valid for the executors' catalog and bound the
// parameters from the goal.
func TestDemoGoals(t *testing.T) {
	set := demoSet(t)
	tools := demoCatalog(t)
	cases := []struct {
		goal     string
		playbook string
		// want maps "step.arg path" to a value the plan must hold.
		want map[string]any
	}{
		{"How many open support tickets does Acme Corp have?", "open-tickets", map[string]any{"count.params[0]": "Acme Corp"}},
		{"how many open tickets does Globex have", "open-tickets", map[string]any{"count.params[0]": "Globex"}},
		{"Count the open support tickets for Initech", "open-tickets", map[string]any{"count.params[0]": "Initech"}},
		{"What is the number of open tickets of  Umbrella   Corp?", "open-tickets", map[string]any{"count.params[0]": "Umbrella Corp"}},
		{"Email the account team a summary of the top 5 customers by revenue in 2025", "top-customers-email", map[string]any{
			"top.params[0]": 2025.0, "top.params[1]": 5.0, "draft.to[0]": "account-team@example.com", "draft.subject": "Top 5 customers by revenue in 2025",
		}},
		{"Email the finance team a report of the top 3 customers by revenue for 2024", "top-customers-email", map[string]any{
			"top.params[0]": 2024.0, "top.params[1]": 3.0, "draft.to[0]": "finance@example.com",
		}},
		{"Send the on-call team the top ten customers by revenue in 2025", "top-customers-email", map[string]any{
			"top.params[1]": 10.0, "draft.to[0]": "oncall@example.com",
		}},
		{"Email Someone.Else@Example.com a summary of the top 5 customers by revenue in 2025", "top-customers-email", map[string]any{
			"draft.to[0]": "Someone.Else@Example.com",
		}},
		{"Send a summary of the top 7 customers by revenue in 2025 to the account team", "top-customers-email", map[string]any{
			"top.params[1]": 7.0, "draft.to[0]": "account-team@example.com",
		}},
		{"Find the runbook for failed payment retries and send it to oncall@example.com", "send-runbook", map[string]any{
			"find.query": "failed payment retries", "draft.to[0]": "oncall@example.com",
		}},
		{"Look up the runbook about database failover and email it to the on-call team", "send-runbook", map[string]any{
			"find.query": "database failover", "draft.to[0]": "oncall@example.com",
		}},
		{"Send the runbook for overdue invoices to finance@example.com", "send-runbook", map[string]any{
			"draft.to[0]": "finance@example.com",
		}},
		{"Compare revenue and open tickets for Acme Corp and Globex", "compare-customers", map[string]any{
			"revenue_a.params[0]": "Acme Corp", "revenue_b.params[0]": "Globex", "tickets_a.params[0]": "Acme Corp", "tickets_b.params[0]": "Globex",
		}},
		{"Compare Initech and Stark Industries by open tickets and revenue", "compare-customers", map[string]any{
			"revenue_a.params[0]": "Initech", "tickets_b.params[0]": "Stark Industries",
		}},
		{"What is the average order value by region in 2025?", "order-value-by-region", map[string]any{"by_region.params[0]": 2025.0}},
		{"Show me the average order amount per customer region for 2024", "order-value-by-region", map[string]any{"by_region.params[0]": 2024.0}},
		{"what's the average order value by region", "order-value-by-region", map[string]any{"by_region.params[0]": 2025.0}},
	}
	for _, tc := range cases {
		t.Run(tc.goal, func(t *testing.T) {
			resp, err := set.Plan(context.Background(), &planexv1.PlanRequest{Goal: tc.goal, Tools: tools, Revision: 1})
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			p := resp.GetPlan()
			if err := plan.Validate(p, plan.NewCatalog(tools), plan.DefaultLimits()); err != nil {
				t.Fatalf("plan invalid for the catalog: %v", err)
			}
			if !strings.HasPrefix(p.GetRationale(), "playbook "+tc.playbook+":") {
				t.Errorf("rationale %q, want playbook %s", p.GetRationale(), tc.playbook)
			}
			if p.GetRevision() != 1 || resp.GetBackend() != "playbook" {
				t.Errorf("revision %d backend %q, want 1 and playbook", p.GetRevision(), resp.GetBackend())
			}
			for path, want := range tc.want {
				if got := argAt(t, p, path); got != want {
					t.Errorf("%s = %#v, want %#v", path, got, want)
				}
			}
		})
	}
}

// argAt reads "step.field[i].field" from a plan's args.
func argAt(t *testing.T, p *planexv1.Plan, path string) any {
	t.Helper()
	id, rest, _ := strings.Cut(path, ".")
	var st *planexv1.Step
	for _, s := range p.GetSteps() {
		if s.GetId() == id {
			st = s
		}
	}
	if st == nil {
		t.Fatalf("no step %q in plan", id)
	}
	var cur any = st.GetArgs().AsMap()
	for _, part := range strings.Split(rest, ".") {
		name, idx := part, -1
		if i := strings.IndexByte(part, '['); i >= 0 {
			name = part[:i]
			_, _ = fmt.Sscanf(part[i:], "[%d]", &idx)
		}
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[name]
		if idx >= 0 {
			l, ok := cur.([]any)
			if !ok || idx >= len(l) {
				return nil
			}
			cur = l[idx]
		}
	}
	return cur
}

// TestDemoRuns runs the demo plans through a small engine: steps in
// dependency order, arguments resolved with internal/plan, sql tools on the
// real demo SQLite database, fixed outputs for email and search, replanning
// through the planner on failure. It proves the SQL, the CEL and the
// on_failure branches work together, and that a goal the data cannot
// answer fails with a message naming what to change.
func TestDemoRuns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "demo.db")
	if err := demo.GenerateDB(context.Background(), path); err != nil {
		t.Fatalf("demo db: %v", err)
	}
	db, err := sql.Open("sqlite", "file:"+path+"")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	runDemoGoals(t, db, false)
}

// TestDemoRunsPostgres runs the same goals on PostgreSQL: the demo
// playbooks' SQL is portable.
func TestDemoRunsPostgres(t *testing.T) {
	db := demoPostgres(t)
	runDemoGoals(t, db, true)
}

func runDemoGoals(t *testing.T, db *sql.DB, postgres bool) {
	set := demoSet(t)
	tools := demoCatalog(t)
	full, next := planexv1.PlanningMode_PLANNING_MODE_FULL, planexv1.PlanningMode_PLANNING_MODE_NEXT_STEP
	cases := []struct {
		goal      string
		mode      planexv1.PlanningMode
		revisions int      // planner calls: one per revision, and the stop
		answer    []string // substrings of the final answer
		fail      string   // substring of the planner's final error, for goals that fail
	}{
		{goal: "How many open support tickets does Acme Corp have?", mode: full, revisions: 1, answer: []string{"Acme Corp has 3 open support tickets."}},
		{goal: "How many open tickets does globex have?", mode: next, revisions: 3, answer: []string{"Globex has 2 open support tickets."}},
		{goal: "How many open tickets does Nobody Inc have?", mode: full, revisions: 2, fail: "no customer is named Nobody Inc"},
		{goal: "How many open tickets does Acme Corporation have?", mode: full, revisions: 2, fail: "no customer is named Acme Corporation; closest: Acme Corp"},
		{goal: "Email the account team a summary of the top 5 customers by revenue in 2025", mode: full, revisions: 1, answer: []string{`Sent "Top 5 customers by revenue in 2025" to account-team@example.com (5 customers, message msg-draft-1).`}},
		{goal: "Email the account team a summary of the top 5 customers by revenue in 2023", mode: full, revisions: 2, fail: "no completed orders in 2023 (the demo data covers 2024–2025); nothing was sent"},
		{goal: "Find the runbook for failed payment retries and send it to oncall@example.com", mode: full, revisions: 1, answer: []string{`Sent "Runbook: Failed payment retries" (runbook-failed-payment-retries) to oncall@example.com`}},
		{goal: "Find the runbook for coffee machine cleaning and send it to oncall@example.com", mode: full, revisions: 2, fail: "no runbook about coffee machine cleaning; closest: Runbook: Security incident (runbook-security-incident). Nothing was sent."},
		{goal: "Find the runbook for quantum teleportation and send it to oncall@example.com", mode: full, revisions: 2, fail: "no runbook about quantum teleportation (no document mentions it). Nothing was sent."},
		{goal: "Find the runbook for database migration and send it to oncall@example.com", mode: full, revisions: 2, fail: "no runbook about database migration; closest: Runbook: Slow database queries (runbook-slow-database-queries), Runbook: Database failover (runbook-database-failover). Nothing was sent."},
		{goal: "Find the runbook for database and send it to oncall@example.com", mode: full, revisions: 2, fail: "several runbooks are about database: Runbook: Database failover (runbook-database-failover), Runbook: Slow database queries (runbook-slow-database-queries); name one. Nothing was sent."},
		{goal: "Compare revenue and open tickets for Acme Corp and Globex", mode: full, revisions: 1, answer: []string{"Acme Corp: revenue $", ", 3 open support tickets; Globex: revenue $", ", 2 open support tickets"}},
		{goal: "Compare revenue and open tickets for Acme Corp and Globex", mode: next, revisions: 4, answer: []string{"Acme Corp: revenue $"}},
		{goal: "Compare revenue and open tickets for Acme Corp and Globex Inc", mode: full, revisions: 2, fail: "no customer is named Globex Inc; closest: Globex"},
		{goal: "What is the average order value by region in 2025?", mode: full, revisions: 2, answer: []string{"Average order value by region in 2025: APAC $", "EMEA $", "NA $", " orders)"}},
		{goal: "What is the average order value by region in 2025?", mode: next, revisions: 4, answer: []string{"Average order value by region in 2025: APAC $"}},
		{goal: "What is the average order value by region in 2026?", mode: full, revisions: 3, fail: "no completed orders in 2026 (the demo data covers 2024–2025)"},
		{goal: "Close support ticket 400", mode: full, revisions: 1, answer: []string{`Closed support ticket 400 of Stark Industries ("Webhook deliveries failing").`}},
		{goal: "Close support ticket 1", mode: full, revisions: 2, fail: "support ticket 1 is already closed; nothing was changed"},
		{goal: "Close support ticket 9999", mode: full, revisions: 2, fail: "no support ticket has id 9999"},
	}
	for _, tc := range cases {
		t.Run(tc.mode.String()+"/"+tc.goal, func(t *testing.T) {
			e := &engine{t: t, db: db, postgres: postgres, set: set, tools: tools, goal: tc.goal, mode: tc.mode}
			answer, revs := e.run()
			if revs != tc.revisions {
				t.Errorf("finished on revision %d, want %d", revs, tc.revisions)
			}
			if tc.fail != "" {
				var sf *playbook.StepFailedError
				if !errors.As(e.err, &sf) || !errors.Is(e.err, playbook.ErrNoBranch) || !strings.Contains(sf.Message, tc.fail) {
					t.Fatalf("planner error %v, want a StepFailedError containing %q", e.err, tc.fail)
				}
				if e.drafts > 0 {
					t.Errorf("a failing goal drafted %d mails", e.drafts)
				}
				return
			}
			if e.err != nil {
				t.Fatalf("planner: %v", e.err)
			}
			s, _ := answer.(string)
			for _, want := range tc.answer {
				if !strings.Contains(s, want) {
					t.Errorf("answer %q does not contain %q", s, want)
				}
			}
			t.Logf("answer: %s", s)
		})
	}
}

// engine is a minimal, sequential stand-in for the supervisor.
type engine struct {
	t        *testing.T
	db       *sql.DB
	postgres bool
	// err is the planner's error that ended the run, if any.
	err     error
	set     *playbook.Set
	tools   []*planexv1.ToolSpec
	goal    string
	mode    planexv1.PlanningMode
	history planexv1.PlanHistory
	outputs map[string]any
	drafts  int
}

func (e *engine) plan(rev int32) *planexv1.PlanResponse {
	e.t.Helper()
	resp, err := e.set.Plan(context.Background(), &planexv1.PlanRequest{
		Goal: e.goal, Tools: e.tools, Mode: e.mode, Revision: rev, History: &e.history,
	})
	if err != nil {
		e.err = err
		return nil
	}
	if p := resp.GetPlan(); p != nil {
		if err := plan.Validate(p, plan.NewCatalog(e.tools), plan.DefaultLimits()); err != nil {
			e.t.Fatalf("revision %d invalid: %v", rev, err)
		}
		e.history.Revisions = append(e.history.Revisions, p)
		// Like the supervisor, forget the outcomes of the steps the new
		// revision dropped.
		e.history.Steps = slices.DeleteFunc(e.history.Steps, func(o *planexv1.StepOutcome) bool {
			return !slices.ContainsFunc(p.GetSteps(), func(s *planexv1.Step) bool { return s.GetId() == o.GetStepId() })
		})
	}
	return resp
}

// run drives the run to its end and returns the result and the number of
// plan revisions.
func (e *engine) run() (any, int) {
	e.outputs = map[string]any{}
	rev := int32(1)
	resp := e.plan(rev)
	for range 20 {
		if resp == nil {
			return nil, int(rev)
		}
		if resp.GetStop() {
			return resp.GetFinalAnswer().AsInterface(), int(rev)
		}
		p := resp.GetPlan()
		done := map[string]bool{}
		for id := range e.outputs {
			done[id] = true
		}
		ready := plan.Ready(p, done, nil)
		if len(ready) == 0 {
			if e.mode == planexv1.PlanningMode_PLANNING_MODE_NEXT_STEP {
				e.t.Fatalf("next-step plan revision %d has nothing to run", rev)
			}
			res, err := plan.Result(p, plan.Env{Goal: e.goal, Outputs: e.outputs})
			if err != nil {
				e.t.Fatalf("result: %v", err)
			}
			return res, int(rev)
		}
		failed := false
		for _, id := range ready {
			if !e.step(p, id) {
				failed = true
				break
			}
		}
		if failed {
			rev++
			resp = e.plan(rev)
			continue
		}
		if e.mode == planexv1.PlanningMode_PLANNING_MODE_NEXT_STEP {
			rev++
			resp = e.plan(rev) // the supervisor asks again after progress
		}
	}
	e.t.Fatal("run did not finish")
	return nil, 0
}

func (e *engine) step(p *planexv1.Plan, id string) bool {
	var st *planexv1.Step
	for _, s := range p.GetSteps() {
		if s.GetId() == id {
			st = s
		}
	}
	o := &planexv1.StepOutcome{StepId: id, Tool: st.GetTool(), Attempt: 1, PlanRevision: p.GetRevision()}
	args, err := plan.ResolveArgs(st.GetArgs(), plan.Env{Goal: e.goal, Outputs: e.outputs})
	if err != nil {
		// As the supervisor does: the step fails with INVALID_ARGUMENT.
		o.Status = planexv1.StepStatus_STEP_STATUS_FAILED
		o.Error = &planexv1.StepError{Code: planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, Message: err.Error()}
		e.history.Steps = append(e.history.Steps, o)
		return false
	}
	o.Args = args
	for _, spec := range e.tools {
		if spec.GetName() == st.GetTool() {
			if err := plan.ValidateArgs(spec, args); err != nil {
				e.t.Fatalf("args of %s: %v", id, err)
			}
		}
	}
	out, serr := e.exec(st.GetTool(), args.AsMap())
	if serr == nil {
		ok, err := plan.CheckExpect(st.GetExpect(), out, args.AsMap())
		if err != nil {
			e.t.Fatalf("expect of %s: %v", id, err)
		}
		if !ok {
			serr = &planexv1.StepError{Code: planexv1.ErrorCode_ERROR_CODE_EXPECTATION_FAILED, Message: "expectation failed: " + st.GetExpect()}
		}
	}
	if serr != nil {
		o.Status = planexv1.StepStatus_STEP_STATUS_FAILED
		o.Error = serr
		e.history.Steps = append(e.history.Steps, o)
		return false
	}
	v, err := structpb.NewValue(out)
	if err != nil {
		e.t.Fatalf("output of %s: %v", id, err)
	}
	o.Status = planexv1.StepStatus_STEP_STATUS_SUCCEEDED
	o.Output = v
	e.history.Steps = append(e.history.Steps, o)
	e.outputs[id] = v.AsInterface()
	return true
}

// scanRow reads one row as JSON would carry it: numbers as float64,
// text as string.
func scanRow(rows *sql.Rows, n int) ([]any, error) {
	row := make([]any, n)
	dest := make([]any, n)
	for i := range row {
		dest[i] = &row[i]
	}
	err := rows.Scan(dest...)
	for i, v := range row {
		if x, ok := v.(int64); ok {
			row[i] = float64(x)
		} else if b, ok := v.([]byte); ok {
			row[i] = string(b)
		}
	}
	return row, err
}

// exec runs one tool call; SQL for real, the rest with fixed outputs.
func (e *engine) exec(tool string, args map[string]any) (any, *planexv1.StepError) {
	switch tool {
	case "sql.query":
		params, _ := args["params"].([]any)
		query := args["sql"].(string)
		if e.postgres {
			query = dollarParams(query)
		}
		rows, err := e.db.Query(query, params...)
		if err != nil {
			return nil, &planexv1.StepError{Code: planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED, Message: err.Error()}
		}
		defer rows.Close()
		cols, _ := rows.Columns()
		out := []any{}
		for rows.Next() {
			row, err := scanRow(rows, len(cols))
			if err != nil {
				e.t.Fatal(err)
			}
			out = append(out, row)
		}
		if err := rows.Err(); err != nil {
			return nil, &planexv1.StepError{Code: planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED, Message: err.Error()}
		}
		columns := make([]any, len(cols))
		for i, c := range cols {
			columns[i] = map[string]any{"name": c, "type": ""}
		}
		return map[string]any{"columns": columns, "rows": out, "row_count": float64(len(out)), "truncated": false}, nil
	case "sql.exec":
		params, _ := args["params"].([]any)
		query := args["sql"].(string)
		if e.postgres {
			query = dollarParams(query)
		}
		// In a transaction rolled back at once: the database is shared by
		// the cases.
		tx, err := e.db.Begin()
		if err != nil {
			e.t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }()
		res, err := tx.Exec(query, params...)
		if err != nil {
			return nil, &planexv1.StepError{Code: planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED, Message: err.Error()}
		}
		n, _ := res.RowsAffected()
		return map[string]any{"rows_affected": float64(n)}, nil
	case "sql.schema":
		return map[string]any{"tables": []any{
			map[string]any{"name": "orders", "columns": []any{map[string]any{"name": "customer_id"}, map[string]any{"name": "amount"}}},
			map[string]any{"name": "customers", "columns": []any{map[string]any{"name": "id"}, map[string]any{"name": "region"}}},
		}}, nil
	case "search.query":
		// The search pool's answers (see searchpool's grounding tests) for
		// an on-topic query, off-topic ones whose words occur in a body or
		// share one generic word with a title, one no document mentions,
		// and one several documents are about.
		if args["require_all_terms"] != true {
			e.t.Errorf("search.query without require_all_terms: true: %v", args)
		}
		switch args["query"] {
		case "coffee machine cleaning":
			return map[string]any{"total": 1.0, "hits": []any{}, "below": []any{
				map[string]any{"id": "runbook-security-incident", "title": "Runbook: Security incident", "snippet": "...", "score": 0.004, "coverage": 0.0, "grounded": false, "missing": []any{"coffee", "machine", "cleaning"}},
			}}, nil
		case "database migration":
			return map[string]any{"total": 9.0, "hits": []any{}, "below": []any{
				map[string]any{"id": "runbook-slow-database-queries", "title": "Runbook: Slow database queries", "snippet": "...", "score": 1.9, "coverage": 0.5, "grounded": false, "missing": []any{"migration"}},
				map[string]any{"id": "runbook-database-failover", "title": "Runbook: Database failover", "snippet": "...", "score": 1.8, "coverage": 0.5, "grounded": false, "missing": []any{"migration"}},
			}}, nil
		case "database":
			return map[string]any{"total": 9.0, "below": []any{}, "hits": []any{
				map[string]any{"id": "runbook-database-failover", "title": "Runbook: Database failover", "snippet": "...", "score": 2.8, "coverage": 1.0, "grounded": true},
				map[string]any{"id": "runbook-slow-database-queries", "title": "Runbook: Slow database queries", "snippet": "...", "score": 2.7, "coverage": 1.0, "grounded": true},
			}}, nil
		case "quantum teleportation":
			return map[string]any{"total": 0.0, "hits": []any{}, "below": []any{}}, nil
		}
		return map[string]any{"total": 2.0, "hits": []any{
			map[string]any{"id": "runbook-failed-payment-retries", "title": "Runbook: Failed payment retries", "snippet": "Card payments are retried three times...", "score": 2.5, "coverage": 1.0, "grounded": true},
		}, "below": []any{
			map[string]any{"id": "runbook-duplicate-charge", "title": "Runbook: Duplicate charge", "snippet": "...", "score": 0.7, "coverage": 0.5, "grounded": false, "missing": []any{"retries"}},
		}}, nil
	case "search.get":
		return map[string]any{"id": args["id"], "title": "Runbook: Failed payment retries", "body": "## Retry schedule\n\n| Attempt | When |\n| --- | --- |\n| 1 | day 0 |\n", "tags": []any{"billing"}}, nil
	case "email.draft":
		e.drafts++
		body, _ := args["body"].(string)
		if strings.Contains(body, "${{") || body == "" {
			e.t.Errorf("draft body not resolved: %q", body)
		}
		return map[string]any{"draft_id": fmt.Sprintf("draft-%d", e.drafts), "to": args["to"], "subject": args["subject"], "size": float64(len(body))}, nil
	case "email.send":
		return map[string]any{"message_id": "msg-" + args["draft_id"].(string), "accepted": []any{"x"}, "sent_at": "2025-12-31T00:00:00Z"}, nil
	}
	e.t.Fatalf("unexpected tool %s", tool)
	return nil, nil
}

// TestDemoRejections: goals a demo playbook matches but cannot run say
// what to change, not "no playbook matches".
func TestDemoRejections(t *testing.T) {
	set := demoSet(t)
	tools := demoCatalog(t)
	cases := []struct{ goal, want string }{
		{"Email the account team a summary of the top 200 customers by revenue in 2025", `playbook top-customers-email: n: 200 is out of range: must be from 1 to 100`},
		{"Email the account team a summary of the top 0 customers by revenue in 2025", `n: 0 is out of range: must be from 1 to 100`},
		{"Email the account team a summary of the top 5 customers by revenue in 1800", `year: 1800 is out of range: must be from 1900 to 2100`},
		{"Email the sales team a summary of the top 5 customers by revenue in 2025", `to: "sales team" is not valid; want a team (the account team, oncall or finance) or an e-mail address`},
		{"Find the runbook for failed payment retries and send it to the sales team", `to: "sales team" is not valid; want a team (the account team, oncall or finance) or an e-mail address`},
		// A recipient the dev email pool would refuse is refused before
		// any step runs, not at email.draft after search and fetch.
		{"Find the runbook for failed payment retries and send it to ops@evil.com", `to: "ops@evil.com" is not valid; want a team (the account team, oncall or finance) or an e-mail address at example.com`},
		{"Email ops@example.org a summary of the top 5 customers by revenue in 2025", `to: "ops@example.org" is not valid; want a team (the account team, oncall or finance) or an e-mail address at example.com`},
		{"Find the runbook for failed payment retries and send it to ops@mail.example.com", `to: "ops@mail.example.com" is not valid`},
	}
	for _, tc := range cases {
		t.Run(tc.goal, func(t *testing.T) {
			_, err := set.Plan(context.Background(), &planexv1.PlanRequest{Goal: tc.goal, Tools: tools, Revision: 1})
			if !errors.Is(err, playbook.ErrNoMatch) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrNoMatch containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "no playbook matches") {
				t.Errorf("err says no playbook matches although one did: %v", err)
			}
		})
	}
}

// TestRejectionIsAFailureToBranchOn: the supervisor shows a step rejected
// at its gate as FAILED with code REJECTED; close-ticket's branch for it
// reads the ticket again, and a playbook without such a branch gives up
// naming the rejection.
func TestRejectionIsAFailureToBranchOn(t *testing.T) {
	tools := demoCatalog(t)
	const rejected = `gate close.r1 (step "close") rejected by alice: not before the customer confirms`
	history := func(rev1 *planexv1.Plan, gated string) *planexv1.PlanHistory {
		return &planexv1.PlanHistory{Revisions: []*planexv1.Plan{rev1}, Steps: []*planexv1.StepOutcome{
			outcome("ticket", 1, planexv1.StepStatus_STEP_STATUS_SUCCEEDED, map[string]any{"rows": []any{[]any{400, "Stark Industries", "open", "Webhook deliveries failing"}}, "row_count": 1}, 0, ""),
			outcome(gated, 1, planexv1.StepStatus_STEP_STATUS_FAILED, nil, planexv1.ErrorCode_ERROR_CODE_REJECTED, rejected),
		}, ReplanReason: rejected}
	}

	set := demoSet(t)
	const goal = "Close support ticket 400"
	first, err := set.Plan(context.Background(), &planexv1.PlanRequest{Goal: goal, Tools: tools, Revision: 1})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := set.Plan(context.Background(), &planexv1.PlanRequest{Goal: goal, Tools: tools, Revision: 2, History: history(first.GetPlan(), "close")})
	if err != nil {
		t.Fatal(err)
	}
	p := resp.GetPlan()
	if got := strings.Join(stepIDs(p), ","); got != "ticket,recheck" {
		t.Fatalf("steps after the rejection = %s, want ticket,recheck", got)
	}
	if !strings.Contains(p.GetRationale(), `on_failure branch close-rejected after step "close" failed (REJECTED: `+rejected+`)`) ||
		!strings.Contains(p.GetAnswer(), "was left") {
		t.Fatalf("rationale %q answer %q", p.GetRationale(), p.GetAnswer())
	}
	if err := plan.Validate(p, plan.NewCatalog(tools), plan.DefaultLimits()); err != nil {
		t.Fatal(err)
	}

	bare := mustLoad(t, map[string]string{"bare.yaml": `name: bare
description: Close a ticket, no branch for a rejection
examples: ["close it 4"]
match: ['^close it (?P<n>\d+)$']
params: {n: {type: int}}
steps:
  - id: ticket
    tool: sql.query
    args: {sql: "SELECT ?", params: ["${{ params.n }}"]}
  - id: close
    tool: sql.exec
    depends_on: [ticket]
    requires_approval: true
    args: {sql: "UPDATE support_tickets SET status = 'closed' WHERE id = ?", params: ["${{ params.n }}"]}
`})
	first, err = bare.Plan(context.Background(), &planexv1.PlanRequest{Goal: "close it 4", Tools: tools, Revision: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, err = bare.Plan(context.Background(), &planexv1.PlanRequest{Goal: "close it 4", Tools: tools, Revision: 2, History: history(first.GetPlan(), "close")})
	var sf *playbook.StepFailedError
	if !errors.As(err, &sf) || sf.Code != planexv1.ErrorCode_ERROR_CODE_REJECTED ||
		sf.Message != rejected+`; playbook bare has no on_failure branch for a rejection of step "close"` {
		t.Fatalf("planner error %v, want the rejection with no branch", err)
	}
}
