package main

import (
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/policy"
)

func policyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Check guardrail policies offline",
	}
	cmd.AddCommand(policyTestCmd())
	return cmd
}

func policyTestCmd() *cobra.Command {
	var (
		planFile, toolsFile, goal string
		labels                    []string
		asJSON                    bool
	)
	cmd := &cobra.Command{
		Use:   "test FILE... --plan plan.json",
		Short: "Evaluate policy files against a plan, offline",
		Long: `Compile policy files (` + policy.Builtin + ` is the embedded default policy) and
evaluate them against a plan (a planex.v1.Plan in JSON, as the planner
answers it): the plan rules on the plan, the step rules on each step with its
arguments as planned (references are not resolved offline). Tool specs come
from --tools (the output of planex tools --json); without them every tool is
treated as unregistered (side effect EXTERNAL).

A policy that does not compile is reported with its file, line and CEL
error, and the command exits 1.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			set, err := policy.Load(args...)
			if err != nil {
				return err
			}
			if planFile == "" {
				return usageError(cmd, "--plan: required")
			}
			p := &planexv1.Plan{}
			if err := readProtoJSON(planFile, p); err != nil {
				return fmt.Errorf("--plan: %w", err)
			}
			if p.GetRevision() == 0 {
				p.Revision = 1
			}
			specs := map[string]*planexv1.ToolSpec{}
			if toolsFile != "" {
				tools := &planexv1.ListToolsResponse{}
				if err := readProtoJSON(toolsFile, tools); err != nil {
					return fmt.Errorf("--tools: %w", err)
				}
				for _, t := range tools.GetTools() {
					specs[t.GetSpec().GetName()] = t.GetSpec()
				}
			}
			lbls, err := parseLabels(labels)
			if err != nil {
				return usageError(cmd, "%v", err)
			}
			run := &planexv1.Run{Id: "offline", Goal: goal, Labels: lbls, Usage: &planexv1.BudgetUsage{}}
			now := time.Now()
			report := &policyReport{Plan: verdictOf(set.EvalPlan(policy.PlanInput(run, p, now)))}
			for _, s := range p.GetSteps() {
				v := verdictOf(set.EvalStep(policy.StepInput(run, p, s, s.GetArgs(), specs[s.GetTool()], now)))
				v.Step, v.Tool = s.GetId(), s.GetTool()
				report.Steps = append(report.Steps, v)
			}
			if asJSON {
				return printJSONValue(cmd.OutOrStdout(), report)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TARGET\tTOOL\tVERDICT\tRULE\tREASON")
			fmt.Fprintf(tw, "plan r%d (confidence %.2f)\t-\t%s\t%s\t%s\n", p.GetRevision(), p.GetConfidence(), report.Plan.Verdict, dash(report.Plan.Rule), dash(report.Plan.Reason))
			for _, v := range report.Steps {
				fmt.Fprintf(tw, "step %s\t%s\t%s\t%s\t%s\n", v.Step, v.Tool, v.Verdict, dash(v.Rule), dash(v.Reason))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&planFile, "plan", "", "plan to evaluate (planex.v1.Plan JSON)")
	cmd.Flags().StringVar(&toolsFile, "tools", "", "tool specs (planex tools --json output)")
	cmd.Flags().StringVar(&goal, "goal", "", "the run's goal, as rules see it (run.goal)")
	cmd.Flags().StringArrayVar(&labels, "label", nil, "a run label key=value, as rules see it (run.labels; repeatable)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the verdicts as JSON")
	return cmd
}

// policyReport is the JSON form of planex policy test.
type policyReport struct {
	Plan  verdict   `json:"plan"`
	Steps []verdict `json:"steps"`
}

type verdict struct {
	Step      string   `json:"step,omitempty"`
	Tool      string   `json:"tool,omitempty"`
	Verdict   string   `json:"verdict"`
	Policy    string   `json:"policy,omitempty"`
	Rule      string   `json:"rule,omitempty"`
	Reason    string   `json:"reason,omitempty"`
	Approvers []string `json:"approvers,omitempty"`
}

func verdictOf(d policy.Decision) verdict {
	return verdict{Verdict: d.Action.String(), Policy: d.Policy, Rule: d.Rule, Reason: d.Reason, Approvers: d.Approvers}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func readProtoJSON(path string, m proto.Message) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := protojson.Unmarshal(data, m); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
