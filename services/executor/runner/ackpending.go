package runner

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planex-dev/planex/internal/bus"
)

// scaleAckPending sets the pool consumer's MaxAckPending to the number of
// the pool's replicas registered in planex-tools times this replica's
// concurrency, when Options.MaxAckPending was left zero: the bound is
// pool-wide, so a fixed default would let a scaled-out pool run no more
// steps at once than one replica. Replicas of a pool are expected to share
// their concurrency (one deployment); the registrations of a replica that
// died expire with the bucket's TTL, and so does its share. It is called at
// start and with every renewal of the registrations; it changes the
// consumer only when the bound differs.
func (r *Runner) scaleAckPending(ctx context.Context) error {
	if !r.autoAckPending {
		return nil
	}
	replicas, err := r.countReplicas(ctx)
	if err != nil {
		return err
	}
	want := max(replicas, 1) * r.opts.Concurrency
	if r.ackPending.Load() == int64(want) {
		return nil
	}
	cfg := bus.PoolConsumerConfig(r.opts.Pool, want, r.opts.AckWait, r.opts.MaxDeliver)
	if _, err := r.res.JS.CreateOrUpdateConsumer(ctx, bus.StreamSteps, cfg); err != nil {
		return fmt.Errorf("scale %s max ack pending to %d: %w", cfg.Durable, want, err)
	}
	if r.fromLogs.Load() {
		dcfg := bus.DispatchConsumerConfig(r.opts.Pool, want, r.opts.AckWait, r.opts.MaxDeliver)
		if _, err := r.res.JS.CreateOrUpdateConsumer(ctx, bus.StreamEvents, dcfg); err != nil {
			return fmt.Errorf("scale %s on %s max ack pending to %d: %w", dcfg.Durable, bus.StreamEvents, want, err)
		}
	}
	r.ackPending.Store(int64(want))
	r.logger.InfoContext(ctx, "pool consumer scaled", "replicas", replicas, "max_ack_pending", want)
	return nil
}

// countReplicas counts the distinct replicas with a registration of one of
// the pool's tools in planex-tools.
func (r *Runner) countReplicas(ctx context.Context) (int, error) {
	lister, err := r.res.Tools.ListKeysFiltered(ctx, r.opts.Pool+".*.*")
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return 0, nil
		}
		return 0, fmt.Errorf("list %s: %w", bus.BucketTools, err)
	}
	defer func() { _ = lister.Stop() }()
	seen := map[string]bool{}
	for key := range lister.Keys() {
		if _, replica, err := bus.ParseToolKey(key); err == nil {
			seen[replica] = true
		}
	}
	return len(seen), nil
}
