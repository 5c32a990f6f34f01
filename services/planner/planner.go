// Package planner is planex's planner service (planex.v1.PlannerService):
// it turns a goal, the tool catalog and a run's history into the next plan
// revision. It never calls a tool.
package planner

import (
	"context"
	"errors"
	"log/slog"
	"net"

	"github.com/spf13/pflag"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/service"
)

// DefaultGRPCAddr is the planner's default listen address.
const DefaultGRPCAddr = ":7401"

// Config configures a planner replica.
type Config struct {
	// Common service flags.
	Common service.Common
	// OnReady, when set, is called with the gRPC address once SERVING.
	OnReady func(net.Addr)
}

// RegisterFlags adds the planner's flags to fs.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	c.Common.RegisterFlags(fs, DefaultGRPCAddr)
}

// Validate checks the configuration, naming the flag and value at fault.
func (c Config) Validate() error {
	return errors.Join(c.Common.Validate())
}

// Run serves the planner until ctx ends, then shuts down gracefully.
func Run(ctx context.Context, cfg Config, logger *slog.Logger, metrics service.MetricsHandler) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	return service.Serve(ctx, service.Params{
		Name:    "planner",
		Common:  cfg.Common,
		Logger:  logger,
		Metrics: metrics,
		Ready:   cfg.OnReady,
		Start: func(ctx context.Context, d service.Deps) (func(context.Context) error, error) {
			planexv1.RegisterPlannerServiceServer(d.Server.GRPC, planexv1.UnimplementedPlannerServiceServer{})
			return func(context.Context) error { return nil }, nil
		},
	})
}
