package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// schedulesCmd manages schedules (ScheduleService): runs that start
// themselves on a cron expression or an interval.
func schedulesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "schedules",
		Short: "Manage schedules: runs started by cron expression or interval, exactly once per time (docs/schedules.md)",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(schedulesCreateCmd(), schedulesUpdateCmd(), schedulesListCmd(), schedulesGetCmd(),
		schedulesPauseCmd(true), schedulesPauseCmd(false), schedulesDeleteCmd(), schedulesBackfillCmd())
	return cmd
}

// schedulesCLI runs the subcommands of the supervisor's ScheduleService.
var schedulesCLI = serviceCLI[planexv1.ScheduleServiceClient]{newClient: planexv1.NewScheduleServiceClient, rpcError: scheduleRPCError}

// dialSchedules connects to the supervisor's ScheduleService (for
// `planex mcp`).
func dialSchedules(addr string) (planexv1.ScheduleServiceClient, func() error, error) {
	return dialService(addr, planexv1.NewScheduleServiceClient)
}

// scheduleFlags are the flags of `schedules create` and `schedules update`.
type scheduleFlags struct {
	description string
	cron        string
	every       time.Duration
	offset      time.Duration
	tz          string
	jitter      time.Duration
	goal        string
	inputs      []string
	labels      []string
	backend     string
	overlap     string
	catchUp     time.Duration
	paused      bool
}

func (f *scheduleFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.description, "description", "", "free text shown in listings")
	fs.StringVar(&f.cron, "cron", "", "cron expression: 5 fields (minute hour day-of-month month day-of-week), 6 with seconds first, or @daily, @hourly...")
	fs.DurationVar(&f.every, "every", 0, "fire at this interval instead of --cron (whole seconds, at least 1s), counted from the Unix epoch")
	fs.DurationVar(&f.offset, "offset", 0, "phase of --every (e.g. --every 1h --offset 15m fires at a quarter past)")
	fs.StringVar(&f.tz, "tz", "", "IANA time zone of --cron, e.g. Europe/Paris (default UTC)")
	fs.DurationVar(&f.jitter, "jitter", 0, "delay each firing by a stable pseudo-random duration below this")
	fs.StringVar(&f.goal, "goal", "", "goal of every run the schedule starts (required on create)")
	fs.StringArrayVar(&f.inputs, "input", nil, "input of every run, key=value; a JSON value is parsed, anything else is a string (repeatable)")
	fs.StringArrayVar(&f.labels, "label", nil, "label of every run, key=value (repeatable)")
	fs.StringVar(&f.backend, "backend", "", "planner backend of every run (when the planner allows overrides)")
	fs.StringVar(&f.overlap, "overlap", "skip", "what a firing does while the schedule's earlier run has not finished: skip, buffer-one, allow-all or cancel-other")
	fs.DurationVar(&f.catchUp, "catch-up", 0, "after downtime, fire missed times at most this late (default 1m); older ones are recorded as skipped")
	fs.BoolVar(&f.paused, "paused", false, "create the schedule paused")
}

// parseOverlap parses --overlap.
func parseOverlap(flag, s string) (planexv1.ScheduleOverlapPolicy, error) {
	switch strings.ToLower(strings.ReplaceAll(s, "_", "-")) {
	case "skip":
		return planexv1.ScheduleOverlapPolicy_SCHEDULE_OVERLAP_POLICY_SKIP, nil
	case "buffer-one":
		return planexv1.ScheduleOverlapPolicy_SCHEDULE_OVERLAP_POLICY_BUFFER_ONE, nil
	case "allow-all":
		return planexv1.ScheduleOverlapPolicy_SCHEDULE_OVERLAP_POLICY_ALLOW_ALL, nil
	case "cancel-other":
		return planexv1.ScheduleOverlapPolicy_SCHEDULE_OVERLAP_POLICY_CANCEL_OTHER, nil
	case "":
		return planexv1.ScheduleOverlapPolicy_SCHEDULE_OVERLAP_POLICY_UNSPECIFIED, nil
	}
	return 0, fmt.Errorf("%s %q: want skip, buffer-one, allow-all or cancel-other", flag, s)
}

// parseInputs parses --input key=value pairs into a Struct.
func parseInputs(pairs []string) (*structpb.Struct, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	m := map[string]any{}
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--input %q: want key=value", p)
		}
		var parsed any
		if err := json.Unmarshal([]byte(v), &parsed); err == nil {
			m[k] = parsed
		} else {
			m[k] = v
		}
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		return nil, fmt.Errorf("--input: %w", err)
	}
	return s, nil
}

// apply sets the schedule fields of the flags given (changed reports the
// flags set on the command line; every one on create).
func (f *scheduleFlags) apply(sc *planexv1.Schedule, changed func(string) bool) error {
	if sc.Spec == nil {
		sc.Spec = &planexv1.ScheduleSpec{}
	}
	if sc.Action == nil {
		sc.Action = &planexv1.ScheduleAction{}
	}
	if changed("cron") && changed("every") && f.cron != "" && f.every != 0 {
		return errors.New("--cron and --every: give one")
	}
	if changed("cron") && f.cron != "" {
		sc.Spec.Cron, sc.Spec.Interval, sc.Spec.Offset = f.cron, nil, nil
	}
	if changed("every") && f.every != 0 {
		sc.Spec.Cron, sc.Spec.TimeZone, sc.Spec.Interval = "", "", durationpb.New(f.every)
	}
	if changed("offset") && f.offset != 0 {
		sc.Spec.Offset = durationpb.New(f.offset)
	}
	if changed("tz") {
		sc.Spec.TimeZone = f.tz
	}
	if changed("jitter") {
		sc.Spec.Jitter = durationpb.New(f.jitter)
	}
	if changed("description") {
		sc.Description = f.description
	}
	if changed("goal") {
		sc.Action.Goal = f.goal
	}
	if changed("input") {
		in, err := parseInputs(f.inputs)
		if err != nil {
			return err
		}
		sc.Action.Inputs = in
	}
	if changed("label") {
		l, err := parseLabels(f.labels)
		if err != nil {
			return err
		}
		sc.Action.Labels = l
	}
	if changed("backend") {
		sc.Action.PlannerBackend = f.backend
	}
	if changed("overlap") {
		p, err := parseOverlap("--overlap", f.overlap)
		if err != nil {
			return err
		}
		sc.OverlapPolicy = p
	}
	if changed("catch-up") && f.catchUp != 0 {
		sc.CatchUpWindow = durationpb.New(f.catchUp)
	}
	return nil
}

// scheduleFlagOfField maps schedule fields to the flags setting them.
var scheduleFlagOfField = []struct{ field, flag string }{
	{"spec.cron", "--cron"}, {"spec.time_zone", "--tz"}, {"spec.interval", "--every"}, {"spec.offset", "--offset"},
	{"spec.jitter", "--jitter"}, {"spec:", "--cron or --every:"}, {"action.goal", "--goal"}, {"action.labels", "--label"},
	{"catch_up_window", "--catch-up"}, {"description", "--description"}, {"start_time", "--from"}, {"end_time", "--to"},
	{"overlap_policy", "--overlap"},
}

// scheduleRPCError explains a ScheduleService error, naming flags: nil
// for nil, an error that is not a gRPC status unchanged.
func scheduleRPCError(addr string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.InvalidArgument:
		msg := st.Message()
		for _, m := range scheduleFlagOfField {
			msg = strings.ReplaceAll(msg, m.field, m.flag+" ("+m.field+")")
		}
		return errors.New(msg)
	case codes.PermissionDenied:
		return fmt.Errorf("permission denied by the supervisor at %s: reading schedules needs the viewer role, changing them the runner role: %s", addr, st.Message())
	case codes.NotFound, codes.AlreadyExists, codes.Aborted:
		return errors.New(st.Message())
	case codes.Unimplemented:
		return fmt.Errorf("the supervisor at %s does not serve schedules (an earlier release)", addr)
	}
	return rpcError(addr, err)
}

func schedulesCreateCmd() *cobra.Command {
	var of outputFlags
	var f scheduleFlags
	cmd := &cobra.Command{
		Use:   "create ID",
		Short: "Create a schedule (--cron or --every, and --goal)",
		Example: `  planex schedules create nightly-report --cron "0 6 * * MON-FRI" --tz Europe/Paris --goal "mail the sales report" --overlap skip
  planex schedules create heartbeat --every 5m --jitter 30s --goal "check the queue depth" --label team=ops`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sc := &planexv1.Schedule{Id: args[0], Paused: f.paused}
			check := func() error {
				if f.cron == "" && f.every == 0 {
					return errors.New("--cron or --every: required")
				}
				if f.goal == "" {
					return errors.New("--goal: required")
				}
				return f.apply(sc, func(string) bool { return true })
			}
			return schedulesCLI.run(cmd, &of, check, func(ctx context.Context, client planexv1.ScheduleServiceClient, asJSON bool) error {
				resp, err := client.CreateSchedule(ctx, &planexv1.CreateScheduleRequest{Schedule: sc})
				if err != nil {
					return err
				}
				return printSchedule(cmd.OutOrStdout(), resp.GetSchedule(), asJSON)
			})
		},
	}
	of.register(cmd.Flags())
	f.register(cmd.Flags())
	return cmd
}

func schedulesUpdateCmd() *cobra.Command {
	var of outputFlags
	var f scheduleFlags
	cmd := &cobra.Command{
		Use:   "update ID",
		Short: "Change a schedule: only the flags given change (compare-and-set: a concurrent change is refused)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return schedulesCLI.run(cmd, &of, nil, func(ctx context.Context, client planexv1.ScheduleServiceClient, asJSON bool) error {
				got, err := client.GetSchedule(ctx, &planexv1.GetScheduleRequest{Id: args[0]})
				if err != nil {
					return err
				}
				sc := got.GetSchedule()
				if err := f.apply(sc, cmd.Flags().Changed); err != nil {
					return err
				}
				resp, err := client.UpdateSchedule(ctx, &planexv1.UpdateScheduleRequest{Schedule: sc, Revision: sc.GetRevision()})
				if err != nil {
					return err
				}
				return printSchedule(cmd.OutOrStdout(), resp.GetSchedule(), asJSON)
			})
		},
	}
	of.register(cmd.Flags())
	f.register(cmd.Flags())
	return cmd
}

func schedulesListCmd() *cobra.Command {
	var of outputFlags
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List schedules with their next and last firings",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return schedulesCLI.run(cmd, &of, nil, func(ctx context.Context, client planexv1.ScheduleServiceClient, asJSON bool) error {
				resp, err := client.ListSchedules(ctx, &planexv1.ListSchedulesRequest{})
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), resp)
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tSPEC\tOVERLAP\tSTATE\tNEXT\tLAST")
				for _, sc := range resp.GetSchedules() {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", sc.GetId(), specText(sc.GetSpec()), overlapText(sc.GetOverlapPolicy()),
						stateText(sc), nextText(sc), lastText(sc))
				}
				return tw.Flush()
			})
		},
	}
	of.register(cmd.Flags())
	return cmd
}

func schedulesGetCmd() *cobra.Command {
	var of outputFlags
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Show a schedule, its next firings and its recent firings",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return schedulesCLI.run(cmd, &of, nil, func(ctx context.Context, client planexv1.ScheduleServiceClient, asJSON bool) error {
				resp, err := client.GetSchedule(ctx, &planexv1.GetScheduleRequest{Id: args[0]})
				if err != nil {
					return err
				}
				return printSchedule(cmd.OutOrStdout(), resp.GetSchedule(), asJSON)
			})
		},
	}
	of.register(cmd.Flags())
	return cmd
}

// schedulesPauseCmd is `schedules pause` (pause) or `schedules resume`.
func schedulesPauseCmd(pause bool) *cobra.Command {
	var of outputFlags
	var note string
	use, short := "resume ID", "Resume a paused schedule: it fires from the next time on (times of the pause never fire)"
	if pause {
		use, short = "pause ID", "Pause a schedule: it fires nothing until resumed"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return schedulesCLI.run(cmd, &of, nil, func(ctx context.Context, client planexv1.ScheduleServiceClient, asJSON bool) error {
				var sc *planexv1.Schedule
				if pause {
					resp, err := client.PauseSchedule(ctx, &planexv1.PauseScheduleRequest{Id: args[0], Note: note})
					if err != nil {
						return err
					}
					sc = resp.GetSchedule()
				} else {
					resp, err := client.ResumeSchedule(ctx, &planexv1.ResumeScheduleRequest{Id: args[0], Note: note})
					if err != nil {
						return err
					}
					sc = resp.GetSchedule()
				}
				return printSchedule(cmd.OutOrStdout(), sc, asJSON)
			})
		},
	}
	of.register(cmd.Flags())
	cmd.Flags().StringVar(&note, "note", "", "why, shown with the schedule")
	return cmd
}

func schedulesDeleteCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "delete ID",
		Short: "Delete a schedule (the runs it started stay)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return schedulesCLI.do(cmd, cf.addr, func(ctx context.Context, client planexv1.ScheduleServiceClient) error {
				if _, err := client.DeleteSchedule(ctx, &planexv1.DeleteScheduleRequest{Id: args[0]}); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "schedule %s deleted\n", args[0])
				return nil
			})
		},
	}
	cf.register(cmd.Flags())
	return cmd
}

func schedulesBackfillCmd() *cobra.Command {
	var of outputFlags
	var from, to, overlap string
	cmd := &cobra.Command{
		Use:     "backfill ID --from TIME --to TIME",
		Short:   "Fire the schedule's times in [--from, --to) now, each once (a time that already ran finds its run)",
		Example: `  planex schedules backfill nightly-report --from 2026-11-01T00:00:00Z --to 2026-11-08T00:00:00Z --overlap buffer-one`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &planexv1.BackfillScheduleRequest{Id: args[0]}
			check := func() error { return backfillRange(req, from, to, overlap) }
			return schedulesCLI.run(cmd, &of, check, func(ctx context.Context, client planexv1.ScheduleServiceClient, asJSON bool) error {
				resp, err := client.BackfillSchedule(ctx, req)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), resp)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "schedule %s: %d time(s) to backfill\n", args[0], resp.GetFirings())
				return nil
			})
		},
	}
	of.register(cmd.Flags())
	cmd.Flags().StringVar(&from, "from", "", "first time of the range, RFC 3339 (inclusive)")
	cmd.Flags().StringVar(&to, "to", "", "end of the range, RFC 3339 (exclusive)")
	cmd.Flags().StringVar(&overlap, "overlap", "", "overlap policy of the backfill: skip, buffer-one (one after the other), allow-all, cancel-other (default: the schedule's)")
	return cmd
}

// backfillRange sets the range and overlap policy of req from
// `schedules backfill --from, --to and --overlap`.
func backfillRange(req *planexv1.BackfillScheduleRequest, from, to, overlap string) error {
	start, err := time.Parse(time.RFC3339, from)
	if err != nil {
		return fmt.Errorf("--from %q: want an RFC 3339 time like 2026-11-01T00:00:00Z", from)
	}
	end, err := time.Parse(time.RFC3339, to)
	if err != nil {
		return fmt.Errorf("--to %q: want an RFC 3339 time like 2026-11-08T00:00:00Z", to)
	}
	p, err := parseOverlap("--overlap", overlap)
	if err != nil {
		return err
	}
	req.StartTime, req.EndTime, req.OverlapPolicy = timestamppb.New(start), timestamppb.New(end), p
	return nil
}

func specText(s *planexv1.ScheduleSpec) string {
	var out string
	if s.GetCron() != "" {
		out = s.GetCron()
		if s.GetTimeZone() != "" {
			out += " " + s.GetTimeZone()
		}
	} else {
		out = "every " + s.GetInterval().AsDuration().String()
		if o := s.GetOffset().AsDuration(); o > 0 {
			out += " +" + o.String()
		}
	}
	if j := s.GetJitter().AsDuration(); j > 0 {
		out += " ~" + j.String()
	}
	return out
}

func overlapText(p planexv1.ScheduleOverlapPolicy) string {
	if p == planexv1.ScheduleOverlapPolicy_SCHEDULE_OVERLAP_POLICY_UNSPECIFIED {
		return "skip"
	}
	return strings.ReplaceAll(statusName(p, "SCHEDULE_OVERLAP_POLICY_"), "_", "-")
}

func stateText(sc *planexv1.Schedule) string {
	if sc.GetPaused() {
		return "paused"
	}
	return "active"
}

func nextText(sc *planexv1.Schedule) string {
	if n := sc.GetNextFirings(); len(n) > 0 {
		return n[0].AsTime().UTC().Format(time.RFC3339)
	}
	return "-"
}

func lastText(sc *planexv1.Schedule) string {
	if f := sc.GetRecentFirings(); len(f) > 0 {
		return firingText(f[0])
	}
	return "-"
}

func firingText(f *planexv1.ScheduleFiring) string {
	s := f.GetNominalTime().AsTime().UTC().Format(time.RFC3339) + " " + statusName(f.GetOutcome(), "SCHEDULE_FIRING_OUTCOME_")
	if f.GetRunId() != "" {
		s += " " + f.GetRunId()
	}
	if f.GetReason() != "" {
		s += " (" + oneLineText(f.GetReason(), 80) + ")"
	}
	if f.GetBackfill() {
		s += " [backfill]"
	}
	return s
}

// printSchedule shows one schedule.
func printSchedule(w io.Writer, sc *planexv1.Schedule, asJSON bool) error {
	if asJSON {
		return printJSON(w, sc)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "id:\t%s\n", sc.GetId())
	if sc.GetDescription() != "" {
		fmt.Fprintf(tw, "description:\t%s\n", sc.GetDescription())
	}
	fmt.Fprintf(tw, "spec:\t%s\n", specText(sc.GetSpec()))
	fmt.Fprintf(tw, "goal:\t%s\n", sc.GetAction().GetGoal())
	fmt.Fprintf(tw, "overlap:\t%s\n", overlapText(sc.GetOverlapPolicy()))
	if w := sc.GetCatchUpWindow().AsDuration(); w > 0 {
		fmt.Fprintf(tw, "catch-up:\t%s\n", w)
	}
	state := stateText(sc)
	if sc.GetNote() != "" {
		state += " (" + sc.GetNote() + ")"
	}
	fmt.Fprintf(tw, "state:\t%s\n", state)
	var next []string
	for _, n := range sc.GetNextFirings() {
		next = append(next, n.AsTime().UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(tw, "next:\t%s\n", orDash(strings.Join(next, ", ")))
	if len(sc.GetRunningRunIds()) > 0 {
		fmt.Fprintf(tw, "running:\t%s\n", strings.Join(sc.GetRunningRunIds(), ", "))
	}
	if b := sc.GetBufferedFiring(); b != nil {
		fmt.Fprintf(tw, "buffered:\t%s\n", b.AsTime().UTC().Format(time.RFC3339))
	}
	if n := sc.GetBackfillRemaining(); n > 0 {
		fmt.Fprintf(tw, "backfill:\t%d time(s) left\n", n)
	}
	fmt.Fprintf(tw, "revision:\t%d\n", sc.GetRevision())
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(sc.GetRecentFirings()) > 0 {
		fmt.Fprintln(w, "recent firings:")
		for _, f := range sc.GetRecentFirings() {
			fmt.Fprintf(w, "  %s\n", firingText(f))
		}
	}
	return nil
}
