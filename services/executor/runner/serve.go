package runner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planex-dev/planex/internal/bus"
)

// Serve is the entry point of an out-of-tree pool: it connects to NATS at
// natsURL, binds planex's streams, buckets and object store (creating them
// when missing), starts a runner for opts and serves until ctx ends; then
// it stops fetching, lets running steps finish within 30 seconds, removes
// the replica's registrations and drains the connection. The caller's
// process sets up logging and OpenTelemetry (the global providers are
// used).
func Serve(ctx context.Context, natsURL string, opts Options, natsOpts ...nats.Option) (err error) {
	nc, err := nats.Connect(natsURL, append([]nats.Option{nats.Name("planex-executor-" + opts.Pool), nats.CustomInboxPrefix(bus.InboxPrefix("executor-" + opts.Pool)), nats.MaxReconnects(-1)}, natsOpts...)...)
	if err != nil {
		return fmt.Errorf("connect to NATS at %s: %w", natsURL, err)
	}
	defer func() {
		if derr := nc.Drain(); derr != nil && !errors.Is(derr, nats.ErrConnectionClosed) {
			err = errors.Join(err, fmt.Errorf("drain NATS connection: %w", derr))
		}
	}()
	res, err := bus.Setup(ctx, nc, bus.Options{})
	if err != nil {
		return err
	}
	r, err := New(res, opts)
	if err != nil {
		return err
	}
	if err := r.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	return r.Stop(sctx)
}
