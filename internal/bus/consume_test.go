package bus_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/telemetry/metrictest"
)

// A kept consumption survives its consumer's deletion (`nats consumer rm`)
// and its stream's (a restore that makes the stream again): a pull ends
// for good when its consumer is deleted; bus.Consume makes the
// consumer again and goes on handling the queue, and loses none of the
// messages published while it was gone (a work queue keeps them).
func TestConsumeKeepsADeletedConsumer(t *testing.T) {
	reader := metrictest.Global(t)
	ctx := ctxT(t)
	js, scfg := workQueue(t, "KEPT")
	ccfg := jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: "kept.>"}
	got := make(chan string, 16)
	logs := &logTap{t: t, msgs: make(chan string, 64)}
	c, err := bus.Consume(ctx, js, "KEPT", ccfg, func(m jetstream.Msg) {
		_ = m.DoubleAck(ctx) // acked before the deletion: not delivered again
		got <- string(m.Data())
	}, slog.New(logs), nil, bus.PullOptions{Heartbeat: 500 * time.Millisecond, Expires: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		c.Stop()
		<-c.Closed()
	}()
	publish := func(data string) {
		t.Helper()
		if _, err := js.Publish(ctx, "kept.a", []byte(data)); err != nil {
			t.Fatalf("publish %s: %v", data, err)
		}
	}
	expect := func(want string, within time.Duration) {
		t.Helper()
		select {
		case m := <-got:
			if m != want {
				t.Fatalf("handled %q, want %q", m, want)
			}
		case <-time.After(within):
			t.Fatalf("%q not handled within %s (consumer made again %d times)", want, within, c.Remade())
		}
	}
	publish("before")
	expect("before", 5*time.Second)

	// The consumer deleted while its pull waits: the server tells the
	// pull (409 Consumer Deleted) and nats.go stops consuming.
	if err := js.DeleteConsumer(ctx, "KEPT", "worker"); err != nil {
		t.Fatal(err)
	}
	publish("after the consumer's deletion")
	expect("after the consumer's deletion", 10*time.Second)
	if n := c.Remade(); n != 1 {
		t.Fatalf("consumer made again %d times, want 1", n)
	}

	// The stream deleted and made again (with its consumer gone): the
	// server does not tell the pull; its heartbeats stop, the consumption
	// looks the consumer up and retries making it until the stream is
	// back.
	if err := js.DeleteStream(ctx, "KEPT"); err != nil {
		t.Fatal(err)
	}
	logs.waitFor("make consumer again", 10*time.Second) // a try failed: no stream
	if _, err := js.CreateStream(ctx, scfg); err != nil {
		t.Fatal(err)
	}
	publish("after the stream's restore")
	expect("after the stream's restore", 15*time.Second)
	if n := c.Remade(); n != 2 {
		t.Fatalf("consumer made again %d times, want 2", n)
	}
	if n := metrictest.Sum(t, reader, "planex.consumers.remade", attribute.String("stream", "KEPT"), attribute.String("consumer", "worker")); n != 2 {
		t.Fatalf("planex.consumers.remade{stream=KEPT,consumer=worker} = %d, want 2", n)
	}
	select {
	case m := <-got:
		t.Fatalf("handled %q more than once", m)
	default:
	}
}

// A consumer lost without a word to its pulls — a server restarted that
// kept its streams in memory — is looked up when the pull sent after the
// reconnect finds nobody (no responders; missed heartbeats would do the
// same), found missing, and made again once its stream is back.
func TestConsumeKeepsAConsumerLostWithItsServer(t *testing.T) {
	srv := natstest.Start(t)
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	scfg := jetstream.StreamConfig{Name: "MEM", Subjects: []string{"mem.>"}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage}
	if _, err := js.CreateStream(ctx, scfg); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 4)
	logs := &logTap{t: t, msgs: make(chan string, 64)}
	c, err := bus.Consume(ctx, js, "MEM", jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy},
		func(m jetstream.Msg) { _ = m.DoubleAck(ctx); got <- string(m.Data()) }, slog.New(logs), func(err error) { t.Logf("consume error: %v", err) },
		bus.PullOptions{Heartbeat: 500 * time.Millisecond, Expires: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		c.Stop()
		<-c.Closed()
	}()
	srv.Restart() // the stream and its consumer are gone; the client reconnects
	logs.waitFor("make consumer again", 15*time.Second)
	if _, err := js.CreateStream(ctx, scfg); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "mem.a", []byte("after the restart")); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if m != "after the restart" {
			t.Fatalf("handled %q", m)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("nothing handled within 15s of the stream's return (consumer made again %d times)", c.Remade())
	}
	if n := c.Remade(); n != 1 {
		t.Fatalf("consumer made again %d times, want 1", n)
	}
}

// Stopping a consumption whose stream is gone (it is retrying to make the
// consumer) returns at once, and nothing is consumed after Stop.
func TestConsumeStopsWhileRemaking(t *testing.T) {
	ctx := ctxT(t)
	js, scfg := workQueue(t, "GONE")
	handled := make(chan struct{}, 4)
	logs := &logTap{t: t, msgs: make(chan string, 64)}
	c, err := bus.Consume(ctx, js, "GONE", jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy},
		func(m jetstream.Msg) { _ = m.Ack(); handled <- struct{}{} }, slog.New(logs), nil,
		bus.PullOptions{Heartbeat: 500 * time.Millisecond, Expires: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, "GONE"); err != nil {
		t.Fatal(err)
	}
	logs.waitFor("make consumer again", 10*time.Second) // a try failed: no stream
	c.Stop()
	select {
	case <-c.Closed():
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not close the consumption within 5s")
	}
	if _, err := js.CreateStream(ctx, scfg); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "gone.a", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Consumer(ctx, "GONE", "worker"); err == nil {
		t.Fatal("the consumer was made again after Stop")
	}
	select {
	case <-handled:
		t.Fatal("a message was handled after Stop")
	default:
	}
}

// A config without a durable name is refused, naming the field.
func TestConsumeNeedsADurable(t *testing.T) {
	_, err := bus.Consume(context.Background(), nil, "S", jetstream.ConsumerConfig{}, func(jetstream.Msg) {}, nil, nil, bus.PullOptions{})
	if err == nil || !strings.Contains(fmt.Sprint(err), "Durable") {
		t.Fatalf("err = %v, want it to name Durable", err)
	}
}

// workQueue starts a server and creates a work-queue stream name on
// subjects "<name in lower case>.>".
func workQueue(t *testing.T, name string) (jetstream.JetStream, jetstream.StreamConfig) {
	t.Helper()
	js, err := jetstream.New(natstest.Start(t).Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}, Retention: jetstream.WorkQueuePolicy}
	if _, err := js.CreateStream(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}
	return js, cfg
}

// logTap is a slog handler that logs to the test and hands each record's
// message to waitFor.
type logTap struct {
	t    testing.TB
	msgs chan string
}

func (l *logTap) Enabled(context.Context, slog.Level) bool { return true }
func (l *logTap) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logTap) WithGroup(string) slog.Handler            { return l }
func (l *logTap) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s", a); return true })
	l.t.Logf("%s %s%s", r.Level, r.Message, b.String())
	select {
	case l.msgs <- r.Message:
	default:
	}
	return nil
}

// waitFor waits for a record with message msg.
func (l *logTap) waitFor(msg string, within time.Duration) {
	l.t.Helper()
	timeout := time.After(within)
	for {
		select {
		case m := <-l.msgs:
			if m == msg {
				return
			}
		case <-timeout:
			l.t.Fatalf("no %q logged within %s", msg, within)
		}
	}
}
