package runner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/planex-dev/planex/internal/bus"
)

// register puts the replica's tool specs into planex-tools and returns how
// often they must be renewed: a third of the bucket's TTL, so two
// heartbeats may be lost before the catalog forgets the replica.
func (r *Runner) register(ctx context.Context) (time.Duration, error) {
	interval := 10 * time.Second
	st, err := r.res.Tools.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("read %s status: %w", bus.BucketTools, err)
	}
	if ttl := st.TTL(); ttl > 0 {
		interval = max(ttl/3, 50*time.Millisecond)
	}
	return interval, r.putSpecs(ctx)
}

func (r *Runner) putSpecs(ctx context.Context) error {
	for _, spec := range r.specs {
		data, err := proto.Marshal(spec)
		if err != nil {
			return fmt.Errorf("encode tool spec %s: %w", spec.GetName(), err)
		}
		key := bus.ToolKey(spec.GetName(), r.opts.ReplicaID)
		if _, err := r.res.Tools.Put(ctx, key, data); err != nil {
			return fmt.Errorf("register tool %s: %w", key, err)
		}
	}
	return nil
}

// registrationLoop renews the registrations until ctx ends.
func (r *Runner) registrationLoop(ctx context.Context, interval time.Duration) {
	defer close(r.hbDone)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			pctx, cancel := context.WithTimeout(ctx, interval)
			err := r.putSpecs(pctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				r.logger.Warn("renew tool registrations", "err", err)
			}
		}
	}
}

// deregister removes the replica's registrations (clean shutdown).
func (r *Runner) deregister(ctx context.Context) error {
	var errs []error
	for _, spec := range r.specs {
		key := bus.ToolKey(spec.GetName(), r.opts.ReplicaID)
		if err := r.res.Tools.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			errs = append(errs, fmt.Errorf("deregister tool %s: %w", key, err))
		}
	}
	return errors.Join(errs...)
}
