package runlog_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// lastSubject is the subject of the last message of the events stream.
func lastSubject(t *testing.T, res *bus.Resources) string {
	t.Helper()
	stream, err := res.JS.Stream(t.Context(), bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.GetMsg(t.Context(), info.State.LastSeq)
	if err != nil {
		t.Fatal(err)
	}
	return m.Subject
}

// A decision committed as its step's request goes on the pool's dispatch
// subject, signed, and is checked against the whole run log: a writer
// that did not see it is refused, though it writes on another subject.
func TestDispatchIsCheckedAgainstTheWholeLog(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	a, b := newLog(t, res), newLog(t, res)
	if !a.Routed() {
		t.Fatal("the embedded server supports the routed layout; the log does not use it")
	}
	st := create(t, a, "RUNR")
	if lastSubject(t, res) != bus.RunLogSubject("RUNR") {
		t.Fatalf("RunCreated on %s, want %s", lastSubject(t, res), bus.RunLogSubject("RUNR"))
	}
	stale, err := b.Load(t.Context(), "RUNR")
	if err != nil {
		t.Fatal(err)
	}
	tx := a.Begin(st)
	for _, ev := range []*planexv1.RunEvent{dispatched("x", 1)} {
		if err := tx.Emit(ev); err != nil {
			t.Fatal(err)
		}
	}
	signed := false
	d := &runlog.Dispatch{Pool: "t", Ctx: context.Background(), Sign: func(subject string, data []byte) nats.Header {
		signed = subject == bus.DispatchSubject("RUNR", "t")
		return nats.Header{"Planex-Test-Signature": []string{"1"}}
	}}
	tx.SetDispatch(d)
	st, err = a.Commit(t.Context(), tx)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Sent || !signed || lastSubject(t, res) != bus.DispatchSubject("RUNR", "t") {
		t.Fatalf("dispatch sent %v, signed for its subject %v, on %s", d.Sent, signed, lastSubject(t, res))
	}
	if !st.DirectAttempt("x", 1) {
		t.Fatal("committed state does not know the attempt went as its request")
	}
	// The stale writer's append goes on the log subject, behind the
	// dispatch it never saw: refused.
	if _, err := appendEv(t, b, stale, dispatched("y", 1)); !errors.Is(err, runlog.ErrConflict) {
		t.Fatalf("stale append after a dispatch on another subject: %v, want ErrConflict", err)
	}
	// A fresh reader folds both subjects and learns the attempt is direct
	// from the subject it was stored on.
	got, err := newLog(t, res).Load(t.Context(), "RUNR")
	if err != nil {
		t.Fatal(err)
	}
	if !got.Routed || !got.DirectAttempt("x", 1) || got.Run.GetLastSequence() != 2 {
		t.Fatalf("loaded routed %v direct %v last %d", got.Routed, got.DirectAttempt("x", 1), got.Run.GetLastSequence())
	}
	// The request the pool's consumer gets is the one the event describes.
	stream, _ := res.JS.Stream(t.Context(), bus.StreamEvents)
	m, err := stream.GetLastMsgForSubject(t.Context(), bus.DispatchSubject("RUNR", "t"))
	if err != nil {
		t.Fatal(err)
	}
	req, err := bus.StepRequestOf(&nats.Msg{Subject: m.Subject, Data: m.Data, Header: m.Header})
	if err != nil || req.GetRunId() != "RUNR" || req.GetStepId() != "x" || req.GetAttempt() != 1 || req.GetTool() != "t.x" {
		t.Fatalf("request of the dispatch: %v %v", req, err)
	}
	// Its attempt ends: no longer direct (Direct holds steps in flight).
	st, err = appendEv(t, a, st, succeeded("x", 1))
	if err != nil || st.DirectAttempt("x", 1) {
		t.Fatalf("after success: %v, direct %v", err, st.DirectAttempt("x", 1))
	}
	// Watch reads the routed log.
	var seen []uint64
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	_ = newLog(t, res).Watch(ctx, "RUNR", 1, func(ev *planexv1.RunEvent) error {
		seen = append(seen, ev.GetSequence())
		if len(seen) == 3 {
			cancel()
		}
		return nil
	})
	if len(seen) != 3 {
		t.Fatalf("watched events %v, want 1..3", seen)
	}
}

// A log told to keep one subject per run (the layout of servers before
// 2.11) appends there and never dispatches through the log; both layouts
// are read by any log.
func TestSingleSubjectLayout(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	l, err := runlog.New(t.Context(), res, natstest.Logger(t), runlog.Options{SingleSubject: true})
	if err != nil {
		t.Fatal(err)
	}
	st := create(t, l, "RUNS")
	tx := l.Begin(st)
	if err := tx.Emit(dispatched("x", 1)); err != nil {
		t.Fatal(err)
	}
	d := &runlog.Dispatch{Pool: "t"}
	tx.SetDispatch(d)
	if st, err = l.Commit(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	if d.Sent || st.Routed || st.DirectAttempt("x", 1) || lastSubject(t, res) != bus.EventSubject("RUNS") {
		t.Fatalf("single-subject run: sent %v routed %v on %s", d.Sent, st.Routed, lastSubject(t, res))
	}
	got, err := newLog(t, res).Load(t.Context(), "RUNS")
	if err != nil || got.Routed || got.Run.GetLastSequence() != 2 {
		t.Fatalf("routed log loading a single-subject run: %v", err)
	}
	if _, err := appendEv(t, newLog(t, res), got, succeeded("x", 1)); err != nil {
		t.Fatal(err)
	}
	if lastSubject(t, res) != bus.EventSubject("RUNS") {
		t.Fatalf("a single-subject run stays on its subject, got %s", lastSubject(t, res))
	}
	events, err := runlog.ReadStored(t.Context(), res.JS, "RUNS")
	if err != nil || len(events) != 3 {
		t.Fatalf("ReadStored: %d events, %v", len(events), err)
	}
}

// A routed run met on a server older than 2.11 (a downgrade) is read, but
// not appended to: that server would check an append against one of the
// run's subjects only, so a stale replica could append behind a dispatch.
// Against the machine's distribution NATS (PLANEX_TEST_NATS_URL, default
// nats://127.0.0.1:4222), skipped when there is none or it is 2.11+.
func TestRoutedRunOnAnOldServerIsNotAppended(t *testing.T) {
	url, nc := natstest.External(t)
	if bus.RoutedLogs(nc) {
		t.Skipf("NATS %s at %s checks routed appends", nc.ConnectedServerVersion(), url)
	}
	res, err := bus.Setup(t.Context(), nc, bus.Options{Update: true})
	if err != nil {
		t.Fatal(err)
	}
	runID := fmt.Sprintf("RUNOLD%d", time.Now().UnixNano())
	// The run's first event, as a 2.11+ supervisor wrote it.
	tx := (&runlog.Log{}).Begin(&runlog.State{})
	if err := tx.Emit(&planexv1.RunEvent{RunId: runID, Payload: &planexv1.RunEvent_Created{Created: &planexv1.RunCreated{Goal: "g", Budget: &planexv1.Budget{MaxSteps: 5}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Publish(t.Context(), res.JS, bus.Publication{Subject: bus.RunLogSubject(runID), Msg: tx.Events()[0], MsgID: runID + ":ev:1"}); err != nil {
		t.Fatal(err)
	}
	l := newLog(t, res)
	st, err := l.Load(t.Context(), runID)
	if err != nil {
		t.Fatalf("load a routed run on NATS %s: %v", nc.ConnectedServerVersion(), err)
	}
	if !st.Routed || st.Run.GetLastSequence() != 1 {
		t.Fatalf("loaded routed %v, last sequence %d", st.Routed, st.Run.GetLastSequence())
	}
	if _, err := appendEv(t, l, st, dispatched("x", 1)); err == nil || !strings.Contains(err.Error(), "needs NATS 2.11+") {
		t.Fatalf("append to a routed run on NATS %s: %v, want it refused", nc.ConnectedServerVersion(), err)
	}
}
