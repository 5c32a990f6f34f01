package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// recordRemade counts the consumer made again on stream
// (planex_consumers_remade_total; alert PlanexConsumerRemade). The counter
// is looked up each time, from the meter provider of the moment: this is
// rare.
func recordRemade(ctx context.Context, stream, consumer string) {
	c, err := otel.Meter("github.com/planex-dev/planex/internal/bus").Int64Counter("planex.consumers.remade",
		metric.WithDescription("Durable consumers a service made again after the server deleted them (nats consumer rm, a stream made again), by stream and consumer."))
	if err == nil {
		c.Add(ctx, 1, metric.WithAttributes(attribute.String("stream", stream), attribute.String("consumer", consumer)))
	}
}

// ConsumerGone reports whether err says that a durable consumer (or its
// stream) does not exist: the server deleted it while a pull waited
// (ErrConsumerDeleted), or a lookup did not find it.
func ConsumerGone(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerDeleted) ||
		errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, jetstream.ErrStreamNotFound)
}

// PullUnanswered reports whether a pull's error may mean that its consumer
// is gone without saying so: a consumer deleted while no pull waited has no
// subscription for the next one, which then finds nobody (no responders)
// or nothing (missed heartbeats). Look the consumer up to know.
func PullUnanswered(err error) bool {
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoHeartbeat)
}

// EnsureConsumer looks the durable consumer cfg up on stream and creates it
// with cfg when it is gone; made reports whether it was (and it is counted,
// recordRemade). A consumer that exists is returned as it is (its
// configuration is not updated).
func EnsureConsumer(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig) (cons jetstream.Consumer, made bool, err error) {
	cons, err = js.Consumer(ctx, stream, cfg.Durable)
	if err == nil || !ConsumerGone(err) {
		return cons, false, err
	}
	cons, err = js.CreateOrUpdateConsumer(ctx, stream, cfg)
	if err != nil {
		return nil, false, fmt.Errorf("create consumer %s on %s: %w", cfg.Durable, stream, err)
	}
	recordRemade(ctx, stream, cfg.Durable)
	return cons, true, nil
}

// Consumption is a durable consumer consumed with Consume and kept
// consumed: a pull ends for good when the server deletes its
// consumer (`nats consumer rm`, a stream deleted and made again by a
// restore), and a service that only logged it would stop handling its
// queue while it looked healthy. A Consumption creates the consumer again
// with the configuration it was started with and consumes it again,
// retrying with backoff while the stream is missing, until Stop or Drain.
//
// Only consumers whose configuration loses nothing when made again should
// be kept this way: DeliverAll on a work queue (the messages not acked are
// still in the stream) or on a stream whose messages are deduplicated by
// the handler.
type Consumption struct {
	js      jetstream.JetStream
	stream  string
	cfg     jetstream.ConsumerConfig
	handler jetstream.MessageHandler
	opts    PullOptions
	onErr   func(error)
	logger  *slog.Logger

	ctx    context.Context // ends with Stop or Drain: the remaking loop's
	cancel context.CancelFunc
	check  chan struct{} // a pull went unanswered: is the consumer still there?
	gone   chan struct{} // the current pull ended without Stop or Drain
	closed chan struct{}

	mu       sync.Mutex
	cc       *puller
	stopping bool
	remade   int
}

// Consume creates (or updates) the durable consumer cfg on stream and
// consumes it with handler and a standing pull shaped by opts until Stop or
// Drain, making it again whenever the server deletes it. onErr, when set,
// receives the errors reported while consuming (missed heartbeats,
// leadership changes), as a nats.go ConsumeErrHandler would. The first
// create and pull happen before Consume returns, and their failure is
// returned. The handler runs on one goroutine, a message at a time.
//
// It does not use nats.go's Consume, whose standing pull can stall for two
// heartbeats under load (puller says how).
func Consume(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig, handler jetstream.MessageHandler, logger *slog.Logger, onErr func(error), opts PullOptions) (*Consumption, error) {
	if cfg.Durable == "" {
		return nil, errors.New("bus: consume: the consumer config has no Durable name")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := &Consumption{js: js, stream: stream, cfg: cfg, handler: handler, opts: opts, onErr: onErr, logger: logger,
		check: make(chan struct{}, 1), gone: make(chan struct{}, 1), closed: make(chan struct{})}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if err := c.start(ctx); err != nil {
		c.cancel()
		return nil, err
	}
	go c.keep()
	return c, nil
}

// start creates the consumer and starts pulling from it.
func (c *Consumption) start(ctx context.Context) error {
	if _, err := c.js.CreateOrUpdateConsumer(ctx, c.stream, c.cfg); err != nil {
		return fmt.Errorf("create consumer %s on %s: %w", c.cfg.Durable, c.stream, err)
	}
	cc, err := startPull(c.js, c.stream, c.cfg.Durable, c.handler, c.opts, c.consumeErr)
	if err != nil {
		return fmt.Errorf("consume %s on %s: %w", c.cfg.Durable, c.stream, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopping { // Stop came while this one started
		cc.Stop()
		return nil
	}
	c.cc = cc
	go func() {
		<-cc.Closed()
		c.mu.Lock()
		ours := !c.stopping && c.cc == cc
		c.mu.Unlock()
		if ours {
			select {
			case c.gone <- struct{}{}:
			default:
			}
		}
	}()
	return nil
}

// consumeErr passes the pull's errors on and asks the keeping loop to look
// for the consumer when a pull went unanswered: a consumer deleted while no
// pull waited on it is not reported as deleted; its next pull finds nobody
// (no responders) or nothing (missed heartbeats).
func (c *Consumption) consumeErr(err error) {
	if c.ctx.Err() != nil {
		return
	}
	if c.onErr != nil {
		c.onErr(err)
	}
	if PullUnanswered(err) {
		select {
		case c.check <- struct{}{}:
		default:
		}
	}
}

// keep waits for the current Consume to end without Stop (or for a pull
// that went unanswered and a consumer that is gone) and makes the consumer
// again, until Stop or Drain.
func (c *Consumption) keep() {
	defer close(c.closed)
	for {
		select {
		case <-c.ctx.Done():
			c.wait()
			return
		case <-c.gone:
		case <-c.check:
			lctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
			_, err := c.js.Consumer(lctx, c.stream, c.cfg.Durable)
			cancel()
			if err == nil || !ConsumerGone(err) {
				continue
			}
			c.mu.Lock()
			cc := c.cc
			c.cc = nil
			c.mu.Unlock()
			if cc != nil {
				cc.Stop()
			}
		}
		if c.ctx.Err() != nil {
			c.wait()
			return
		}
		c.remake()
	}
}

// remake creates and consumes the consumer again, with backoff, until it
// can, Stop, or the connection is closed for good (the pull ends
// then too: nothing can be made again; the service is stopping).
func (c *Consumption) remake() {
	if c.closedConn() {
		return
	}
	c.logger.Warn("consumer gone; making it again", "stream", c.stream, "consumer", c.cfg.Durable)
	backoff := 250 * time.Millisecond
	for {
		sctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
		err := c.start(sctx)
		cancel()
		if err == nil {
			c.mu.Lock()
			c.remade++
			c.mu.Unlock()
			recordRemade(c.ctx, c.stream, c.cfg.Durable)
			c.logger.Info("consumer made again", "stream", c.stream, "consumer", c.cfg.Durable)
			// A pull answered by nobody while it was gone may have asked
			// for a check that is now stale.
			select {
			case <-c.check:
			default:
			}
			return
		}
		if c.ctx.Err() != nil || c.closedConn() {
			return
		}
		c.logger.Warn("make consumer again", "stream", c.stream, "consumer", c.cfg.Durable, "err", err, "retry_in", backoff)
		select {
		case <-time.After(backoff):
		case <-c.ctx.Done():
			return
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

// closedConn reports whether the connection is closed for good.
func (c *Consumption) closedConn() bool {
	nc := c.js.Conn()
	return nc == nil || nc.IsClosed()
}

// wait waits for the current Consume (stopped or draining) to close.
func (c *Consumption) wait() {
	c.mu.Lock()
	cc := c.cc
	c.mu.Unlock()
	if cc != nil {
		<-cc.Closed()
	}
}

// Stop stops consuming at once (messages buffered are not handled) and
// ends the remaking loop; Closed is closed when the current Consume is.
func (c *Consumption) Stop() { c.end(false) }

// Drain stops pulling and lets the messages already pulled be handled;
// Closed is closed when they have been.
func (c *Consumption) Drain() { c.end(true) }

func (c *Consumption) end(drain bool) {
	c.mu.Lock()
	if c.stopping {
		c.mu.Unlock()
		return
	}
	c.stopping = true
	cc := c.cc
	c.mu.Unlock()
	if cc != nil {
		if drain {
			cc.Drain()
		} else {
			cc.Stop()
		}
	}
	c.cancel()
}

// Closed is closed once Stop or Drain has taken effect and the messages
// being handled (for Drain, those already pulled) are done.
func (c *Consumption) Closed() <-chan struct{} { return c.closed }

// Remade returns how many times the consumer was made again.
func (c *Consumption) Remade() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.remade
}
