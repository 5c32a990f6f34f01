package bus_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
)

// A timer due later than TimersAfter becomes a message schedule in
// PLANEX_TIMERS, which the server fires once, at its second, into
// planex.due.<run> with the timer's payload and headers but without its
// message id, removing the schedule; a nearer timer stays parked.
func TestHeldTimerFiresIntoDue(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	ctx := ctxT(t)
	res, err := bus.Setup(ctx, nc, bus.Options{HoldTimers: true, TimersAfter: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !res.HoldsTimers() {
		t.Fatalf("NATS %s: PLANEX_TIMERS does not hold schedules", nc.ConnectedServerVersion())
	}
	const run, id = "01HELD", "01HELD:timer:deadline"
	off, err := bus.Setup(ctx, nc, bus.Options{TimersAfter: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if q := (bus.Publication{Subject: "x", MsgID: id}); !off.HoldsTimers() || off.HoldTimer(ctx, &q, run, time.Now().Add(time.Hour)) {
		t.Fatalf("without HoldTimers: the stream holds schedules %v, a timer held on %s", off.HoldsTimers(), q.Subject)
	}
	near := bus.Publication{Subject: bus.EngineSubject(run, bus.KindTimer), Msg: wrapperspb.String("near"), MsgID: id}
	if res.HoldTimer(ctx, &near, run, time.Now().Add(500*time.Millisecond)) || near.Subject != bus.EngineSubject(run, bus.KindTimer) {
		t.Fatalf("a timer due within TimersAfter was held (%s)", near.Subject)
	}

	fireAt := time.Now().Add(2 * time.Second)
	p := bus.Publication{Subject: bus.EngineSubject(run, bus.KindTimer), Msg: wrapperspb.String("deadline"), MsgID: id}
	if !res.HoldTimer(ctx, &p, run, fireAt) {
		t.Fatal("a timer due in 2s (TimersAfter 1s) was not held")
	}
	if p.Subject != bus.LaterSubject(run, id) || p.ScheduleTarget != bus.DueSubject(run) {
		t.Fatalf("held on %s targeting %s", p.Subject, p.ScheduleTarget)
	}
	if p.ScheduleAt.Before(fireAt) || p.ScheduleAt.Sub(fireAt) >= time.Second || p.ScheduleAt.Nanosecond() != 0 {
		t.Fatalf("scheduled at %v for a timer due %v: want the next whole second", p.ScheduleAt, fireAt)
	}
	if _, err := bus.Publish(ctx, res.JS, p); err != nil {
		t.Fatal(err)
	}
	ack, err := bus.Publish(ctx, res.JS, p)
	if err != nil || !ack.Duplicate {
		t.Fatalf("the same timer again: %+v, %v; want a duplicate", ack, err)
	}

	cons, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamTimers, jetstream.ConsumerConfig{
		Durable: "test-due", FilterSubject: bus.DueSubject("*"), AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got jetstream.Msg
	for m := range batch.Messages() {
		got = m
	}
	if got == nil {
		t.Fatalf("the held timer did not fire within 10s: %v", batch.Error())
	}
	received := time.Now()
	if received.Before(p.ScheduleAt) {
		t.Fatalf("fired at %v, before its schedule %v", received, p.ScheduleAt)
	}
	if got.Subject() != bus.DueSubject(run) {
		t.Fatalf("fired on %s, want %s", got.Subject(), bus.DueSubject(run))
	}
	h := got.Headers()
	if h.Get(jetstream.MsgIDHeader) != "" || h.Get(bus.HeaderContentType) != "google.protobuf.StringValue" || h.Get("Nats-Scheduler") != p.Subject {
		t.Fatalf("fired headers %v: want the content type, the scheduler, no message id", h)
	}
	var body wrapperspb.StringValue
	if err := proto.Unmarshal(got.Data(), &body); err != nil || body.GetValue() != "deadline" {
		t.Fatalf("fired payload %q (%v)", body.GetValue(), err)
	}
	if err := got.Ack(); err != nil {
		t.Fatal(err)
	}
	s, err := res.JS.Stream(ctx, bus.StreamTimers)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetLastMsgForSubject(ctx, p.Subject); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("the schedule is still stored after firing: %v", err)
	}
}

// A PLANEX_TIMERS past 80 % of its share parks timers instead of holding
// them: the stream must discard its oldest messages when full (NATS refuses
// DiscardNew with schedules), and a discarded schedule would be a deadline
// that never fires.
func TestFullTimersStreamParksTimers(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	ctx := ctxT(t)
	res, err := bus.Setup(ctx, nc, bus.Options{MaxBytes: 10 << 20, HoldTimers: true, TimersAfter: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s, err := res.JS.Stream(ctx, bus.StreamTimers)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; c.Discard != jetstream.DiscardOld || c.MaxBytes != 1<<20 || !c.AllowMsgSchedules {
		t.Fatalf("PLANEX_TIMERS: discard %v, max bytes %d, schedules %v", c.Discard, c.MaxBytes, c.AllowMsgSchedules)
	}
	payload := make([]byte, 64<<10)
	for range 14 { // 14 × 64 KiB ≥ 80 % of 1 MiB
		if _, err := res.JS.Publish(ctx, bus.DueSubject("01FILLER"), payload); err != nil {
			t.Fatal(err)
		}
	}
	// A fresh Resources reads the fill at once (it reads it every 5s).
	res, err = bus.Setup(ctx, nc, bus.Options{MaxBytes: 10 << 20, HoldTimers: true, TimersAfter: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	p := bus.Publication{Subject: bus.EngineSubject("01FULL", bus.KindTimer), Msg: wrapperspb.String("x"), MsgID: "01FULL:timer:deadline"}
	if res.HoldTimer(ctx, &p, "01FULL", time.Now().Add(time.Hour)) {
		t.Fatalf("a timer was held in a PLANEX_TIMERS 80 %% full (%s)", p.Subject)
	}
}
