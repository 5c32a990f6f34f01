package bus_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planex-dev/planex/internal/bus"
)

// Every message is delivered without the help of heartbeats: the pull is
// topped up by the message that takes the count under the threshold, in
// the delivering goroutine. With a heartbeat of a minute, a pull not
// topped up (nats.go v1.55's Consume under load: docs/performance.md, "The
// lost pull") would hold the rest back for two minutes.
func TestPullIsToppedUpWithoutHeartbeats(t *testing.T) {
	for _, batch := range []int{1, 2, 32} {
		t.Run(fmt.Sprintf("batch %d", batch), func(t *testing.T) {
			ctx := ctxT(t)
			js, _ := workQueue(t, "TOPPED")
			const n = 2000
			for i := range n {
				if _, err := js.PublishAsync(fmt.Sprintf("topped.%d", i%7), []byte(fmt.Sprint(i))); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				t.Fatal("publishes not acknowledged")
			}
			var handled atomic.Int64
			all := make(chan struct{})
			var errs errList
			c, err := bus.Consume(ctx, js, "TOPPED", jetstream.ConsumerConfig{Durable: "w", AckPolicy: jetstream.AckExplicitPolicy},
				func(m jetstream.Msg) {
					if err := m.Ack(); err != nil {
						t.Error(err)
					}
					if handled.Add(1) == n {
						close(all)
					}
				}, nil, errs.add, bus.PullOptions{Batch: batch, Heartbeat: time.Minute, Expires: 5 * time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { c.Stop(); <-c.Closed() }()
			select {
			case <-all:
			case <-ctx.Done():
				t.Fatalf("%d of %d messages handled before the test's deadline (errors: %v)", handled.Load(), n, errs.get())
			}
			if e := errs.get(); len(e) > 0 {
				t.Fatalf("errors reported: %v", e)
			}
		})
	}
}

// A pull that expires on the server is replaced at once (the 408 says how
// many it still owed), not after missed heartbeats.
func TestExpiredPullIsReplaced(t *testing.T) {
	ctx := ctxT(t)
	js, _ := workQueue(t, "EXPIRING")
	// The server's copy of each pull request, as another client sees it.
	pulls := make(chan struct{}, 16)
	watch, err := js.Conn().Subscribe("$JS.API.CONSUMER.MSG.NEXT.EXPIRING.w", func(*nats.Msg) { pulls <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Unsubscribe()
	if err := js.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	var errs errList
	c, err := bus.Consume(ctx, js, "EXPIRING", jetstream.ConsumerConfig{Durable: "w", AckPolicy: jetstream.AckExplicitPolicy},
		func(m jetstream.Msg) { _ = m.Ack(); got <- string(m.Data()) },
		nil, errs.add, bus.PullOptions{Batch: 4, Heartbeat: time.Second, Expires: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { c.Stop(); <-c.Closed() }()
	for i := range 3 { // the first pull and two that replaced an expired one
		select {
		case <-pulls:
		case <-ctx.Done():
			t.Fatalf("pull %d not seen", i+1)
		}
	}
	if _, err := js.Publish(ctx, "expiring.a", []byte("after")); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if m != "after" {
			t.Fatalf("handled %q", m)
		}
	case <-ctx.Done():
		t.Fatal("message published after the expiries not handled")
	}
	if reported(errs.get(), jetstream.ErrNoHeartbeat) {
		t.Fatalf("the expired pull was replaced only after missed heartbeats: %v", errs.get())
	}
}

// A message delivered by Consume is acknowledged as nats.go's own:
// metadata from its reply subject, one final acknowledgement, progress
// as often as wanted, a delayed nak redelivered, a term not.
func TestPulledMessagesAcknowledgeAsJetStreamMessages(t *testing.T) {
	ctx := ctxT(t)
	js, _ := workQueue(t, "ACKS")
	msgs := make(chan jetstream.Msg, 8)
	c, err := bus.Consume(ctx, js, "ACKS", jetstream.ConsumerConfig{Durable: "w", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute},
		func(m jetstream.Msg) { msgs <- m }, nil, nil, bus.PullOptions{Batch: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { c.Stop(); <-c.Closed() }()
	next := func() jetstream.Msg {
		t.Helper()
		select {
		case m := <-msgs:
			return m
		case <-ctx.Done():
			t.Fatal("no message")
			return nil
		}
	}
	for _, s := range []string{"acks.ack", "acks.nak", "acks.term"} {
		if _, err := js.Publish(ctx, s, []byte(s), jetstream.WithMsgID(s)); err != nil {
			t.Fatal(err)
		}
	}
	byData := map[string]jetstream.Msg{}
	for range 3 {
		m := next()
		byData[string(m.Data())] = m
	}

	ack := byData["acks.ack"]
	md, err := ack.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	if md.Stream != "ACKS" || md.Consumer != "w" || md.NumDelivered != 1 || md.Sequence.Stream != 1 || md.Sequence.Consumer == 0 || md.Timestamp.IsZero() {
		t.Fatalf("metadata %+v", md)
	}
	if ack.Subject() != "acks.ack" || ack.Headers().Get(jetstream.MsgIDHeader) != "acks.ack" || !strings.HasPrefix(ack.Reply(), "$JS.ACK.ACKS.w.") {
		t.Fatalf("subject %q, headers %v, reply %q", ack.Subject(), ack.Headers(), ack.Reply())
	}
	for range 2 {
		if err := ack.InProgress(); err != nil {
			t.Fatalf("in progress: %v", err)
		}
	}
	if err := ack.DoubleAck(ctx); err != nil {
		t.Fatalf("double ack: %v", err)
	}
	if err := ack.Ack(); !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		t.Fatalf("second ack: %v, want ErrMsgAlreadyAckd", err)
	}

	if err := byData["acks.nak"].NakWithDelay(50 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := byData["acks.term"].TermWithReason("test"); err != nil {
		t.Fatal(err)
	}
	again := next()
	if string(again.Data()) != "acks.nak" {
		t.Fatalf("redelivered %q, want the nakked message", again.Data())
	}
	if md, err := again.Metadata(); err != nil || md.NumDelivered != 2 {
		t.Fatalf("redelivery metadata %+v, %v", md, err)
	}
	if err := again.Ack(); err != nil {
		t.Fatal(err)
	}
	// The terminated message is not delivered again: the stream is empty
	// once the acks are processed.
	st, err := js.Stream(ctx, "ACKS")
	if err != nil {
		t.Fatal(err)
	}
	for {
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs == 0 {
			break
		}
		select {
		case m := <-msgs:
			t.Fatalf("%q delivered again", m.Data())
		case <-ctx.Done():
			t.Fatalf("%d messages left in the work queue", info.State.Msgs)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// A consumer deleted while its pull waits ends the pull (and bus.Consume
// makes it again: TestConsumeKeepsADeletedConsumer); the error is reported.
func TestPullReportsItsConsumerDeleted(t *testing.T) {
	ctx := ctxT(t)
	js, _ := workQueue(t, "DELETED")
	var errs errList
	c, err := bus.Consume(ctx, js, "DELETED", jetstream.ConsumerConfig{Durable: "w", AckPolicy: jetstream.AckExplicitPolicy},
		func(m jetstream.Msg) { _ = m.Ack() }, nil, errs.add, bus.PullOptions{Heartbeat: time.Minute, Expires: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { c.Stop(); <-c.Closed() }()
	// Deleted once its pull waits (one deleted before the server queued
	// the pull is found by missed heartbeats instead).
	for {
		cons, err := js.Consumer(ctx, "DELETED", "w")
		if err != nil {
			t.Fatal(err)
		}
		if cons.CachedInfo().NumWaiting > 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the pull never waited on the server")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := js.DeleteConsumer(ctx, "DELETED", "w"); err != nil {
		t.Fatal(err)
	}
	for !reported(errs.get(), jetstream.ErrConsumerDeleted) {
		select {
		case <-ctx.Done():
			t.Fatalf("deletion not reported: %v", errs.get())
		case <-time.After(10 * time.Millisecond):
		}
	}
	for c.Remade() == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("consumer not made again")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// reported reports whether one of errs is target.
func reported(errs []error, target error) bool {
	return slices.ContainsFunc(errs, func(err error) bool { return errors.Is(err, target) })
}

// errList collects the errors a consumption reports.
type errList struct {
	mu   sync.Mutex
	errs []error
}

func (l *errList) add(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, err)
}

func (l *errList) get() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]error(nil), l.errs...)
}

// A handler that blocks longer than two heartbeats (the engine's, while
// its hand is full) is not a lost pull: the heartbeats wait behind it.
func TestBlockedHandlerMissesNoHeartbeat(t *testing.T) {
	ctx := ctxT(t)
	js, _ := workQueue(t, "BLOCKED")
	var errs errList
	const hb = 500 * time.Millisecond // silences of a second are missed heartbeats: far above a loaded machine's pauses
	handled := make(chan struct{}, 2)
	c, err := bus.Consume(ctx, js, "BLOCKED", jetstream.ConsumerConfig{Durable: "w", AckPolicy: jetstream.AckExplicitPolicy},
		func(m jetstream.Msg) {
			if string(m.Data()) == "slow" {
				time.Sleep(6 * hb) // the block itself is the case under test
			}
			_ = m.Ack()
			handled <- struct{}{}
		}, nil, errs.add, bus.PullOptions{Heartbeat: hb, Expires: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { c.Stop(); <-c.Closed() }()
	for _, d := range []string{"slow", "next"} {
		if _, err := js.Publish(ctx, "blocked.a", []byte(d)); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		select {
		case <-handled:
		case <-ctx.Done():
			t.Fatal("messages not handled")
		}
	}
	if reported(errs.get(), jetstream.ErrNoHeartbeat) {
		t.Fatalf("a blocked handler was taken for missed heartbeats: %v", errs.get())
	}
}
