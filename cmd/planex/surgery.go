package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// surgeryFlags are the flags reset and fork share.
type surgeryFlags struct {
	fromStep  string
	at        uint64
	reason    string
	replan    bool
	args      []string // step=JSON
	maxSteps  int32
	deadline  time.Duration
	requestID string
	dryRun    bool
	wait      bool
}

func (f *surgeryFlags) register(cmd *cobra.Command, atName, atHelp string) {
	fs := cmd.Flags()
	fs.StringVar(&f.fromStep, "from-step", "", "run this step and every step that depends on it again")
	fs.Uint64Var(&f.at, atName, 0, atHelp)
	fs.StringVar(&f.reason, "reason", "", "why (recorded in the run log)")
	fs.BoolVar(&f.replan, "replan", false, "send the run to the planner instead of running the same steps again")
	fs.StringArrayVar(&f.args, "args", nil, `new arguments of a step that runs again: STEP='{"json":"object"}' (repeatable)`)
	fs.Int32Var(&f.maxSteps, "max-steps", 0, "budget: maximum step attempts (0 keeps the run's)")
	fs.DurationVar(&f.deadline, "deadline", 0, "budget: wall-clock limit, from now (0 keeps the run's)")
	fs.StringVar(&f.requestID, "request-id", "", "client-chosen id: repeating the command with it does not do it twice")
	fs.BoolVar(&f.dryRun, "dry-run", false, "only show what would run again and what is kept")
	fs.BoolVar(&f.wait, "wait", false, "follow the run until it stops (exit code as for `planex run`)")
}

// stepArgs parses --args STEP=JSON flags.
func (f *surgeryFlags) stepArgs() (map[string]*structpb.Struct, error) {
	out := map[string]*structpb.Struct{}
	for _, a := range f.args {
		id, raw, ok := strings.Cut(a, "=")
		if !ok || id == "" {
			return nil, fmt.Errorf("--args %q: want STEP='{\"field\": value}'", a)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			return nil, fmt.Errorf("--args %s: not a JSON object: %v", id, err)
		}
		s, err := structpb.NewStruct(m)
		if err != nil {
			return nil, fmt.Errorf("--args %s: %v", id, err)
		}
		if _, dup := out[id]; dup {
			return nil, fmt.Errorf("--args %s: given twice", id)
		}
		out[id] = s
	}
	return out, nil
}

func (f *surgeryFlags) budget() *planexv1.Budget {
	if f.maxSteps == 0 && f.deadline == 0 {
		return nil
	}
	b := &planexv1.Budget{MaxSteps: f.maxSteps}
	if f.deadline > 0 {
		b.Deadline = durationpb.New(f.deadline)
	}
	return b
}

func runsResetCmd() *cobra.Command {
	var (
		cf      clientFlags
		sf      surgeryFlags
		unknown []string
	)
	cmd := &cobra.Command{
		Use:   "reset RUN_ID",
		Short: "Re-open a finished run: run its failed steps (or a step and its dependents) again, keeping what succeeded",
		Long: `Reset re-opens a finished run. Without --from-step or --to-event, the steps that did
not succeed run again (the repair after a broken tool was fixed). Steps that
succeeded keep their results and are not executed again; a step whose side
effect happened (a WRITE or EXTERNAL tool that succeeded) is never executed
again by a reset. A step whose outcome is unknown needs --unknown STEP=retry
(run it again, accepting its effect may happen twice) or STEP=done (it
happened). Needs the operator role.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if sf.reason == "" && !sf.dryRun {
				return fmt.Errorf("--reason is required: say why the run is reset (it is recorded in the run log)")
			}
			stepArgs, err := sf.stepArgs()
			if err != nil {
				return err
			}
			decisions, err := unknownDecisions(unknown)
			if err != nil {
				return err
			}
			client, closeConn, err := dial(cf.addr)
			if err != nil {
				return err
			}
			defer closeConn()
			reason := sf.reason
			if reason == "" {
				reason = "dry run"
			}
			resp, err := client.ResetRun(cmd.Context(), &planexv1.ResetRunRequest{
				RunId: args[0], ToSequence: sf.at, FromStep: sf.fromStep, Reason: reason, Replan: sf.replan,
				StepArgs: stepArgs, UnknownOutcomes: decisions, Budget: sf.budget(), RequestId: sf.requestID,
				DryRun: sf.dryRun, Actor: actorName(),
			})
			if err != nil {
				return rpcError(cf.addr, err)
			}
			if cf.json && !sf.wait {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			w := cmd.OutOrStdout()
			verb := "reset"
			if resp.GetDryRun() {
				verb = "would reset"
			}
			fmt.Fprintf(w, "run %s %s: runs again %s; keeps %s\n", args[0], verb, idList(resp.GetRerun()), idList(resp.GetKept()))
			if se := resp.GetKeptSideEffects(); len(se) > 0 {
				fmt.Fprintf(w, "  side effects that happened are kept, not repeated: %s\n", strings.Join(se, ", "))
			}
			if resp.GetDryRun() || !sf.wait {
				return nil
			}
			return followToEnd(cmd, client, cf.addr, args[0], resp.GetRun().GetLastSequence()+1)
		},
	}
	cf.register(cmd.Flags())
	sf.register(cmd, "to-event", "go back to the state after this event of the run's log (see `planex runs watch --json`)")
	cmd.Flags().StringArrayVar(&unknown, "unknown", nil, "decision for a step whose outcome is unknown: STEP=retry or STEP=done (repeatable)")
	return cmd
}

func runsForkCmd() *cobra.Command {
	var (
		cf     cliForkFlags
		sf     surgeryFlags
		labels []string
	)
	cmd := &cobra.Command{
		Use:   "fork RUN_ID",
		Short: "Start a new run from another run's history, with edited arguments, goal or inputs",
		Long: `Fork starts a new run that shares another run's history up to a point: the
steps that succeeded by then are not executed again; the others (and
--from-step with its dependents) run in the new run, with --args edits.
Both runs are linked. Needs the operator role.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			stepArgs, err := sf.stepArgs()
			if err != nil {
				return err
			}
			lm, err := parseLabels(labels)
			if err != nil {
				return err
			}
			var inputs *structpb.Struct
			if cf.inputs != "" {
				var m map[string]any
				if err := json.Unmarshal([]byte(cf.inputs), &m); err != nil {
					return fmt.Errorf("--inputs: not a JSON object: %v", err)
				}
				if inputs, err = structpb.NewStruct(m); err != nil {
					return fmt.Errorf("--inputs: %v", err)
				}
			}
			client, closeConn, err := dial(cf.addr)
			if err != nil {
				return err
			}
			defer closeConn()
			resp, err := client.ForkRun(cmd.Context(), &planexv1.ForkRunRequest{
				RunId: args[0], AtSequence: sf.at, FromStep: sf.fromStep, Goal: cf.goal, Inputs: inputs,
				StepArgs: stepArgs, Labels: lm, Reason: sf.reason, Replan: sf.replan, Budget: sf.budget(),
				RequestId: sf.requestID, DryRun: sf.dryRun,
			})
			if err != nil {
				return rpcError(cf.addr, err)
			}
			if cf.json && !sf.wait {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			w := cmd.OutOrStdout()
			if resp.GetDryRun() {
				fmt.Fprintf(w, "a fork of run %s would share %s and run %s\n", args[0], idList(resp.GetShared()), idList(resp.GetRerun()))
				return nil
			}
			fmt.Fprintf(w, "run %s forked from %s: shares %s; runs %s\n", resp.GetRun().GetId(), args[0], idList(resp.GetShared()), idList(resp.GetRerun()))
			if !sf.wait {
				return nil
			}
			return followToEnd(cmd, client, cf.addr, resp.GetRun().GetId(), 0)
		},
	}
	cf.register(cmd.Flags())
	cmd.Flags().StringVar(&cf.goal, "goal", "", "the fork's goal (default: the original's)")
	cmd.Flags().StringVar(&cf.inputs, "inputs", "", "the fork's inputs as a JSON object (default: the original's)")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "label of the fork, key=value (repeatable; added to the original's)")
	sf.register(cmd, "at-event", "share the history up to and including this event of the run's log")
	return cmd
}

// cliForkFlags are the client flags of fork and its goal and inputs.
type cliForkFlags struct {
	clientFlags
	goal, inputs string
}

// unknownDecisions parses --unknown STEP=retry|done.
func unknownDecisions(in []string) ([]*planexv1.UnknownOutcome, error) {
	var out []*planexv1.UnknownOutcome
	for _, u := range in {
		id, action, ok := strings.Cut(u, "=")
		if !ok || id == "" {
			return nil, fmt.Errorf("--unknown %q: want STEP=retry or STEP=done", u)
		}
		d := &planexv1.UnknownOutcome{StepId: id}
		switch strings.ToLower(action) {
		case "retry":
			d.Action = planexv1.UnknownOutcomeAction_UNKNOWN_OUTCOME_ACTION_RETRY
		case "done":
			d.Action = planexv1.UnknownOutcomeAction_UNKNOWN_OUTCOME_ACTION_DONE
		default:
			return nil, fmt.Errorf("--unknown %s=%s: want retry (run it again) or done (it happened)", id, action)
		}
		out = append(out, d)
	}
	return out, nil
}

// followToEnd follows a run until it stops; a run that did not succeed
// exits non-zero, as `planex run` does.
func followToEnd(cmd *cobra.Command, client planexv1.SupervisorServiceClient, addr, runID string, from uint64) error {
	view := &liveView{w: cmd.OutOrStdout(), tty: stdoutIsTerminal()}
	final, err := follow(cmd.Context(), client, addr, runID, from, view)
	if err != nil {
		return err
	}
	view.final(final)
	if code := runExitCode(final); code != exitOK {
		return &exitError{code: code, msg: runOutcome(final)}
	}
	return nil
}

func idList(ids []string) string {
	if len(ids) == 0 {
		return "nothing"
	}
	return strings.Join(ids, ", ")
}

// actorName is who the CLI records as the actor: $USER, when set.
func actorName() string { return os.Getenv("USER") }
