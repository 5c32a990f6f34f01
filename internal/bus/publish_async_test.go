package bus_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
)

// TestPublishAsyncOrderDedupAndConflicts checks that asynchronous
// publishes are stored in the order they were started, are deduplicated
// by message id like synchronous ones, and report a failed expected last
// subject sequence from Wait.
func TestPublishAsyncOrderDedupAndConflicts(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	ctx := ctxT(t)
	res, err := bus.Setup(ctx, nc, bus.Options{EventsMaxAge: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	subject := bus.EngineSubject("run1", bus.KindTimer)
	pub := func(id string) bus.Publication {
		return bus.Publication{Subject: subject, MsgID: id, Msg: &planexv1.EngineTimer{RunId: "run1", FireAt: timestamppb.Now(), StepId: id}}
	}
	var pending []*bus.Pending
	for _, id := range []string{"a", "b", "c", "a"} {
		pending = append(pending, bus.PublishAsync(ctx, res.JS, pub(id)))
	}
	var seqs []uint64
	for i, p := range pending {
		ack, err := p.Wait(ctx)
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		if want := i == 3; ack.Duplicate != want {
			t.Fatalf("publish %d: duplicate %v, want %v", i, ack.Duplicate, want)
		}
		seqs = append(seqs, ack.Sequence)
	}
	if !(seqs[0] < seqs[1] && seqs[1] < seqs[2]) || seqs[3] != seqs[0] {
		t.Fatalf("sequences %v: want increasing in start order, the duplicate acknowledged with the first's", seqs)
	}

	stale := seqs[0] // the subject's last sequence is seqs[2]
	p := pub("d")
	p.ExpectLastSubjectSeq = &stale
	_, err = bus.PublishAsync(ctx, res.JS, p).Wait(ctx)
	var apiErr *jetstream.APIError
	if err == nil || !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		t.Fatalf("stale expected last sequence: got %v, want wrong last sequence", err)
	}
	if _, err := bus.PublishAsync(ctx, res.JS, bus.Publication{Subject: subject, Msg: &planexv1.EngineTimer{}}).Wait(ctx); err == nil {
		t.Fatal("publish without message id: want an error")
	}
}
