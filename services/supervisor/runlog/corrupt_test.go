package runlog_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// recorder is a slog handler that keeps the records at ERROR.
type recorder struct {
	mu     sync.Mutex
	errors []slog.Record
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	if rec.Level >= slog.LevelError {
		r.mu.Lock()
		r.errors = append(r.errors, rec.Clone())
		r.mu.Unlock()
	}
	return nil
}

func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

// errorsAbout counts the ERROR records with attribute run_id = id.
func (r *recorder) errorsAbout(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.errors {
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == "run_id" && a.Value.String() == id {
				n++
			}
			return true
		})
	}
	return n
}

// garbage is what a corruption test appends to a run's log: data and
// headers, given the run's state (two events) and another run's third
// event.
type garbage struct {
	name     string
	notEvent bool
	reason   string
	msg      func(st *runlog.State, foreign *planexv1.RunEvent) (*nats.Msg, error)
}

func garbageCases() []garbage {
	raw := func(data []byte) func(*runlog.State, *planexv1.RunEvent) (*nats.Msg, error) {
		return func(*runlog.State, *planexv1.RunEvent) (*nats.Msg, error) { return &nats.Msg{Data: data}, nil }
	}
	event := func(edit func(st *runlog.State, ev *planexv1.RunEvent)) func(*runlog.State, *planexv1.RunEvent) (*nats.Msg, error) {
		return func(st *runlog.State, _ *planexv1.RunEvent) (*nats.Msg, error) {
			ev := succeeded("x", 1)
			ev.RunId, ev.Sequence, ev.PrevHash = st.Run.GetId(), st.Run.GetLastSequence()+1, st.Hash
			edit(st, ev)
			data, err := proto.Marshal(ev)
			return &nats.Msg{Data: data}, err
		}
	}
	return []garbage{
		{name: "not protobuf", notEvent: true, reason: "does not decode", msg: raw([]byte("\xff\xfe not a planex event"))},
		{name: "protobuf of nothing", notEvent: true, reason: "no run id and no sequence", msg: raw([]byte{0xc0, 0x3e, 0x01})}, // field 1000 = 1
		{name: "empty batch", notEvent: true, reason: "empty event batch", msg: func(*runlog.State, *planexv1.RunEvent) (*nats.Msg, error) {
			m := &nats.Msg{Header: nats.Header{}}
			m.Header.Set(bus.HeaderContentType, "planex.v1.RunEventBatch")
			return m, nil
		}},
		{name: "wrong hash", reason: "hash does not match its content", msg: event(func(_ *runlog.State, ev *planexv1.RunEvent) {
			ev.Hash = []byte("forged")
		})},
		{name: "wrong prev link, hash recomputed", reason: "prev_hash does not match the hash of event 2", msg: event(func(_ *runlog.State, ev *planexv1.RunEvent) {
			ev.PrevHash = []byte("forged")
			ev.Hash, _ = runlog.Hash(ev)
		})},
		{name: "valid event of another run", reason: "belongs to run RUNOTHER", msg: func(_ *runlog.State, foreign *planexv1.RunEvent) (*nats.Msg, error) {
			data, err := proto.Marshal(foreign)
			return &nats.Msg{Data: data}, err
		}},
	}
}

// TestCorruptLogIsNamed appends garbage to a run's log (in both layouts)
// and checks that every reader names the entry — run, event, stream
// sequence, what is wrong — rather than failing anonymously; that nothing
// can be appended past it; that the process logs it once; that other runs
// are unaffected; and that deleting the entry repairs the run.
func TestCorruptLogIsNamed(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	ctx := t.Context()

	// Another run, three events: its third is the "valid event of another
	// run" appended where a run's third belongs.
	other := newLog(t, res)
	ost := create(t, other, "RUNOTHER")
	ost, err := appendEv(t, other, ost, dispatched("x", 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := appendEv(t, other, ost, succeeded("x", 1)); err != nil {
		t.Fatal(err)
	}
	otherEvents, err := runlog.ReadStored(ctx, res.JS, "RUNOTHER")
	if err != nil || len(otherEvents) != 3 {
		t.Fatalf("other run: %v, %d events", err, len(otherEvents))
	}

	for _, layout := range []struct {
		name    string
		single  bool
		subject func(id string) string
	}{
		{"routed", false, bus.RunLogSubject},
		{"single subject", true, bus.EventSubject},
	} {
		for i, tt := range garbageCases() {
			t.Run(layout.name+"/"+tt.name, func(t *testing.T) {
				id := fmt.Sprintf("RUNC%d%s", i, map[bool]string{true: "S", false: "R"}[layout.single])
				rec := &recorder{}
				writer, err := runlog.New(ctx, res, slog.New(rec), runlog.Options{SingleSubject: layout.single})
				if err != nil {
					t.Fatal(err)
				}
				st := create(t, writer, id)
				if st, err = appendEv(t, writer, st, dispatched("x", 1)); err != nil {
					t.Fatal(err)
				}
				m, err := tt.msg(st, otherEvents[2])
				if err != nil {
					t.Fatal(err)
				}
				m.Subject = layout.subject(id)
				ack, err := res.JS.PublishMsg(ctx, m)
				if err != nil {
					t.Fatal(err)
				}
				check := func(what string, err error) {
					t.Helper()
					var be *runlog.BrokenEventError
					if !errors.As(err, &be) || !errors.Is(err, runlog.ErrBrokenChain) {
						t.Fatalf("%s: %v, want a BrokenEventError", what, err)
					}
					if be.RunID != id || be.Sequence != 3 || be.StreamSeq != ack.Sequence || be.NotEvent != tt.notEvent || !strings.Contains(be.Reason, tt.reason) {
						t.Fatalf("%s: %+v, want run %s event 3 at stream sequence %d, not an event %v, reason with %q", what, be, id, ack.Sequence, tt.notEvent, tt.reason)
					}
					want := fmt.Sprintf("hash chain broken at stream sequence %d", ack.Sequence)
					if tt.notEvent {
						want = fmt.Sprintf("the entry at stream sequence %d, where event 3 belongs, is not a planex event", ack.Sequence)
					}
					if advice := be.Advice(); !strings.Contains(advice, "run "+id+" is corrupt: "+want) || !strings.Contains(advice, "planex audit verify "+id) {
						t.Fatalf("%s: advice %q, want it to name %q and the command", what, advice, want)
					}
				}
				// The writer (its cached state is the one before the
				// garbage) and a fresh process (from the snapshot), twice
				// each: the second answer comes from the corrupt-run memory.
				fresh := newLog(t, res)
				for _, l := range []*runlog.Log{writer, fresh, writer, fresh} {
					_, err := l.Load(ctx, id)
					check("load", err)
				}
				var watched []uint64
				err = writer.Watch(ctx, id, 1, func(ev *planexv1.RunEvent) error {
					watched = append(watched, ev.GetSequence())
					return nil
				})
				check("watch", err)
				if len(watched) != 2 {
					t.Fatalf("watch delivered events %v before the broken entry, want 1 and 2", watched)
				}
				_, err = runlog.VerifyStored(ctx, res.JS, id)
				check("verify", err)
				if n := rec.errorsAbout(id); n != 1 {
					t.Fatalf("%d ERROR records about the run, want 1", n)
				}

				// Fail closed: nothing is appended past the entry.
				if _, err := appendEv(t, writer, st, succeeded("x", 1)); !errors.Is(err, runlog.ErrConflict) {
					t.Fatalf("append after the broken entry: %v, want ErrConflict", err)
				}

				// Listed from its snapshot, marked.
				run, err := fresh.Current(ctx, id)
				if err != nil || !runlog.CorruptListing(run) || run.GetStatus() != planexv1.RunStatus_RUN_STATUS_PENDING {
					t.Fatalf("listed: %v, status %s, stop message %q; want PENDING marked corrupt", err, run.GetStatus(), run.GetStopMessage())
				}

				// Other runs are unaffected.
				if _, err := fresh.Load(ctx, "RUNOTHER"); err != nil {
					t.Fatalf("load another run: %v", err)
				}
				if v, err := runlog.VerifyStored(ctx, res.JS, "RUNOTHER"); err != nil || v.Events != 3 {
					t.Fatalf("verify another run: %v %+v", err, v)
				}
				after := create(t, fresh, id+"N")
				if _, err := appendEv(t, fresh, after, dispatched("y", 1)); err != nil {
					t.Fatalf("run created after: %v", err)
				}

				// An operator deletes the forged entry: the run loads again.
				stream, err := res.JS.Stream(ctx, bus.StreamEvents)
				if err != nil {
					t.Fatal(err)
				}
				if err := stream.DeleteMsg(ctx, ack.Sequence); err != nil {
					t.Fatal(err)
				}
				for _, l := range []*runlog.Log{writer, fresh} {
					got, err := l.Load(ctx, id)
					if err != nil || got.Run.GetLastSequence() != 2 {
						t.Fatalf("load after the entry was deleted: %v", err)
					}
				}
				if _, err := appendEv(t, writer, st, succeeded("x", 1)); err != nil {
					t.Fatalf("append after the repair: %v", err)
				}
			})
		}
	}
}

// TestVerifyStoredNamesTheFirstBrokenEntry checks that an entry that is not
// an event is named after the events before it verify, and that a break
// before it comes first.
func TestVerifyStoredNamesTheFirstBrokenEntry(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	ctx := t.Context()
	storedRun(t, res, "RUNVS")
	ack, err := res.JS.Publish(ctx, bus.RunLogSubject("RUNVS"), []byte("\xff\xfe"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = runlog.VerifyStored(ctx, res.JS, "RUNVS")
	var be *runlog.BrokenEventError
	if !errors.As(err, &be) || !be.NotEvent || be.Sequence != 5 || be.StreamSeq != ack.Sequence {
		t.Fatalf("verify: %v, want entry at stream sequence %d, where event 5 belongs, named as not an event", err, ack.Sequence)
	}
	if _, err := runlog.ReadStored(ctx, res.JS, "RUNVS"); !errors.As(err, &be) || be.StreamSeq != ack.Sequence {
		t.Fatalf("read stored: %v, want the entry named", err)
	}
	// Event 2 rewritten (deleted and published again after the garbage):
	// the gap where it was comes first.
	rewrite(t, res, "RUNVS", 2, func(ev *planexv1.RunEvent) {})
	_, err = runlog.VerifyStored(ctx, res.JS, "RUNVS")
	if !errors.As(err, &be) || be.NotEvent || be.Sequence != 2 || be.StreamSeq == 0 || be.StreamSeq == ack.Sequence ||
		!strings.Contains(be.Reason, "missing: the next stored event is 3") {
		t.Fatalf("verify: %v, want the missing event 2 named first, at the stream sequence of event 3", err)
	}
}
