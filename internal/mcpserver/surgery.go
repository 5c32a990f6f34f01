package mcpserver

import (
	"context"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

type resetRunIn struct {
	RunID      string                    `json:"run_id" jsonschema:"the finished run to re-open"`
	Reason     string                    `json:"reason" jsonschema:"why (required; recorded in the run log)"`
	FromStep   string                    `json:"from_step,omitempty" jsonschema:"run this step and its dependents again; empty: the steps that did not succeed"`
	ToSequence uint64                    `json:"to_sequence,omitempty" jsonschema:"go back to the state after this event of the run's log"`
	Replan     bool                      `json:"replan,omitempty" jsonschema:"send the run to the planner instead of running the same steps again"`
	StepArgs   map[string]map[string]any `json:"step_args,omitempty" jsonschema:"new arguments of steps that run again, by step id"`
	Unknown    map[string]string         `json:"unknown_outcomes,omitempty" jsonschema:"for a step whose outcome is unknown: retry (run it again, its effect may happen twice) or done (it happened)"`
	DryRun     bool                      `json:"dry_run,omitempty" jsonschema:"only say what would run again and what is kept"`
}

type forkRunIn struct {
	RunID      string                    `json:"run_id" jsonschema:"the run to fork"`
	Reason     string                    `json:"reason,omitempty" jsonschema:"why (recorded in both runs' logs)"`
	FromStep   string                    `json:"from_step,omitempty" jsonschema:"share every result except this step's and its dependents'"`
	AtSequence uint64                    `json:"at_sequence,omitempty" jsonschema:"share the history up to and including this event"`
	Goal       string                    `json:"goal,omitempty" jsonschema:"the fork's goal (default: the original's)"`
	StepArgs   map[string]map[string]any `json:"step_args,omitempty" jsonschema:"new arguments of steps that run again, by step id"`
	Labels     map[string]string         `json:"labels,omitempty" jsonschema:"labels added to the original's"`
	DryRun     bool                      `json:"dry_run,omitempty" jsonschema:"only say what the fork would share and run"`
}

// addSurgeryTools registers reset_run and fork_run (the operator role).
func (m *server) addSurgeryTools(s *mcp.Server) {
	yes, no := true, false
	mcp.AddTool(s, &mcp.Tool{Name: "reset_run", Description: "Re-open a finished run: run its failed steps (or a step and its dependents) again, keeping the results of steps that succeeded; a side effect that happened is never repeated. Try dry_run first. Needs the operator role.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &yes, OpenWorldHint: &yes}}, m.resetRun)
	mcp.AddTool(s, &mcp.Tool{Name: "fork_run", Description: "Start a new run from another run's history up to a point (its results are not executed again), with edited step arguments or goal. Needs the operator role.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &yes}}, m.forkRun)
}

func structs(in map[string]map[string]any, field string) (map[string]*structpb.Struct, error) {
	out := make(map[string]*structpb.Struct, len(in))
	for id, args := range in {
		s, err := structpb.NewStruct(args)
		if err != nil {
			return nil, fmt.Errorf("%s.%s: %v", field, id, err)
		}
		out[id] = s
	}
	return out, nil
}

func (m *server) resetRun(ctx context.Context, _ *mcp.CallToolRequest, in resetRunIn) (*mcp.CallToolResult, any, error) {
	args, err := structs(in.StepArgs, "step_args")
	if err != nil {
		return nil, nil, err
	}
	var decisions []*planexv1.UnknownOutcome
	for id, a := range in.Unknown {
		d := &planexv1.UnknownOutcome{StepId: id}
		switch strings.ToLower(a) {
		case "retry":
			d.Action = planexv1.UnknownOutcomeAction_UNKNOWN_OUTCOME_ACTION_RETRY
		case "done":
			d.Action = planexv1.UnknownOutcomeAction_UNKNOWN_OUTCOME_ACTION_DONE
		default:
			return nil, nil, fmt.Errorf("unknown_outcomes.%s %q: want retry or done", id, a)
		}
		decisions = append(decisions, d)
	}
	got, err := m.client.ResetRun(ctx, &planexv1.ResetRunRequest{
		RunId: in.RunID, Reason: in.Reason, FromStep: in.FromStep, ToSequence: in.ToSequence, Replan: in.Replan,
		StepArgs: args, UnknownOutcomes: decisions, DryRun: in.DryRun, Actor: m.opts.Actor,
	})
	if err != nil {
		return nil, nil, m.opts.Error(err)
	}
	return result(got)
}

func (m *server) forkRun(ctx context.Context, _ *mcp.CallToolRequest, in forkRunIn) (*mcp.CallToolResult, any, error) {
	args, err := structs(in.StepArgs, "step_args")
	if err != nil {
		return nil, nil, err
	}
	got, err := m.client.ForkRun(ctx, &planexv1.ForkRunRequest{
		RunId: in.RunID, Reason: in.Reason, FromStep: in.FromStep, AtSequence: in.AtSequence, Goal: in.Goal,
		StepArgs: args, Labels: in.Labels, DryRun: in.DryRun,
	})
	if err != nil {
		return nil, nil, m.opts.Error(err)
	}
	return result(got)
}
