package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/cassette"
	"github.com/planex-dev/planex/internal/telemetry"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/engine"
)

func replayCmd() *cobra.Command {
	var (
		sf          storeFlags
		toolsFile   string
		autoApprove []string
		s2s         time.Duration
	)
	cmd := &cobra.Command{
		Use:   "replay RUN_ID|FILE",
		Short: "Decide a recorded run again with this engine and report the first divergence",
		Long: `Re-fold a run's log and decide it again with the engine code of this binary,
like Temporal's replayer: after every event that came from outside (creation,
planner answers, executor results, timers, gate decisions) the engine advances
the run at the recorded time, and what it emits must equal the events recorded
next. The first difference is reported with the differing fields (exit 3).

RUN_ID reads the stored log from NATS (--nats-url and credentials); FILE is an
export made with planex runs export --no-redact. Decisions depend on the tool
catalog (read from planex-tools unless --tools FILE) and on the supervisor's
--auto-approve and --default-schedule-to-start-timeout: give the values the
run was decided with (planex dev auto-approves email.send).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			ctx := cmd.Context()
			// Traced like every command: a "replay" span, exported where
			// OTEL_EXPORTER_OTLP_ENDPOINT (and the other OTEL_ variables)
			// say; replaying writes none of the run's own spans again.
			t, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: "planex-replay", Version: version})
			if err != nil {
				return err
			}
			defer func() {
				sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				if serr := t.Shutdown(sctx); serr != nil {
					err = errors.Join(err, serr)
				}
			}()
			ctx, span := otel.Tracer("github.com/planex-dev/planex/cmd/planex").Start(ctx, "replay", trace.WithAttributes(attribute.String("planex.replay.source", args[0])))
			defer func() {
				if err != nil {
					span.SetStatus(codes.Error, err.Error())
				}
				span.End()
			}()
			events, redacted, err := loadEvents(ctx, &sf, args[0])
			if err != nil {
				return err
			}
			for i, r := range redacted {
				if r {
					return fmt.Errorf("%s: event %d was redacted on export; replay needs the stored log (RUN_ID) or an export made with --no-redact", args[0], events[i].GetSequence())
				}
			}
			tools, err := replayTools(ctx, &sf, toolsFile)
			if err != nil {
				return err
			}
			res, err := engine.Replay(ctx, events, engine.ReplayConfig{Tools: tools, AutoApprove: autoApprove, ScheduleToStartTimeout: s2s})
			if err != nil {
				return err
			}
			span.SetAttributes(attribute.String("planex.run_id", events[0].GetRunId()), attribute.Int("planex.replay.events", res.Events),
				attribute.Int("planex.replay.decisions", res.Decisions), attribute.Bool("planex.replay.diverged", res.Divergence != nil))
			if d := res.Divergence; d != nil {
				return &exitError{code: exitFailed, msg: fmt.Sprintf("run %s: %v", events[0].GetRunId(), d)}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "run %s: %d events replayed, %d decisions made again identically\n", events[0].GetRunId(), res.Events, res.Decisions)
			return nil
		},
	}
	sf.register(cmd.Flags())
	cmd.Flags().StringVar(&toolsFile, "tools", "", "tool catalog file (JSON array of ToolSpecs) instead of the planex-tools bucket")
	cmd.Flags().StringSliceVar(&autoApprove, "auto-approve", nil, "the supervisor's --auto-approve when the run was decided")
	cmd.Flags().DurationVar(&s2s, "default-schedule-to-start-timeout", 0, "the supervisor's --default-schedule-to-start-timeout when the run was decided")
	return cmd
}

// replayTools reads the catalog from a file, or from planex-tools.
func replayTools(ctx context.Context, sf *storeFlags, file string) ([]*planexv1.ToolSpec, error) {
	if file != "" {
		f, err := os.Open(file)
		if err != nil {
			return nil, fmt.Errorf("--tools: %w", err)
		}
		defer f.Close()
		specs, err := cassette.ReadTools(f)
		if err != nil {
			return nil, fmt.Errorf("--tools %s: %w", file, err)
		}
		return specs, nil
	}
	js, closeConn, err := sf.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the tool catalog (or give --tools FILE): %w", err)
	}
	defer closeConn()
	kv, err := js.KeyValue(ctx, bus.BucketTools)
	if err != nil {
		return nil, fmt.Errorf("read the tool catalog (or give --tools FILE): %w", err)
	}
	cat, err := catalog.Load(ctx, kv, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	if len(cat.Specs()) == 0 {
		return nil, errors.New("the planex-tools bucket is empty (no executor registered): give --tools FILE")
	}
	return cat.Specs(), nil
}
