package policy

import (
	"strings"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"google.golang.org/protobuf/types/known/structpb"
)

// StepInput is what step rules see for step s of run with its resolved
// arguments and tool spec (nil when the tool is not registered).
func StepInput(run *planexv1.Run, p *planexv1.Plan, s *planexv1.Step, args *structpb.Struct, spec *planexv1.ToolSpec, now time.Time) Input {
	in := PlanInput(run, p, now)
	in.Step = map[string]any{
		"id": s.GetId(), "tool": s.GetTool(), "args": structMap(args), "description": s.GetDescription(),
		"requires_approval": s.GetRequiresApproval(),
	}
	in.Tool = toolMap(s.GetTool(), spec)
	return in
}

// PlanInput is what plan rules see for plan p of run.
func PlanInput(run *planexv1.Run, p *planexv1.Plan, now time.Time) Input {
	steps := make([]any, 0, len(p.GetSteps()))
	for _, s := range p.GetSteps() {
		steps = append(steps, map[string]any{"id": s.GetId(), "tool": s.GetTool(), "args": structMap(s.GetArgs()), "description": s.GetDescription()})
	}
	labels := map[string]any{}
	for k, v := range run.GetLabels() {
		labels[k] = v
	}
	u, b := run.GetUsage(), run.GetBudget()
	return Input{
		Plan: map[string]any{
			"revision": int64(p.GetRevision()), "confidence": p.GetConfidence(), "rationale": p.GetRationale(), "steps": steps,
		},
		Run: map[string]any{
			"id": run.GetId(), "goal": run.GetGoal(), "labels": labels, "mode": enumName(run.GetMode().String(), "PLANNING_MODE_"),
			"started_by": run.GetStartedBy(),
			"usage":      map[string]any{"steps": int64(u.GetSteps()), "replans": int64(u.GetReplans()), "tokens": u.GetTokens()},
			"budget": map[string]any{
				"max_steps": int64(b.GetMaxSteps()), "max_replans": int64(b.GetMaxReplans()), "max_tokens": b.GetMaxTokens(),
				"max_parallelism": int64(b.GetMaxParallelism()),
			},
		},
		Now: now,
	}
}

func toolMap(name string, spec *planexv1.ToolSpec) map[string]any {
	if spec == nil {
		// Unknown tools are treated like the most careful class.
		return map[string]any{"name": name, "side_effect": "EXTERNAL", "pool": "", "idempotent": false, "requires_approval": false, "registered": false}
	}
	se := enumName(spec.GetSideEffect().String(), "SIDE_EFFECT_")
	if spec.GetSideEffect() == planexv1.SideEffect_SIDE_EFFECT_UNSPECIFIED {
		se = "EXTERNAL"
	}
	return map[string]any{
		"name": spec.GetName(), "side_effect": se, "pool": spec.GetPool(), "idempotent": spec.GetIdempotent(),
		"requires_approval": spec.GetRequiresApproval(), "registered": true,
	}
}

func enumName(s, prefix string) string { return strings.TrimPrefix(s, prefix) }

func structMap(s *structpb.Struct) map[string]any {
	if s == nil {
		return map[string]any{}
	}
	return s.AsMap()
}
