package backup

import (
	"github.com/planex-dev/planex/internal/trigger"
	"slices"
	"strings"

	"github.com/planex-dev/planex/internal/bus"
)

// Stream is one JetStream stream a backup holds, with why.
type Stream struct {
	// Name is the stream's name ("PLANEX_EVENTS", "KV_planex-effects",
	// "OBJ_planex-outputs-email").
	Name string `json:"name"`
	// Role says what planex keeps there.
	Role string `json:"role"`
	// Required streams exist wherever a supervisor has started; a backup
	// of a NATS without them fails (it is not planex's, or not set up).
	Required bool `json:"required,omitempty"`
}

// Streams are the streams a backup takes, in the order it snapshots them,
// before the output buckets (OutputPrefix, found by listing) and the
// records of side effects. Snapshots are per stream, each consistent in
// itself but taken one after another while planex may run; the order makes
// what the streams disagree on harmless after a restore:
//
//   - what starts runs by itself first: the tenants, schedules and
//     triggers with their firing state and queued events. A firing or an
//     event they show as pending whose run the log already has is sent
//     again with the same idempotency key and finds that run (the keys
//     are taken after the log); taken after the log, a schedule could show
//     a firing done whose run the restored log lacks — a lost firing;
//   - the run log next, the engine inbox and step queues after it: a
//     queued message the log does not know yet is an advance a restored
//     supervisor ignores (a result for an attempt it does not show) or
//     decides again (the same attempt number, so the same effect key),
//     whereas a dispatch the log shows without its request would wait for
//     a timeout;
//   - the idempotency keys and run snapshots after the log: a key without
//     its run makes StartRun create the run under that id, and a snapshot
//     ahead of the log is discarded and rewritten by the first load (the
//     restore's run check loads every run);
//   - the side-effect records (drafts, then effects) last: every side
//     effect a restored queue can deliver again started before the
//     effects snapshot, so its record is in the backup and the executor
//     returns the recorded outcome (or escalates a started, unfinished
//     one) instead of performing it again.
var Streams = []Stream{
	{Name: kvStream(bus.BucketTenants), Role: "tenants: members, pools, quotas, policies (the default tenant's account)"},
	{Name: kvStream(bus.BucketSchedules), Role: "schedules and their firing state (pending firing, cursor, recent firings)"},
	{Name: kvStream(trigger.Bucket), Role: "triggers: subjects, webhooks, CEL filter, goal and key expressions"},
	{Name: trigger.StreamEvents, Role: "trigger events not yet evaluated, with their consumer"},
	{Name: trigger.StreamOutcomes, Role: "trigger event outcomes (the triggers' counters)"},
	{Name: trigger.StreamRejections, Role: "trigger rejection records"},
	{Name: bus.StreamEvents, Role: "run logs (hash-chained events) and, on NATS 2.11+, step requests and the pools' dispatch consumers", Required: true},
	{Name: bus.StreamEngine, Role: "engine inbox: step results, gate decisions, kicks, timers (deadlines, step timeouts, retries)", Required: true},
	{Name: bus.StreamTimers, Role: "timers due later held by NATS as message schedules (run deadlines, gate SLAs; NATS 2.12+)"},
	{Name: bus.StreamSteps, Role: "step requests queued for executor pools (NATS 2.9–2.10, and during upgrades)", Required: true},
	{Name: kvStream(bus.BucketIdempotency), Role: "StartRun idempotency keys", Required: true},
	{Name: kvStream(bus.BucketRuns), Role: "run snapshots (ListRuns reads them)", Required: true},
}

// TailStreams are snapshotted after the output buckets, last of all.
var TailStreams = []Stream{
	{Name: kvStream(bus.BucketToolFloors), Role: "per tool, the most restrictive registration supervisors accepted (security floor)"},
	{Name: kvStream(stepReplayBucket), Role: "step request signatures executors accepted (replay protection)"},
	{Name: kvStream(bus.BucketDrafts), Role: "email drafts and their send state"},
	{Name: kvStream(bus.BucketUsage), Role: "tenants' usage per UTC day (runs, steps, model tokens, cost): what the token and money quotas count"},
	{Name: kvStream(bus.BucketEffects), Role: "records of side-effecting attempts: what keeps a restored queue from repeating a sent mail", Required: true},
}

// Skipped are the planex streams a backup leaves out, with why: each is
// rebuilt by the services within seconds of their start.
var Skipped = []Stream{
	{Name: kvStream(bus.BucketTools), Role: "tool catalog: executors register again every few seconds (TTL 30 s)"},
	{Name: kvStream(bus.BucketSupervisors), Role: "live supervisor replicas: renewed by their heartbeats"},
	{Name: kvStream(planCacheBucket), Role: "the planner's plan cache: a cache, refilled by planning"},
	{Name: "OBJ_" + bus.ObjectRunIndex, Role: "the checkpoint of the supervisors' run index: a cache of planex-runs, written again by the supervisors after a restore"},
	{Name: "PLANEX_BENCH_FLOOR", Role: "planex bench's scratch stream for the JetStream floor, deleted when the bench ends"},
}

// OutputPrefix is the stream name prefix of the output object stores:
// OBJ_planex-outputs and every pool's OBJ_planex-outputs-<pool>.
const OutputPrefix = "OBJ_" + bus.ObjectOutputs

// stepReplayBucket is internal/stepsign's ReplayBucket, named here as
// bus names it for the usage gauge.
const stepReplayBucket = bus.BucketStepReplay

// planCacheBucket is the planner's KV bucket (services/planner, which
// internal/ may not import).
const planCacheBucket = "planex-plans"

func kvStream(bucket string) string { return "KV_" + bucket }

// outputStream reports whether name is an output object store's stream.
func outputStream(name string) bool {
	if name == OutputPrefix {
		return true
	}
	pool, ok := strings.CutPrefix(name, OutputPrefix+"-")
	return ok && bus.ValidToken(pool)
}

// planexStream reports whether a stream's name is planex's (its streams
// PLANEX_*, buckets planex-*, object stores planex-*).
func planexStream(name string) bool {
	return strings.HasPrefix(name, "PLANEX_") || strings.HasPrefix(name, "KV_planex-") || strings.HasPrefix(name, "OBJ_planex-")
}

// known reports whether a backup knows what to do with a planex stream:
// take it (Streams, TailStreams, outputs) or leave it out (Skipped).
func known(name string) bool {
	for _, list := range [][]Stream{Streams, TailStreams, Skipped} {
		for _, s := range list {
			if s.Name == name {
				return true
			}
		}
	}
	return outputStream(name)
}

// plan lists the streams to back up, in order, out of the names of the
// streams that exist; missing are the required ones that do not, unknown
// the planex streams neither taken nor skipped (a backup refuses them
// rather than silently leave state out).
func plan(existing []string) (streams []Stream, missing, unknown []string) {
	for _, name := range existing {
		if planexStream(name) && !known(name) {
			unknown = append(unknown, name)
		}
	}
	slices.Sort(unknown)
	have := func(name string) bool { return slices.Contains(existing, name) }
	add := func(list []Stream) {
		for _, s := range list {
			switch {
			case have(s.Name):
				streams = append(streams, s)
			case s.Required:
				missing = append(missing, s.Name)
			}
		}
	}
	add(Streams)
	var outputs []string
	for _, name := range existing {
		if outputStream(name) {
			outputs = append(outputs, name)
		}
	}
	slices.Sort(outputs)
	for _, name := range outputs {
		streams = append(streams, Stream{Name: name, Role: "step outputs and run results too large for the log"})
	}
	add(TailStreams)
	return streams, missing, unknown
}
