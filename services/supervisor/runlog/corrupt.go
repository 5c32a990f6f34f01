package runlog

import (
	"context"
	"strings"
	"sync"

	"go.opentelemetry.io/otel/metric"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// A corrupt run log — an entry that is not a planex event, or an event
// that does not continue the hash chain, appended by whoever can publish
// on the run's subjects — is final: waiting does not repair it, and
// nothing is appended after it (every append expects the last sequence
// of a log that verified, so it fails). Load, Watch and VerifyStored
// answer a *BrokenEventError naming the entry; the process logs it at
// ERROR once and counts it in planex.runs.corrupt, and until the log
// changes a load of the run costs one read. An operator inspects the run
// with `planex audit verify RUN_ID`; deleting a forged entry from the
// stream makes the run readable again.

// maxCorruptRuns bounds the corrupt runs a process remembers; beyond it,
// one is forgotten (and logged again if it is read again).
const maxCorruptRuns = 4096

// corruptRuns remembers the runs this process found corrupt.
type corruptRuns struct {
	mu sync.Mutex
	m  map[string]corruptRun
}

// corruptRun is a corrupt run: its first broken entry and the stream
// sequence of its log's last message when that was found.
type corruptRun struct {
	last uint64
	err  *BrokenEventError
}

// get returns the error a run's log gave when its last message was last,
// or nil.
func (c *corruptRuns) get(runID string, last uint64) *BrokenEventError {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.m[runID]; ok && r.last == last && last > 0 {
		return r.err
	}
	return nil
}

// put records err for its run and reports whether its entry is new to
// this process. last is the log's last stream sequence (0: unknown).
func (c *corruptRuns) put(err *BrokenEventError, last uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]corruptRun{}
	}
	old, known := c.m[err.RunID]
	if known && old.err.StreamSeq == err.StreamSeq && old.err.Sequence == err.Sequence {
		if last > old.last {
			c.m[err.RunID] = corruptRun{last: last, err: old.err}
		}
		return false
	}
	if !known && len(c.m) >= maxCorruptRuns {
		for id := range c.m {
			delete(c.m, id)
			break
		}
	}
	c.m[err.RunID] = corruptRun{last: last, err: err}
	return true
}

// forget drops a run that loaded (an operator repaired its log).
func (c *corruptRuns) forget(runID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, runID)
}

// noteCorrupt logs and counts a corrupt run log the first time this
// process meets its broken entry. last is the log's last stream sequence
// then (0: unknown).
func (l *Log) noteCorrupt(ctx context.Context, err *BrokenEventError, last uint64) {
	if !l.corrupt.put(err, last) {
		return
	}
	l.logger.ErrorContext(ctx, "run log corrupt: the run cannot continue; inspect it with `planex audit verify "+err.RunID+"`",
		"run_id", err.RunID, "stream_sequence", err.StreamSeq, "event", err.Sequence, "not_an_event", err.NotEvent, "reason", err.Reason)
	if l.corruptCount != nil {
		l.corruptCount.Add(ctx, 1)
	}
}

// newCorruptCounter is the planex.runs.corrupt counter.
func newCorruptCounter(m metric.Meter) (metric.Int64Counter, error) {
	return m.Int64Counter("planex.runs.corrupt",
		metric.WithDescription("Corrupt run log entries found (an entry that is not a planex event, or a broken hash chain), once per entry and process."))
}

// corruptPrefix starts the advice about a corrupt run (Advice) and the
// stop_message of its listing (MarkCorrupt).
func corruptPrefix(runID string) string { return "run " + runID + " is corrupt: " }

// MarkCorrupt makes run, a corrupt run's last snapshot (which keeps the
// status it had before its log broke: no terminal status was recorded),
// show the corruption where listings look: stop_message is err's advice.
// It modifies run.
func MarkCorrupt(run *planexv1.Run, err *BrokenEventError) *planexv1.Run {
	run.StopMessage = err.Advice()
	return run
}

// CorruptListing reports whether a listed run is marked corrupt by
// MarkCorrupt: not terminal, with a stop message (which the fold sets only
// when a run finishes) naming the corruption.
func CorruptListing(run *planexv1.Run) bool {
	return !Terminal(run.GetStatus()) && strings.HasPrefix(run.GetStopMessage(), corruptPrefix(run.GetId()))
}
