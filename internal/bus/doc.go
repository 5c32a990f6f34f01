// Package bus is planex's JetStream wiring, shared by every service: the
// names of streams, subjects, consumers and buckets; their idempotent
// creation at start-up; protobuf payloads; and OpenTelemetry trace context
// carried in NATS headers so one trace follows a step from the supervisor
// through the queue to the executor and back.
//
// Layout (see docs/queues.md):
//
//	PLANEX_EVENTS  planex.events.<run>.log      limits, the run log (source of truth); on
//	               planex.events.<run>.step.<p> NATS 2.11+ a decision dispatching one step of
//	               planex.events.requests.step.<p> pool p is its request, and requests published
//	                                            apart live here too (consumers pool-<p>);
//	               planex.events.<run>          runs created on older servers
//	PLANEX_STEPS   planex.steps.<pool>.<verb>   work queue, one durable consumer per pool
//	PLANEX_ENGINE  planex.engine.<run>.<kind>   work queue: results, started notices, kicks, decisions
//	               planex.timers.<run>          and persisted timers; two durable consumers shared by all supervisors
//	PLANEX_TIMERS  planex.later.<run>.<key>     NATS 2.12+: message schedules of deadlines and gate SLAs due later
//	               planex.due.<run>             (--hold-timers), fired here when due; consumer supervisor-due
//	KV planex-runs, planex-tools (TTL heartbeats), planex-effects, planex-idempotency
//	Object store planex-outputs (large step outputs)
package bus
