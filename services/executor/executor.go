// Package executor is planex's executor runtime: one pool of tools (sql,
// email or search) consuming planex.steps.<pool>.> through the pool's
// durable pull consumer, validating, running and reporting each step.
package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"

	"github.com/spf13/pflag"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/service"
)

// DefaultGRPCAddr is the executor's default listen address.
const DefaultGRPCAddr = ":7402"

// Pools lists the pool names the runtime knows.
var Pools = []string{"sql", "email", "search"}

// Config configures an executor replica.
type Config struct {
	// Common service flags.
	Common service.Common
	// Pool is the pool this replica serves.
	Pool string
	// OnReady, when set, is called with the gRPC address once SERVING.
	OnReady func(net.Addr)
}

// RegisterFlags adds the executor's flags to fs.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	c.Common.RegisterFlags(fs, DefaultGRPCAddr)
	fs.StringVar(&c.Pool, "pool", "", "executor pool to serve: sql, email or search (required)")
}

// Validate checks the configuration, naming the flag and value at fault.
func (c Config) Validate() error {
	var errs []error
	if !slices.Contains(Pools, c.Pool) {
		errs = append(errs, fmt.Errorf("--pool %q: want one of sql, email, search", c.Pool))
	}
	return errors.Join(append(errs, c.Common.Validate())...)
}

// Run serves the pool until ctx ends, then shuts down gracefully.
func Run(ctx context.Context, cfg Config, logger *slog.Logger, metrics service.MetricsHandler) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	return service.Serve(ctx, service.Params{
		Name:    "executor-" + cfg.Pool,
		Common:  cfg.Common,
		Logger:  logger,
		Metrics: metrics,
		Ready:   cfg.OnReady,
		Start: func(ctx context.Context, d service.Deps) (func(context.Context) error, error) {
			planexv1.RegisterExecutorServiceServer(d.Server.GRPC, planexv1.UnimplementedExecutorServiceServer{})
			return func(context.Context) error { return nil }, nil
		},
	})
}
