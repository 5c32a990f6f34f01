package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/plan"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// fieldScheduleToStart marks (in StepError.field) a TIMEOUT of an attempt
// no executor started; like Temporal's ScheduleToStart, it is not retried.
const fieldScheduleToStart = "schedule_to_start_timeout"

// maxPendingScan bounds the inbox messages of one run read before a
// timeout is declared.
const maxPendingScan = 64

// stepTimeouts are an attempt's three timeouts (0: none).
type stepTimeouts struct {
	startToClose, scheduleToStart, heartbeat time.Duration
}

// timeouts resolves a step's timeouts: start-to-close as before (step,
// run, tool, server default, ceiling); schedule-to-start from the step,
// else the server default (0: wait for capacity); heartbeat from the step,
// else the tool.
func (e *Engine) timeouts(s *planexv1.Step, b *planexv1.Budget, spec *planexv1.ToolSpec) stepTimeouts {
	t := stepTimeouts{startToClose: e.cfg.Limits.stepTimeout(s, b, spec), scheduleToStart: e.cfg.ScheduleToStartTimeout}
	if d := s.GetScheduleToStartTimeout(); d != nil && d.AsDuration() > 0 {
		t.scheduleToStart = d.AsDuration()
	}
	for _, d := range []interface{ AsDuration() time.Duration }{s.GetHeartbeatTimeout(), spec.GetHeartbeatTimeout()} {
		if d != nil && d.AsDuration() > 0 {
			t.heartbeat = d.AsDuration()
			break
		}
	}
	return t
}

// startToClose is the run time an attempt is given: its recorded
// start-to-close timeout, else (an attempt dispatched by an older
// supervisor) its deadline minus its dispatch time, else def.
func startToClose(st *runlog.State, s *planexv1.StepState, def time.Duration) time.Duration {
	if d := s.GetStartToCloseTimeout(); d != nil && d.AsDuration() > 0 {
		return d.AsDuration()
	}
	if dl, ok := st.Deadlines[s.GetStepId()]; ok && s.GetDispatchedAt() != nil {
		if d := dl.Sub(s.GetDispatchedAt().AsTime()); d > 0 {
			return d
		}
	}
	return def
}

// queueTimer is the schedule-to-start timer of a dispatched attempt, or
// nil when it waits for capacity (no schedule-to-start timeout).
func (e *Engine) queueTimer(st *runlog.State, s *planexv1.StepState) *planexv1.EngineTimer {
	sts := s.GetScheduleToStartTimeout()
	if s.GetDispatchedAt() == nil || sts == nil || sts.AsDuration() <= 0 {
		return nil
	}
	return &planexv1.EngineTimer{
		RunId: st.Run.GetId(), FireAt: timestamppb.New(s.GetDispatchedAt().AsTime().Add(sts.AsDuration())),
		Kind: planexv1.EngineTimerKind_ENGINE_TIMER_KIND_SCHEDULE_TO_START, StepId: s.GetStepId(), Attempt: s.GetAttempt(),
	}
}

// runTimers are the timers of a started attempt: start-to-close from its
// start and the first heartbeat deadline. An attempt dispatched by an
// older supervisor has its timer from dispatch already.
func (e *Engine) runTimers(st *runlog.State, s *planexv1.StepState) []*planexv1.EngineTimer {
	if s.GetStartedAt() == nil || s.GetStartToCloseTimeout() == nil {
		return nil
	}
	start := s.GetStartedAt().AsTime()
	out := []*planexv1.EngineTimer{{
		RunId: st.Run.GetId(), FireAt: timestamppb.New(start.Add(s.GetStartToCloseTimeout().AsDuration())),
		Kind: planexv1.EngineTimerKind_ENGINE_TIMER_KIND_STEP_TIMEOUT, StepId: s.GetStepId(), Attempt: s.GetAttempt(),
	}}
	if hb := s.GetHeartbeatTimeout(); hb != nil && hb.AsDuration() > 0 {
		out = append(out, &planexv1.EngineTimer{
			RunId: st.Run.GetId(), FireAt: timestamppb.New(start.Add(hb.AsDuration())),
			Kind: planexv1.EngineTimerKind_ENGINE_TIMER_KIND_HEARTBEAT, StepId: s.GetStepId(), Attempt: s.GetAttempt(),
		})
	}
	return out
}

func timerSuffix(t *planexv1.EngineTimer) string {
	if t.GetKind() == planexv1.EngineTimerKind_ENGINE_TIMER_KIND_HEARTBEAT {
		return "hb:start"
	}
	return "run"
}

// onStepTimer fires a timeout of a step attempt still in flight: the
// start-to-close timeout of a started attempt, the schedule-to-start
// timeout of one no executor started, or the heartbeat timeout of a
// running one. Before failing the attempt it looks for its outcome in the
// inbox: a replica that prefetched the result (or the started notice,
// or a heartbeat) and died leaves it there until the ack wait passes, and
// the timeout then waits for it instead of failing a step that succeeded.
func (e *Engine) onStepTimer(ctx context.Context, tx *runlog.Tx, t *planexv1.EngineTimer) error {
	run, now := tx.Run(), e.cfg.Now()
	st := runlog.Step(run, t.GetStepId())
	if st == nil || t.GetAttempt() > st.GetAttempt() {
		return errStale
	}
	if st.GetAttempt() != t.GetAttempt() || !runlog.InFlight(st.GetStatus()) || runlog.Critiquing(st) {
		return errIgnore // over, or succeeded and waiting for the model critic
	}
	var due time.Time
	var msg, field string
	kinds := []string{bus.KindResult}
	switch t.GetKind() {
	case planexv1.EngineTimerKind_ENGINE_TIMER_KIND_STEP_TIMEOUT:
		stc := st.GetStartToCloseTimeout()
		if stc == nil {
			// Dispatched by an older supervisor: its timer counts from
			// the dispatch.
			due = t.GetFireAt().AsTime()
			msg = fmt.Sprintf("attempt %d of step %q did not finish within %s", st.GetAttempt(), st.GetStepId(),
				due.Sub(st.GetDispatchedAt().AsTime()).Round(time.Millisecond))
			break
		}
		if st.GetStatus() != planexv1.StepStatus_STEP_STATUS_RUNNING || st.GetStartedAt() == nil {
			return errIgnore
		}
		// A redelivery that started the attempt again re-armed the timer
		// from its start (onRestart): the latest such timer decides.
		newer, err := e.newerTimer(ctx, run.GetId(), t)
		if err != nil || newer {
			return cmpErr(err, errIgnore)
		}
		due = st.GetStartedAt().AsTime().Add(stc.AsDuration())
		if fa := t.GetFireAt().AsTime(); fa.After(due) {
			due = fa
		}
		msg = fmt.Sprintf("attempt %d of step %q did not finish within %s of starting (start_to_close_timeout)", st.GetAttempt(), st.GetStepId(), stc.AsDuration())
	case planexv1.EngineTimerKind_ENGINE_TIMER_KIND_SCHEDULE_TO_START:
		if st.GetStatus() != planexv1.StepStatus_STEP_STATUS_DISPATCHED {
			return errIgnore
		}
		sts := st.GetScheduleToStartTimeout()
		if sts == nil {
			return errIgnore
		}
		kinds = append(kinds, bus.KindStarted)
		due = st.GetDispatchedAt().AsTime().Add(sts.AsDuration())
		msg = fmt.Sprintf("attempt %d of step %q waited %s without an executor starting it (schedule_to_start_timeout)", st.GetAttempt(), st.GetStepId(), sts.AsDuration())
		field = fieldScheduleToStart
	case planexv1.EngineTimerKind_ENGINE_TIMER_KIND_HEARTBEAT:
		hb := st.GetHeartbeatTimeout()
		if st.GetStatus() != planexv1.StepStatus_STEP_STATUS_RUNNING || hb == nil {
			return errIgnore
		}
		newer, err := e.newerTimer(ctx, run.GetId(), t)
		if err != nil || newer {
			return cmpErr(err, errIgnore)
		}
		due = t.GetFireAt().AsTime()
		msg = fmt.Sprintf("attempt %d of step %q sent no heartbeat for %s (heartbeat_timeout)", st.GetAttempt(), st.GetStepId(), hb.AsDuration())
		kinds = append(kinds, bus.KindStarted)
	}
	if now.Before(due) {
		return notYet{due.Sub(now)}
	}
	pending, err := e.pendingFor(ctx, run.GetId(), st.GetStepId(), st.GetAttempt(), kinds...)
	if err != nil {
		return err
	}
	if pending {
		e.logger.InfoContext(ctx, "step timeout deferred: the attempt's outcome waits in the engine inbox", "step_id", st.GetStepId(), "attempt", st.GetAttempt(), "timer", t.GetKind())
		return notYet{e.cfg.AckWait}
	}
	return tx.Emit(Event(&planexv1.StepFailed{StepId: st.GetStepId(), Attempt: st.GetAttempt(), Error: &planexv1.StepError{
		Code: planexv1.ErrorCode_ERROR_CODE_TIMEOUT, Retryable: field == "", Message: msg, Field: field,
	}}))
}

func cmpErr(err, otherwise error) error {
	if err != nil {
		return err
	}
	return otherwise
}

// pendingFor reports whether the engine inbox still holds a message of
// one of kinds (result, started) about the attempt: unacknowledged by a
// replica (perhaps a dead one) or not delivered yet. PLANEX_ENGINE is a
// work queue, so every message in it is pending.
func (e *Engine) pendingFor(ctx context.Context, runID, stepID string, attempt int32, kinds ...string) (bool, error) {
	for _, kind := range kinds {
		found, err := e.scanInbox(ctx, bus.EngineSubject(runID, kind), func(data *nats.Msg) bool {
			var m interface {
				proto.Message
				GetStepId() string
				GetAttempt() int32
			}
			switch kind {
			case bus.KindResult:
				m = &planexv1.StepResult{}
			default:
				m = &planexv1.StepStartedNotice{}
			}
			return bus.Decode(data, m) == nil && m.GetStepId() == stepID && m.GetAttempt() == attempt
		})
		if err != nil || found {
			return found, err
		}
	}
	return false, nil
}

// newerTimer reports whether a later timer of the same kind and attempt
// waits in the inbox (a heartbeat timer re-armed by a heartbeat, a
// start-to-close timer re-armed by a restart): then t is superseded.
func (e *Engine) newerTimer(ctx context.Context, runID string, t *planexv1.EngineTimer) (bool, error) {
	return e.scanInbox(ctx, bus.EngineSubject(runID, bus.KindTimer), func(m *nats.Msg) bool {
		o := &planexv1.EngineTimer{}
		return bus.Decode(m, o) == nil && o.GetKind() == t.GetKind() &&
			o.GetStepId() == t.GetStepId() && o.GetAttempt() == t.GetAttempt() && o.GetFireAt().AsTime().After(t.GetFireAt().AsTime())
	})
}

// scanInbox reads the messages of one PLANEX_ENGINE subject (direct gets,
// oldest first, at most maxPendingScan) until match holds.
func (e *Engine) scanInbox(ctx context.Context, subject string, match func(*nats.Msg) bool) (bool, error) {
	seq := uint64(1)
	for range maxPendingScan {
		m, err := e.inbox.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("read engine inbox %s: %w", subject, err)
		}
		if match(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data}) {
			return true, nil
		}
		seq = m.Sequence + 1
	}
	return false, nil
}

// onHeartbeat pushes a running attempt's heartbeat timeout forward: it
// publishes a heartbeat timer due heartbeat_timeout after this heartbeat
// (without appending to the run log). A heartbeat of an attempt whose
// started notice was lost is handled as that notice (handled false).
func (e *Engine) onHeartbeat(ctx context.Context, runID string, n *planexv1.StepStartedNotice) (handled bool, err error) {
	st, err := e.log.Load(ctx, runID)
	if err != nil {
		return true, err
	}
	s := runlog.Step(st.Run, n.GetStepId())
	switch {
	case runlog.Terminal(st.Run.GetStatus()):
		return true, errIgnore
	case s == nil || n.GetAttempt() > s.GetAttempt():
		return true, errStale
	case n.GetAttempt() < s.GetAttempt():
		return true, errIgnore
	case s.GetStatus() == planexv1.StepStatus_STEP_STATUS_DISPATCHED:
		return false, nil
	case s.GetStatus() != planexv1.StepStatus_STEP_STATUS_RUNNING:
		return true, errIgnore
	}
	hb := s.GetHeartbeatTimeout()
	if hb == nil || hb.AsDuration() <= 0 {
		return true, errIgnore
	}
	at := e.cfg.Now()
	if t := n.GetHeartbeatAt(); t != nil && t.AsTime().Before(at) {
		at = t.AsTime()
	}
	t := &planexv1.EngineTimer{
		RunId: runID, FireAt: timestamppb.New(at.Add(hb.AsDuration())),
		Kind: planexv1.EngineTimerKind_ENGINE_TIMER_KIND_HEARTBEAT, StepId: s.GetStepId(), Attempt: s.GetAttempt(),
	}
	return true, e.publishTimer(ctx, st, t, "hb:"+strconv.FormatInt(at.UnixNano(), 10))
}

// onRestart handles the started notice of an attempt already running: a
// redelivery that started it again on another replica (or on the same one)
// after its first owner died or lost its delivery. It is the same attempt
// — its effect record, its message ids — so the run log keeps the first
// start; but the new owner gets the attempt's whole start-to-close timeout
// from its own start, and its start counts as a heartbeat, so a live,
// heartbeating new owner is never timed out on the dead one's clock.
// Redeliveries are bounded by the pool's max deliveries, so restarts
// cannot extend an attempt without limit. Notices that are not later than
// the recorded start (a repeat of the first one) are left to onStarted
// (handled false).
func (e *Engine) onRestart(ctx context.Context, runID string, n *planexv1.StepStartedNotice) (handled bool, err error) {
	st, err := e.log.Load(ctx, runID)
	if err != nil {
		return true, err
	}
	s := runlog.Step(st.Run, n.GetStepId())
	if runlog.Terminal(st.Run.GetStatus()) || s == nil || s.GetAttempt() != n.GetAttempt() ||
		s.GetStatus() != planexv1.StepStatus_STEP_STATUS_RUNNING || s.GetStartedAt() == nil || n.GetStartedAt() == nil ||
		!n.GetStartedAt().AsTime().After(s.GetStartedAt().AsTime()) {
		return false, nil
	}
	at := n.GetStartedAt().AsTime()
	if now := e.cfg.Now(); at.After(now) {
		at = now // the executor's clock runs ahead; never beyond now
	}
	e.logger.InfoContext(ctx, "attempt started again by a redelivery; its timeouts count from the new start",
		"step_id", s.GetStepId(), "attempt", s.GetAttempt(), "executor_id", n.GetExecutorId(), "first_executor_id", s.GetExecutorId())
	suffix := strconv.FormatInt(at.UnixNano(), 10)
	var timers []func() error
	if stc := s.GetStartToCloseTimeout(); stc != nil && stc.AsDuration() > 0 {
		t := &planexv1.EngineTimer{
			RunId: runID, FireAt: timestamppb.New(at.Add(stc.AsDuration())),
			Kind: planexv1.EngineTimerKind_ENGINE_TIMER_KIND_STEP_TIMEOUT, StepId: s.GetStepId(), Attempt: s.GetAttempt(),
		}
		timers = append(timers, func() error { return e.publishTimer(ctx, st, t, "run:"+suffix) })
	}
	if hb := s.GetHeartbeatTimeout(); hb != nil && hb.AsDuration() > 0 {
		t := &planexv1.EngineTimer{
			RunId: runID, FireAt: timestamppb.New(at.Add(hb.AsDuration())),
			Kind: planexv1.EngineTimerKind_ENGINE_TIMER_KIND_HEARTBEAT, StepId: s.GetStepId(), Attempt: s.GetAttempt(),
		}
		timers = append(timers, func() error { return e.publishTimer(ctx, st, t, "hb:"+suffix) })
	}
	if len(timers) == 0 {
		return true, errIgnore
	}
	return true, concurrently(timers)
}

// retry schedules the next attempt of a failed step when its retry policy
// allows it, the step budget has room and the retry can start before the
// run's deadline. It reports whether it did.
func (e *Engine) retry(ctx context.Context, tx *runlog.Tx, s *planexv1.Step, st *planexv1.StepState) (bool, error) {
	serr := st.GetError()
	if serr == nil || serr.GetField() == fieldScheduleToStart || serr.GetField() == fieldPolicy {
		return false, nil
	}
	cat, err := e.tools.Get(ctx)
	if err != nil {
		return false, err
	}
	spec, _ := cat.Tool(s.GetTool())
	pol := plan.RetryOf(s, spec)
	if !pol.Retries(serr.GetCode(), int(st.GetRetries())) {
		return false, nil
	}
	run := tx.Run()
	if run.GetUsage().GetSteps() >= run.GetBudget().GetMaxSteps() {
		return false, nil
	}
	n := st.GetRetries() + 1
	at := e.cfg.Now().Add(pol.Backoff(int(n)))
	if dl := runDeadline(run); !dl.IsZero() && !at.Before(dl) {
		return false, nil
	}
	e.logger.InfoContext(ctx, "retrying step", "step_id", st.GetStepId(), "attempt", st.GetAttempt(), "retry", n, "code", serr.GetCode().String(), "at", at)
	return true, tx.Emit(Event(&planexv1.StepRetrying{
		StepId: st.GetStepId(), Attempt: st.GetAttempt(), Retry: n, RetryAt: timestamppb.New(at), Error: serr,
	}))
}

// finishStep stops the run because of a failed step the planner does not
// recover from (why is the planner's give-up message, "" when it gave
// none or the run allows no replan). The stop message is what the user
// can act on, first and alone; the step, tool, attempts, error code, field
// and error behind it go to the detail (Run.stop_detail).
//
// The stop reason says whether something is broken:
//   - STEP_TIMEOUT for a timeout;
//   - NO_DATA when the data says no: the planner's own message (a
//     playbook's fail: branch) about a failure that is not a broken tool,
//     an expectation that did not hold (EXPECTATION_FAILED) or a refusal
//     (PERMISSION_DENIED: a recipient or action a policy refuses);
//   - STEP_FAILED otherwise (a broken tool, an invalid argument).
//
// The message is the planner's own message when it gave one; else a
// refusal's message without its field; else the step's error with the
// step, tool and attempts. A give-up message that only restates the
// step's error (a playbook without a branch for the failure answers
// `step "x" (tool) failed: <error>`) is not the planner's own.
func finishStep(tx *runlog.Tx, failed *planexv1.StepState, why string) error {
	serr := failed.GetError()
	code := serr.GetCode()
	if restatesStepError(why, failed) {
		why = ""
	}
	attempts := failed.GetRetries() + 1
	noun := "attempt"
	if attempts > 1 {
		noun = "attempts"
	}
	where := fmt.Sprintf("step %q (%s) failed after %d %s", failed.GetStepId(), failed.GetTool(), attempts, noun)
	detail := fmt.Sprintf("%s: %s", where, strings.TrimPrefix(code.String(), "ERROR_CODE_"))
	if f := serr.GetField(); f != "" {
		detail += " at " + f
	}
	detail += ": " + withoutField(serr.GetMessage(), serr.GetField())

	reason := planexv1.StopReason_STOP_REASON_STEP_FAILED
	switch {
	case code == planexv1.ErrorCode_ERROR_CODE_TIMEOUT:
		reason = planexv1.StopReason_STOP_REASON_STEP_TIMEOUT
	case dataRefusal(code), why != "" && !brokenStep(code):
		reason = planexv1.StopReason_STOP_REASON_NO_DATA
	}
	msg := why
	switch {
	case msg != "":
	case code == planexv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED && serr.GetMessage() != "":
		// The refusal is written for the user; the field it names is
		// in the detail.
		msg = withoutField(serr.GetMessage(), serr.GetField())
	default:
		msg = where + ": " + serr.GetMessage()
		if serr.GetMessage() == "" {
			msg = where + ": " + strings.ToLower(strings.TrimPrefix(code.String(), "ERROR_CODE_"))
		}
	}
	return tx.Emit(Event(&planexv1.RunFinished{Status: planexv1.RunStatus_RUN_STATUS_FAILED, StopReason: reason, Message: msg, Detail: detail}))
}

// dataRefusal reports whether a step error is the data (or a policy over
// it) saying no rather than something broken: an expect that did not hold
// or a refusal.
func dataRefusal(code planexv1.ErrorCode) bool {
	switch code {
	case planexv1.ErrorCode_ERROR_CODE_EXPECTATION_FAILED, planexv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED:
		return true
	}
	return false
}

// brokenStep reports whether a step error means a tool, a backend or
// planex itself is broken, whatever a playbook says about it: such a run
// stops STEP_FAILED (or STEP_TIMEOUT) even with a fail: message.
func brokenStep(code planexv1.ErrorCode) bool {
	switch code {
	case planexv1.ErrorCode_ERROR_CODE_UNSPECIFIED, planexv1.ErrorCode_ERROR_CODE_UNKNOWN_TOOL,
		planexv1.ErrorCode_ERROR_CODE_TIMEOUT, planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN,
		planexv1.ErrorCode_ERROR_CODE_MAX_DELIVERIES, planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE,
		planexv1.ErrorCode_ERROR_CODE_CANCELLED, planexv1.ErrorCode_ERROR_CODE_INTERNAL:
		return true
	}
	return false
}

// restatesStepError reports whether a planner's give-up message says no
// more than the failed step's own error: empty, the error itself, or the
// playbook planner's "step %q (tool) failed: <error>" for a failure no
// on_failure branch handles.
func restatesStepError(why string, failed *planexv1.StepState) bool {
	msg := failed.GetError().GetMessage()
	if msg == "" {
		msg = strings.ToLower(strings.TrimPrefix(failed.GetError().GetCode().String(), "ERROR_CODE_"))
	}
	why = strings.TrimSpace(why)
	if why == "" || why == msg {
		return true
	}
	for _, step := range []string{fmt.Sprintf("step %q (%s)", failed.GetStepId(), failed.GetTool()), fmt.Sprintf("step %q", failed.GetStepId())} {
		if why == step+" failed: "+msg {
			return true
		}
	}
	return false
}

// withoutField drops the "args.to[0]: " an executor puts before the
// message of an error about one argument.
func withoutField(msg, field string) string {
	if field == "" {
		return msg
	}
	if m, ok := strings.CutPrefix(msg, field+": "); ok && m != "" {
		return m
	}
	return msg
}

// succeed finishes the run with its result, storing a result larger than
// the inline limit in planex-outputs (<run>/result/0, a name no step
// output has) and keeping only its reference in the log, so the last
// event never exceeds the NATS payload limit.
func (e *Engine) succeed(ctx context.Context, tx *runlog.Tx, msg string, result *structpb.Value) error {
	if result == nil || proto.Size(result) <= e.cfg.InlineOutputBytes {
		return finish(tx, planexv1.StopReason_STOP_REASON_SUCCEEDED, msg, result, 0)
	}
	data, err := protojson.Marshal(result)
	if err != nil {
		return fmt.Errorf("encode result of run %s: %w", tx.Run().GetId(), err)
	}
	name := bus.OutputName(tx.Run().GetId(), "result", 0)
	if _, err := e.res.Outputs.PutBytes(ctx, name, data); err != nil {
		return fmt.Errorf("%w: store result of run %s: %w", errOutputs, tx.Run().GetId(), err)
	}
	sum := sha256.Sum256(data)
	return tx.Emit(Event(&planexv1.RunFinished{
		Status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED, StopReason: planexv1.StopReason_STOP_REASON_SUCCEEDED, Message: msg,
		ResultRef: &planexv1.OutputRef{Bucket: bus.ObjectOutputs, Name: name, Size: int64(len(data)), Sha256: hex.EncodeToString(sum[:])},
	}))
}

// maxArgsBytes is the largest resolved arguments a step may be dispatched
// with: the connection's max payload less room for the rest of the
// request and event.
func (e *Engine) maxArgsBytes() int {
	limit := 1 << 20
	if nc := e.res.JS.Conn(); nc != nil && nc.MaxPayload() > 0 {
		limit = int(nc.MaxPayload())
	}
	return max(limit-16<<10, 1024)
}
