package devstack

import (
	"context"
	"fmt"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/tlsconfig"
	"github.com/planex-dev/planex/services/console"
)

// startConsole serves the web console on cfg.Services.ConsoleAddr. It
// talks to the stack's supervisor over TLS with no credential of its own:
// every browser signs in with an API key (the CLI's is in
// Credentials.CLITokenFile), which the console forwards.
func (s *Stack) startConsole(ctx context.Context, cfg Config, logger *slog.Logger) error {
	r, err := tlsconfig.NewReloader(tlsconfig.Files{CAFile: s.Credentials.CAFile})
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	conn, err := grpc.NewClient(s.Addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsconfig.ClientConfig(r, ""))))
	if err != nil {
		return fmt.Errorf("console: supervisor %s: %w", s.Addr, err)
	}
	ccfg := console.Config{HTTPAddr: cfg.Services.ConsoleAddr, JaegerURL: cfg.Services.JaegerURL, ForwardTokens: true}
	ccfg.Schedules = planexv1.NewScheduleServiceClient(conn)
	onReady, ready := readyChan()
	ccfg.OnReady = onReady
	s.goService("console", func() error {
		defer conn.Close()
		return console.Run(ctx, ccfg, planexv1.NewSupervisorServiceClient(conn), logger)
	})
	addr, err := s.waitReady(ctx, "console", ready)
	if err != nil {
		return err
	}
	s.ConsoleURL = "http://" + addr.String() + "/"
	return nil
}
