package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// viaRunYes is DecideRequest.via of `planex run --yes` (api.ViaRunYes).
const viaRunYes = "run --yes"

func gatesCmd() *cobra.Command {
	var (
		cf    clientFlags
		runID string
	)
	cmd := &cobra.Command{
		Use:   "gates",
		Short: "List open gates across runs (or of one run), oldest first, with their SLA",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, closeConn, err := dial(cf.addr)
			if err != nil {
				return err
			}
			defer closeConn()
			resp, err := client.ListGates(cmd.Context(), &planexv1.ListGatesRequest{RunId: runID})
			if err != nil {
				return rpcError(cf.addr, err)
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			return printGates(cmd.OutOrStdout(), resp.GetGates(), time.Now())
		},
	}
	cf.register(cmd.Flags())
	cmd.Flags().StringVar(&runID, "run", "", "only the gates of this run")
	return cmd
}

// printGates prints open gates as a table; SLA is the time left (or
// "overdue", or "-" without an SLA); ON REJECT is what a rejection does:
// "replan" (back to the planner with the reason) or "stop" (the gate's
// rule says on_reject: stop, or a gate recorded before rejections
// replanned).
func printGates(w io.Writer, gates []*planexv1.OpenGate, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tGATE\tKIND\tTOOL\tOPEN FOR\tSLA\tON REJECT\tREASON")
	for _, og := range gates {
		g := og.GetGate()
		sla := "-"
		if at := g.GetSlaAt(); at != nil {
			if left := at.AsTime().Sub(now); left > 0 {
				sla = left.Round(time.Second).String() + " → " + strings.ToLower(strings.TrimPrefix(g.GetOnTimeout().String(), "GATE_TIMEOUT_ACTION_"))
			} else {
				sla = "overdue"
			}
		}
		tool := og.GetTool()
		if tool == "" {
			tool = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", og.GetRunId(), g.GetId(), statusName(g.GetKind(), "GATE_KIND_"), tool,
			now.Sub(g.GetOpenedAt().AsTime()).Round(time.Second), sla, onReject(g), oneLineText(g.GetReason(), 70))
	}
	return tw.Flush()
}

// onReject is what rejecting an open gate does, as the engine decides it
// (engine.stopsOnReject): stop when the gate's rule says on_reject: stop,
// or for a step gate without a policy recorded before rejections
// replanned (no replan_on_reject); replan otherwise. A decider may still
// stop a replanning gate (planex runs reject --stop).
func onReject(g *planexv1.Gate) string {
	if !g.GetReplanOnReject() && (g.GetStopOnReject() || (g.GetKind() == planexv1.GateKind_GATE_KIND_STEP && g.GetPolicy() == "")) {
		return "stop"
	}
	return "replan"
}

// openGates lists the ids of a run's open gates that are approved or
// rejected (input gates, which take an answer, are left out).
func openGates(ctx context.Context, client planexv1.SupervisorServiceClient, runID string) ([]string, error) {
	resp, err := client.ListGates(ctx, &planexv1.ListGatesRequest{RunId: runID})
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(resp.GetGates()))
	for _, g := range resp.GetGates() {
		if g.GetGate().GetKind() == planexv1.GateKind_GATE_KIND_INPUT {
			continue // answered, not approved: planex runs answer
		}
		ids = append(ids, g.GetGate().GetId())
	}
	return ids, nil
}

// decideMany answers several gates of a run in one Decide call; stop asks
// rejections to stop the run instead of replanning.
func decideMany(ctx context.Context, client planexv1.SupervisorServiceClient, runID string, gates []string, decision planexv1.DecisionKind, actor, comment, via string, stop bool) (*planexv1.Run, error) {
	req := &planexv1.DecideRequest{RunId: runID, Actor: actor, Via: via}
	for _, g := range gates {
		req.Decisions = append(req.Decisions, &planexv1.GateDecision{GateId: g, Decision: decision, Comment: comment, StopRun: stop})
	}
	resp, err := client.Decide(ctx, req)
	return resp.GetRun(), err
}

// followApproving follows a run like follow and, each time it waits at
// gates, approves them on the caller's behalf (`planex run --yes`,
// recorded with via "run --yes"; the supervisor refuses it unless the
// caller may approve the run it started).
func followApproving(ctx context.Context, client planexv1.SupervisorServiceClient, addr, runID string, view *liveView, stderr io.Writer) (*planexv1.Run, error) {
	var from uint64
	for {
		run, err := follow(ctx, client, addr, runID, from, view)
		if err != nil || run.GetStatus() != planexv1.RunStatus_RUN_STATUS_WAITING {
			return run, err
		}
		gates, err := openGates(ctx, client, runID)
		if err != nil {
			return nil, rpcError(addr, err)
		}
		if len(gates) == 0 {
			fmt.Fprintf(stderr, "--yes: run %s waits for an answer (planex runs answer %s)\n", runID, runID)
		}
		if len(gates) > 0 {
			fmt.Fprintf(stderr, "--yes: approving %s\n", strings.Join(gates, ", "))
			if _, err := decideMany(ctx, client, runID, gates, planexv1.DecisionKind_DECISION_KIND_APPROVE, os.Getenv("USER"), "approved with planex run --yes", viaRunYes, false); err != nil {
				return nil, rpcError(addr, err)
			}
		}
		from = run.GetLastSequence() + 1
	}
}
