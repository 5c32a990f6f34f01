// Package runlog is the supervisor's run log: every run is the fold of the
// events on its subject planex.events.<run> in stream PLANEX_EVENTS.
//
// Events are appended with an expected last subject sequence, so two
// supervisors can never both advance a run (the loser gets [ErrConflict],
// reloads and decides again), and with Nats-Msg-Id "<run>:ev:<n>". They form
// a hash chain: RunEvent.hash = SHA-256(prev_hash || deterministic encoding
// of the event without its hash), verified on every load.
//
// [Fold] is the pure state transition Run × RunEvent → Run. A [Log] loads a
// run by bringing a cached (or planex-runs snapshotted) [State] up to date
// with the events appended since, so a load usually costs one direct get of
// the subject's last message. Snapshots are only a cache: a snapshot that
// does not chain with the log is discarded.
package runlog
