package bus

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ScheduleAfter is how far ahead a timer must be due, by default, for
// HoldTimer to hand it to StreamTimers. A nearer timer is parked in the engine
// consumer (NakWithDelay) as before: it is gone within the minute, and a
// schedule fires on whole seconds.
const ScheduleAfter = time.Minute

// timersFullRatio is the fill of StreamTimers above which HoldTimer parks
// timers instead: the stream must discard its oldest messages when full
// (NATS refuses DiscardNew with message schedules), and a discarded
// schedule would be a deadline that never fires.
const timersFullRatio = 0.8

// timersCheckEvery is how often HoldTimer reads StreamTimers' fill.
const timersCheckEvery = 5 * time.Second

// timerStream is StreamTimers as a supervisor's Resources found it: set
// only when the stream holds message schedules.
type timerStream struct {
	js    jetstream.JetStream
	hold  bool          // Options.HoldTimers
	after time.Duration // Options.TimersAfter

	mu      sync.Mutex
	checked time.Time // last fill read
	room    bool      // below timersFullRatio at the last read
}

// timersStreamConfig is StreamTimers' configuration: a work queue of the
// timers it fires (planex.due.<run>, the supervisors' ConsumerDue) and
// the schedules that fire them (planex.later.<run>.<key>, consumed by
// nobody: the server removes a schedule when it fires). NATS requires
// roll-ups (each schedule rolls up its own subject) and refuses DiscardNew
// with schedules; only supervisors may publish on its subjects
// (internal/natsauth), so no other identity can roll anything up.
func timersStreamConfig(opts Options) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              StreamTimers,
		Description:       "planex timers due later (run deadlines, gate SLAs), held by NATS as message schedules",
		Subjects:          []string{SubjectLaterPrefix + ">", SubjectDuePrefix + "*"},
		Retention:         jetstream.WorkQueuePolicy,
		Storage:           opts.storage(),
		Replicas:          opts.Replicas,
		Duplicates:        opts.DuplicateWindow,
		Discard:           jetstream.DiscardOld,
		MaxBytes:          maxBytesFor(opts.MaxBytes, StreamTimers),
		AllowMsgSchedules: true,
		AllowRollup:       true,
	}
}

// MessageSchedules reports whether the connected server can hold message
// schedules (NATS 2.12+).
func MessageSchedules(nc *nats.Conn) bool {
	return nc != nil && versionAtLeast(nc.ConnectedServerVersion(), 2, 12)
}

// setupTimers creates or updates StreamTimers on a server that holds
// message schedules and returns it, or nil (an older server, or one that
// dropped the setting): timers are then all parked in the engine consumer.
func setupTimers(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, opts Options) (*timerStream, error) {
	if !MessageSchedules(nc) {
		return nil, nil
	}
	cfg := timersStreamConfig(opts)
	var info *jetstream.StreamInfo
	err := retry(ctx, func(ctx context.Context) error {
		var (
			s   jetstream.Stream
			err error
		)
		if opts.Update {
			s, err = js.CreateOrUpdateStream(ctx, cfg)
		} else {
			s, err = js.CreateStream(ctx, cfg)
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				s, err = js.Stream(ctx, cfg.Name)
			}
		}
		if err == nil {
			info = s.CachedInfo()
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if info == nil || !info.Config.AllowMsgSchedules {
		// A cluster node older than 2.12 created it without schedules.
		return nil, nil
	}
	return &timerStream{js: js, hold: opts.HoldTimers, after: opts.TimersAfter}, nil
}

// LaterSubject is the subject of the message schedule holding the timer
// with message id msgID: planex.later.<run>.<key>, key a digest of the id
// (ids hold characters a subject token may not).
func LaterSubject(runID, msgID string) string {
	sum := sha256.Sum256([]byte(msgID))
	return SubjectLaterPrefix + runID + "." + hex.EncodeToString(sum[:10])
}

// DueSubject is the subject StreamTimers fires a run's timers into:
// planex.due.<run>.
func DueSubject(runID string) string { return SubjectDuePrefix + runID }

// HoldsTimers reports whether r's StreamTimers holds message schedules.
func (r *Resources) HoldsTimers() bool { return r != nil && r.timers != nil }

// HoldTimer turns p, an engine timer of run due at fireAt, into a message
// schedule in StreamTimers when Options.HoldTimers is set, fireAt is more
// than Options.TimersAfter
// (default ScheduleAfter) away and
// the stream holds schedules and has room; it reports whether it did. The
// server then fires p's message into DueSubject(runID) at fireAt (rounded
// up to the second), with p's headers but not its message id, and removes
// the schedule. Only timers nothing supersedes may be held (the engine
// looks for a newer step timer among the parked ones only).
func (r *Resources) HoldTimer(ctx context.Context, p *Publication, runID string, fireAt time.Time) bool {
	if !r.HoldsTimers() || !r.timers.hold || time.Until(fireAt) <= r.timers.after || !r.timers.hasRoom(ctx) {
		return false
	}
	at := fireAt.Truncate(time.Second)
	if at.Before(fireAt) {
		at = at.Add(time.Second)
	}
	p.Subject = LaterSubject(runID, p.MsgID)
	p.ScheduleAt, p.ScheduleTarget = at, DueSubject(runID)
	return true
}

// hasRoom reports whether StreamTimers was below timersFullRatio when last
// read (at most timersCheckEvery ago). A failed read counts as full: the
// timer is parked, which is always safe.
func (t *timerStream) hasRoom(ctx context.Context) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if time.Since(t.checked) < timersCheckEvery {
		return t.room
	}
	t.checked = time.Now()
	t.room = false
	s, err := t.js.Stream(ctx, StreamTimers)
	if err != nil {
		return false
	}
	info := s.CachedInfo()
	if max := info.Config.MaxBytes; max > 0 && float64(info.State.Bytes) >= timersFullRatio*float64(max) {
		return false
	}
	t.room = true
	return true
}
