package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/planex-dev/planex/internal/service"
	"github.com/planex-dev/planex/internal/telemetry"
	"github.com/planex-dev/planex/services/executor"
	"github.com/planex-dev/planex/services/planner"
	"github.com/planex-dev/planex/services/supervisor"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "planex",
		Short:         "planex runs AI agents with the planner–executor pattern",
		Long:          "planex runs AI agents with the planner–executor pattern as Go services on NATS JetStream.\nEvery flag can also be set with the environment variable PLANEX_<FLAG> (upper case, '-' as '_').",
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return bindEnv(cmd.Flags())
		},
	}
	root.AddCommand(supervisorCmd(), plannerCmd(), executorCmd(), devCmd(), runCmd(), runsCmd(), toolsCmd(), outboxCmd())
	return root
}

func supervisorCmd() *cobra.Command {
	var cfg supervisor.Config
	cmd := &cobra.Command{
		Use:   "supervisor",
		Short: "Run the supervisor: the run engine and the public SupervisorService API",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return err
			}
			return serve(cmd.Context(), "planex-supervisor", cfg.Common, func(ctx context.Context, logger *slog.Logger, t *telemetry.Telemetry) error {
				return supervisor.Run(ctx, cfg, logger, t.Metrics)
			})
		},
	}
	cfg.RegisterFlags(cmd.Flags())
	return cmd
}

func plannerCmd() *cobra.Command {
	var cfg planner.Config
	cmd := &cobra.Command{
		Use:   "planner",
		Short: "Run the planner service (PlannerService)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return err
			}
			return serve(cmd.Context(), "planex-planner", cfg.Common, func(ctx context.Context, logger *slog.Logger, t *telemetry.Telemetry) error {
				return planner.Run(ctx, cfg, logger, t.Metrics)
			})
		},
	}
	cfg.RegisterFlags(cmd.Flags())
	return cmd
}

func executorCmd() *cobra.Command {
	var cfg executor.Config
	cmd := &cobra.Command{
		Use:   "executor",
		Short: "Run one executor pool (--pool sql|email|search)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return err
			}
			return serve(cmd.Context(), "planex-executor-"+cfg.Pool, cfg.Common, func(ctx context.Context, logger *slog.Logger, t *telemetry.Telemetry) error {
				return executor.Run(ctx, cfg, logger, t.Metrics)
			})
		},
	}
	cfg.RegisterFlags(cmd.Flags())
	return cmd
}

// serve sets up logging and telemetry for one service process, runs it,
// and joins the telemetry shutdown into the returned error.
func serve(ctx context.Context, name string, c service.Common, run func(context.Context, *slog.Logger, *telemetry.Telemetry) error) (err error) {
	logger, err := telemetry.NewLogger(os.Stderr, c.LogLevel, c.LogFormat)
	if err != nil {
		return err
	}
	t, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: name, Version: version})
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.ShutdownGrace)
		defer cancel()
		err = errors.Join(err, t.Shutdown(sctx))
	}()
	return run(ctx, logger, t)
}

// bindEnv sets every flag not given on the command line from its
// PLANEX_<FLAG> environment variable.
func bindEnv(fs *pflag.FlagSet) error {
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			return
		}
		name := "PLANEX_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		v, ok := os.LookupEnv(name)
		if !ok {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %w", name, v, err))
		}
	})
	return errors.Join(errs...)
}

// oneLine flattens a (possibly joined) error into one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}
