package playbook_test

import (
	"context"
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/planner/internal/plannertest"
)

// BenchmarkPlan measures one playbook answer: matching the goal against
// every demo playbook, binding parameters, substituting them into args and
// CEL, and building the plan.
func BenchmarkPlan(b *testing.B) {
	set := demoSet(b)
	req := &planexv1.PlanRequest{Goal: "Email the account team a summary of the top 5 customers by revenue in 2025", Tools: plannertest.Catalog(b), Revision: 1}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := set.Plan(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "plans/s")
}
