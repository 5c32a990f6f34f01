package bench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// floorWarmup is how many round trips warm the floor up before it is
// measured; each chain length warms up with as many steps by default
// (--warmup-steps).
const floorWarmup = 50

// floorStream is the work-queue stream of the floor measurement, created
// for it and deleted afterwards.
const floorStream = "PLANEX_BENCH_FLOOR"

// floorMeter measures the JetStream two-hop floor, what a distributed
// step cannot go below: a request published (acknowledged by the server,
// with a message id) on a work-queue stream, consumed by a durable pull
// consumer on another connection that publishes a reply on the same kind
// of stream and acks the request, and the reply consumed back. Storage is
// file storage, like planex's streams. It stays open while the chains are
// measured, so that each repetition of a chain is measured right after one
// of the floor, on the same machine at the same moment.
type floorMeter struct {
	trip   func(n int) error
	n      int
	closes []func()
}

// openFloor creates the floor's stream, consumers and worker, and warms
// them up with floorWarmup round trips.
func openFloor(ctx context.Context, url string, replicas int) (_ *floorMeter, err error) {
	f := &floorMeter{}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	reqNC, err := nats.Connect(url, nats.Name("planex-bench-floor-requester"))
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	f.closes = append(f.closes, reqNC.Close)
	workNC, err := nats.Connect(url, nats.Name("planex-bench-floor-worker"))
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	f.closes = append(f.closes, workNC.Close)
	reqJS, err := jetstream.New(reqNC)
	if err != nil {
		return nil, err
	}
	workJS, err := jetstream.New(workNC)
	if err != nil {
		return nil, err
	}
	st, err := reqJS.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: floorStream, Subjects: []string{"planex.bench.floor.>"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Duplicates: time.Minute,
		Replicas: max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("create stream %s: %w", floorStream, err)
	}
	f.closes = append(f.closes, func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = reqJS.DeleteStream(dctx, floorStream)
	})
	consumer := func(name, subject string) (jetstream.Consumer, error) {
		return st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable: name, FilterSubject: subject, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 64,
		})
	}
	work, err := consumer("work", "planex.bench.floor.req")
	if err != nil {
		return nil, fmt.Errorf("floor consumer: %w", err)
	}
	replies, err := consumer("replies", "planex.bench.floor.rep")
	if err != nil {
		return nil, fmt.Errorf("floor consumer: %w", err)
	}
	// The worker: consume a request, publish its reply, ack the request —
	// an executor's path in its simplest form.
	wctx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	f.closes = append(f.closes, stopWork)
	cc, err := work.Consume(func(m jetstream.Msg) {
		id := m.Headers().Get(jetstream.MsgIDHeader)
		if _, err := workJS.PublishMsg(wctx, &nats.Msg{Subject: "planex.bench.floor.rep", Data: m.Data(), Header: nats.Header{jetstream.MsgIDHeader: []string{id + ":rep"}}}); err != nil {
			_ = m.Nak()
			return
		}
		_ = m.Ack()
	}, jetstream.PullMaxMessages(64))
	if err != nil {
		return nil, fmt.Errorf("floor worker: %w", err)
	}
	f.closes = append(f.closes, cc.Stop)
	it, err := replies.Messages(jetstream.PullMaxMessages(64))
	if err != nil {
		return nil, fmt.Errorf("floor replies: %w", err)
	}
	f.closes = append(f.closes, it.Stop)
	f.trip = func(n int) error {
		id := "floor:" + strconv.Itoa(n)
		if _, err := reqJS.PublishMsg(ctx, &nats.Msg{Subject: "planex.bench.floor.req", Data: []byte(id), Header: nats.Header{jetstream.MsgIDHeader: []string{id}}}); err != nil {
			return fmt.Errorf("floor publish: %w", err)
		}
		m, err := it.Next()
		if err != nil {
			return fmt.Errorf("floor reply: %w", err)
		}
		if string(m.Data()) != id {
			return fmt.Errorf("floor reply %q, want %q", m.Data(), id)
		}
		return m.Ack()
	}
	// Warm up the connections, consumers and store.
	for range floorWarmup {
		if err := f.next(); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func (f *floorMeter) next() error {
	f.n++
	return f.trip(f.n)
}

// measure is one repetition: the mean of trips sequential round trips, in
// milliseconds.
func (f *floorMeter) measure(ctx context.Context, trips int) (float64, error) {
	start := time.Now()
	for range trips {
		if err := f.next(); err != nil {
			return 0, err
		}
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return ms(time.Since(start)) / float64(trips), nil
}

// close stops the worker and deletes the floor's stream; once is enough.
func (f *floorMeter) close() {
	for _, c := range slices.Backward(f.closes) {
		c()
	}
	f.closes = nil
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
