package bus

import (
	"errors"
	"fmt"
	"strings"
)

// Stream, bucket and consumer names. They are part of planex's operational
// contract: dashboards and runbooks refer to them.
const (
	// StreamEvents holds every run's append-only event log.
	StreamEvents = "PLANEX_EVENTS"
	// StreamSteps is the work queue of step requests for executor pools.
	StreamSteps = "PLANEX_STEPS"
	// StreamEngine is the work queue of everything that advances a run:
	// step results, decisions, timers and kicks.
	StreamEngine = "PLANEX_ENGINE"
	// StreamTimers holds the engine timers due later than ScheduleAfter
	// (run deadlines, gate SLAs) as NATS message schedules (NATS 2.12+),
	// on planex.later.<run>.<key>, which the server fires into
	// planex.due.<run> when they are due. A timer waiting there costs the
	// server an entry in its timing wheel, not a pending delivery of a
	// consumer (see docs/engine.md, Timers).
	StreamTimers = "PLANEX_TIMERS"

	// BucketRuns holds run snapshots (a cache of the event fold).
	BucketRuns = "planex-runs"
	// BucketTools holds the tool catalog; entries expire unless executors
	// renew them.
	BucketTools = "planex-tools"
	// BucketEffects holds idempotency records of side-effecting attempts.
	BucketEffects = "planex-effects"
	// BucketIdempotency maps StartRun idempotency keys to run ids.
	BucketIdempotency = "planex-idempotency"
	// BucketDrafts holds the email pool's drafts, shared by its replicas.
	BucketDrafts = "planex-drafts"
	// BucketSupervisors registers the live supervisor replicas (key: the
	// replica id, value: the engine messages it may hold, in decimal);
	// entries expire unless the replica renews them. Only the supervisor
	// creates it (Resources.SupervisorsBucket).
	BucketSupervisors = "planex-supervisors"
	// BucketStepReplay is the executors' shared cache of the step
	// signatures they accepted (created by internal/stepsign, whose
	// ReplayBucket it names); listed here for the usage gauge, as a full
	// cache refuses every signed step (fail closed).
	BucketStepReplay = "planex-step-replay"
	// BucketToolFloors holds, per tool, the most restrictive registration
	// a supervisor has accepted (side effect, approval, sensitive fields,
	// output masking): a later registration that lowers any of them is
	// refused. Only the supervisor creates, reads and writes it.
	BucketToolFloors = "planex-tool-floors"
	// BucketTenants is the tenant registry (internal/tenant): one key per
	// tenant, its spec as protobuf JSON. It lives in the default tenant's
	// NATS account; only the supervisor reads and writes it.
	BucketTenants = "planex-tenants"
	// BucketUsage holds a tenant's usage counters per UTC day, in the
	// tenant's own NATS account; only the supervisor writes it.
	BucketUsage = "planex-usage"
	// ObjectOutputs stores step outputs too large to keep in events.
	ObjectOutputs = "planex-outputs"
	// ObjectRunIndex holds the supervisors' latest checkpoint of their run
	// index (Resources.RunIndexBucket): a cache of planex-runs that a
	// restarted supervisor loads instead of decoding every snapshot. Only
	// the supervisor creates, reads and writes it.
	ObjectRunIndex = "planex-run-index"

	// ConsumerEngine is the durable consumer shared by all supervisors.
	ConsumerEngine = "supervisor"

	// SubjectEventsPrefix prefixes run log subjects.
	SubjectEventsPrefix = "planex.events."
	// SubjectStepsPrefix prefixes step request subjects.
	SubjectStepsPrefix = "planex.steps."
	// SubjectEnginePrefix prefixes engine subjects.
	SubjectEnginePrefix = "planex.engine."
	// SubjectTimersPrefix prefixes engine timer subjects
	// (planex.timers.<run>), also in PLANEX_ENGINE. Timers live apart from
	// the other engine kinds so that each engine consumer needs a single
	// filter subject (multiple filters need NATS 2.10).
	SubjectTimersPrefix = "planex.timers."
	// SubjectLaterPrefix prefixes the message schedules of timers held in
	// StreamTimers: planex.later.<run>.<key>, one subject per timer.
	SubjectLaterPrefix = "planex.later."
	// SubjectDuePrefix prefixes the timers StreamTimers' schedules fire:
	// planex.due.<run>, kind KindTimer like planex.timers.<run>.
	SubjectDuePrefix = "planex.due."

	// ConsumerDue is the supervisors' durable consumer of the timers
	// StreamTimers fires.
	ConsumerDue = "supervisor-due"
)

// Engine message kinds, the last token of planex.engine.<run>.<kind>.
const (
	// KindResult carries a StepResult from an executor.
	KindResult = "result"
	// KindStarted carries a StepStartedNotice from an executor.
	KindStarted = "started"
	// KindTimer carries an EngineTimer.
	KindTimer = "timer"
	// KindKick carries an EngineKick.
	KindKick = "kick"
	// KindDecision carries a GateDecided from the public API.
	KindDecision = "decision"
)

// ValidToken reports whether s can be used as one NATS subject token
// (run ids, pool names).
// It is ^[A-Za-z0-9_-]{1,128}$, checked without a regular expression
// (it runs for every engine message).
func ValidToken(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isLowerOrDigit(c) && (c < 'A' || c > 'Z') && c != '-' {
			return false
		}
	}
	return true
}

// isLowerOrDigit reports whether c is in [a-z0-9_].
func isLowerOrDigit(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_'
}

// validTool reports whether tool is ^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*$:
// two lower-case words, each starting with a letter.
func validTool(tool string) bool {
	pool, verb, ok := strings.Cut(tool, ".")
	word := func(w string) bool {
		if w == "" || w[0] < 'a' || w[0] > 'z' {
			return false
		}
		for i := 1; i < len(w); i++ {
			if !isLowerOrDigit(w[i]) {
				return false
			}
		}
		return true
	}
	return ok && word(pool) && word(verb)
}

// EventSubject is the run log subject of a run in the single-subject
// layout: every event of the run on planex.events.<run>. Runs created on a
// NATS server older than 2.11 (which cannot check an append against
// several subjects) use it; newer runs use the routed layout
// (RunLogFilter).
func EventSubject(runID string) string { return SubjectEventsPrefix + runID }

// Routed run log layout: a run's events on planex.events.<run>.log, except
// the decisions that dispatch exactly one step, which go on
// planex.events.<run>.step.<pool> and are that step's request too — the
// pool's consumer on PLANEX_EVENTS (DispatchConsumerConfig) delivers them
// straight to its executors. An append is checked against the last
// message of the whole filter planex.events.<run>.>.
const (
	// routedLogToken ends the subject of a routed run's other events.
	routedLogToken = "log"
	// routedStepToken precedes the pool in a dispatching decision's
	// subject.
	routedStepToken = "step"
	// requestsToken takes the place of the run in RequestSubject: run ids
	// are ULIDs (upper case), so it is never a run's.
	requestsToken = "requests"
)

// RequestSubject is the subject of the step requests published apart from
// their decision (a decision that dispatches several steps, or the repeat
// of a request after a crash) for a pool that consumes its steps from
// PLANEX_EVENTS: planex.events.requests.step.<pool>, under the pool's
// DispatchFilter and under no run's log filter.
func RequestSubject(pool string) string {
	return SubjectEventsPrefix + requestsToken + "." + routedStepToken + "." + pool
}

// RunOfLogSubject returns the run whose log a PLANEX_EVENTS subject is part
// of, in either layout; ok is false for the requests published apart
// (RequestSubject), which are no run's log.
func RunOfLogSubject(subject string) (runID string, ok bool) {
	rest, found := strings.CutPrefix(subject, SubjectEventsPrefix)
	if !found {
		return "", false
	}
	runID, _, _ = strings.Cut(rest, ".")
	return runID, runID != "" && runID != requestsToken
}

// ValidRunID reports whether s can be a run id: a subject token that is
// not the requests token.
func ValidRunID(s string) bool { return ValidToken(s) && s != requestsToken }

// RunLogFilter is the subject filter of a routed run's log:
// planex.events.<run>.>.
func RunLogFilter(runID string) string { return SubjectEventsPrefix + runID + ".>" }

// RunLogSubject is the subject of a routed run's events other than the
// decisions that dispatch one step: planex.events.<run>.log.
func RunLogSubject(runID string) string { return SubjectEventsPrefix + runID + "." + routedLogToken }

// DispatchSubject is the subject of a routed run's decision that
// dispatches exactly one step, of pool: planex.events.<run>.step.<pool>.
func DispatchSubject(runID, pool string) string {
	return SubjectEventsPrefix + runID + "." + routedStepToken + "." + pool
}

// DispatchFilter is the filter of pool's consumer on PLANEX_EVENTS:
// planex.events.*.step.<pool>.
func DispatchFilter(pool string) string {
	return SubjectEventsPrefix + "*." + routedStepToken + "." + pool
}

// ParseDispatchSubject returns the run and pool of a DispatchSubject; ok is
// false for any other subject.
func ParseDispatchSubject(subject string) (runID, pool string, ok bool) {
	rest, found := strings.CutPrefix(subject, SubjectEventsPrefix)
	if !found {
		return "", "", false
	}
	runID, rest, _ = strings.Cut(rest, ".")
	step, pool, _ := strings.Cut(rest, ".")
	if runID == "" || runID == requestsToken || step != routedStepToken || pool == "" || strings.Contains(pool, ".") {
		return "", "", false
	}
	return runID, pool, true
}

// EngineSubject is the engine subject for one kind of message about a run:
// planex.engine.<run>.<kind>, and planex.timers.<run> for KindTimer.
func EngineSubject(runID, kind string) string {
	if kind == KindTimer {
		return SubjectTimersPrefix + runID
	}
	return SubjectEnginePrefix + runID + "." + kind
}

// StepSubject is the subject a step for tool ("sql.query") is published on:
// planex.steps.sql.query. The tool's first token is its pool.
func StepSubject(tool string) (string, error) {
	if !validTool(tool) {
		return "", fmt.Errorf("tool name %q: want <pool>.<verb> in lower case", tool)
	}
	return SubjectStepsPrefix + tool, nil
}

// PoolOf returns the pool part of a tool name ("sql" for "sql.query").
func PoolOf(tool string) string {
	pool, _, _ := strings.Cut(tool, ".")
	return pool
}

// PoolConsumer is the durable consumer name of an executor pool.
func PoolConsumer(pool string) string { return "pool-" + pool }

// PoolFilter is the subject filter of an executor pool's consumer on
// PLANEX_STEPS.
func PoolFilter(pool string) string { return SubjectStepsPrefix + pool + ".>" }

// ParseEngineSubject splits planex.engine.<run>.<kind> (and
// planex.timers.<run> and planex.due.<run>, whose kind is KindTimer).
func ParseEngineSubject(subject string) (runID, kind string, err error) {
	for _, prefix := range []string{SubjectTimersPrefix, SubjectDuePrefix} {
		if run, ok := strings.CutPrefix(subject, prefix); ok {
			if run == "" || strings.Contains(run, ".") {
				return "", "", fmt.Errorf("subject %q: want %s<run>", subject, prefix)
			}
			return run, KindTimer, nil
		}
	}
	rest, ok := strings.CutPrefix(subject, SubjectEnginePrefix)
	if !ok {
		return "", "", fmt.Errorf("subject %q is not an engine subject", subject)
	}
	runID, kind, ok = strings.Cut(rest, ".")
	if !ok || runID == "" || kind == "" || strings.Contains(kind, ".") {
		return "", "", fmt.Errorf("subject %q: want %s<run>.<kind>", subject, SubjectEnginePrefix)
	}
	return runID, kind, nil
}

// MsgID builds a deterministic Nats-Msg-Id from parts, so that a repeated
// publish of the same logical message inside the duplicate window is
// dropped by the server.
func MsgID(parts ...string) string { return strings.Join(parts, ":") }

// ToolKey is the planex-tools key under which an executor replica
// registers a tool: "<pool>.<verb>.<replica>".
func ToolKey(tool, replica string) string { return tool + "." + replica }

// ParseToolKey splits a planex-tools key into tool name and replica id.
func ParseToolKey(key string) (tool, replica string, err error) {
	parts := strings.SplitN(key, ".", 3)
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return "", "", fmt.Errorf("tool key %q: want <pool>.<verb>.<replica>", key)
	}
	return parts[0] + "." + parts[1], parts[2], nil
}

// OutputName is the object name of a step attempt's output, in its
// pool's OutputBucket (or, for outputs the supervisor stores itself,
// ObjectOutputs).
func OutputName(runID, stepID string, attempt int32) string {
	return fmt.Sprintf("%s/%s/%d", runID, stepID, attempt)
}

// OutputBucket is the object store holding pool's step outputs too large
// to inline: "planex-outputs-<pool>". Each pool has its own, created by
// its executors, because NATS cannot confine object store access per
// object name (chunk subjects are random, meta subjects encoded names):
// an executor identity may write and look up its own pool's bucket only,
// and reads no other (internal/natsauth). The supervisor reads every
// pool's bucket (Resources.ReadOutput) and writes ObjectOutputs.
func OutputBucket(pool string) string { return ObjectOutputs + "-" + pool }

// ErrOutputBucket is returned for an output reference whose bucket is
// neither ObjectOutputs nor a pool's OutputBucket.
var ErrOutputBucket = errors.New("not a planex output bucket")

// CheckOutputBucket accepts the bucket an output reference names:
// ObjectOutputs (outputs the supervisor stored, and those of executors
// older than the per-pool buckets) or OutputBucket(pool) of a valid pool
// token. Anything else is refused with ErrOutputBucket, so a reference
// written by a compromised executor cannot make the supervisor read an
// arbitrary object store.
func CheckOutputBucket(name string) error {
	if name == ObjectOutputs {
		return nil
	}
	if pool, ok := strings.CutPrefix(name, ObjectOutputs+"-"); ok && ValidToken(pool) && len(name) <= maxBucketName {
		return nil
	}
	return fmt.Errorf("output bucket %q: %w: want %s or %s", name, ErrOutputBucket, ObjectOutputs, OutputBucket("<pool>"))
}

// maxBucketName bounds a bucket name (its stream name "OBJ_<bucket>" must
// stay a valid stream name).
const maxBucketName = 200

// EffectKey is the attempt key of a side-effecting attempt:
// "<run>.<step>.<attempt>". Replicas of a pool name an attempt by it
// (in-flight bookkeeping, attempt queries); its planex-effects record is
// stored under PoolEffectKey. Records written before the per-pool layout
// are stored under the attempt key itself (three subject tokens, where a
// pool's keys have four): executors still read them, never write them.
func EffectKey(runID, stepID string, attempt int32) string {
	return fmt.Sprintf("%s.%s.%d", runID, stepID, attempt)
}

// PoolEffectKey is the planex-effects key of the attempt EffectKey names
// in pool: "<pool>.<run>.<step>.<attempt>". An executor identity may
// write and read its own pool's keys only (internal/natsauth).
func PoolEffectKey(pool, attemptKey string) string { return pool + "." + attemptKey }
