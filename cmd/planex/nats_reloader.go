package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/planex-dev/planex/internal/reload"
	"github.com/planex-dev/planex/internal/telemetry"
)

// natsReloaderCmd is the sidecar that makes nats-server pick up a renewed
// certificate or a new authorization block: it polls the mounted files and
// sends SIGHUP to the server found through its pid file (the pod shares
// its process namespace).
func natsReloaderCmd() *cobra.Command {
	cfg := &reload.Config{}
	var logLevel, logFormat string
	cmd := &cobra.Command{
		Use:   "nats-reloader",
		Short: "Signal nats-server to reload when its mounted certificates or config change",
		Long: "nats-reloader polls the contents of the --watch files (Kubernetes swaps Secret volumes with a symlink, so it\n" +
			"compares contents, not inotify events) and, when any of them changes, sends SIGHUP to the process whose id is in\n" +
			"--pid-file. It logs the names of changed files, never their contents.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return err
			}
			logger, err := telemetry.NewLogger(os.Stderr, logLevel, logFormat, nil)
			if err != nil {
				return err
			}
			r, err := reload.New(*cfg, logger)
			if err != nil {
				return err
			}
			return r.Run(cmd.Context())
		},
	}
	cfg.RegisterFlags(cmd.Flags())
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	cmd.Flags().StringVar(&logFormat, "log-format", "json", "log format: json or text")
	return cmd
}
