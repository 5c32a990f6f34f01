package runlog_test

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// storedRun appends a run of four events and returns the stream.
func storedRun(t *testing.T, res *bus.Resources, id string) {
	t.Helper()
	l := newLog(t, res)
	st := create(t, l, id)
	// Event 2 alone in its message, events 3 and 4 as one decision's batch:
	// both shapes the engine writes.
	st, err := appendEv(t, l, st, dispatched("x", 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := appendEv(t, l, st, succeeded("x", 1), dispatched("y", 1)); err != nil {
		t.Fatal(err)
	}
}

// rewrite replaces stored event seq of run id through the NATS API: the
// message holding it (one event or a batch) is deleted from PLANEX_EVENTS
// and published again on its subject with that event modified (the
// only way to "edit" a stream).
func rewrite(t *testing.T, res *bus.Resources, id string, seq uint64, edit func(*planexv1.RunEvent)) {
	t.Helper()
	ctx := t.Context()
	stream, err := res.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	for s := uint64(1); ; {
		m, err := stream.GetMsg(ctx, s, jetstream.WithGetMsgSubject(bus.RunLogFilter(id)))
		if err != nil {
			t.Fatal(err)
		}
		s = m.Sequence + 1
		evs, err := runlog.DecodeEvents(&nats.Msg{Subject: m.Subject, Data: m.Data, Header: m.Header})
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(evs, func(ev *planexv1.RunEvent) bool { return ev.GetSequence() == seq })
		if i < 0 {
			continue
		}
		if err := stream.DeleteMsg(ctx, m.Sequence); err != nil {
			t.Fatal(err)
		}
		evs[i] = proto.CloneOf(evs[i])
		edit(evs[i])
		var data []byte
		if len(evs) == 1 {
			data, err = proto.Marshal(evs[0])
		} else {
			data, err = proto.Marshal(&planexv1.RunEventBatch{Events: evs})
		}
		if err != nil {
			t.Fatal(err)
		}
		out := &nats.Msg{Subject: m.Subject, Data: data, Header: nats.Header{}}
		out.Header.Set(bus.HeaderContentType, m.Header.Get(bus.HeaderContentType))
		if _, err := res.JS.PublishMsg(ctx, out); err != nil {
			t.Fatal(err)
		}
		return
	}
}

func TestVerifyNamesTheRewrittenEvent(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	tests := []struct {
		name   string
		seq    uint64
		edit   func(*planexv1.RunEvent)
		reason string
	}{
		{"middle event, payload changed", 2, func(ev *planexv1.RunEvent) { ev.GetStepDispatched().Tool = "t.evil" }, "stored out of place"},
		{"event inside a batch, payload changed", 3, func(ev *planexv1.RunEvent) {
			ev.GetStepSucceeded().Output = structpb.NewStringValue("evil")
		}, "hash does not match its content"},
		{"last event, payload changed", 4, func(ev *planexv1.RunEvent) { ev.GetStepDispatched().Tool = "t.evil" }, "hash does not match its content"},
		{"last event, hash recomputed, link forged", 4, func(ev *planexv1.RunEvent) {
			ev.GetStepDispatched().Tool = "t.evil"
			ev.PrevHash = []byte("forged")
			ev.Hash, _ = runlog.Hash(ev)
		}, "prev_hash does not match the hash of event 3"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := "RUNV" + string(rune('A'+i))
			storedRun(t, res, id)
			events, err := runlog.ReadStored(t.Context(), res.JS, id)
			if err != nil {
				t.Fatal(err)
			}
			if v, err := runlog.Verify(events, nil); err != nil || v.Events != 4 {
				t.Fatalf("untouched log: %v %+v", err, v)
			}
			rewrite(t, res, id, tt.seq, tt.edit)
			events, err = runlog.ReadStored(t.Context(), res.JS, id)
			if err != nil {
				t.Fatal(err)
			}
			_, err = runlog.Verify(events, nil)
			var be *runlog.BrokenEventError
			if !errors.As(err, &be) || !errors.Is(err, runlog.ErrBrokenChain) {
				t.Fatalf("verify after rewrite: %v, want a BrokenEventError", err)
			}
			if be.Sequence != tt.seq || !strings.Contains(be.Reason, tt.reason) {
				t.Fatalf("verify names event %d (%s), want event %d with %q", be.Sequence, be.Reason, tt.seq, tt.reason)
			}
		})
	}
}

func TestExportRoundTripKeepsTheChain(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	storedRun(t, res, "RUNX")
	events, err := runlog.ReadStored(t.Context(), res.JS, "RUNX")
	if err != nil {
		t.Fatal(err)
	}
	var out []runlog.ExportedEvent
	for _, ev := range events {
		out = append(out, runlog.ExportedEvent{Event: ev})
	}
	// A redacted event keeps its link but its hash cannot be recomputed.
	out[2].Event = proto.CloneOf(out[2].Event)
	out[2].Event.GetStepSucceeded().Output = nil
	out[2].Redacted = true
	var buf bytes.Buffer
	if err := runlog.WriteExport(&buf, out); err != nil {
		t.Fatal(err)
	}
	back, err := runlog.ReadExport(&buf)
	if err != nil {
		t.Fatal(err)
	}
	evs, red := make([]*planexv1.RunEvent, len(back)), make([]bool, len(back))
	for i, e := range back {
		evs[i], red[i] = e.Event, e.Redacted
	}
	v, err := runlog.Verify(evs, red)
	if err != nil {
		t.Fatal(err)
	}
	if v.Events != 4 || len(v.Unchecked) != 1 || v.Unchecked[0] != 3 || !bytes.Equal(v.LastHash, events[3].GetHash()) {
		t.Fatalf("verified %+v", v)
	}
	red[2] = false // claiming the redacted event is original must fail
	if _, err := runlog.Verify(evs, red); err == nil || !strings.Contains(err.Error(), "event 3: hash does not match") {
		t.Fatalf("redacted event checked as original: %v", err)
	}
	if _, err := runlog.ReadExport(strings.NewReader("{\"event\":{}}\nnot json\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("bad line: %v", err)
	}
}
