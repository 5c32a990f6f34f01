package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// ReplayConfig is what a replay needs besides the log: the decisions of
// the engine depend on the tool catalog and a few supervisor settings that
// the log does not record.
type ReplayConfig struct {
	// Tools is the catalog the run was decided with (timeouts, retry
	// policies, approval).
	Tools []*planexv1.ToolSpec
	// AutoApprove is the supervisor's --auto-approve.
	AutoApprove []string
	// ScheduleToStartTimeout is the supervisor's
	// --default-schedule-to-start-timeout.
	ScheduleToStartTimeout time.Duration
	// Limits are the supervisor's budget defaults and ceilings (default:
	// DefaultLimits); the step timeout default comes from them.
	Limits Limits
	// InlineOutputBytes is the supervisor's --inline-output-bytes
	// (default 64 KiB).
	InlineOutputBytes int
	// Outputs reads step outputs stored by reference; nil makes a run that
	// has one fail to replay with a clear error.
	Outputs jetstream.ObjectStore
}

// Divergence is the first place where the current engine decides a
// recorded run differently.
type Divergence struct {
	// Sequence is the recorded event where the decisions part: the event
	// the engine decides differently or not at all, or the sequence the
	// engine's extra decision would have had.
	Sequence uint64
	// After is the event (input) after which the engine decided.
	After uint64
	// Recorded is the recorded event (nil: the log ends where the engine
	// decides more).
	Recorded *planexv1.RunEvent
	// Decided is what the engine decides now (nil: nothing).
	Decided *planexv1.RunEvent
	// Diff lists the differing fields, "path: recorded → decided".
	Diff []string
}

func (d *Divergence) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "replay diverges at event %d (deciding after event %d): ", d.Sequence, d.After)
	switch {
	case d.Decided == nil:
		fmt.Fprintf(&b, "recorded %s, the engine now decides nothing", runlog.PayloadName(d.Recorded))
	case d.Recorded == nil:
		fmt.Fprintf(&b, "the log ends, the engine now decides %s", runlog.PayloadName(d.Decided))
	default:
		fmt.Fprintf(&b, "recorded %s, the engine now decides %s", runlog.PayloadName(d.Recorded), runlog.PayloadName(d.Decided))
	}
	for _, l := range d.Diff {
		b.WriteString("\n  " + l)
	}
	return b.String()
}

// ReplayResult summarises a replay.
type ReplayResult struct {
	// Events is the number of recorded events replayed.
	Events int
	// Decisions is how many of them the engine decided again and matched.
	Decisions int
	// Divergence is the first divergence, nil when the engine decides the
	// run exactly as recorded.
	Divergence *Divergence
}

// replayAdvance is how replay decides after an input: the engine's
// advance. Tests replace it with a deliberately changed decision.
var replayAdvance = (*Engine).advance

// timeTolerance absorbs the microseconds between the clock readings of one
// recorded transaction (a retry's retry_at, an attempt's deadline).
const timeTolerance = time.Second

// Replay re-folds a recorded run log and decides it again with the current
// engine code, like Temporal's replayer: after every event that came from
// outside the engine's decisions (the run's creation, planner answers,
// executor results and notices, timers, gate decisions), it runs the
// engine's advance on the state folded so far — at the recorded time — and
// compares the events it emits with the events recorded next. It returns
// the first divergence in the result; an error means the log could not be
// replayed at all (broken chain, output unavailable).
func Replay(ctx context.Context, events []*planexv1.RunEvent, cfg ReplayConfig) (*ReplayResult, error) {
	var now time.Time
	ecfg := Config{
		Limits: cfg.Limits, InlineOutputBytes: cfg.InlineOutputBytes, AutoApprove: cfg.AutoApprove,
		ScheduleToStartTimeout: cfg.ScheduleToStartTimeout, Now: func() time.Time { return now },
	}.withDefaults()
	outputs := cfg.Outputs
	if outputs == nil {
		outputs = noOutputs{}
	}
	e := &Engine{
		cfg:    ecfg,
		res:    &bus.Resources{JS: offlineJS{}, Outputs: outputs},
		tools:  catalog.StaticCache(catalog.Static(cfg.Tools)),
		logger: slog.New(slog.DiscardHandler),
	}
	st := &runlog.State{}
	res := &ReplayResult{}
	var builder runlog.Log // a zero Log builds transactions without committing
	for i := 0; i < len(events); {
		ev := events[i]
		after := ev.GetSequence() - 1
		if d := ev.GetGateDecided(); d != nil && st.Run != nil {
			// A decision: the engine records it and, for a rejection,
			// replans or stops in the same transaction.
			now = ev.GetTime().AsTime()
			tx := builder.Begin(st)
			if err := e.onDecision(tx, d); err != nil {
				return res, fmt.Errorf("replay: decide gate %s at event %d: %w", d.GetGateId(), ev.GetSequence(), err)
			}
			for n, dec := range tx.Events() {
				if i >= len(events) {
					res.Divergence = &Divergence{Sequence: dec.GetSequence(), After: ev.GetSequence(), Decided: dec}
					return res, nil
				}
				rec := events[i]
				if diff := decisionDiff(rec, dec); len(diff) > 0 {
					res.Divergence = &Divergence{Sequence: rec.GetSequence(), After: ev.GetSequence(), Recorded: rec, Decided: dec, Diff: diff}
					return res, nil
				}
				if err := st.Apply(rec, uint64(i)+1); err != nil {
					return res, fmt.Errorf("replay: %w", err)
				}
				i++
				res.Events++
				if n > 0 {
					res.Decisions++
				}
			}
			ev = events[i-1] // the transaction's last event: advance follows it
			after = ev.GetSequence()
		} else if st.Run == nil || !decisionOnly(st.Run, ev) {
			// An input: fold it, then decide as the engine did in the
			// same transaction.
			now = ev.GetTime().AsTime()
			if div, err := recheckResult(ctx, e, &builder, st, ev); err != nil || div != nil {
				res.Divergence = div
				return res, err
			}
			if err := st.Apply(ev, uint64(i)+1); err != nil {
				return res, fmt.Errorf("replay: %w", err)
			}
			i++
			res.Events++
			after = ev.GetSequence()
		}
		// A recorded decision with no input before it was made by a
		// transaction that records none (a retry timer, a repair kick):
		// decide at its time.
		now = ev.GetTime().AsTime()
		tx := builder.Begin(st)
		if err := replayAdvance(e, ctx, tx); err != nil {
			return res, fmt.Errorf("replay: decide after event %d: %w", after, err)
		}
		if len(tx.Events()) == 0 && after != ev.GetSequence() {
			res.Divergence = &Divergence{Sequence: ev.GetSequence(), After: after, Recorded: ev}
			return res, nil
		}
		for _, d := range tx.Events() {
			if i >= len(events) {
				res.Divergence = &Divergence{Sequence: d.GetSequence(), After: after, Decided: d}
				return res, nil
			}
			rec := events[i]
			if diff := decisionDiff(rec, d); len(diff) > 0 {
				res.Divergence = &Divergence{Sequence: rec.GetSequence(), After: after, Recorded: rec, Decided: d, Diff: diff}
				return res, nil
			}
			if err := st.Apply(rec, uint64(i)+1); err != nil {
				return res, fmt.Errorf("replay: %w", err)
			}
			i++
			res.Events++
			res.Decisions++
		}
	}
	return res, nil
}

// replayResult is how replay judges a recorded executor result again: the
// engine's result handling. Tests replace it with a changed judgement.
var replayResult = (*Engine).onResult

// recheckResult judges a recorded step success again. The executor's
// result is an input, but whether its output meets the step's expect (and
// how a large one is kept) is the engine's decision: the StepSucceeded is
// turned back into the executor's result and handed to the engine's result
// handling, which must emit exactly the recorded event. A changed
// expectation check shows as a divergence at that event (the engine now
// decides expectation_failed). An ExpectationFailed does not record the
// output it judged, so it is folded as recorded.
func recheckResult(ctx context.Context, e *Engine, builder *runlog.Log, st *runlog.State, ev *planexv1.RunEvent) (*Divergence, error) {
	s := ev.GetStepSucceeded()
	if s == nil || st.Run == nil {
		return nil, nil
	}
	tx := builder.Begin(st)
	res := &planexv1.StepResult{
		RunId: st.Run.GetId(), StepId: s.GetStepId(), Attempt: s.GetAttempt(), Tool: runlog.Step(st.Run, s.GetStepId()).GetTool(),
		Status: planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED, Output: s.GetOutput(), OutputRef: s.GetOutputRef(),
		Truncated: s.GetTruncated(), Duration: s.GetDuration(), ExecutorId: s.GetExecutorId(),
	}
	if err := replayResult(e, ctx, tx, res); err != nil {
		return nil, fmt.Errorf("replay: judge the result of step %s at event %d: %w", s.GetStepId(), ev.GetSequence(), err)
	}
	decided := tx.Events()
	if len(decided) > 0 && decided[0].GetStepStarted() != nil {
		// The start a result implies when its started notice was not
		// handled first; logs of engines that did not record it fold
		// the success from DISPATCHED.
		decided = decided[1:]
	}
	after := ev.GetSequence() - 1
	if len(decided) == 0 {
		return &Divergence{Sequence: ev.GetSequence(), After: after, Recorded: ev}, nil
	}
	if diff := decisionDiff(ev, decided[0]); len(diff) > 0 {
		return &Divergence{Sequence: ev.GetSequence(), After: after, Recorded: ev, Decided: decided[0], Diff: diff}, nil
	}
	if len(decided) > 1 {
		return &Divergence{Sequence: ev.GetSequence() + 1, After: ev.GetSequence(), Decided: decided[1]}, nil
	}
	return nil, nil
}

// decisionOnly reports whether ev can only come from the engine advancing
// run (never from a message it folds): dispatches, retries, replan
// requests, gates, and the end of a run that is not planning (a planner's
// answer, a cancel or a rejected gate end runs from outside). Gate
// decisions are replayed through the engine's own handling, with the
// replan or stop a rejection records.
func decisionOnly(run *planexv1.Run, ev *planexv1.RunEvent) bool {
	switch p := ev.GetPayload().(type) {
	case *planexv1.RunEvent_StepDispatched, *planexv1.RunEvent_StepRetrying, *planexv1.RunEvent_ReplanRequested, *planexv1.RunEvent_GateOpened:
		return true
	case *planexv1.RunEvent_Finished:
		switch p.Finished.GetStopReason() {
		case planexv1.StopReason_STOP_REASON_CANCELLED, planexv1.StopReason_STOP_REASON_REJECTED:
			return false
		case planexv1.StopReason_STOP_REASON_DEADLINE:
			return true
		}
		s := run.GetStatus()
		return s != planexv1.RunStatus_RUN_STATUS_PENDING && s != planexv1.RunStatus_RUN_STATUS_PLANNING
	}
	return false
}

// decisionDiff compares a recorded decision with the one the engine makes
// now, ignoring what the log adds (run id, sequence, time, hashes) and
// clock jitter within one transaction; it returns the differing fields.
func decisionDiff(rec, dec *planexv1.RunEvent) []string {
	a, b := proto.CloneOf(rec), proto.CloneOf(dec)
	for _, ev := range []*planexv1.RunEvent{a, b} {
		ev.RunId, ev.Sequence, ev.Time, ev.PrevHash, ev.Hash = "", 0, nil, nil, nil
		ev.ProtoReflect().SetUnknown(nil) // the salt of a version 2 hash is random (runlog.Hash)
	}
	if ra, rb := a.GetStepRetrying(), b.GetStepRetrying(); ra != nil && rb != nil && closeTimes(ra.GetRetryAt().AsTime(), rb.GetRetryAt().AsTime()) {
		rb.RetryAt = ra.RetryAt
	}
	if da, db := a.GetStepDispatched(), b.GetStepDispatched(); da != nil && db != nil && (da.Deadline == nil) == (db.Deadline == nil) &&
		closeTimes(da.GetDeadline().AsTime(), db.GetDeadline().AsTime()) {
		db.Deadline = da.Deadline
	}
	if proto.Equal(a, b) {
		return nil
	}
	if runlog.PayloadName(a) != runlog.PayloadName(b) {
		jb, _ := protojson.Marshal(b)
		return []string{"decided: " + string(jb)}
	}
	var ma, mb map[string]any
	ja, _ := protojson.Marshal(a)
	jb, _ := protojson.Marshal(b)
	_ = json.Unmarshal(ja, &ma)
	_ = json.Unmarshal(jb, &mb)
	fa, fb := map[string]string{}, map[string]string{}
	flatten("", ma, fa)
	flatten("", mb, fb)
	keys := map[string]bool{}
	for k := range fa {
		keys[k] = true
	}
	for k := range fb {
		keys[k] = true
	}
	var out []string
	for k := range keys {
		va, okA := fa[k]
		vb, okB := fb[k]
		if va == vb && okA == okB {
			continue
		}
		if !okA {
			va = "(none)"
		}
		if !okB {
			vb = "(none)"
		}
		out = append(out, fmt.Sprintf("%s: recorded %s, decided %s", k, va, vb))
	}
	sort.Strings(out)
	if len(out) == 0 {
		out = []string{"the events differ in a way protojson does not show"}
	}
	return out
}

func closeTimes(a, b time.Time) bool { d := a.Sub(b); return d <= timeTolerance && d >= -timeTolerance }

// flatten maps every leaf of a JSON value to its dotted path.
func flatten(path string, v any, out map[string]string) {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			p := k
			if path != "" {
				p = path + "." + k
			}
			flatten(p, x, out)
		}
	case []any:
		for i, x := range t {
			flatten(fmt.Sprintf("%s[%d]", path, i), x, out)
		}
	default:
		b, _ := json.Marshal(t)
		out[path] = string(b)
	}
}

// offlineJS stands in for JetStream during a replay: the engine asks it
// only for the connection's max payload (none: the default limit).
type offlineJS struct{ jetstream.JetStream }

func (offlineJS) Conn() *nats.Conn { return nil }

// noOutputs is the outputs store of a replay that has none: reads fail
// with a clear error; a large result "stored" is only hashed into its
// reference, as the recorded one was.
type noOutputs struct{ jetstream.ObjectStore }

var errNoOutputs = errors.New("the output is stored by reference in planex-outputs; replay the run by id against its NATS server")

func (noOutputs) GetBytes(_ context.Context, name string, _ ...jetstream.GetObjectOpt) ([]byte, error) {
	return nil, fmt.Errorf("%s: %w", name, errNoOutputs)
}

func (noOutputs) PutBytes(_ context.Context, name string, data []byte) (*jetstream.ObjectInfo, error) {
	return &jetstream.ObjectInfo{ObjectMeta: jetstream.ObjectMeta{Name: name}, Size: uint64(len(data))}, nil
}
