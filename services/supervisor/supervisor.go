// Package supervisor is planex's run engine and public API
// (planex.v1.SupervisorService): it owns every run from goal to stop
// reason, folding each run's event log from JetStream, dispatching ready
// steps to executor pools and asking the planner to replan on failure.
package supervisor

import (
	"context"
	"errors"
	"log/slog"
	"net"

	"github.com/spf13/pflag"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/service"
)

// DefaultGRPCAddr is the supervisor's default listen address (loopback:
// expose it deliberately).
const DefaultGRPCAddr = "127.0.0.1:7400"

// Config configures a supervisor replica.
type Config struct {
	// Common service flags.
	Common service.Common
	// OnReady, when set, is called with the gRPC address once SERVING.
	OnReady func(net.Addr)
}

// RegisterFlags adds the supervisor's flags to fs.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	c.Common.RegisterFlags(fs, DefaultGRPCAddr)
}

// Validate checks the configuration, naming the flag and value at fault.
func (c Config) Validate() error {
	return errors.Join(c.Common.Validate())
}

// Run serves the supervisor until ctx ends, then shuts down gracefully.
func Run(ctx context.Context, cfg Config, logger *slog.Logger, metrics service.MetricsHandler) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	return service.Serve(ctx, service.Params{
		Name:    "supervisor",
		Common:  cfg.Common,
		Logger:  logger,
		Metrics: metrics,
		Ready:   cfg.OnReady,
		Start: func(ctx context.Context, d service.Deps) (func(context.Context) error, error) {
			planexv1.RegisterSupervisorServiceServer(d.Server.GRPC, planexv1.UnimplementedSupervisorServiceServer{})
			return func(context.Context) error { return nil }, nil
		},
	})
}
