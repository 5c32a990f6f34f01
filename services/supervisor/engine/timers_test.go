package engine

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// TestTimersInHandAreBounded: timers falling due together (here 300
// deadline timers of one run whose lock is held, so none can finish) are
// handled at most timersPerWorker × workers at once; the rest wait on the
// server instead of as goroutines holding their messages. Once the lock is
// free every timer is handled.
func TestTimersInHandAreBounded(t *testing.T) {
	f := newKickFixture(t)
	const runID = "01JDTIMERSBOUNDED000000000"
	f.commit(&runlog.State{}, runID, &planexv1.RunCreated{Goal: "wait", Budget: testBudget()})
	tools := catalog.StaticCache(catalog.Static([]*planexv1.ToolSpec{{Name: "test.echo", Description: "echo"}}))
	e, err := New(f.ctx, Config{Workers: 1, SweepInterval: -1}, f.res, f.log, tools, f.planner, f.e.logger)
	if err != nil {
		t.Fatal(err)
	}
	const timers = 300
	for i := range timers {
		if _, err := bus.Publish(f.ctx, f.res.JS, bus.Publication{
			Subject: bus.EngineSubject(runID, bus.KindTimer),
			Msg: &planexv1.EngineTimer{RunId: runID, Kind: planexv1.EngineTimerKind_ENGINE_TIMER_KIND_DEADLINE,
				FireAt: timestamppb.New(time.Now().Add(-time.Minute))},
			MsgID: fmt.Sprintf("%s:timer:test:%d", runID, i),
		}); err != nil {
			t.Fatal(err)
		}
	}
	unlock := sync.OnceFunc(e.locks.lock(runID))
	if err := e.Start(f.ctx); err != nil {
		unlock()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop(f.ctx) })
	t.Cleanup(unlock) // first: the handlers must get the lock for Stop to drain them
	bound := int64(timersPerWorker * 1)
	// Wait until the server delivered the first pull's worth to this
	// replica and the handlers took every place.
	cons, err := f.res.JS.Consumer(f.ctx, bus.StreamEngine, ConsumerTimers)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "timers delivered and every place taken", func() bool {
		info, err := cons.Info(f.ctx)
		return err == nil && info.Delivered.Consumer >= 200 && e.timersBusy.Load() >= bound
	})
	if p := e.timersPeak.Load(); p > bound {
		t.Fatalf("%d timers handled at once with the run locked, want at most %d", p, bound)
	}
	unlock()
	waitFor(t, 20*time.Second, "every timer handled", func() bool { return e.timersDone.Load() >= timers })
	if p := e.timersPeak.Load(); p > bound {
		t.Fatalf("%d timers handled at once, want at most %d", p, bound)
	}
}

func waitFor(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
