package plan

import (
	"fmt"
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

func BenchmarkResolveArgs(b *testing.B) {
	args := jsonStruct(b, `{
		"to": "${{ steps.find.output.rows.map(r, r.email) }}",
		"subject": "Report for ${{ inputs.team }}: ${{ steps.find.output.total }} users",
		"body": "A fixed body that holds no reference at all.",
		"options": {"format": "text", "priority": 3, "tags": ["weekly", "auto"]}
	}`)
	env := testEnv()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ResolveArgs(args, env); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkValidate(b *testing.B) {
	cat := testCatalog(b)
	steps := []*planexv1.Step{step(b, "find", "sql.query", `{"query": "select email from users where team = ?", "params": ["${{ inputs.team }}"], "limit": 10}`)}
	for i := range 8 {
		steps = append(steps, step(b, fmt.Sprintf("send_%d", i), "email.send", `{
			"to": "${{ steps.find.output.rows.map(r, r.email) }}",
			"subject": "Report ${{ goal }}",
			"format": "text"}`, "find"))
	}
	p := newPlan(steps...)
	p.Steps[1].Expect = "output.sent > 0"
	p.Answer = "steps.send_0.output"
	lim := DefaultLimits()
	if err := Validate(p, cat, lim); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := Validate(p, cat, lim); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(p.Steps)), "steps/plan")
}
