package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// filterFlags are the run filter flags of `runs list` and `runs batch`
// (RunFilter).
type filterFlags struct {
	goal        string
	selector    string
	tools       []string
	startedBy   string
	since       string
	until       string
	stopReasons []string
	waiting     bool
	forkedFrom  string
	parent      string
	// statuses and labels: runs list sends them in ListRunsRequest's own
	// fields (understood by servers before filters), runs batch in the
	// filter.
	statuses []string
	labels   []string
}

func (f *filterFlags) register(fs *pflag.FlagSet) {
	fs.StringSliceVar(&f.statuses, "status", nil, "only runs in these statuses (comma separated)")
	fs.StringArrayVar(&f.labels, "label", nil, "only runs with label key=value (repeatable)")
	fs.StringVar(&f.goal, "goal", "", "only runs whose goal contains all these words (case-insensitive)")
	fs.StringVarP(&f.selector, "selector", "l", "", "label selector: key=value, key!=value, key in (a,b), key notin (a,b), key, !key (comma separated, all must hold)")
	fs.StringArrayVar(&f.tools, "tool", nil, "only runs whose plans call this tool (repeatable: any of them)")
	fs.StringVar(&f.startedBy, "started-by", "", "only runs started by this identity (e.g. apikey:ci)")
	fs.StringVar(&f.since, "since", "", "only runs created at or after this: a duration ago (2h, 30m) or an RFC 3339 time")
	fs.StringVar(&f.until, "until", "", "only runs created before this: a duration ago (2h, 30m) or an RFC 3339 time")
	fs.StringArrayVar(&f.stopReasons, "stop-reason", nil, "only finished runs with this stop reason, e.g. step_failed (repeatable)")
	fs.BoolVar(&f.waiting, "waiting", false, "only runs waiting at an open gate (planex gates lists the gates)")
	fs.StringVar(&f.forkedFrom, "forked-from", "", "only forks of this run")
	fs.StringVar(&f.parent, "parent", "", "only child runs of this run (started by its run.child steps)")
}

// parseStatuses turns --status names into run statuses.
func parseStatuses(names []string) ([]planexv1.RunStatus, error) {
	var out []planexv1.RunStatus
	for _, s := range names {
		v, ok := planexv1.RunStatus_value["RUN_STATUS_"+strings.ToUpper(strings.TrimSpace(s))]
		if !ok || v == 0 {
			return nil, fmt.Errorf("--status %q: want pending, planning, running, waiting, succeeded, failed, escalated or cancelled", s)
		}
		out = append(out, planexv1.RunStatus(v))
	}
	return out, nil
}

// parseWhen reads --since and --until: a duration ago or an RFC 3339 time.
func parseWhen(flag, v string, now time.Time) (*timestamppb.Timestamp, error) {
	if v == "" {
		return nil, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 {
			return nil, fmt.Errorf("--%s %q: want a positive duration (how long ago)", flag, v)
		}
		return timestamppb.New(now.Add(-d)), nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return nil, fmt.Errorf("--%s %q: want a duration ago like 2h or an RFC 3339 time like 2026-01-02T15:04:05Z", flag, v)
	}
	return timestamppb.New(t), nil
}

// filter builds the RunFilter of the flags; withLegacy puts --status and
// --label in it too.
func (f *filterFlags) filter(now time.Time, withLegacy bool) (*planexv1.RunFilter, error) {
	rf := &planexv1.RunFilter{
		GoalContains: f.goal, LabelSelector: f.selector, Tools: f.tools, StartedBy: f.startedBy,
		WaitingForDecision: f.waiting, ForkedFrom: f.forkedFrom, ParentRunId: f.parent,
	}
	var err error
	if rf.CreatedAfter, err = parseWhen("since", f.since, now); err != nil {
		return nil, err
	}
	if rf.CreatedBefore, err = parseWhen("until", f.until, now); err != nil {
		return nil, err
	}
	for _, r := range f.stopReasons {
		v, ok := planexv1.StopReason_value["STOP_REASON_"+strings.ToUpper(strings.TrimSpace(r))]
		if !ok || v == 0 {
			return nil, fmt.Errorf("--stop-reason %q: want a stop reason such as succeeded, failed, step_failed, cancelled, rejected, deadline", r)
		}
		rf.StopReasons = append(rf.StopReasons, planexv1.StopReason(v))
	}
	if withLegacy {
		if rf.Statuses, err = parseStatuses(f.statuses); err != nil {
			return nil, err
		}
		if rf.Labels, err = parseLabels(f.labels); err != nil {
			return nil, err
		}
	}
	return rf, nil
}

// confirmTerminal reports whether a batch may ask for its confirmation:
// stdin is a terminal (tests replace it).
var confirmTerminal = func() bool { return term.IsTerminal(int(os.Stdin.Fd())) }

// batchVerbs are the operations of runs batch.
var batchVerbs = []struct {
	use, short, verb string
}{
	{"cancel", "Cancel every run a filter selects (finished runs are skipped)", "Cancel"},
	{"approve", "Approve the open gates of every run a filter selects", "Approve the gates of"},
	{"reject", "Reject the open gates of every run a filter selects", "Reject the gates of"},
	{"reset", "Reset every finished run a filter selects from its steps that did not succeed", "Reset"},
}

func runsBatchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "batch",
		Short: "Cancel, approve, reject or reset every run a filter selects",
		Long: `Apply one operation to every run a filter selects (the filter flags of
runs list; at least one is required — use --until to mean every run).

A batch first counts the runs (a dry run) and shows a sample; it then asks
"Cancel 37 runs? Type 37 to confirm:" at a terminal, or proceeds with --yes.
The server refuses the batch when the filter selects another number of runs
by then. Progress is printed as the runs are done; the command exits
non-zero when any run failed. Running the same --batch-id again skips what
it already did. Requires the operator role.`,
	}
	for _, v := range batchVerbs {
		cmd.AddCommand(runsBatchVerbCmd(v.use, v.short, v.verb))
	}
	return cmd
}

func runsBatchVerbCmd(use, short, verb string) *cobra.Command {
	var (
		cf      clientFlags
		ff      filterFlags
		reason  string
		dryRun  bool
		yes     bool
		batchID string
		actor   string
		stop    bool
		replan  bool
	)
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			filter, err := ff.filter(time.Now(), true)
			if err != nil {
				return usageError(cmd, "%v", err)
			}
			req := &planexv1.RunBatchRequest{Filter: filter, Reason: reason, BatchId: batchID, Actor: actor}
			switch use {
			case "cancel":
				req.Operation = &planexv1.RunBatchRequest_Cancel{Cancel: &planexv1.BatchCancel{}}
			case "approve":
				req.Operation = &planexv1.RunBatchRequest_Decide{Decide: &planexv1.BatchDecide{Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE}}
			case "reject":
				req.Operation = &planexv1.RunBatchRequest_Decide{Decide: &planexv1.BatchDecide{Decision: planexv1.DecisionKind_DECISION_KIND_REJECT, StopRun: stop}}
			case "reset":
				req.Operation = &planexv1.RunBatchRequest_Reset_{Reset_: &planexv1.BatchReset{Replan: replan}}
			}
			if reason == "" && !dryRun {
				return usageError(cmd, "--reason: required (recorded in each run's log)")
			}
			client, closeConn, err := dial(cf.addr)
			if err != nil {
				return err
			}
			defer closeConn()
			return runBatch(cmd, client, cf, req, batchOpts{verb: verb, dryRun: dryRun, yes: yes})
		},
	}
	cf.register(cmd.Flags())
	ff.register(cmd.Flags())
	cmd.Flags().StringVar(&reason, "reason", "", "why (required; recorded in each run's log)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "only count the runs and show a sample")
	cmd.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation (the count is still checked by the server)")
	cmd.Flags().StringVar(&batchID, "batch-id", "", "batch id ([A-Za-z0-9_-], at most 64); run again with the same id to finish an interrupted batch")
	cmd.Flags().StringVar(&actor, "actor", os.Getenv("USER"), "who (recorded in each run's log)")
	switch use {
	case "reject":
		cmd.Flags().BoolVar(&stop, "stop", false, "stop the runs (REJECTED) instead of sending them back to the planner")
	case "reset":
		cmd.Flags().BoolVar(&replan, "replan", false, "send the runs back to the planner instead of dispatching their steps again")
	}
	return cmd
}

type batchOpts struct {
	verb   string // "Cancel", "Approve the gates of", ...
	dryRun bool
	yes    bool
}

// runBatch counts the runs (dry run), confirms, then runs the batch and
// prints its progress.
func runBatch(cmd *cobra.Command, client planexv1.SupervisorServiceClient, cf clientFlags, req *planexv1.RunBatchRequest, o batchOpts) error {
	out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
	dry := cloneBatch(req)
	dry.DryRun = true
	count, err := recvBatch(client, cmd, dry, func(*planexv1.RunBatchResponse) error { return nil })
	if err != nil {
		return rpcError(cf.addr, err)
	}
	n := count.GetMatched()
	if o.dryRun || n == 0 {
		if cf.json {
			return printJSON(out, count)
		}
		fmt.Fprintf(out, "%d runs selected\n", n)
		for _, id := range count.GetSampleRunIds() {
			fmt.Fprintln(out, id)
		}
		if n > int64(len(count.GetSampleRunIds())) {
			fmt.Fprintf(out, "… and %d more\n", n-int64(len(count.GetSampleRunIds())))
		}
		return nil
	}
	if !o.yes {
		if !confirmTerminal() {
			return &exitError{code: exitUsage, msg: fmt.Sprintf("%s %d runs: not confirmed; stdin is not a terminal to ask. Check them with --dry-run, then pass --yes (the server refuses the batch if the filter then selects another number of runs)", o.verb, n)}
		}
		fmt.Fprintf(errOut, "%d runs selected, e.g.:\n", n)
		for _, id := range count.GetSampleRunIds() {
			fmt.Fprintln(errOut, "  "+id)
		}
		fmt.Fprintf(errOut, "%s %d runs? Type %d to confirm: ", o.verb, n, n)
		line, err := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if strings.TrimSpace(line) != strconv.FormatInt(n, 10) {
			return &exitError{code: exitUsage, msg: "not confirmed: nothing was done"}
		}
	}
	req = cloneBatch(req)
	req.ExpectedCount = n
	last, err := recvBatch(client, cmd, req, func(m *planexv1.RunBatchResponse) error {
		if cf.json {
			return printJSONLine(out, m)
		}
		for _, it := range m.GetItems() {
			line := fmt.Sprintf("%s %s", it.GetRunId(), it.GetOutcome())
			if it.GetMessage() != "" {
				line += ": " + it.GetMessage()
			}
			fmt.Fprintln(out, line)
		}
		if !m.GetFinished() {
			fmt.Fprintf(errOut, "batch %s: %d/%d runs, %d failed\n", m.GetBatchId(), m.GetDone(), m.GetMatched(), m.GetFailed())
		}
		return nil
	})
	if err != nil {
		return rpcError(cf.addr, err)
	}
	if !last.GetFinished() {
		return &exitError{code: exitFailed, msg: fmt.Sprintf("batch %s: the stream ended before the batch finished (%d/%d runs); run it again with --batch-id %s", last.GetBatchId(), last.GetDone(), last.GetMatched(), last.GetBatchId())}
	}
	summary := fmt.Sprintf("batch %s: %d runs, %d failed", last.GetBatchId(), last.GetDone(), last.GetFailed())
	if last.GetFailed() > 0 {
		return &exitError{code: exitFailed, msg: summary + " (see the failed runs above; run again with --batch-id " + last.GetBatchId() + " once fixed)"}
	}
	if !cf.json {
		fmt.Fprintln(errOut, summary)
	}
	return nil
}

// recvBatch runs a RunBatch, calling fn with each message, and returns
// the last one.
func recvBatch(client planexv1.SupervisorServiceClient, cmd *cobra.Command, req *planexv1.RunBatchRequest, fn func(*planexv1.RunBatchResponse) error) (*planexv1.RunBatchResponse, error) {
	stream, err := client.RunBatch(cmd.Context(), req)
	if err != nil {
		return nil, err
	}
	last := &planexv1.RunBatchResponse{}
	for {
		m, err := stream.Recv()
		if isEOF(err) {
			return last, nil
		}
		if err != nil {
			return last, err
		}
		last = m
		if err := fn(m); err != nil {
			return last, err
		}
	}
}

func cloneBatch(req *planexv1.RunBatchRequest) *planexv1.RunBatchRequest { return proto.CloneOf(req) }

// printJSONLine prints m as one line of JSON.
func printJSONLine(w io.Writer, m *planexv1.RunBatchResponse) error {
	b, err := jsonLine.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode %T: %w", m, err)
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}
