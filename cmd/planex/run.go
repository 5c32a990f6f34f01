package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/planex-dev/planex/cmd/internal/devstack"
	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/telemetry"
)

func runCmd() *cobra.Command {
	var (
		cf       clientFlags
		dev      devFlags
		useDev   bool
		labels   []string
		idemKey  string
		nextStep bool
		backend  string
		yes      bool
	)
	cmd := &cobra.Command{
		Use:   `run [flags] "<goal>"`,
		Short: "Start a run and follow it live until it stops",
		Long: `Start a run for a goal on a supervisor and show it live: the plan as a tree,
each step's state and duration, replans and the result.

With --dev the whole planex stack starts in this process for this one run
(embedded NATS, SQLite demo database, search index, local outbox), on
--data-dir. When a planex dev already serves that directory, the run goes to
it instead; when another planex run --dev holds it, this one stops at once
with "data dir ... in use by pid N; use --data-dir".

Exit codes: 0 succeeded; 1 could not talk to the server or bad usage;
3 failed; 4 escalated or waiting for a decision; 5 cancelled, deadline or
budget exceeded.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 || strings.TrimSpace(args[0]) == "" {
				return usageError(cmd, "want exactly one goal argument, quoted")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			lbls, err := parseLabels(labels)
			if err != nil {
				return usageError(cmd, "%v", err)
			}
			ctx := cmd.Context()
			addr := cf.addr
			ownDataDir := "" // the data directory of a dev stack this command runs
			if useDev {
				// A real tracer provider gives the run a trace id; spans
				// are exported only when OTEL_EXPORTER_OTLP_ENDPOINT is set.
				r, err := dev.redactor()
				if err != nil {
					return usageError(cmd, "%v", err)
				}
				t, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: "planex-dev", Version: version, Redactor: r})
				if err != nil {
					return err
				}
				defer func() {
					// Flush the run's spans (its root is written when it
					// finished) before the process exits.
					sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
					defer cancel()
					if serr := t.Shutdown(sctx); serr != nil {
						err = errors.Join(err, serr)
					}
				}()
				stack, err := startDevStack(ctx, dev, "run", "127.0.0.1:0", cmd.ErrOrStderr(), slog.LevelError)
				var inUse *devstack.InUseError
				switch {
				case errors.As(err, &inUse) && inUse.Holder.Command == "dev" && inUse.Holder.Addr != "":
					// A planex dev serves this data directory: run there.
					fmt.Fprintf(cmd.ErrOrStderr(), "data dir %s is served by planex dev (pid %d); running on it at %s\n", inUse.Dir, inUse.Holder.PID, inUse.Holder.Addr)
					addr = inUse.Holder.Addr
				case errors.As(err, &inUse) && inUse.Holder.Command == "dev":
					// A planex dev is still starting there: run on it once
					// it serves (its executor pools registered).
					fmt.Fprintf(cmd.ErrOrStderr(), "data dir %s: planex dev (pid %d) is starting; waiting for it to serve\n", inUse.Dir, inUse.Holder.PID)
					h, werr := devstack.WaitServing(ctx, inUse.Dir, devstack.ServeWait)
					if werr != nil {
						return werr
					}
					addr = h.Addr
				case err != nil:
					return err
				default:
					defer func() {
						if serr := stopDevStack(ctx, stack); serr != nil && err == nil {
							err = serr
						}
					}()
					addr, ownDataDir = stack.Addr, stack.DataDir
					if !cf.json {
						fmt.Fprintf(cmd.ErrOrStderr(), "dev stack in %s (auto-approves %s; planex outbox lists the mail)\n", stack.DataDir, strings.Join(devstack.AutoApprove, ", "))
					}
				}
			}
			req := &planexv1.StartRunRequest{
				Goal:           args[0],
				Labels:         lbls,
				IdempotencyKey: idemKey,
				PlannerBackend: backend,
			}
			if nextStep {
				req.Mode = planexv1.PlanningMode_PLANNING_MODE_NEXT_STEP
			}
			err = runGoal(ctx, addr, req, cf.json, yes, cmd.OutOrStdout(), cmd.ErrOrStderr())
			if ownDataDir != "" {
				err = devStoppedOutcome(err, ownDataDir)
			}
			return err
		},
	}
	cf.register(cmd.Flags())
	dev.register(cmd.Flags(), "run-dev")
	cmd.Flags().BoolVar(&useDev, "dev", false, "start the dev stack in this process for this run")
	cmd.Flags().StringArrayVar(&labels, "label", nil, "label the run with key=value (repeatable)")
	cmd.Flags().StringVar(&idemKey, "idempotency-key", "", "start at most one run for this key")
	cmd.Flags().BoolVar(&nextStep, "next-step", false, "plan one step at a time instead of a full plan")
	cmd.Flags().StringVar(&backend, "backend", "", "planner backend for this run (when the planner allows overrides)")
	cmd.Flags().BoolVar(&yes, "yes", false, "approve this run's gates as they open, on your behalf (recorded as \"run --yes\"; needs a server that lets you approve your own runs)")
	return cmd
}

// runGoal starts a run and follows it until it ends (or waits for a
// decision), printing the live view or, with asJSON, only the final Run.
func runGoal(ctx context.Context, addr string, req *planexv1.StartRunRequest, asJSON, yes bool, stdout, stderr io.Writer) error {
	client, closeConn, err := dial(addr)
	if err != nil {
		return err
	}
	defer closeConn()
	started, err := client.StartRun(ctx, req)
	if err != nil {
		return rpcError(addr, err)
	}
	run := started.GetRun()
	view := &liveView{w: stdout, tty: !asJSON && stdoutIsTerminal()}
	if asJSON {
		view.w = io.Discard
	} else {
		fmt.Fprintf(stderr, "run %s started (trace %s)\n", run.GetId(), run.GetTraceId())
	}
	var final *planexv1.Run
	switch {
	case yes:
		final, err = followApproving(ctx, client, addr, run.GetId(), view, stderr)
	case !asJSON && interactive():
		// At a terminal, gates are decided here as they open.
		final, err = followInteractive(ctx, client, addr, run.GetId(), view, newPrompter(os.Stdin, stdout))
	default:
		final, err = follow(ctx, client, addr, run.GetId(), 0, view)
	}
	if err != nil {
		return err
	}
	if asJSON {
		if err := printJSON(stdout, final); err != nil {
			return err
		}
	} else {
		view.final(final)
	}
	if code := runExitCode(final); code != exitOK {
		return &exitError{code: code, msg: runOutcome(final), run: final}
	}
	return nil
}

// follow watches a run from sequence from until its final event or until it
// waits for a decision, and returns the run's state then.
func follow(ctx context.Context, client planexv1.SupervisorServiceClient, addr, runID string, from uint64, view *liveView) (*planexv1.Run, error) {
	stream, err := client.WatchRun(ctx, &planexv1.WatchRunRequest{RunId: runID, FromSequence: from})
	if err != nil {
		return nil, rpcError(addr, err)
	}
	for {
		resp, err := stream.Recv()
		if isEOF(err) {
			break
		}
		if err != nil {
			return nil, rpcError(addr, err)
		}
		ev := resp.GetEvent()
		if ev.GetFinished() != nil {
			view.event(ev, nil)
			break
		}
		// The folded run is needed only to redraw the tree, and to learn
		// whether an opened gate left the run waiting.
		var run *planexv1.Run
		if view.tty || ev.GetGateOpened() != nil {
			got, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: runID})
			if err != nil {
				return nil, rpcError(addr, err)
			}
			run = got.GetRun()
		}
		view.event(ev, run)
		if run.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING {
			return run, nil
		}
	}
	got, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: runID})
	if err != nil {
		return nil, rpcError(addr, err)
	}
	return got.GetRun(), nil
}

// runOutcome is the one-line summary of a run that did not succeed.
func runOutcome(r *planexv1.Run) string {
	if r.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING {
		for _, g := range r.GetGates() {
			if g.GetKind() == planexv1.GateKind_GATE_KIND_INPUT && g.GetDecision() == planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED {
				return fmt.Sprintf("run %s is waiting for an answer: %s (planex runs answer %s)", r.GetId(), g.GetInput().GetQuestion(), r.GetId())
			}
		}
		return fmt.Sprintf("run %s is waiting for a decision (planex runs get %s)", r.GetId(), r.GetId())
	}
	return fmt.Sprintf("run %s %s", r.GetId(), statusAndReason(r.GetStatus(), r.GetStopReason()))
}
