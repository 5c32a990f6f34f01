package runlog

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
)

// ErrBrokenChain is matched by errors.Is when a run log fails verification:
// a gap or repeat in the per-run sequence, a previous-hash mismatch or an
// event whose hash does not match its content.
var ErrBrokenChain = errors.New("run log hash chain broken")

// State is a run as folded from its log, with what appending to the log
// needs (the stream sequence and hash of the last event) and the few facts
// of the log the Run message has no field for.
type State struct {
	// Run is the folded run.
	Run *planexv1.Run
	// StreamSeq is the PLANEX_EVENTS sequence of the last event, the
	// expected last subject sequence of the next append.
	StreamSeq uint64
	// Hash is the hash of the last event, the prev_hash of the next.
	Hash []byte
	// TraceContext is the W3C trace context of the run's root span.
	TraceContext map[string]string
	// RejectErrors are the validation errors of the last rejected plan,
	// cleared by the next revision.
	RejectErrors []string
	// ReplanReason is why the run last went back to the planner, cleared
	// by the next revision.
	ReplanReason string
	// ReplanStep is the step whose failure sent the run back to the
	// planner (empty for other replans), cleared by the next revision.
	ReplanStep string
	// Deadlines maps a step id to the deadline of its last dispatched
	// attempt (StepDispatched.deadline), so its request and timer can be
	// published again from the state alone.
	Deadlines map[string]time.Time
	// Routed is true for a run whose log uses the routed layout
	// (planex.events.<run>.log and .step.<pool>, see bus.RunLogFilter), false
	// for one on the single subject planex.events.<run>.
	Routed bool
	// Direct maps a step in flight to its attempt whose request is the
	// run log message that dispatched it (routed layout, delivered to the
	// pool by its consumer on PLANEX_EVENTS): that request is in the log
	// for good, so it is never published to PLANEX_STEPS.
	Direct map[string]int32
	// Verified is true when this state was produced by this process and
	// every side effect it implies was performed; a state read (even
	// partly) from the log or a snapshot is not verified, and the engine
	// repeats its recent side effects (deduplicated by the server).
	Verified bool

	// sharedDeadlines is set on a clone whose Deadlines map is still the
	// original's, sharedSteps on one whose Run.Steps slice is.
	sharedDeadlines, sharedSteps, sharedDirect bool
	// own identifies this state as the writer of what it does not share
	// (see owner); ix is the index derived from Run (see index).
	own *owner
	ix  *index

	// snap is what this process knows of the run's snapshot, shared with
	// the state's clones (nil: nothing yet).
	snap *snapMark
}

// snapMark is what this process knows of a run's snapshot in planex-runs.
// A state and the states derived from it share one, so a snapshot written
// in the background is known to the decisions taken meanwhile.
type snapMark struct {
	mu     sync.Mutex
	rev    uint64             // KV revision of the snapshot this process saw or wrote
	seq    uint64             // run sequence of that snapshot
	status planexv1.RunStatus // run status of that snapshot
	at     time.Time          // when this process last started writing one
	// write is held while this process writes one of the run's snapshots:
	// they are written one at a time, in the order of the states.
	write sync.Mutex
}

// mark returns the state's snapshot mark, creating it for a state no other
// goroutine sees yet.
func (s *State) mark() *snapMark {
	if s.snap == nil {
		s.snap = &snapMark{}
	}
	return s.snap
}

// snapStatus is the run status of the snapshot this process last saw or
// wrote (unspecified: none); a loaded state whose status differs rewrites
// the snapshot.
func (s *State) snapStatus() planexv1.RunStatus {
	if s.snap == nil {
		return planexv1.RunStatus_RUN_STATUS_UNSPECIFIED
	}
	_, _, status, _ := s.snap.get()
	return status
}

// get returns the revision, sequence and status of the known snapshot, and
// when this process last started writing one.
func (m *snapMark) get() (rev, seq uint64, status planexv1.RunStatus, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rev, m.seq, m.status, m.at
}

// started records that a snapshot is being written now.
func (m *snapMark) started() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.at = time.Now()
}

// set records a snapshot written or seen.
func (m *snapMark) set(rev, seq uint64, status planexv1.RunStatus) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rev, m.seq, m.status = rev, seq, status
}

// Clone returns a copy whose changes (by Apply) never reach s, nor those
// of s (if it is changed afterwards) the copy. The plans, gates and step
// states of the run are shared, not copied — the fold never modifies a
// plan and writes only to its own copy of a step's state or a gate — and
// so are the step slice and the index until the first write, so cloning
// costs little even for a plan of thousands of steps.
func (s *State) Clone() *State {
	c := *s
	if s.own != nil {
		s.own.cloned.Store(true) // s copies what it shares before its next write
	}
	c.own = &owner{}
	c.Run = cloneRun(s.Run)
	c.Hash = bytes.Clone(s.Hash)
	c.TraceContext = maps.Clone(s.TraceContext)
	c.RejectErrors = slices.Clone(s.RejectErrors)
	c.sharedDeadlines, c.sharedSteps, c.sharedDirect = true, true, true // copied before their first write
	c.ix = nil
	if c.Run != nil {
		if s.ix != nil && s.ix.run == s.Run {
			c.ix = s.ix.clone(c.Run, c.own)
		} else {
			c.ix = buildIndex(c.Run, c.own)
		}
	}
	return &c
}

// writer makes s ready to be changed: a state cloned since its last
// change (or never changed by this process) takes a new owner and copies
// what it shares before writing it, and its index is built if missing.
func (s *State) writer() {
	if s.own == nil || s.own.cloned.Load() {
		s.own = &owner{}
		s.sharedDeadlines, s.sharedSteps, s.sharedDirect = true, true, true
		if s.ix != nil {
			s.ix.own, s.ix.sharedChunks, s.ix.sharedSlots = s.own, true, true
		}
	}
	if s.Run != nil && (s.ix == nil || s.ix.run != s.Run) {
		s.ix = buildIndex(s.Run, s.own)
	}
}

// cloneRun copies a run's fields, sharing its plans, gates, step states
// and step slice (see Clone); the usage counters and the progress ledger,
// which the fold changes in place, are copied, and so are the plan and
// gate slices (the fold appends to them). A singular message field the
// fold starts changing in place must be copied here too: a shared one
// races with the snapshot encoder of the state it was cloned from.
func cloneRun(r *planexv1.Run) *planexv1.Run {
	if r == nil {
		return nil
	}
	// Field by field: reflection costs a few microseconds per decision.
	// TestCloneRunCopiesEverySingularField fails when a field is added to
	// Run and not here.
	c := &planexv1.Run{
		Id: r.Id, Goal: r.Goal, Inputs: r.Inputs, Status: r.Status, StopReason: r.StopReason,
		StopMessage: r.StopMessage, StopDetail: r.StopDetail, ExceededBudget: r.ExceededBudget, Budget: r.Budget,
		TraceId: r.TraceId, Result: r.Result, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt,
		FinishedAt: r.FinishedAt, IdempotencyKey: r.IdempotencyKey, LastSequence: r.LastSequence,
		Mode: r.Mode, PlannerBackend: r.PlannerBackend, ResultRef: r.ResultRef, StartedBy: r.StartedBy,
		ApprovePlans: r.ApprovePlans, CriticTokens: r.CriticTokens,
		Resets: r.Resets, ResetAt: r.ResetAt, ForkedFrom: r.ForkedFrom,
		ParentRunId: r.ParentRunId, ParentStepId: r.ParentStepId, ParentAttempt: r.ParentAttempt,
		ChildrenUsage: r.ChildrenUsage, // replaced, never changed in place, by the fold
		StepCounts:    r.StepCounts,    // set only in ListRuns' basic views, never by the fold
	}
	c.Children = slices.Clip(r.GetChildren()) // the fold appends to (or replaces) a copy
	c.Forks = slices.Clip(r.GetForks())       // the fold appends to a copy
	c.Labels = r.GetLabels()                  // never changed by the fold
	c.Usage = cloneUsage(r.GetUsage())
	if r.GetProgress() != nil {
		c.Progress = proto.CloneOf(r.GetProgress())
	}
	c.Plans = slices.Clone(r.GetPlans())
	c.Steps = r.GetSteps() // copied by the fold before its first write
	c.Gates = slices.Clone(r.GetGates())
	return c
}

// cloneUsage copies a BudgetUsage field by field (proto.Clone's reflection
// was 3 % of the throughput figure's allocations);
// TestCloneUsageCopiesEveryField fails when a field is added and not here.
func cloneUsage(u *planexv1.BudgetUsage) *planexv1.BudgetUsage {
	if u == nil {
		return nil
	}
	return &planexv1.BudgetUsage{Steps: u.Steps, Replans: u.Replans, Tokens: u.Tokens, TokensReserved: u.TokensReserved}
}

// Apply verifies that ev continues the log (run id, sequence, previous hash,
// own hash) and folds it in. streamSeq is the event's PLANEX_EVENTS sequence.
// On error the state is unchanged.
func (s *State) Apply(ev *planexv1.RunEvent, streamSeq uint64) error {
	return s.apply(ev, streamSeq, nil)
}

// apply is Apply; hash, when not nil, is ev's hash as the caller just
// computed it from ev itself (Tx.Emit), which is not computed again.
func (s *State) apply(ev *planexv1.RunEvent, streamSeq uint64, hash []byte) error {
	var link chainLink
	if s.Run != nil {
		link = chainLink{runID: s.Run.GetId(), seq: s.Run.GetLastSequence(), hash: s.Hash}
	}
	if err := link.next(ev, hash); err != nil {
		return err
	}
	h := link.hash
	s.writer()
	f := folder{run: s.Run, ix: s.ix, tok: s.own, sharedSteps: &s.sharedSteps}
	run, err := f.apply(ev)
	if err != nil {
		return err
	}
	s.Run, s.ix = run, f.ix
	s.StreamSeq = streamSeq
	s.Hash = h
	switch p := ev.GetPayload().(type) {
	case *planexv1.RunEvent_Created:
		s.TraceContext = p.Created.GetTraceContext()
		if p.Created.GetForkReplan() {
			s.ReplanReason = "forked from run " + p.Created.GetForkOf().GetRunId() + ": " + p.Created.GetForkOf().GetReason()
			s.ReplanStep = p.Created.GetForkOf().GetFromStep()
		}
	case *planexv1.RunEvent_PlanRejected:
		s.RejectErrors = p.PlanRejected.GetErrors()
	case *planexv1.RunEvent_ReplanRequested:
		s.ReplanReason = p.ReplanRequested.GetReason()
		s.ReplanStep = p.ReplanRequested.GetStepId()
	case *planexv1.RunEvent_PlanRevised:
		s.RejectErrors, s.ReplanReason, s.ReplanStep = nil, "", ""
	case *planexv1.RunEvent_StepDispatched:
		s.writeDeadlines()[p.StepDispatched.GetStepId()] = p.StepDispatched.GetDeadline().AsTime()
	case *planexv1.RunEvent_StepSucceeded:
		s.dropDeadline(p.StepSucceeded.GetStepId())
		s.dropDirect(p.StepSucceeded.GetStepId())
	case *planexv1.RunEvent_StepFailed:
		s.dropDeadline(p.StepFailed.GetStepId())
		s.dropDirect(p.StepFailed.GetStepId())
	case *planexv1.RunEvent_RunReset:
		// Attempts a finished run left in flight are over: the reset
		// restarted their steps (with new attempt numbers) or kept them.
		for id := range s.Deadlines {
			s.dropDeadline(id)
		}
		for id := range s.Direct {
			s.dropDirect(id)
		}
		s.RejectErrors, s.ReplanReason, s.ReplanStep = nil, "", ""
		if r := p.RunReset; r.GetReplan() || r.GetPlan() == nil {
			s.ReplanReason = "the run was reset by " + nonEmpty(r.GetActor(), r.GetResetBy(), "an operator") + ": " + r.GetReason()
			s.ReplanStep = r.GetFromStep()
		}
	}
	return nil
}

// nonEmpty returns the first of its arguments that is not empty.
func nonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// markDirect records that the attempts evs dispatch (one, in a routed
// decision message) went to their pool as that log message.
func (s *State) markDirect(evs []*planexv1.RunEvent) {
	for _, ev := range evs {
		if d := ev.GetStepDispatched(); d != nil {
			if s.Direct == nil {
				s.Direct = map[string]int32{}
			} else if s.sharedDirect {
				s.Direct = maps.Clone(s.Direct)
			}
			s.sharedDirect = false
			s.Direct[d.GetStepId()] = d.GetAttempt()
		}
	}
}

// dropDirect forgets a step whose attempt ended (Direct holds the steps in
// flight, like Deadlines).
func (s *State) dropDirect(stepID string) {
	if _, ok := s.Direct[stepID]; !ok {
		return
	}
	if s.sharedDirect {
		s.Direct = maps.Clone(s.Direct)
		s.sharedDirect = false
	}
	delete(s.Direct, stepID)
}

// DirectAttempt reports whether the attempt's request is the run log
// message that dispatched it (see Direct).
func (s *State) DirectAttempt(stepID string, attempt int32) bool {
	a, ok := s.Direct[stepID]
	return ok && a == attempt
}

// writeDeadlines returns Deadlines ready to be written: its own copy on a
// clone.
func (s *State) writeDeadlines() map[string]time.Time {
	if s.Deadlines == nil {
		s.Deadlines = map[string]time.Time{}
	} else if s.sharedDeadlines {
		s.Deadlines = maps.Clone(s.Deadlines)
	}
	s.sharedDeadlines = false
	return s.Deadlines
}

// dropDeadline forgets the deadline of a step whose attempt ended: only
// attempts in flight are published again, so the map (copied by the first
// dispatch of every decision, and saved in snapshots) holds the steps in
// flight, not every step the run ever dispatched.
func (s *State) dropDeadline(stepID string) {
	if _, ok := s.Deadlines[stepID]; ok {
		delete(s.writeDeadlines(), stepID)
	}
}

// chainLink is the end of a verified hash chain: the run, the sequence and
// the hash of its last event (zero before the first).
type chainLink struct {
	runID string
	seq   uint64
	hash  []byte
}

// next verifies that ev continues the chain (run id, sequence, previous
// hash, own hash: computed, unless computed is ev's hash as its caller
// just computed it) and moves the link to it; on error the link is
// unchanged. The error is a *BrokenEventError (without a stream sequence,
// which the caller knows) unless the event cannot be encoded.
func (l *chainLink) next(ev *planexv1.RunEvent, computed []byte) error {
	want := l.seq + 1
	broken := func(notEvent bool, format string, args ...any) error {
		id := l.runID
		if id == "" {
			id = ev.GetRunId()
		}
		return &BrokenEventError{RunID: id, Sequence: want, NotEvent: notEvent, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case !eventLike(ev):
		return broken(true, "it has no run id and no sequence")
	case l.runID != "" && ev.GetRunId() != l.runID:
		return broken(false, "the event stored there belongs to %s", otherRun(ev.GetRunId()))
	case ev.GetSequence() != want:
		return broken(false, "the event stored there is event %d", ev.GetSequence())
	case !bytes.Equal(ev.GetPrevHash(), l.hash) && l.seq == 0:
		return broken(false, "the first event has a prev_hash")
	case !bytes.Equal(ev.GetPrevHash(), l.hash):
		return broken(false, "its prev_hash does not match the hash of event %d", l.seq)
	}
	h := computed
	if h == nil {
		var err error
		if h, err = Hash(ev); err != nil {
			return err
		}
	}
	if !bytes.Equal(h, ev.GetHash()) {
		return broken(false, "its hash does not match its content (modified after it was appended?)")
	}
	l.runID, l.seq, l.hash = ev.GetRunId(), ev.GetSequence(), h
	return nil
}

// applyAll applies the events of one log message (a batch shares its
// stream sequence); on error the state may hold a prefix of them, so
// callers apply to a copy.
func (s *State) applyAll(evs []*planexv1.RunEvent, streamSeq uint64) error {
	for _, ev := range evs {
		if err := s.Apply(ev, streamSeq); err != nil {
			return err
		}
	}
	return nil
}

// applyMsg folds the events of one log message, recording a dispatching
// decision's attempt as direct (see Direct).
func (s *State) applyMsg(evs []*planexv1.RunEvent, streamSeq uint64, subject string) error {
	if err := s.applyAll(evs, streamSeq); err != nil {
		return err
	}
	if _, _, ok := bus.ParseDispatchSubject(subject); ok {
		s.markDirect(evs)
	}
	return nil
}

// Hash computes an event's hash. A version 2 event (one with a salt, as
// [Tx.Emit] appends them) hashes per field (see commit.go): an export can
// mask a field and still prove every other. A version 1 event (appended
// before) hashes as SHA-256 over prev_hash followed by the deterministic
// protobuf encoding of the event with hash unset.
func Hash(ev *planexv1.RunEvent) ([]byte, error) {
	if salt := eventSalt(ev); salt != nil {
		return hashV2(ev, salt)
	}
	saved := ev.Hash
	ev.Hash = nil
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(ev)
	ev.Hash = saved
	if err != nil {
		return nil, fmt.Errorf("encode event %d of run %s: %w", ev.GetSequence(), ev.GetRunId(), err)
	}
	h := sha256.New()
	h.Write(ev.GetPrevHash())
	h.Write(data)
	return h.Sum(nil), nil
}

// Snapshots are stored in planex-runs as: magic, a length-prefixed JSON
// header with what State holds besides the run, then the Run in protobuf.
// The format is private to this package; an unreadable snapshot is ignored
// and the run is folded from its log.
var snapMagic = []byte("PXS1")

type snapHeader struct {
	StreamSeq    uint64               `json:"stream_seq"`
	Hash         []byte               `json:"hash"`
	TraceContext map[string]string    `json:"trace_context,omitempty"`
	RejectErrors []string             `json:"reject_errors,omitempty"`
	ReplanReason string               `json:"replan_reason,omitempty"`
	ReplanStep   string               `json:"replan_step,omitempty"`
	Deadlines    map[string]time.Time `json:"deadlines,omitempty"`
	Routed       bool                 `json:"routed,omitempty"`
	Direct       map[string]int32     `json:"direct,omitempty"`
}

func encodeSnapshot(s *State) ([]byte, error) {
	hdr, err := json.Marshal(snapHeader{
		StreamSeq: s.StreamSeq, Hash: s.Hash, TraceContext: s.TraceContext,
		RejectErrors: s.RejectErrors, ReplanReason: s.ReplanReason, ReplanStep: s.ReplanStep, Deadlines: s.Deadlines,
		Routed: s.Routed, Direct: s.Direct,
	})
	if err != nil {
		return nil, fmt.Errorf("encode snapshot header of run %s: %w", s.Run.GetId(), err)
	}
	run, err := proto.Marshal(s.Run)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot of run %s: %w", s.Run.GetId(), err)
	}
	out := make([]byte, 0, len(snapMagic)+4+len(hdr)+len(run))
	out = append(out, snapMagic...)
	out = binary.BigEndian.AppendUint32(out, uint32(len(hdr)))
	out = append(out, hdr...)
	return append(out, run...), nil
}

func decodeSnapshot(data []byte) (*State, error) {
	if !bytes.HasPrefix(data, snapMagic) || len(data) < len(snapMagic)+4 {
		return nil, errors.New("decode snapshot: bad magic")
	}
	data = data[len(snapMagic):]
	n := binary.BigEndian.Uint32(data)
	data = data[4:]
	if uint64(n) > uint64(len(data)) {
		return nil, errors.New("decode snapshot: truncated header")
	}
	var hdr snapHeader
	if err := json.Unmarshal(data[:n], &hdr); err != nil {
		return nil, fmt.Errorf("decode snapshot header: %w", err)
	}
	run := &planexv1.Run{}
	if err := proto.Unmarshal(data[n:], run); err != nil {
		return nil, fmt.Errorf("decode snapshot run: %w", err)
	}
	return &State{
		Run: run, StreamSeq: hdr.StreamSeq, Hash: hdr.Hash, TraceContext: hdr.TraceContext,
		RejectErrors: hdr.RejectErrors, ReplanReason: hdr.ReplanReason, ReplanStep: hdr.ReplanStep, Deadlines: hdr.Deadlines,
		Routed: hdr.Routed, Direct: hdr.Direct,
		snap: &snapMark{seq: run.GetLastSequence(), status: run.GetStatus()},
	}, nil
}
