package runlog

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
)

var (
	// ErrRunNotFound is returned by Load for a run that has no log (never
	// created, or expired by the events retention).
	ErrRunNotFound = errors.New("run not found")
	// ErrConflict is returned by Commit when another writer appended to the
	// run since it was loaded: reload and decide again.
	ErrConflict = errors.New("run log advanced concurrently")
)

// A run's snapshot is written at every status change and, in between, by
// its cadence: once it lags the log by snapshotEvery events and was last
// written snapshotInterval ago, or whenever it lags by snapshotMaxLag
// events or a snapshotShare-th of the run, whichever is more. A snapshot
// is a cache (a load folds the events after it): the interval keeps a
// fast run from writing one every few milliseconds (each costs in
// proportion to the plan) while ListRuns stays that fresh, and the lag
// bounds how far a load after a crash folds while the cost of writing
// snapshots stays a constant share per event on long runs.
const (
	snapshotEvery    = 16
	snapshotInterval = 200 * time.Millisecond
	snapshotMaxLag   = 1024
	snapshotShare    = 4
)

// snapshotDue reports whether a run at sequence last, whose snapshot was
// last seen or written at sequence seq and started at, is due for one.
func (l *Log) snapshotDue(last, seq uint64, at time.Time) bool {
	lag := last - seq
	return lag >= snapshotEvery && (time.Since(at) >= l.snapInterval || lag >= max(snapshotMaxLag, last/snapshotShare))
}

// Log reads and appends run logs on PLANEX_EVENTS and keeps snapshots in
// planex-runs. It keeps recently used states in memory, checked against the
// stream's last sequence on every load. It is safe for concurrent use; the
// caller serialises work on one run.
type Log struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	kv     jetstream.KeyValue
	logger *slog.Logger
	now    func() time.Time
	cache  *stateCache
	// checked: the server checks appends against a subject filter (NATS
	// 2.11+); routed: new runs use the routed layout (bus.RunLogFilter).
	checked, routed bool
	// snapInterval is Options.SnapshotInterval.
	snapInterval time.Duration
	// legacy is Options.LegacyHashes.
	legacy bool

	// ctx is New's: it bounds the watch behind index (the service's life;
	// once it ends, listing falls back to listing the bucket).
	ctx       context.Context
	index     searchIndex // search.go
	indexOnce sync.Once

	// corrupt remembers the runs found corrupt (corrupt.go).
	corrupt      corruptRuns
	corruptCount metric.Int64Counter
	// appended remembers the digests of this process's latest appends
	// (appended.go).
	appended *appended
}

// Options tune a Log.
type Options struct {
	// CacheSize bounds the states kept in memory (default 10000).
	CacheSize int
	// Now is the clock stamping events (default time.Now).
	Now func() time.Time
	// SingleSubject creates new runs with every event on
	// planex.events.<run>, as on servers older than 2.11, even where the
	// server could check the routed layout (for tests of that layout and
	// as an operator's way back).
	SingleSubject bool
	// SnapshotInterval is how long a run's snapshot waits, once it lags
	// its log by 16 events, before the next is written (default 200ms; see
	// snapshotInterval).
	SnapshotInterval time.Duration
	// LegacyHashes appends version 1 events (no salt, the hash of
	// releases before per-field commitments), which supervisors of those
	// releases can verify: for a rolling upgrade while they still run.
	// Either version is always read and verified.
	LegacyHashes bool
	// IndexCheckpoints configure checkpoints of the run index
	// (checkpoint.go): with a store, a restart loads the last one instead
	// of every snapshot.
	IndexCheckpoints IndexCheckpoints
}

// Routed reports whether new runs use the routed layout.
func (l *Log) Routed() bool { return l.routed }

// lastMessage returns the last message of a run's log in either layout.
func (l *Log) lastMessage(ctx context.Context, runID string) (*jetstream.RawStreamMsg, error) {
	if l.routed {
		last, err := l.stream.GetLastMsgForSubject(ctx, bus.RunLogFilter(runID))
		if !errors.Is(err, jetstream.ErrMsgNotFound) {
			return last, err
		}
	}
	last, err := l.stream.GetLastMsgForSubject(ctx, bus.EventSubject(runID))
	if errors.Is(err, jetstream.ErrMsgNotFound) && !l.routed {
		// A routed run on a server now older than 2.11 (a downgrade):
		// readable, though it is not appended to safely any more.
		if m, rerr := l.stream.GetLastMsgForSubject(ctx, bus.RunLogFilter(runID)); rerr == nil {
			return m, nil
		}
	}
	return last, err
}

// logFilter is the subject filter of a run's log, given the subject of one
// of its messages.
func logFilter(runID, subject string) string {
	if subject == bus.EventSubject(runID) {
		return subject
	}
	return bus.RunLogFilter(runID)
}

const instrumentation = "github.com/planex-dev/planex/services/supervisor/runlog"

// New returns a Log on the PLANEX_EVENTS stream and the planex-runs bucket.
func New(ctx context.Context, res *bus.Resources, logger *slog.Logger, opts Options) (*Log, error) {
	stream, err := res.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", bus.StreamEvents, err)
	}
	if opts.CacheSize <= 0 {
		opts.CacheSize = 10000
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	checked := bus.RoutedLogs(res.JS.Conn())
	interval := opts.SnapshotInterval
	if interval == 0 {
		interval = snapshotInterval
	}
	corruptCount, err := newCorruptCounter(otel.Meter(instrumentation))
	if err != nil {
		return nil, err
	}
	l := &Log{
		js: res.JS, stream: stream, kv: res.Runs, logger: logger, now: opts.Now, cache: newStateCache(opts.CacheSize),
		checked:      checked,
		routed:       checked && !opts.SingleSubject,
		snapInterval: interval,
		legacy:       opts.LegacyHashes,
		ctx:          ctx,
		corruptCount: corruptCount,
		appended:     newAppended(appendedSize),
	}
	if opts.IndexCheckpoints.Store != nil {
		l.index.cp = opts.IndexCheckpoints.withDefaults()
		l.index.cp.js = res.JS
	}
	return l, nil
}

// CheckpointIndex writes a checkpoint of the run index if it changed
// since the last one and is large enough to be worth one (see
// IndexCheckpoints), so that the next start loads it: a replica stopping
// calls it. It returns how many runs it wrote (0: none was needed).
func (l *Log) CheckpointIndex(ctx context.Context) (int, error) {
	if l.index.cp.Store == nil {
		return 0, nil
	}
	n, err := l.index.checkpoint(ctx, l.kv, true)
	if errors.Is(err, errSkipped) {
		return 0, nil
	}
	return n, err
}

// IndexRestored reports how many runs the run index loaded from a
// checkpoint and how long that took (0: it was loaded from planex-runs).
func (l *Log) IndexRestored() (int, time.Duration) {
	l.index.mu.RLock()
	defer l.index.mu.RUnlock()
	return l.index.restored, l.index.restoreTime
}

// Load returns the current state of a run: the cached or snapshotted state
// brought up to date with the events appended since, verifying the hash
// chain. It returns ErrRunNotFound for an unknown run, and a
// *BrokenEventError naming the first broken entry of a corrupt log (see
// corrupt.go). The state may be shared with the cache: callers must not
// modify it (Begin copies it).
func (l *Log) Load(ctx context.Context, runID string) (*State, error) {
	if !bus.ValidRunID(runID) {
		return nil, fmt.Errorf("load run %q: %w", runID, ErrRunNotFound)
	}
	last, err := l.lastMessage(ctx, runID)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		l.cache.remove(runID)
		return nil, fmt.Errorf("load run %s: %w", runID, ErrRunNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("load run %s: last event: %w", runID, err)
	}
	base := l.cache.get(runID)
	if base != nil && base.StreamSeq == last.Sequence {
		return base, nil
	}
	if be := l.corrupt.get(runID, last.Sequence); be != nil {
		return nil, be // unchanged since it was found corrupt
	}
	if base == nil || base.StreamSeq > last.Sequence {
		base = l.snapshot(ctx, runID, last.Sequence)
	}
	st, err := l.catchUp(ctx, base, runID, last)
	var be *BrokenEventError
	if err != nil && base.Run != nil && !(errors.As(err, &be) && be.NotEvent) {
		// A cached or snapshotted state that does not chain with the log is
		// discarded; the log is the truth. (An entry that is not an event
		// is wrong whatever the state.)
		l.logger.WarnContext(ctx, "run state does not chain with its log, folding from the start", "run_id", runID, "err", err)
		st, err = l.catchUp(ctx, &State{}, runID, last)
	}
	if err != nil {
		l.cache.remove(runID)
		if errors.As(err, &be) {
			l.noteCorrupt(ctx, be, last.Sequence)
		}
		return nil, err
	}
	l.corrupt.forget(runID)
	if st.Run.GetStatus() != st.snapStatus() {
		// The writer of the last status change died before its snapshot
		// (or the snapshot write failed): whoever reads the log repairs it,
		// so ListRuns converges on the log.
		l.saveSnapshot(ctx, st)
	}
	l.cache.put(runID, st)
	return st, nil
}

// LoadTrusted returns the state this process produced for the run and
// whose side effects it performed (a verified state) without reading the
// log; other states are loaded with Load. The state may be stale when
// another replica appended since: a decision on it is refused by the
// conditional append (ErrConflict), after which the caller loads with
// Load. Decisions that append nothing must not conclude from absence on a
// trusted state (an attempt it does not show yet); facts that only move
// forward (an attempt finished, the run terminal) hold.
func (l *Log) LoadTrusted(ctx context.Context, runID string) (*State, error) {
	if st := l.cache.get(runID); st != nil && st.Verified {
		return st, nil
	}
	return l.Load(ctx, runID)
}

// Cached returns this process's cached state of the run, or nil, without
// reading the log. It may be stale: only facts that move forward (an
// attempt finished, the run terminal) can be read from it.
func (l *Log) Cached(runID string) *State { return l.cache.get(runID) }

// Current returns a run for listing: its snapshot when terminal (a terminal
// snapshot is final), else the run loaded from its log, which also repairs
// a snapshot that missed a status change. A run whose log is corrupt is
// listed as its snapshot marked by MarkCorrupt (see CorruptListing).
func (l *Log) Current(ctx context.Context, runID string) (*planexv1.Run, error) {
	run, err := l.Snapshot(ctx, runID)
	if err != nil || Terminal(run.GetStatus()) {
		return run, err
	}
	st, err := l.Load(ctx, runID)
	var be *BrokenEventError
	if errors.As(err, &be) {
		return MarkCorrupt(run, be), nil // run is Snapshot's own copy
	}
	if err != nil {
		return nil, err
	}
	return st.Run, nil
}

// catchUp folds the events after base up to (at least) last into a copy of
// base. A message that is not an event, or an event that does not continue
// the chain or fold, is a *BrokenEventError naming it.
func (l *Log) catchUp(ctx context.Context, base *State, runID string, last *jetstream.RawStreamMsg) (*State, error) {
	st := base.Clone()
	st.Verified = false
	subj := logFilter(runID, last.Subject)
	st.Routed = subj != bus.EventSubject(runID)
	if evs, err := decodeRaw(last); err == nil && st.Run != nil && evs[0].GetSequence() == st.Run.GetLastSequence()+1 {
		if err := st.applyStored(runID, evs, last); err != nil {
			return nil, err
		}
		return st, nil
	}
	for seq := st.StreamSeq + 1; seq <= last.Sequence; {
		m, err := l.stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("load run %s: event after stream sequence %d: %w", runID, seq-1, err)
		}
		evs, err := decodeRaw(m)
		if err != nil {
			return nil, notEventAt(runID, st.Run.GetLastSequence()+1, m.Sequence, err)
		}
		if err := st.applyStored(runID, evs, m); err != nil {
			return nil, err
		}
		seq = m.Sequence + 1
	}
	if st.Run == nil {
		return nil, fmt.Errorf("load run %s: %w: the log does not start with RunCreated (expired?)", runID, ErrBrokenChain)
	}
	return st, nil
}

// applyStored folds the events of stored message m of run runID into st,
// or returns a *BrokenEventError naming the first that does not belong
// to the run, continue its chain or fold (st then may hold a prefix).
func (st *State) applyStored(runID string, evs []*planexv1.RunEvent, m *jetstream.RawStreamMsg) error {
	for _, ev := range evs {
		if eventLike(ev) && ev.GetRunId() != runID {
			return &BrokenEventError{RunID: runID, Sequence: st.Run.GetLastSequence() + 1, StreamSeq: m.Sequence,
				Reason: "the event stored there belongs to " + otherRun(ev.GetRunId())}
		}
	}
	if err := st.applyMsg(evs, m.Sequence, m.Subject); err != nil {
		return brokenAt(runID, st.Run.GetLastSequence()+1, m.Sequence, err)
	}
	return nil
}

// snapshot returns the run's snapshot from planex-runs when it is usable
// (not ahead of the log), or an empty state.
func (l *Log) snapshot(ctx context.Context, runID string, lastSeq uint64) *State {
	e, err := l.kv.Get(ctx, runID)
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			l.logger.DebugContext(ctx, "run snapshot unavailable", "run_id", runID, "err", err)
		}
		return &State{}
	}
	st, err := decodeSnapshot(e.Value())
	if err != nil || st.StreamSeq > lastSeq || st.Run.GetId() != runID {
		l.logger.DebugContext(ctx, "run snapshot unusable", "run_id", runID, "err", err)
		return &State{snap: &snapMark{rev: e.Revision()}}
	}
	st.snap.rev = e.Revision() // st is not shared yet
	return st
}

// Snapshot returns the run as of its last snapshot in planex-runs, which may
// lag the log by a few events (never by a status change made by a live
// supervisor). ListRuns reads runs this way.
func (l *Log) Snapshot(ctx context.Context, runID string) (*planexv1.Run, error) {
	e, err := l.kv.Get(ctx, runID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("snapshot of run %s: %w", runID, ErrRunNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot of run %s: %w", runID, err)
	}
	st, err := decodeSnapshot(e.Value())
	if err != nil {
		return nil, fmt.Errorf("snapshot of run %s: %w", runID, err)
	}
	return st.Run, nil
}

// RunIDs lists the ids of the runs that have a snapshot, sorted. The
// first call starts a watch of planex-runs that keeps an index in memory
// (search.go), so later calls do not list the bucket; until the index is
// loaded, and if the watch fails, the bucket's keys are listed. Runs
// created on other replicas appear in the index within moments.
func (l *Log) RunIDs(ctx context.Context) ([]string, error) {
	if ids, ok := l.index.ids(); ok {
		return ids, nil
	}
	l.IndexRuns()
	keys, err := l.kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list run snapshots: %w", err)
	}
	slices.Sort(keys)
	return keys, nil
}

// IndexRuns starts loading the in-memory index RunIDs and SearchRuns
// read (a watch of planex-runs), so that the first listing need not wait for
// it. RunIDs starts it too.
func (l *Log) IndexRuns() {
	l.indexOnce.Do(func() { l.index.watch(l.ctx, l.kv, l.logger) })
}

// MarkVerified records that every side effect of st was performed, so the
// next load of the run from this process does not repeat them.
func (l *Log) MarkVerified(st *State) {
	c := *st // states are immutable once loaded or committed: share the run
	c.Verified = true
	l.cache.putIfCurrent(c.Run.GetId(), &c)
}

// Forget drops the cached state of a run, after a side effect failed.
func (l *Log) Forget(runID string) { l.cache.remove(runID) }

// Tx builds the events of one decision on top of a loaded state. Events are
// folded into the working state as they are emitted, so later decisions in
// the same transaction see them.
type Tx struct {
	base     *State
	next     *State
	events   []*planexv1.RunEvent
	now      func() time.Time
	dispatch *Dispatch
	legacy   bool // append version 1 events (Options.LegacyHashes)
}

// Dispatch asks Commit to append a routed run's decision that dispatches
// exactly one step as that step's request: on the subject
// planex.events.<run>.step.<pool>, signed, where the pool's consumer on
// PLANEX_EVENTS delivers it to the pool's executors — one publish where
// the decision and the request would take two, with the same conditional
// append. Commit falls back to the log subject (and Sent stays false, so
// the caller publishes the request to PLANEX_STEPS) when the run is not
// routed or the decision does not fit in one message.
type Dispatch struct {
	// Pool is the dispatched step's pool.
	Pool string
	// Sign returns the headers signing the message (stepsign), or is nil.
	Sign func(subject string, data []byte) nats.Header
	// Ctx carries the trace parent of the append (the dispatch span), so
	// the executor's spans continue the step's trace.
	Ctx context.Context
	// Attrs are added to the append's producer span.
	Attrs []attribute.KeyValue
	// Sent is set by Commit when the decision went as the step's request.
	Sent bool
}

// SetDispatch makes the commit of tx a direct dispatch (see Dispatch).
func (tx *Tx) SetDispatch(d *Dispatch) { tx.dispatch = d }

// Begin starts a transaction on st (not modified). A zero Log can build
// transactions (to check events) but not commit them.
func (l *Log) Begin(st *State) *Tx {
	now := l.now
	if now == nil {
		now = time.Now
	}
	return &Tx{base: st, next: st.Clone(), now: now, legacy: l.legacy}
}

// State is the working state: the base with the emitted events folded in.
// Callers must not modify it.
func (tx *Tx) State() *State { return tx.next }

// Run is the working state's run.
func (tx *Tx) Run() *planexv1.Run { return tx.next.Run }

// Events are the events emitted so far.
func (tx *Tx) Events() []*planexv1.RunEvent { return tx.events }

// Emit completes ev (run id, sequence, time, previous hash, a fresh salt
// and hash: a version 2 event, see [Hash]) and folds it into the working
// state. The run id must be set on the first event of a run (RunCreated).
func (tx *Tx) Emit(ev *planexv1.RunEvent) error {
	if tx.next.Run != nil {
		ev.RunId = tx.next.Run.GetId()
		ev.Sequence = tx.next.Run.GetLastSequence() + 1
	} else {
		ev.Sequence = 1
	}
	ev.Time = timestamppb.New(tx.now().UTC())
	ev.PrevHash = tx.next.Hash
	if !tx.legacy {
		salt, err := newSalt()
		if err != nil {
			return err
		}
		setSalt(ev, salt) // a version 2 event: per-field commitments (commit.go)
	}
	h, err := Hash(ev)
	if err != nil {
		return err
	}
	ev.Hash = h
	// Folded without hashing it again: h was computed from ev just above
	// (it was half of what an append spent hashing).
	if err := tx.next.apply(ev, tx.next.StreamSeq, h); err != nil {
		return fmt.Errorf("emit %s: %w", PayloadName(ev), err)
	}
	tx.events = append(tx.events, ev)
	return nil
}

// Commit appends the transaction's events and returns the new state (not
// verified; shared with the cache, so not to be modified). The events go
// as one message — a RunEventBatch when there are several — expecting the
// subject's last sequence to be the one the transaction was built on, so
// a decision is appended entirely or not at all. Only a decision larger
// than half the server's max payload is split into several such messages,
// each expecting the previous one's sequence (every event is consistent
// on its own, so a conflict between them leaves a valid log). The
// transaction must not be used afterwards. It returns ErrConflict when
// another writer got there first.
func (l *Log) Commit(ctx context.Context, tx *Tx) (*State, error) {
	st, settle, err := l.CommitDeferred(ctx, tx)
	settle()
	return st, err
}

// CommitDeferred is Commit with the run's snapshot (a cache of the fold in
// planex-runs, written at status changes and every so many events) written
// concurrently rather than before it returns. The new state is this
// process's cached one at once (states are immutable once committed). At
// a status change the caller performs the decision's side effects
// meanwhile and then calls settle, which waits for the snapshot, so that
// the change is in planex-runs (what ListRuns reads) before the caller
// settles the decision; it need not hold the run meanwhile, as the run's
// snapshots are written one at a time, in order. Other snapshots are
// written in the background and settle does not wait for them. settle is
// never nil; it must be called once when err is nil.
func (l *Log) CommitDeferred(ctx context.Context, tx *Tx) (_ *State, settle func(), _ error) {
	settle = func() {}
	if len(tx.events) == 0 {
		return tx.base, settle, nil
	}
	runID := tx.next.Run.GetId()
	routed := tx.base.Routed || (tx.base.Run == nil && l.routed)
	if routed && !l.checked {
		// Fail closed: this server would check the append against one of
		// the run's subjects only, and a stale replica could append.
		return nil, settle, fmt.Errorf("append to run %s: its log uses the routed layout, which needs NATS 2.11+ to check appends; this server is %s", runID, l.js.Conn().ConnectedServerVersion())
	}
	expect := tx.base.StreamSeq
	chunks := l.chunks(tx.events)
	d := tx.dispatch
	if d != nil && (!routed || len(chunks) > 1) {
		d = nil
	}
	for _, chunk := range chunks {
		seq, err := l.append(ctx, runID, chunk, expect, routed, d)
		if err != nil {
			l.cache.distrust(runID)
			return nil, settle, err
		}
		expect = seq
	}
	st := tx.next
	tx.next = nil
	st.StreamSeq = expect
	st.Verified = false
	st.Routed = routed
	if d != nil {
		d.Sent = true
		st.markDirect(tx.events)
	}
	m := st.mark()
	if tx.base.Run == nil || Terminal(st.Run.GetStatus()) || st.Run.GetStatus() != tx.base.Run.GetStatus() {
		// Taken here, in the order of the run's decisions: after any
		// snapshot of the run still being written.
		m.write.Lock()
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer m.write.Unlock()
			l.writeSnapshot(ctx, st)
		}()
		l.cache.put(runID, st)
		return st, func() { <-done }, nil
	}
	if _, seq, _, at := m.get(); l.snapshotDue(st.Run.GetLastSequence(), seq, at) && m.write.TryLock() {
		// A snapshot that only bounds how far a load folds is written in
		// the background: the run's next decision does not wait for it
		// (a long run's snapshot takes a millisecond or more). One is
		// written at a time; one due meanwhile waits for the next
		// decision.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), snapshotTimeout)
		go func() {
			defer cancel()
			defer m.write.Unlock()
			l.writeSnapshot(sctx, st)
		}()
	}
	l.cache.put(runID, st)
	return st, settle, nil
}

// snapshotTimeout bounds a snapshot written in the background.
const snapshotTimeout = 30 * time.Second

// chunks splits a decision's events into messages no larger than half the
// server's max payload (one message almost always).
func (l *Log) chunks(evs []*planexv1.RunEvent) [][]*planexv1.RunEvent {
	limit := 512 << 10
	if nc := l.js.Conn(); nc != nil && nc.MaxPayload() > 0 {
		limit = int(nc.MaxPayload() / 2)
	}
	var out [][]*planexv1.RunEvent
	start, size := 0, 0
	for i, ev := range evs {
		n := proto.Size(ev) + 8
		if i > start && size+n > limit {
			out = append(out, evs[start:i])
			start, size = i, 0
		}
		size += n
	}
	return append(out, evs[start:])
}

// append publishes events as one message after the run log's message
// expect and returns its stream sequence: on the run's single subject, or
// in the routed layout on its log subject, or as d's request on its pool's
// dispatch subject, checked against the whole run log filter.
func (l *Log) append(ctx context.Context, runID string, evs []*planexv1.RunEvent, expect uint64, routed bool, d *Dispatch) (uint64, error) {
	first := evs[0]
	var msg proto.Message = first
	name := PayloadName(first)
	if len(evs) > 1 {
		msg = &planexv1.RunEventBatch{Events: evs}
		name = "batch"
	}
	p := bus.Publication{
		Subject:              bus.EventSubject(runID),
		Msg:                  msg,
		MsgID:                bus.MsgID(runID, "ev", fmt.Sprint(first.GetSequence())),
		ExpectLastSubjectSeq: &expect,
		Attrs: []attribute.KeyValue{
			attribute.String("planex.run_id", runID), attribute.String("planex.event", name),
			attribute.Int("planex.events", len(evs)),
		},
	}
	if routed {
		p.Subject, p.ExpectLastSubjectSeqFilter = bus.RunLogSubject(runID), bus.RunLogFilter(runID)
	}
	if l.appended != nil {
		p.Encoded = l.appended.add
	}
	if d != nil {
		p.Subject, p.Sign = bus.DispatchSubject(runID, d.Pool), d.Sign
		p.Attrs = append(p.Attrs, d.Attrs...)
		if d.Ctx != nil {
			ctx = d.Ctx
		}
	}
	ack, err := bus.Publish(ctx, l.js, p)
	if err != nil {
		if isWrongLastSeq(err) {
			return 0, fmt.Errorf("append events %d+ to run %s: %w", first.GetSequence(), runID, ErrConflict)
		}
		return 0, fmt.Errorf("append events %d+ to run %s: %w", first.GetSequence(), runID, err)
	}
	if ack.Duplicate {
		// The id of this per-run sequence is taken: another writer
		// appended event n first.
		return 0, fmt.Errorf("append events %d+ to run %s: %w", first.GetSequence(), runID, ErrConflict)
	}
	return ack.Sequence, nil
}

// saveSnapshot writes st to planex-runs with compare-and-set on the
// revision, so a slow writer never replaces a newer snapshot with an older
// one. Failures are logged: snapshots are a cache.
func (l *Log) saveSnapshot(ctx context.Context, st *State) {
	m := st.mark()
	m.write.Lock()
	defer m.write.Unlock()
	l.writeSnapshot(ctx, st)
}

// writeSnapshot is saveSnapshot with the mark's write lock held.
func (l *Log) writeSnapshot(ctx context.Context, st *State) {
	runID := st.Run.GetId()
	m := st.snap
	rev, seq, _, _ := m.get()
	if seq >= st.Run.GetLastSequence() && seq > 0 {
		return // as new as st, or newer
	}
	m.started()
	data, err := encodeSnapshot(st)
	if err != nil {
		l.logger.WarnContext(ctx, "encode run snapshot", "run_id", runID, "err", err)
		return
	}
	for range 3 {
		var newRev uint64
		if rev == 0 {
			newRev, err = l.kv.Create(ctx, runID, data)
		} else {
			newRev, err = l.kv.Update(ctx, runID, data, rev)
		}
		if err == nil {
			m.set(newRev, st.Run.GetLastSequence(), st.Run.GetStatus())
			l.index.put(st.Run, newRev) // listed at once by this replica
			return
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			break
		}
		e, gerr := l.kv.Get(ctx, runID)
		if errors.Is(gerr, jetstream.ErrKeyNotFound) {
			rev = 0
			continue
		}
		if gerr != nil {
			err = gerr
			break
		}
		if other, derr := decodeSnapshot(e.Value()); derr == nil && other.Run.GetLastSequence() >= st.Run.GetLastSequence() {
			m.set(e.Revision(), other.Run.GetLastSequence(), other.Run.GetStatus())
			return
		}
		rev = e.Revision()
	}
	l.logger.WarnContext(ctx, "save run snapshot", "run_id", runID, "err", err)
}

// watchInactive is how long the consumer of an ended watch lingers.
const watchInactive = 5 * time.Second

// Watch calls fn with every event of the run with sequence >= from, in
// order, first those already in the log and then new ones as they are
// appended, verifying the hash chain. It returns nil once the run is
// finished and its log read to the end (after the RunFinished event, or
// the last of the events that may follow one: RunForked, a RunReset and
// what the reset run appended until it finished again), or the first error (ctx's, fn's, or a *BrokenEventError naming
// the first broken entry).
func (l *Log) Watch(ctx context.Context, runID string, from uint64, fn func(*planexv1.RunEvent) error) error {
	if !bus.ValidRunID(runID) {
		return fmt.Errorf("watch run %q: %w", runID, ErrRunNotFound)
	}
	filter := bus.EventSubject(runID)
	if st := l.cache.get(runID); st != nil {
		if st.Routed {
			filter = bus.RunLogFilter(runID)
		}
	} else if last, err := l.lastMessage(ctx, runID); err == nil {
		filter = logFilter(runID, last.Subject)
	} else if l.routed {
		filter = bus.RunLogFilter(runID) // not created yet: it will be routed
	}
	cons, err := l.js.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		// The server removes a watch's consumer this soon after the watch
		// ends (the client's default is 5 minutes, long enough for a busy
		// API to hit the stream's consumer limit).
		InactiveThreshold: watchInactive,
	})
	if err != nil {
		return fmt.Errorf("watch run %s: %w", runID, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("watch run %s: %w", runID, err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer l.dropWatch(cons)
	defer it.Stop()
	// The watch verifies the hash chain without folding the run: the fold
	// of every event costs in proportion to the plan.
	link := chainLink{runID: runID}
	finished := false
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("watch run %s: %w", runID, err)
		}
		var streamSeq, pending uint64
		if md, err := m.Metadata(); err == nil {
			streamSeq, pending = md.Sequence.Stream, md.NumPending
		}
		evs, err := DecodeEvents(bus.NatsMsg(m))
		if err != nil {
			be := notEventAt(runID, link.seq+1, streamSeq, err)
			l.noteCorrupt(ctx, be, 0)
			return be
		}
		// Bytes this process encoded (from events it hashed when it
		// emitted them) need their chain links checked, not their hashes
		// recomputed.
		own := l.appended != nil && l.appended.matches(m.Data())
		for _, ev := range evs {
			var known []byte
			if own {
				known = ev.GetHash()
			}
			if err := link.next(ev, known); err != nil {
				be := brokenAt(runID, link.seq+1, streamSeq, err)
				l.noteCorrupt(ctx, be, 0)
				return be
			}
			if ev.GetSequence() >= from {
				if err := fn(ev); err != nil {
					return err
				}
			}
			switch {
			case ev.GetFinished() != nil:
				finished = true
			case ev.GetRunReset() != nil:
				finished = false // re-opened: it will finish again
			}
		}
		// The watch ends with the log of a finished run: after its
		// RunFinished, or after what may follow one (a fork's link, a
		// reset that finished again) once nothing more is stored.
		if finished && pending == 0 {
			return nil
		}
	}
}

// dropWatch deletes the consumer of an ended watch in the background,
// rather than leaving it to the server's inactivity threshold: WatchRun
// calls that follow each other quickly (a client following hundreds of
// runs) would otherwise hold up to the stream's consumer limit (1,000 by
// default) at once. A failed deletion is left to the threshold.
func (l *Log) dropWatch(cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil || info.Name == "" {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), watchInactive)
		defer cancel()
		_ = l.js.DeleteConsumer(ctx, bus.StreamEvents, info.Name)
	}()
}

// DecodeEvents decodes one message of a run log: a RunEvent, or the events
// of a RunEventBatch (one decision appended as one message), in order
// (bus.DecodeRunEvents). Readers of PLANEX_EVENTS outside this package use
// it so that both forms are read the same way.
func DecodeEvents(msg *nats.Msg) ([]*planexv1.RunEvent, error) {
	evs, err := bus.DecodeRunEvents(msg)
	if errors.Is(err, bus.ErrEmptyBatch) {
		return nil, fmt.Errorf("%w: %w", ErrBrokenChain, err)
	}
	return evs, err
}

func decodeRaw(m *jetstream.RawStreamMsg) ([]*planexv1.RunEvent, error) {
	return DecodeEvents(&nats.Msg{Subject: m.Subject, Data: m.Data, Header: m.Header})
}

// isWrongLastSeq reports a failed expected-last-subject-sequence check
// (code 10071, or 10164 on replicated streams).
func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// stateCache is a bounded map of run states, evicting the least recently
// stored. States in it are immutable and shared.
type stateCache struct {
	mu  sync.Mutex
	max int
	m   map[string]*list.Element // value: *cacheEntry
	lru *list.List               // front: most recent
}

type cacheEntry struct {
	id string
	st *State
}

func newStateCache(max int) *stateCache {
	return &stateCache{max: max, m: make(map[string]*list.Element), lru: list.New()}
}

func (c *stateCache) get(id string) *State {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[id]; ok {
		return e.Value.(*cacheEntry).st
	}
	return nil
}

func (c *stateCache) put(id string, st *State) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(id, st)
}

// putIfCurrent stores st unless the cache holds a newer state of the run.
func (c *stateCache) putIfCurrent(id string, st *State) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[id]; ok && e.Value.(*cacheEntry).st.StreamSeq > st.StreamSeq {
		return
	}
	c.putLocked(id, st)
}

func (c *stateCache) putLocked(id string, st *State) {
	if e, ok := c.m[id]; ok {
		e.Value.(*cacheEntry).st = st
		c.lru.MoveToFront(e)
		return
	}
	c.m[id] = c.lru.PushFront(&cacheEntry{id: id, st: st})
	for c.lru.Len() > c.max {
		old := c.lru.Back()
		c.lru.Remove(old)
		delete(c.m, old.Value.(*cacheEntry).id)
	}
}

// distrust keeps a run's cached state as a base to catch up from, but no
// longer as verified (another writer appended since, or an append failed).
func (c *stateCache) distrust(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[id]; ok {
		ce := e.Value.(*cacheEntry)
		if ce.st.Verified {
			st := *ce.st
			st.Verified = false
			ce.st = &st
		}
	}
}

func (c *stateCache) remove(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[id]; ok {
		c.lru.Remove(e)
		delete(c.m, id)
	}
}
