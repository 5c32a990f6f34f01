package playbook_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/plan"
)

// humanInputSpec is the supervisor's built-in human.input tool as the
// planner receives it in PlanRequest.tools (its args schema as the
// supervisor's catalog declares it: question, schema, choices).
func humanInputSpec(t *testing.T) *planexv1.ToolSpec {
	t.Helper()
	args, err := structpb.NewStruct(map[string]any{
		"type": "object", "additionalProperties": false, "required": []any{"question"},
		"properties": map[string]any{
			"question": map[string]any{"type": "string", "minLength": 1},
			"schema":   map[string]any{"type": "object"},
			"choices":  map[string]any{"type": "array", "minItems": 1},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return &planexv1.ToolSpec{Name: "human.input", Pool: "human", ArgsSchema: args, SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ}
}

// TestCustomerReportAsksFirst: the customer-report demo plans a
// human.input step whose answer the SQL step reads, valid for the
// supervisor's catalog.
func TestCustomerReportAsksFirst(t *testing.T) {
	tools := append(demoCatalog(t), humanInputSpec(t))
	for _, goal := range []string{"Ask which customer to report on", "report on a customer I choose."} {
		resp, err := demoSet(t).Plan(context.Background(), &planexv1.PlanRequest{Goal: goal, Tools: tools, Revision: 1})
		if err != nil {
			t.Fatalf("%s: Plan: %v", goal, err)
		}
		p := resp.GetPlan()
		if err := plan.Validate(p, plan.NewCatalog(tools), plan.DefaultLimits()); err != nil {
			t.Fatalf("%s: plan invalid for the catalog: %v", goal, err)
		}
		if !strings.HasPrefix(p.GetRationale(), "playbook customer-report:") || p.GetSteps()[0].GetTool() != "human.input" ||
			argAt(t, p, "report.params[0]") != "${{ steps.ask.output }}" {
			t.Fatalf("%s: plan %v", goal, p)
		}
	}
}
