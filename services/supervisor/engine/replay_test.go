package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/cassette"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// The run logs under testdata/demo were recorded from the demo goals on
// `planex dev` (planex eval eval/demo/suite.yaml --dev --save-logs DIR),
// with the dev stack's catalog (tools.json) and auto-approval of
// email.send. A change to the engine that decides any of them differently
// fails TestReplayDemoLogs: make it a versioned migration, or record the
// logs again if the new decision is intended.

func demoReplay(t *testing.T) (map[string][]*planexv1.RunEvent, ReplayConfig) {
	t.Helper()
	f, err := os.Open("testdata/demo/tools.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tools, err := cassette.ReadTools(f)
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("testdata/demo/*.jsonl")
	if err != nil || len(files) < 6 {
		t.Fatalf("recorded logs: %v %v", files, err)
	}
	logs := map[string][]*planexv1.RunEvent{}
	for _, file := range files {
		r, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		exported, err := runlog.ReadExport(r)
		r.Close()
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		name := strings.TrimSuffix(filepath.Base(file), ".jsonl")
		for _, e := range exported {
			logs[name] = append(logs[name], e.Event)
		}
	}
	return logs, ReplayConfig{Tools: tools, AutoApprove: []string{"email.send"}}
}

func TestReplayDemoLogs(t *testing.T) {
	logs, cfg := demoReplay(t)
	for name, events := range logs {
		t.Run(name, func(t *testing.T) {
			res, err := Replay(t.Context(), events, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if res.Divergence != nil {
				t.Fatalf("the engine decides the recorded run differently:\n%v", res.Divergence)
			}
			if res.Events != len(events) || res.Decisions == 0 {
				t.Fatalf("replayed %d of %d events, %d decisions", res.Events, len(events), res.Decisions)
			}
		})
	}
}

// TestReplayReportsTheFirstDivergentEvent changes the engine's decisions
// in this test build (replayAdvance runs the engine with a changed
// setting) and checks that replay names the first event decided
// differently, with the differing fields.
func TestReplayReportsTheFirstDivergentEvent(t *testing.T) {
	logs, cfg := demoReplay(t)
	orig := replayAdvance
	t.Cleanup(func() { replayAdvance = orig })
	tests := []struct {
		name   string
		log    string
		change func(*Config)
		// first is the first recorded event decided differently: its
		// payload and tool.
		payload, tool string
		diff          string
	}{
		{
			name:    "attempts get a schedule-to-start timeout",
			log:     "open-tickets",
			change:  func(c *Config) { c.ScheduleToStartTimeout = time.Minute },
			payload: "step_dispatched", tool: "sql.query",
			diff: `stepDispatched.scheduleToStartTimeout: recorded (none), decided "60s"`,
		},
		{
			name:    "email.send needs approval again",
			log:     "top-customers-email",
			change:  func(c *Config) { c.AutoApprove = nil },
			payload: "step_dispatched", tool: "email.send",
			diff: `decided: {"gateOpened"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			replayAdvance = func(e *Engine, ctx context.Context, tx *runlog.Tx) error {
				changed := &Engine{cfg: e.cfg, res: e.res, tools: e.tools, logger: e.logger}
				tt.change(&changed.cfg)
				return orig(changed, ctx, tx)
			}
			events := logs[tt.log]
			var want uint64
			for _, ev := range events {
				if runlog.PayloadName(ev) == tt.payload && ev.GetStepDispatched().GetTool() == tt.tool {
					want = ev.GetSequence()
					break
				}
			}
			res, err := Replay(t.Context(), events, cfg)
			if err != nil {
				t.Fatal(err)
			}
			d := res.Divergence
			if d == nil {
				t.Fatal("a changed decision replays without divergence")
			}
			if d.Sequence != want || d.Recorded.GetSequence() != want || d.Decided == nil || res.Events != int(want)-1 {
				t.Fatalf("divergence at event %d after %d replayed, want event %d (first %s of %s):\n%v", d.Sequence, res.Events, want, tt.payload, tt.tool, d)
			}
			if !strings.Contains(d.Error(), tt.diff) || !strings.Contains(d.Error(), fmt.Sprintf("replay diverges at event %d", want)) {
				t.Fatalf("divergence lacks %q:\n%v", tt.diff, d)
			}
		})
	}
}

// TestReplayRechecksExpectations changes how the engine judges a step's
// output in this test build (replayResult evaluates step count's expect
// as "output.row_count == 2", which the recorded output does not meet)
// and checks that replay does not take the recorded success as given: it
// names the step_succeeded event, which the engine now decides as
// expectation_failed.
func TestReplayRechecksExpectations(t *testing.T) {
	logs, cfg := demoReplay(t)
	orig := replayResult
	t.Cleanup(func() { replayResult = orig })
	replayResult = func(e *Engine, ctx context.Context, tx *runlog.Tx, res *planexv1.StepResult) error {
		if s := runlog.PlanStep(tx.Run(), res.GetStepId()); s.GetId() == "count" {
			if s.GetExpect() != "output.row_count == 1" {
				t.Errorf("recorded expect of step count: %q", s.GetExpect())
			}
			s.Expect = "output.row_count == 2"
		}
		return orig(e, ctx, tx, res)
	}
	events := logs["open-tickets"]
	var want uint64
	for _, ev := range events {
		if s := ev.GetStepSucceeded(); s != nil && s.GetStepId() == "count" {
			want = ev.GetSequence()
			break
		}
	}
	res, err := Replay(t.Context(), events, cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := res.Divergence
	if d == nil {
		t.Fatal("a changed expectation check replays without divergence")
	}
	if d.Sequence != want || d.After != want-1 || d.Recorded.GetStepSucceeded() == nil || d.Decided.GetExpectationFailed() == nil || res.Events != int(want)-1 {
		t.Fatalf("divergence at event %d after %d replayed, want the step_succeeded at %d judged expectation_failed:\n%v", d.Sequence, res.Events, want, d)
	}
	if f := d.Decided.GetExpectationFailed(); f.GetStepId() != "count" || f.GetExpect() != "output.row_count == 2" || f.GetMessage() != "evaluated to false" {
		t.Errorf("decided %v", f)
	}
	want1 := fmt.Sprintf("replay diverges at event %d (deciding after event %d): recorded step_succeeded, the engine now decides expectation_failed", want, want-1)
	if msg := d.Error(); !strings.Contains(msg, want1) || !strings.Contains(msg, "output.row_count == 2") {
		t.Errorf("divergence lacks %q and the expect:\n%s", want1, msg)
	}
}
