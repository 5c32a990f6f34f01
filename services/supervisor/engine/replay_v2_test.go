package engine

import (
	"bytes"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// TestReplayVersion2Logs appends the demo logs again as the supervisor
// now does (version 2 events, each with a random salt, at the recorded
// times) and replays them: the engine's own events get other salts, which
// must not count as a divergence, and a whole export keeps each salt.
func TestReplayVersion2Logs(t *testing.T) {
	logs, cfg := demoReplay(t)
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	for name, recorded := range logs {
		t.Run(name, func(t *testing.T) {
			var now time.Time
			l, err := runlog.New(t.Context(), res, natstest.Logger(t), runlog.Options{Now: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			st := &runlog.State{}
			var events []*planexv1.RunEvent
			for _, rec := range recorded {
				ev := proto.CloneOf(rec)
				ev.Hash, ev.PrevHash = nil, nil
				now = rec.GetTime().AsTime()
				tx := l.Begin(st)
				if err := tx.Emit(ev); err != nil {
					t.Fatal(err)
				}
				st = tx.State()
				events = append(events, ev)
			}
			if h, _ := runlog.Hash(recorded[0]); bytes.Equal(h, events[0].GetHash()) {
				t.Fatal("the events were appended as version 1")
			}
			out, err := Replay(t.Context(), events, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if out.Divergence != nil {
				t.Fatalf("the engine decides the version 2 log differently:\n%v", out.Divergence)
			}
			if out.Events != len(events) {
				t.Fatalf("replayed %d of %d events", out.Events, len(events))
			}
		})
	}
}
