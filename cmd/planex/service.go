package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
)

// dialService connects to one of the supervisor's services with the
// client constructor newClient (planexv1.NewTenantServiceClient...).
// grpc.NewClient does not connect yet; the first RPC reports an
// unreachable server.
func dialService[C any](addr string, newClient func(grpc.ClientConnInterface) C) (C, func() error, error) {
	var zero C
	opts, err := connection.options(addr)
	if err != nil {
		return zero, nil, err
	}
	conn, err := grpc.NewClient(addr, append(opts, grpc.WithStatsHandler(otelgrpc.NewClientHandler()))...)
	if err != nil {
		return zero, nil, fmt.Errorf("--addr %q: %w", addr, err)
	}
	return newClient(conn), conn.Close, nil
}

// serviceCLI is what the subcommands of one supervisor service (tenants,
// schedules, triggers) share: how to make the client and how to explain
// the service's errors to the user.
type serviceCLI[C any] struct {
	newClient func(grpc.ClientConnInterface) C
	// rpcError explains err from the service at addr; nil for nil, and
	// an error that is not a gRPC status unchanged.
	rpcError func(addr string, err error) error
}

// run is the prologue of a subcommand with -o/--output: it reads
// --output, then runs check (when not nil: local validation that comes
// before dialing), dials of.addr and calls call, whose error it explains
// once with rpcError.
func (s serviceCLI[C]) run(cmd *cobra.Command, of *outputFlags, check func() error, call func(ctx context.Context, client C, asJSON bool) error) error {
	asJSON, err := of.asJSON()
	if err != nil {
		return err
	}
	if check != nil {
		if err := check(); err != nil {
			return err
		}
	}
	return s.do(cmd, of.addr, func(ctx context.Context, client C) error {
		return call(ctx, client, asJSON)
	})
}

// do dials addr, calls call with the command's context and explains the
// error it returns once with rpcError.
func (s serviceCLI[C]) do(cmd *cobra.Command, addr string, call func(ctx context.Context, client C) error) error {
	client, closeConn, err := dialService(addr, s.newClient)
	if err != nil {
		return err
	}
	defer closeConn()
	return s.rpcError(addr, call(cmd.Context(), client))
}
