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
	dev, run, ev := devCmd(), runCmd(), evalCmd()
	dev.AddCommand(devCredentialsCmd())
	groupDevFlags(run)
	groupDevFlags(ev)
	root.AddCommand(supervisorCmd(), plannerCmd(), executorCmd(), dev, run, runsCmd(), toolsCmd(), outboxCmd(), sqlCmd(), authCmd(), mcpCmd(), consoleCmd())
	root.AddCommand(versionCmd(), healthCmd(), demoCmd(), benchCmd(), gatesCmd(), policyCmd())
	root.AddCommand(auditCmd(), replayCmd(), ev, natsReloaderCmd(), backupCmd(), restoreCmd())
	root.AddCommand(tenantsCmd(), usageCmd())
	root.AddCommand(schedulesCmd())
	root.AddCommand(triggersCmd())
	useFlagHelp(root)
	return root
}

// serviceConfig is what every service's Config offers the CLI.
type serviceConfig interface {
	RegisterFlags(*pflag.FlagSet)
	Validate() error
}

// serviceCmd builds the subcommand of one service: flags from cfg, then
// validation, logging, telemetry and the service's Run.
func serviceCmd(use, short string, cfg serviceConfig, describe func() (name string, c service.Common),
	run func(ctx context.Context, logger *slog.Logger, metrics service.MetricsHandler) error) *cobra.Command {
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return err
			}
			name, common := describe()
			return serve(cmd.Context(), name, common, func(ctx context.Context, logger *slog.Logger, t *telemetry.Telemetry) error {
				return run(ctx, logger, t.Metrics)
			})
		},
	}
	cfg.RegisterFlags(cmd.Flags())
	return cmd
}

func supervisorCmd() *cobra.Command {
	cfg := &supervisor.Config{}
	return serviceCmd("supervisor", "Run the supervisor: the run engine and the public SupervisorService API", cfg,
		func() (string, service.Common) { return "planex-supervisor", cfg.Common },
		func(ctx context.Context, logger *slog.Logger, m service.MetricsHandler) error {
			return supervisor.Run(ctx, *cfg, logger, m)
		})
}

func plannerCmd() *cobra.Command {
	cfg := &planner.Config{}
	return serviceCmd("planner", "Run the planner service (PlannerService)", cfg,
		func() (string, service.Common) { return "planex-planner", cfg.Common },
		func(ctx context.Context, logger *slog.Logger, m service.MetricsHandler) error {
			return planner.Run(ctx, *cfg, logger, m)
		})
}

func executorCmd() *cobra.Command {
	cfg := &executor.Config{}
	return serviceCmd("executor", "Run one executor pool (--pool sql|email|search)", cfg,
		func() (string, service.Common) { return "planex-executor-" + cfg.Pool, cfg.Common },
		func(ctx context.Context, logger *slog.Logger, m service.MetricsHandler) error {
			return executor.Run(ctx, *cfg, logger, m)
		})
}

// serve sets up logging and telemetry for one service process, runs it,
// and joins the telemetry shutdown into the returned error.
func serve(ctx context.Context, name string, c service.Common, run func(context.Context, *slog.Logger, *telemetry.Telemetry) error) (err error) {
	r, err := c.Redactor()
	if err != nil {
		return err
	}
	logger, err := telemetry.NewLogger(os.Stderr, c.LogLevel, c.LogFormat, r)
	if err != nil {
		return err
	}
	t, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: name, Version: version, Redactor: r})
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
