package engine

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// Three bounds keep one busy run from holding up the others on a replica:
//
//   - runLocks serialise the handling of one run; a message waits for its
//     run's lock before it takes a worker (transact), so messages queued
//     on a busy run's lock never occupy the worker pool;
//   - a replica holds at most inHandPerWorker × workers main-consumer
//     messages in hand (handled, or waiting for a worker, the run lock or
//     the planner); when they are all in hand the consume callback blocks,
//     which bounds the runs a dead replica strands until the ack wait;
//   - but one run holds at most runInHand of those places: its further
//     messages wait in the run's queue, without a place and without a
//     goroutine, and are handled as its messages in hand are settled.
//     A run whose messages pile up (a wide fan-out's results, a burst of
//     kicks) therefore never fills the hand while other runs' messages
//     wait behind it in the pull buffer.
//
// The queued messages count against the consumer's MaxAckPending; they
// belong to runs already in hand, so a replica's death delays no more runs
// than before (heldPerWorker sizes MaxAckPending for them). They get
// in-progress acks while they wait, as messages waiting for the run lock
// do, so that a long planner call ahead of them does not send them to
// another replica.

// runInHand is the most places in hand one run's messages take; a message
// waits outside the run lock only for a started notice's short delay or a
// planner or critic call, so a few places are enough to keep those off the
// path of the run's other messages.
const runInHand = inHandPerWorker

// runLocks serialises the handling of one run inside this replica; runs
// proceed concurrently.
type runLocks struct {
	mu sync.Mutex
	m  map[string]*runLock
}

type runLock struct {
	mu   sync.Mutex
	refs int
	// joined are the decisions waiting for mu that its next holder may
	// take over (guarded by runLocks.mu).
	joined []*joined
}

// joined is a decision of one of a run's messages (a step's result)
// waiting for the run's lock, which the lock's next holder may take over
// (lockJoined): it decides every such message in one transaction — one
// append for the results of a fan-out that arrive together instead of one
// each — and each waiting handler then settles its own message with its
// own outcome.
type joined struct {
	ctx    context.Context
	decide decision

	taken bool // by the lock's holder (guarded by runLocks.mu)

	// Set by whoever decided it, before the run's lock is unlocked:
	decided error           // the decision's own outcome (nil or errIgnore) while the transaction stands
	err     error           // the message's outcome
	settle  func()          // waits for what the message's ack must follow (never nil once finished)
	by      context.Context // the handling that decided it, for a span link
}

// finish records the outcome of j unless it has one.
func (j *joined) finish(by context.Context, err error, settle func()) {
	if j.settle != nil {
		return
	}
	if settle == nil {
		settle = func() {}
	}
	j.err, j.settle, j.by = err, settle, by
}

func (l *runLocks) lock(id string) (unlock func()) {
	unlock, _ = l.lockJoined(id, nil)
	return unlock
}

// lockJoined is lock for a decision the lock's holder may take over: it
// joins the run's waiting decisions, then waits for the lock. taken is
// true when another holder decided it meanwhile (its outcome is set): the
// caller then only unlocks. Otherwise the caller holds the lock and takes
// the waiting decisions, its own among them, with take. With j nil it is
// lock.
func (l *runLocks) lockJoined(id string, j *joined) (unlock func(), taken bool) {
	l.mu.Lock()
	rl := l.m[id]
	if rl == nil {
		rl = &runLock{}
		l.m[id] = rl
	}
	rl.refs++
	if j != nil {
		rl.joined = append(rl.joined, j)
	}
	l.mu.Unlock()
	rl.mu.Lock()
	if j != nil {
		l.mu.Lock()
		taken = j.taken
		l.mu.Unlock()
	}
	return func() {
		rl.mu.Unlock()
		l.mu.Lock()
		if rl.refs--; rl.refs == 0 {
			delete(l.m, id)
		}
		l.mu.Unlock()
	}, taken
}

// take returns the run's waiting decisions (the caller holds the run's
// lock, taken with lockJoined), in the order they joined, and marks them
// taken.
func (l *runLocks) take(id string) []*joined {
	l.mu.Lock()
	defer l.mu.Unlock()
	rl := l.m[id]
	out := rl.joined
	rl.joined = nil
	for _, j := range out {
		j.taken = true
	}
	return out
}

// hand admits the main consumer's messages: places bounds the messages in
// hand, perRun the places of one run; see the comment at the top of this
// file.
type hand struct {
	places chan struct{}
	perRun int

	mu   sync.Mutex
	runs map[string]*runHand
}

// runHand is one run's share of the hand.
type runHand struct {
	inHand int             // messages of the run holding a place
	queued []jetstream.Msg // further messages, in delivery order
}

func newHand(places, perRun int) *hand {
	return &hand{places: make(chan struct{}, places), perRun: perRun, runs: map[string]*runHand{}}
}

// admit is called by the consume callback for every message, in delivery
// order. It returns true when the caller must handle msg (it holds a place:
// settle it, then call next until it returns nil, then leave), false when
// msg was queued behind the run's messages in hand (one of their handlers
// takes it over) or ctx ended before a place was free (msg is not handled:
// it is redelivered after the ack wait).
func (h *hand) admit(ctx context.Context, runID string, msg jetstream.Msg) bool {
	h.mu.Lock()
	r := h.runs[runID]
	if r == nil {
		r = &runHand{}
		h.runs[runID] = r
	}
	if r.inHand >= h.perRun {
		r.queued = append(r.queued, msg)
		h.mu.Unlock()
		return false
	}
	r.inHand++
	h.mu.Unlock()
	select {
	case h.places <- struct{}{}:
		return true
	case <-ctx.Done():
		// Give the run's count back. Nothing waits in its queue: a run
		// queues messages only when all its places are taken.
		_ = h.next(runID)
		return false
	}
}

// next returns the run's next queued message, which inherits the place of
// the message just settled, or nil when none waits (the caller then calls
// leave).
func (h *hand) next(runID string) jetstream.Msg {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.runs[runID]
	if len(r.queued) > 0 {
		msg := r.queued[0]
		r.queued[0] = nil
		r.queued = r.queued[1:]
		return msg
	}
	if r.inHand--; r.inHand == 0 {
		delete(h.runs, runID)
	}
	return nil
}

// queuedMsgs returns the messages waiting in the runs' queues.
func (h *hand) queuedMsgs() []jetstream.Msg {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []jetstream.Msg
	for _, r := range h.runs {
		out = append(out, r.queued...)
	}
	return out
}

// leave gives a place back.
func (h *hand) leave() { <-h.places }
