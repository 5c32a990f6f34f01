package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

func runsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "List, inspect, follow and cancel runs",
	}
	cmd.AddCommand(runsListCmd(), runsGetCmd(), runsWatchCmd(), runsCancelCmd(),
		runsDecideCmd("approve", planexv1.DecisionKind_DECISION_KIND_APPROVE), runsDecideCmd("reject", planexv1.DecisionKind_DECISION_KIND_REJECT))
	cmd.AddCommand(runsExportCmd(), runsBatchCmd(), runsResetCmd(), runsForkCmd())
	cmd.AddCommand(runsAnswerCmd())
	return cmd
}

func runsListCmd() *cobra.Command {
	var (
		cf    clientFlags
		ff    filterFlags
		limit int32
		token string
		view  string
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List runs, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := &planexv1.ListRunsRequest{PageSize: limit, PageToken: token}
			switch view {
			case "full":
			case "basic":
				req.View = planexv1.RunView_RUN_VIEW_BASIC
			default:
				return usageError(cmd, "--view %q: want basic or full", view)
			}
			var err error
			if req.Statuses, err = parseStatuses(ff.statuses); err != nil {
				return usageError(cmd, "%v", err)
			}
			if ff.waiting {
				// Also as a status, which servers before filters understand.
				req.Statuses = append(req.Statuses, planexv1.RunStatus_RUN_STATUS_WAITING)
			}
			if req.Labels, err = parseLabels(ff.labels); err != nil {
				return usageError(cmd, "%v", err)
			}
			filter, err := ff.filter(time.Now(), false)
			if err != nil {
				return usageError(cmd, "%v", err)
			}
			if proto.Size(filter) > 0 {
				req.Filter = filter // unset otherwise: servers before filters list as asked
			}
			client, closeConn, err := dial(cf.addr)
			if err != nil {
				return err
			}
			defer closeConn()
			resp, err := client.ListRuns(cmd.Context(), req)
			if err != nil {
				return rpcError(cf.addr, err)
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "RUN\tSTATUS\tSTOP\tCREATED\tGOAL")
			var corrupt []string
			for _, r := range resp.GetRuns() {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.GetId(), listedStatus(r),
					stopReasonText(r), r.GetCreatedAt().AsTime().Local().Format(time.DateTime), oneLineText(r.GetGoal(), 60))
				if runlog.CorruptListing(r) {
					corrupt = append(corrupt, r.GetStopMessage())
				}
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, msg := range corrupt {
				fmt.Fprintln(cmd.ErrOrStderr(), msg)
			}
			if resp.GetNextPageToken() != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "more: --page-token %s (with the same filter flags)\n", resp.GetNextPageToken())
			}
			return nil
		},
	}
	cf.register(cmd.Flags())
	ff.register(cmd.Flags())
	cmd.Flags().Int32Var(&limit, "limit", 50, "runs per page (at most 500)")
	cmd.Flags().StringVar(&token, "page-token", "", "page token printed by a previous list (with the same filter flags)")
	cmd.Flags().StringVar(&view, "view", "full", "full: every run read whole (names a corrupt log); basic: from the supervisor's run index, no run read (fast on a cold store)")
	return cmd
}

func runsGetCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "get RUN_ID",
		Short: "Show a run",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, closeConn, err := dial(cf.addr)
			if err != nil {
				return err
			}
			defer closeConn()
			resp, err := client.GetRun(cmd.Context(), &planexv1.GetRunRequest{RunId: args[0]})
			if err != nil {
				return rpcError(cf.addr, err)
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), resp.GetRun())
			}
			fmt.Fprint(cmd.OutOrStdout(), renderRun(resp.GetRun())+stopDetailLine(resp.GetRun()))
			return nil
		},
	}
	cf.register(cmd.Flags())
	return cmd
}

func runsWatchCmd() *cobra.Command {
	var (
		cf   clientFlags
		from uint64
	)
	cmd := &cobra.Command{
		Use:   "watch RUN_ID",
		Short: "Follow a run's events until it stops (exit code as for `planex run`)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, closeConn, err := dial(cf.addr)
			if err != nil {
				return err
			}
			defer closeConn()
			if cf.json {
				// One RunEvent per line, as protojson.
				stream, err := client.WatchRun(cmd.Context(), &planexv1.WatchRunRequest{RunId: args[0], FromSequence: from})
				if err != nil {
					return rpcError(cf.addr, err)
				}
				for {
					resp, err := stream.Recv()
					if err != nil {
						if isEOF(err) {
							return nil
						}
						return rpcError(cf.addr, err)
					}
					b, err := jsonLine.Marshal(resp.GetEvent())
					if err != nil {
						return err
					}
					fmt.Fprintln(cmd.OutOrStdout(), string(b))
				}
			}
			return followToEnd(cmd, client, cf.addr, args[0], from)
		},
	}
	cf.register(cmd.Flags())
	cmd.Flags().Uint64Var(&from, "from", 0, "first event sequence to show (resume after a lost stream)")
	return cmd
}

func runsCancelCmd() *cobra.Command {
	var (
		cf     clientFlags
		reason string
	)
	cmd := &cobra.Command{
		Use:   "cancel RUN_ID",
		Short: "Cancel a run",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, closeConn, err := dial(cf.addr)
			if err != nil {
				return err
			}
			defer closeConn()
			resp, err := client.CancelRun(cmd.Context(), &planexv1.CancelRunRequest{RunId: args[0], Reason: reason})
			if err != nil {
				return rpcError(cf.addr, err)
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), resp.GetRun())
			}
			fmt.Fprintf(cmd.OutOrStdout(), "run %s %s\n", resp.GetRun().GetId(), statusName(resp.GetRun().GetStatus(), "RUN_STATUS_"))
			return nil
		},
	}
	cf.register(cmd.Flags())
	cmd.Flags().StringVar(&reason, "reason", "cancelled from the CLI", "why (recorded in the run log)")
	return cmd
}

func toolsCmd() *cobra.Command {
	var (
		cf   clientFlags
		pool string
	)
	cmd := &cobra.Command{
		Use:   "tools",
		Short: "List the tool catalog registered by executor pools",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, closeConn, err := dial(cf.addr)
			if err != nil {
				return err
			}
			defer closeConn()
			resp, err := client.ListTools(cmd.Context(), &planexv1.ListToolsRequest{Pool: pool})
			if err != nil {
				return rpcError(cf.addr, err)
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TOOL\tPOOL\tEFFECT\tAPPROVAL\tREPLICAS\tDESCRIPTION")
			for _, t := range resp.GetTools() {
				s := t.GetSpec()
				fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%d\t%s\n", s.GetName(), s.GetPool(), statusName(s.GetSideEffect(), "SIDE_EFFECT_"),
					s.GetRequiresApproval(), len(t.GetReplicas()), oneLineText(s.GetDescription(), 70))
			}
			return tw.Flush()
		},
	}
	cf.register(cmd.Flags())
	cmd.Flags().StringVar(&pool, "pool", "", "only tools of this pool")
	return cmd
}

// runsDecideCmd answers open gates of a run: the ones named, or the only
// open one, or all of them with --all; several gates go in one Decide call,
// refused whole if any decision is invalid. A rejection sends the run back
// to the planner with the comment unless --stop (reject only) asks to stop
// it.
func runsDecideCmd(verb string, decision planexv1.DecisionKind) *cobra.Command {
	var (
		cf      clientFlags
		actor   string
		comment string
		all     bool
		stop    bool
	)
	cmd := &cobra.Command{
		Use:   verb + " RUN_ID [GATE_ID...]",
		Short: strings.ToUpper(verb[:1]) + verb[1:] + " open gates of a run (the only open one when no GATE_ID is given, or --all)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, closeConn, err := dial(cf.addr)
			if err != nil {
				return err
			}
			defer closeConn()
			gates := args[1:]
			if len(gates) == 0 {
				open, err := openGates(cmd.Context(), client, args[0])
				if err != nil {
					return rpcError(cf.addr, err)
				}
				if len(open) == 0 {
					return nothingToDecide(cmd, client, cf.addr, args[0], verb)
				}
				if len(open) > 1 && !all {
					return usageError(cmd, "run %s has %d open gates (%s): name them or pass --all", args[0], len(open), strings.Join(open, ", "))
				}
				gates = open
			}
			run, err := decideMany(cmd.Context(), client, args[0], gates, decision, actor, comment, "", stop)
			if err != nil {
				return rpcError(cf.addr, err)
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), run)
			}
			for _, g := range gates {
				fmt.Fprintf(cmd.OutOrStdout(), "gate %s of run %s: %s\n", g, args[0], strings.TrimSuffix(verb, "e")+"ed")
			}
			if decision == planexv1.DecisionKind_DECISION_KIND_REJECT {
				fmt.Fprintf(cmd.OutOrStdout(), "run %s: %s\n", args[0], afterReject(run))
			}
			return nil
		},
	}
	cf.register(cmd.Flags())
	cmd.Flags().StringVar(&actor, "actor", os.Getenv("USER"), "who decides (recorded in the run log)")
	cmd.Flags().StringVar(&comment, "comment", "", "comment recorded with the decision (a rejection's reason goes to the planner)")
	cmd.Flags().BoolVar(&all, "all", false, "decide every open gate of the run")
	if decision == planexv1.DecisionKind_DECISION_KIND_REJECT {
		cmd.Flags().BoolVar(&stop, "stop", false, "stop the run (REJECTED) instead of sending it back to the planner with the comment")
	}
	return cmd
}

// nothingToDecide answers approve or reject of a run without an open
// gate: what state the run is in, so that "0 open gates" is never all the
// user learns (exit 1).
func nothingToDecide(cmd *cobra.Command, client planexv1.SupervisorServiceClient, addr, runID, verb string) error {
	got, err := client.GetRun(cmd.Context(), &planexv1.GetRunRequest{RunId: runID})
	if err != nil {
		return rpcError(addr, err)
	}
	run := got.GetRun()
	if isTerminal(run.GetStatus()) {
		return &exitError{code: exitUsage, msg: fmt.Sprintf("run %s finished (%s): nothing to %s", runID, statusAndReason(run.GetStatus(), run.GetStopReason()), verb)}
	}
	return &exitError{code: exitUsage, msg: fmt.Sprintf("run %s is %s and waits at no gate: nothing to %s (planex runs watch %s follows it)", runID, statusName(run.GetStatus(), "RUN_STATUS_"), verb, runID)}
}

// afterReject says what a rejection did to the run: stopped it, or sent
// it back to the planner. The answer is the run right after the decision:
// while it plans again, the last of its plans is the rejected one, not
// the one being made.
func afterReject(run *planexv1.Run) string {
	if run.GetStopReason() == planexv1.StopReason_STOP_REASON_REJECTED {
		return "stopped (rejected): " + run.GetStopMessage()
	}
	rev := int32(0)
	if n := len(run.GetPlans()); n > 0 {
		rev = run.GetPlans()[n-1].GetRevision()
	}
	switch s := run.GetStatus(); {
	case s == planexv1.RunStatus_RUN_STATUS_PLANNING || s == planexv1.RunStatus_RUN_STATUS_PENDING:
		if rev == 0 {
			return "sent back to the planner with the reason; it is planning again"
		}
		return fmt.Sprintf("sent back to the planner with the reason; it is making a new plan to replace revision %d", rev)
	case isTerminal(s):
		return fmt.Sprintf("sent back to the planner with the reason; the run then finished (%s)", statusAndReason(s, run.GetStopReason()))
	default:
		return fmt.Sprintf("sent back to the planner with the reason; now %s plan revision %d", statusName(s, "RUN_STATUS_"), rev)
	}
}

// listedStatus is the STATUS column of runs list: "corrupt (running)" for
// a run whose log is corrupt (its last snapshot's status in parentheses).
func listedStatus(r *planexv1.Run) string {
	status := statusName(r.GetStatus(), "RUN_STATUS_")
	if runlog.CorruptListing(r) {
		return "corrupt (" + status + ")"
	}
	return status
}

// stopReasonText is the STOP column of runs list: "-" while the run has
// not stopped (a waiting run has no stop reason yet).
func stopReasonText(r *planexv1.Run) string {
	if r.GetStopReason() == planexv1.StopReason_STOP_REASON_UNSPECIFIED {
		return "-"
	}
	return statusName(r.GetStopReason(), "STOP_REASON_")
}
