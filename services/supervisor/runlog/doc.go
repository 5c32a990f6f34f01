// Package runlog is the supervisor's run log: every run is the fold of the
// events on its subjects in stream PLANEX_EVENTS — planex.events.<run>.log,
// and planex.events.<run>.step.<pool> for a decision that is the request of
// the one step it dispatches ([Dispatch], NATS 2.11+); runs created on
// older servers keep the single subject planex.events.<run>.
//
// Events are appended with an expected last subject sequence (of the run's
// whole subject filter when routed), so two
// supervisors can never both advance a run (the loser gets [ErrConflict],
// reloads and decides again), and with Nats-Msg-Id "<run>:ev:<n>". They form
// a hash chain: RunEvent.hash commits to the event's content, prev_hash
// included — per field over a salted tree (version 2, see [Hash] and
// [Commitment]: an export can mask a field and prove every other), or
// SHA-256(prev_hash || deterministic encoding of the event without its
// hash) for events appended before (version 1) — verified on every load. A log with an
// entry that is not an event or breaks the chain is corrupt: readers name
// that entry with a [BrokenEventError], and nothing is appended after it.
//
// [Fold] is the pure state transition Run × RunEvent → Run. A [Log] loads a
// run by bringing a cached (or planex-runs snapshotted) [State] up to date
// with the events appended since, so a load usually costs one direct get of
// the subject's last message. Snapshots are only a cache: a snapshot that
// does not chain with the log is discarded.
package runlog
