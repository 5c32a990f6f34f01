package plan_test

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/plan"
)

func ExampleResolveArgs() {
	args, _ := structpb.NewStruct(map[string]any{
		"to":      "${{ steps.find.output.emails }}",
		"subject": "${{ size(steps.find.output.emails) }} users in ${{ inputs.team }}",
	})
	env := plan.Env{
		Inputs:  map[string]any{"team": "infra"},
		Outputs: map[string]any{"find": map[string]any{"emails": []any{"a@x.io", "b@x.io"}}},
	}
	resolved, err := plan.ResolveArgs(args, env)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(resolved.Fields["to"].GetListValue().AsSlice())
	fmt.Println(resolved.Fields["subject"].GetStringValue())
	// Output:
	// [a@x.io b@x.io]
	// 2 users in infra
}

func ExampleValidate() {
	schema, _ := structpb.NewStruct(map[string]any{
		"type":                 "object",
		"properties":           map[string]any{"to": map[string]any{"type": "array"}},
		"required":             []any{"to"},
		"additionalProperties": false,
	})
	cat := plan.NewCatalog([]*planexv1.ToolSpec{{Name: "email.send", Pool: "email", ArgsSchema: schema}})
	args, _ := structpb.NewStruct(map[string]any{"to": "x"})
	p := &planexv1.Plan{Revision: 1, Confidence: 0.9, Steps: []*planexv1.Step{
		{Id: "send", Tool: "email.send", Args: args, DependsOn: []string{"nope"}},
	}}
	err := plan.Validate(p, cat, plan.DefaultLimits())
	var verr *plan.ValidationError
	if errors.As(err, &verr) {
		for _, problem := range verr.Problems {
			fmt.Println(problem)
		}
	}
	fmt.Println(errors.Is(err, plan.ErrInvalidPlan))
	// Output:
	// step "send": depends_on: unknown step "nope"
	// step "send": args.to: expected array, got string "x"
	// true
}
