package catalog

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// ChildTool is the built-in tool whose step starts a child run
// (docs/child-runs.md). The supervisor runs it itself: no executor pool
// is involved, and a registration of its name by an executor is never
// served (the built-in spec replaces it).
const ChildTool = "run.child"

// ChildSpec is the spec of ChildTool: a goal (required), its inputs,
// labels and planner backend, and the budget carved out of the parent's
// (max_steps, max_tokens, deadline as a Go duration such as "5m").
func ChildSpec() *planexv1.ToolSpec {
	str := map[string]any{"type": "string"}
	schema, err := structpb.NewStruct(map[string]any{
		"type": "object",
		"properties": map[string]any{
			"goal":            map[string]any{"type": "string", "minLength": 1, "maxLength": 16384, "description": "what the child run is to achieve"},
			"inputs":          map[string]any{"type": "object", "description": "the child run's structured inputs"},
			"labels":          map[string]any{"type": "object", "additionalProperties": str, "description": "the child run's labels"},
			"planner_backend": map[string]any{"type": "string", "description": "planner backend (or playbook planner) for the child; empty: the parent's"},
			"budget": map[string]any{
				"type":                 "object",
				"additionalProperties": false,
				"description":          "carved out of what the parent has left; unset fields take a share of it",
				"properties": map[string]any{
					"max_steps":  map[string]any{"type": "integer", "minimum": 1},
					"max_tokens": map[string]any{"type": "integer", "minimum": 1},
					"deadline":   map[string]any{"type": "string", "description": "Go duration, e.g. 5m; at most the parent's remaining time"},
				},
			},
		},
		"required":             []any{"goal"},
		"additionalProperties": false,
	})
	if err != nil {
		panic(err) // a constant schema
	}
	return &planexv1.ToolSpec{
		Name: ChildTool, Pool: "run",
		Description: "Starts a child run for a goal, within a budget and deadline carved out of this run's, and waits for it: " +
			"its result is the step's output; a child that fails, is cancelled or exceeds its budget fails the step with its stop reason.",
		ArgsSchema: schema,
		// A child run may do anything a run does: never repeated by a
		// retry policy (a failed child goes to the planner).
		SideEffect:     planexv1.SideEffect_SIDE_EFFECT_EXTERNAL,
		Retry:          &planexv1.RetryPolicy{MaxAttempts: 1},
		DefaultTimeout: durationpb.New(24 * time.Hour),
	}
}

// addChildTool serves the built-in ChildTool in c, replacing any
// registration of its name.
func addChildTool(c *Catalog) {
	c.specs[ChildTool] = ChildSpec()
	c.replicas[ChildTool] = []string{"supervisor"}
	delete(c.absent, ChildTool)
}
