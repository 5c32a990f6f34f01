package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planex-dev/planex/internal/bus"
)

// heldPerWorker is how many main-consumer messages a replica may hold per
// worker: inHandPerWorker in hand and as many again queued behind their
// runs' messages in hand (locks.go). A replica's share of the consumer's
// MaxAckPending is Workers × heldPerWorker.
const heldPerWorker = 2 * inHandPerWorker

// replicaSet is this replica's registration in planex-supervisors, whose
// live entries tell how many engine messages all supervisor replicas may
// hold: the main consumer's MaxAckPending when Config.MaxAckPending is 0.
// An entry is the replica id with its share as value; it expires with the
// bucket's TTL unless renewed, so a dead replica's share goes with it.
type replicaSet struct {
	kv         jetstream.KeyValue
	id         string
	share      int
	registered atomic.Bool // an entry was written
}

// register puts (or renews) this replica's entry.
func (s *replicaSet) register(ctx context.Context) error {
	if _, err := s.kv.Put(ctx, s.id, []byte(strconv.Itoa(s.share))); err != nil {
		return fmt.Errorf("register supervisor %s in %s: %w", s.id, bus.BucketSupervisors, err)
	}
	s.registered.Store(true)
	return nil
}

// deregister removes this replica's entry (clean shutdown). It does
// nothing when no entry was ever written: a NATS identity without write
// access to the bucket would only wait for its timeout.
func (s *replicaSet) deregister(ctx context.Context) error {
	if !s.registered.Load() {
		return nil
	}
	if err := s.kv.Delete(ctx, s.id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("deregister supervisor %s from %s: %w", s.id, bus.BucketSupervisors, err)
	}
	return nil
}

// renewEvery is how often the entry is renewed: a third of the bucket's
// TTL, so two renewals may be lost before the entry expires.
func (s *replicaSet) renewEvery(ctx context.Context) (time.Duration, error) {
	st, err := s.kv.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("read %s status: %w", bus.BucketSupervisors, err)
	}
	if ttl := st.TTL(); ttl > 0 {
		return max(ttl/3, 50*time.Millisecond), nil
	}
	return 10 * time.Second, nil
}

// total returns how many replicas are live and the sum of their shares:
// the entries of the other replicas, and this replica's share when self
// is set, whether or not its own entry is written yet.
func (s *replicaSet) total(ctx context.Context, self bool) (replicas, held int, err error) {
	w, err := s.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return 0, 0, fmt.Errorf("list %s: %w", bus.BucketSupervisors, err)
	}
	defer func() { _ = w.Stop() }()
	if self {
		replicas, held = 1, s.share
	}
	for {
		select {
		case <-ctx.Done():
			return 0, 0, fmt.Errorf("list %s: %w", bus.BucketSupervisors, ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return 0, 0, fmt.Errorf("list %s: watch closed", bus.BucketSupervisors)
			}
			if e == nil {
				return replicas, held, nil // the current entries are all in
			}
			if e.Key() == s.id {
				continue
			}
			n, err := strconv.Atoi(string(e.Value()))
			if err != nil || n <= 0 {
				n = s.share // an entry this version cannot read: assume it holds as much
			}
			replicas++
			held += n
		}
	}
}

// scaleAckPending sets the main consumer's MaxAckPending to the shares of
// the live replicas (this one included when self is set) unless it is
// already that; with self unset and no other replica live it leaves the
// bound alone. It reads the consumer's bound instead of remembering its
// own last setting, so a replica that set it from an older view of the
// replicas is corrected by the next renewal of any replica.
func (e *Engine) scaleAckPending(ctx context.Context, self bool) error {
	replicas, want, err := e.replicas.total(ctx, self)
	if err != nil || want == 0 {
		return err
	}
	cons, err := e.res.JS.Consumer(ctx, bus.StreamEngine, bus.ConsumerEngine)
	if err != nil {
		return fmt.Errorf("read consumer %s: %w", bus.ConsumerEngine, err)
	}
	if cons.CachedInfo().Config.MaxAckPending == want {
		return nil
	}
	cfg := bus.EngineConsumerConfig(want, e.cfg.AckWait)
	if _, err := e.res.JS.CreateOrUpdateConsumer(ctx, bus.StreamEngine, cfg); err != nil {
		return fmt.Errorf("scale %s max ack pending to %d: %w", cfg.Durable, want, err)
	}
	e.logger.InfoContext(ctx, "engine consumer scaled", "replicas", replicas, "max_ack_pending", want)
	return nil
}

// startReplica opens planex-supervisors and returns the main consumer's
// MaxAckPending for this replica's start: the shares of the replicas
// already running plus its own. When the bucket cannot be read it falls
// back to this replica's share and scaling stays off (e.replicas nil).
func (e *Engine) startReplica(ctx context.Context) int {
	share := e.cfg.Workers * heldPerWorker
	kv, err := e.res.SupervisorsBucket(ctx)
	if err != nil {
		e.logger.WarnContext(ctx, "engine max ack pending stays at this replica's share", "max_ack_pending", share, "err", err)
		return share
	}
	rs := &replicaSet{kv: kv, id: e.cfg.ReplicaID, share: share}
	_, held, err := rs.total(ctx, true)
	if err != nil {
		e.logger.WarnContext(ctx, "engine max ack pending stays at this replica's share", "max_ack_pending", share, "err", err)
		return share
	}
	e.replicas = rs
	return held
}

// renewLoop registers this replica, then renews its entry and re-checks
// the consumer's bound at every renewal until ctx ends.
func (e *Engine) renewLoop(ctx context.Context) {
	every, err := e.replicas.renewEvery(ctx)
	if err != nil {
		e.logger.WarnContext(ctx, "supervisor registration", "err", err)
		every = 10 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for {
		rctx, cancel := context.WithTimeout(ctx, every)
		err := e.replicas.register(rctx)
		if err == nil {
			err = e.scaleAckPending(rctx, true)
		}
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !failing:
			e.logger.WarnContext(ctx, "renew supervisor registration", "err", err)
		case err == nil && failing:
			e.logger.InfoContext(ctx, "supervisor registration renewed again")
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// leave deregisters this replica and shrinks the consumer's bound to the
// shares of the replicas left (clean shutdown, after its messages are
// settled).
func (e *Engine) leave(ctx context.Context) error {
	var cancel context.CancelFunc
	if ctx.Err() != nil {
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	} else {
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
	}
	defer cancel()
	if err := e.replicas.deregister(ctx); err != nil {
		return err
	}
	return e.scaleAckPending(ctx, false)
}
