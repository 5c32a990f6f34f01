package runlog

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protojson"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
)

// BrokenEventError names the first entry of a run log that fails
// verification: where it is, and what is wrong with it. It matches
// ErrBrokenChain with errors.Is. Its message holds no event content (a
// foreign run id is named only when it is a valid one), so it is safe to
// show a client and to log.
type BrokenEventError struct {
	// RunID is the run.
	RunID string
	// Sequence is the per-run sequence of the broken event: the one whose
	// content, link or place in the log is wrong, or the one that belongs
	// where an entry that is not an event is stored.
	Sequence uint64
	// StreamSeq is the PLANEX_EVENTS sequence of the message holding the
	// broken entry (0 when unknown, as in an export): what an operator
	// inspects, and deletes if it was forged.
	StreamSeq uint64
	// NotEvent reports an entry that is not a planex event at all (bytes
	// that do not decode, an empty batch, a message without run id and
	// sequence), rather than an event that breaks the hash chain.
	NotEvent bool
	// Reason says what is wrong, for people.
	Reason string
}

func (e *BrokenEventError) Error() string { return "run " + e.RunID + ": " + e.Detail() }

// Detail is the error without the run: where the log breaks and why.
func (e *BrokenEventError) Detail() string {
	switch {
	case e.NotEvent && e.StreamSeq > 0:
		return fmt.Sprintf("the entry at stream sequence %d, where event %d belongs, is not a planex event: %s", e.StreamSeq, e.Sequence, e.Reason)
	case e.NotEvent:
		return fmt.Sprintf("event %d is not a planex event: %s", e.Sequence, e.Reason)
	case e.StreamSeq > 0:
		return fmt.Sprintf("hash chain broken at stream sequence %d, event %d: %s", e.StreamSeq, e.Sequence, e.Reason)
	}
	return fmt.Sprintf("event %d: %s", e.Sequence, e.Reason)
}

// Advice is what a client is told about the run: that it is corrupt,
// where and why, that it cannot continue, and how to inspect it.
func (e *BrokenEventError) Advice() string {
	return fmt.Sprintf("%s%s; the run cannot continue: inspect it with `planex audit verify %s`", corruptPrefix(e.RunID), e.Detail(), e.RunID)
}

// Unwrap makes the error match ErrBrokenChain.
func (e *BrokenEventError) Unwrap() error { return ErrBrokenChain }

// maxReason bounds a reason's length: a reason quotes at most a decoder's
// error, which names no content, but an attacker chooses what it decodes.
const maxReason = 300

// brokenAt returns err as a *BrokenEventError of run runID at stream
// sequence streamSeq: err's own when it is one, else one for event seq
// that does not fold (the fold refused it) or cannot be hashed.
func brokenAt(runID string, seq, streamSeq uint64, err error) *BrokenEventError {
	var be *BrokenEventError
	if errors.As(err, &be) {
		c := *be
		c.RunID, c.StreamSeq = runID, streamSeq
		return &c
	}
	return &BrokenEventError{RunID: runID, Sequence: seq, StreamSeq: streamSeq, Reason: clipReason("it does not fold into the run: " + err.Error())}
}

// notEventAt is the error for an entry of run runID at stream sequence
// streamSeq that does not decode; seq is the event that belongs there.
func notEventAt(runID string, seq, streamSeq uint64, err error) *BrokenEventError {
	reason := "an empty event batch"
	if !errors.Is(err, bus.ErrEmptyBatch) {
		// The decoder's own words (protobuf's name no content), without
		// the wrapping that repeats the subject.
		for inner := errors.Unwrap(err); inner != nil; inner = errors.Unwrap(inner) {
			err = inner
		}
		reason = "it does not decode as one (" + err.Error() + ")"
	}
	return &BrokenEventError{RunID: runID, Sequence: seq, StreamSeq: streamSeq, NotEvent: true, Reason: clipReason(reason)}
}

func clipReason(s string) string {
	if len(s) <= maxReason {
		return s
	}
	return strings.ToValidUTF8(s[:maxReason], "") + "…"
}

// eventLike reports whether ev is shaped like a planex event at all: bytes
// that happen to decode as a RunEvent leave its run id and sequence unset.
func eventLike(ev *planexv1.RunEvent) bool {
	return ev.GetRunId() != "" || ev.GetSequence() != 0
}

// otherRun names the run a foreign event claims to belong to, without
// repeating an arbitrary string an attacker stored as its run id.
func otherRun(id string) string {
	if bus.ValidRunID(id) {
		return "run " + id
	}
	return "a run id that is not valid"
}

// Verified describes a run log that passed [Verify] or [VerifyExport].
type Verified struct {
	// RunID is the run.
	RunID string
	// Events is the number of events.
	Events int
	// LastHash is the hash of the last event, which commits to the whole log.
	LastHash []byte
	// Finished reports whether the log ends with RunFinished.
	Finished bool
	// Masked lists the events an export masked values of, with where:
	// their hashes were recomputed from the export's commitments, so
	// every field they show is verified, and the masked values are
	// committed to without being shown.
	Masked []MaskedEvent
	// Unchecked lists the events whose content was redacted without a
	// commitment (an export by an older planex, or an event appended
	// before version 2 hashes): their links were checked but their
	// content cannot be. A log with such events is only partially
	// verified (see Partial).
	Unchecked []uint64
}

// MaskedEvent is an event of an export with masked values.
type MaskedEvent struct {
	// Sequence is the event.
	Sequence uint64
	// Paths are the masked values (see [PathString]).
	Paths []string
}

// Partial reports a log whose content was not checked in full: some
// events were redacted without a commitment.
func (v *Verified) Partial() bool { return len(v.Unchecked) > 0 }

// Verify checks a run log in stored order: it starts with event 1, the
// per-run sequence has no gap, repeat or reordering, every prev_hash is the
// hash of the event before, every hash matches its event's content (except
// events redacted[i] marks, whose content an export replaced) and the
// events fold (nothing after RunFinished, one RunCreated). The error is a
// *BrokenEventError naming the first broken event.
func Verify(events []*planexv1.RunEvent, redacted []bool) (*Verified, error) {
	exported := make([]ExportedEvent, len(events))
	for i, ev := range events {
		exported[i] = ExportedEvent{Event: ev, Redacted: i < len(redacted) && redacted[i]}
	}
	return VerifyExport(exported)
}

// VerifyExport is [Verify] for an export: an event with a [Commitment]
// has its hash recomputed from what the export shows and the commitment's
// salts and digests, so a change to any field it shows breaks it; a
// redacted event without one is listed in Verified.Unchecked.
func VerifyExport(events []ExportedEvent) (*Verified, error) {
	if len(events) == 0 {
		return nil, fmt.Errorf("verify run log: %w: no events", ErrBrokenChain)
	}
	v := &Verified{RunID: events[0].Event.GetRunId()}
	broken := func(seq uint64, format string, args ...any) error {
		return &BrokenEventError{RunID: v.RunID, Sequence: seq, Reason: clipReason(fmt.Sprintf(format, args...))}
	}
	var (
		run  *planexv1.Run
		prev []byte
	)
	for i, e := range events {
		ev := e.Event
		want := uint64(i) + 1
		if !eventLike(ev) {
			return nil, &BrokenEventError{RunID: v.RunID, Sequence: want, NotEvent: true, Reason: "it has no run id and no sequence"}
		}
		if ev.GetRunId() != v.RunID {
			return nil, broken(want, "stored event %d belongs to %s", ev.GetSequence(), otherRun(ev.GetRunId()))
		}
		if got := ev.GetSequence(); got != want {
			return nil, broken(want, "%s", misplacedExport(events, i, want))
		}
		if !bytes.Equal(ev.GetPrevHash(), prev) {
			return nil, broken(want, "prev_hash does not match the hash of event %d", want-1)
		}
		switch {
		case e.Commitment != nil:
			h, masked, err := e.Commitment.check(ev)
			if err != nil {
				return nil, broken(want, "its commitment does not hold: %v (the export was modified)", err)
			}
			if !bytes.Equal(h, ev.GetHash()) {
				return nil, broken(want, "hash does not match its content (the event was modified after it was appended or exported)")
			}
			if len(masked) > 0 {
				v.Masked = append(v.Masked, MaskedEvent{Sequence: want, Paths: masked})
			}
		case e.Redacted:
			v.Unchecked = append(v.Unchecked, want)
		default:
			h, err := Hash(ev)
			if err != nil {
				return nil, broken(want, "%v", err)
			}
			if !bytes.Equal(h, ev.GetHash()) {
				return nil, broken(want, "hash does not match its content (the event was modified after it was appended)")
			}
		}
		next, err := Fold(run, ev)
		if err != nil {
			return nil, broken(want, "%v", err)
		}
		run, prev = next, ev.GetHash()
	}
	v.Events = len(events)
	v.LastHash = prev
	v.Finished = Terminal(run.GetStatus()) // a fork's link may follow the end
	return v, nil
}

// misplacedExport is misplaced for an export.
func misplacedExport(events []ExportedEvent, i int, want uint64) string {
	evs := make([]*planexv1.RunEvent, len(events))
	for j, e := range events {
		evs[j] = e.Event
	}
	return misplaced(evs, i, want)
}

// misplaced explains why events[i] is not event want.
func misplaced(events []*planexv1.RunEvent, i int, want uint64) string {
	got := events[i].GetSequence()
	for j := i + 1; j < len(events); j++ {
		if events[j].GetSequence() == want {
			return fmt.Sprintf("stored out of place, after event %d (deleted and published again?)", events[j-1].GetSequence())
		}
	}
	if got < want {
		return fmt.Sprintf("event %d is stored again where event %d belongs", got, want)
	}
	return fmt.Sprintf("missing: the next stored event is %d", got)
}

// ReadStored reads a run's events as stored in PLANEX_EVENTS, in stream
// order, without verifying them (see [Verify], [VerifyStored]). It returns
// ErrRunNotFound for a run without events, and a *BrokenEventError naming
// the first entry that is not an event.
func ReadStored(ctx context.Context, js jetstream.JetStream, runID string) ([]*planexv1.RunEvent, error) {
	events, _, err := readStored(ctx, js, runID)
	if err != nil {
		return nil, err
	}
	return events, nil
}

// VerifyStored reads a run's log as stored in PLANEX_EVENTS and verifies
// it as [Verify] does. The error is a *BrokenEventError naming the first
// broken entry with its stream sequence (an entry that is not an event
// included), or ErrRunNotFound.
func VerifyStored(ctx context.Context, js jetstream.JetStream, runID string) (*Verified, error) {
	events, seqs, err := readStored(ctx, js, runID)
	var notEvent *BrokenEventError
	if errors.As(err, &notEvent) {
		err = nil // the events before it are verified first: an earlier break comes first
	}
	if err != nil {
		return nil, err
	}
	if len(events) == 0 {
		return nil, notEvent
	}
	if ev := events[0]; eventLike(ev) && ev.GetRunId() != runID {
		return nil, &BrokenEventError{RunID: runID, Sequence: 1, StreamSeq: seqs[0], Reason: "the event stored there belongs to " + otherRun(ev.GetRunId())}
	}
	v, err := Verify(events, nil)
	var be *BrokenEventError
	if errors.As(err, &be) {
		c := *be
		c.RunID = runID
		if i := int(c.Sequence) - 1; i >= 0 && i < len(seqs) {
			c.StreamSeq = seqs[i]
		}
		return nil, &c
	}
	if err != nil {
		return nil, fmt.Errorf("verify run %s: %w", runID, err)
	}
	if notEvent != nil {
		return nil, notEvent
	}
	return v, nil
}

// readStored reads a run's events as stored, in stream order, with the
// stream sequence of each. At an entry that is not an event it stops and
// returns the events before it with a *BrokenEventError naming it.
func readStored(ctx context.Context, js jetstream.JetStream, runID string) ([]*planexv1.RunEvent, []uint64, error) {
	if !bus.ValidRunID(runID) {
		return nil, nil, fmt.Errorf("read run %q: %w", runID, ErrRunNotFound)
	}
	stream, err := js.Stream(ctx, bus.StreamEvents)
	if err != nil {
		return nil, nil, fmt.Errorf("open stream %s: %w", bus.StreamEvents, err)
	}
	// Both layouts, in stream order: a run's messages are on one of them,
	// and a message forged on the other is read (and refused by Verify)
	// rather than hidden.
	var msgs []*jetstream.RawStreamMsg
	for _, subj := range []string{bus.EventSubject(runID), bus.RunLogFilter(runID)} {
		for seq := uint64(1); ; {
			m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return nil, nil, fmt.Errorf("read run %s: event after stream sequence %d: %w", runID, seq-1, err)
			}
			msgs = append(msgs, m)
			seq = m.Sequence + 1
		}
	}
	if len(msgs) == 0 {
		return nil, nil, fmt.Errorf("read run %s: %w", runID, ErrRunNotFound)
	}
	slices.SortFunc(msgs, func(a, b *jetstream.RawStreamMsg) int { return cmp.Compare(a.Sequence, b.Sequence) })
	var (
		out  []*planexv1.RunEvent
		seqs []uint64
	)
	for _, m := range msgs {
		evs, err := decodeRaw(m) // one message holds one event or a decision's batch
		if err != nil {
			return out, seqs, notEventAt(runID, uint64(len(out))+1, m.Sequence, err)
		}
		for _, ev := range evs {
			out = append(out, ev)
			seqs = append(seqs, m.Sequence)
		}
	}
	return out, seqs, nil
}

// ExportedEvent is one line of an exported run log (`planex runs export`):
// the event as protojson, whether the export redacted its content, and
// for a version 2 event the commitment that proves what it shows.
type ExportedEvent struct {
	// Event is the event.
	Event *planexv1.RunEvent
	// Redacted reports that sensitive fields were masked on export.
	Redacted bool
	// Commitment proves the fields of a redacted version 2 event (see
	// [Commitment]); nil for an event shown whole (WriteExport then
	// writes its salt) or a version 1 event.
	Commitment *Commitment
}

type exportLine struct {
	RunID      string          `json:"run_id"`
	Sequence   uint64          `json:"sequence"`
	Redacted   bool            `json:"redacted,omitempty"`
	Commitment *Commitment     `json:"commitment,omitempty"`
	Event      json.RawMessage `json:"event"`
}

// WriteExport writes events as JSON lines, one object per event with
// run_id, sequence, redacted, commitment and event (protojson). A version
// 2 event shown whole gets the commitment that reveals its salt (protojson
// has no place for it), so that its hash can be recomputed.
func WriteExport(w io.Writer, events []ExportedEvent) error {
	bw := bufio.NewWriter(w)
	for _, e := range events {
		data, err := protojson.Marshal(e.Event)
		if err != nil {
			return fmt.Errorf("encode event %d: %w", e.Event.GetSequence(), err)
		}
		c := e.Commitment
		if salt := eventSalt(e.Event); c == nil && !e.Redacted && salt != nil {
			c = fullCommitment(salt)
		}
		line, err := json.Marshal(exportLine{RunID: e.Event.GetRunId(), Sequence: e.Event.GetSequence(), Redacted: e.Redacted, Commitment: c, Event: data})
		if err != nil {
			return fmt.Errorf("encode event %d: %w", e.Event.GetSequence(), err)
		}
		bw.Write(line)
		bw.WriteByte('\n')
	}
	return bw.Flush()
}

// ReadExport reads a run log written by WriteExport. A line that is not an
// exported event is an error naming the line (and the event it claims to
// be). An event shown whole gets its salt back, so that [Hash] and replay
// read it as stored.
func ReadExport(r io.Reader) ([]ExportedEvent, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	var out []ExportedEvent
	for n := 1; sc.Scan(); n++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var l exportLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if len(l.Event) == 0 {
			return nil, fmt.Errorf("line %d (event %d): no event", n, l.Sequence)
		}
		ev := &planexv1.RunEvent{}
		if err := protojson.Unmarshal(l.Event, ev); err != nil {
			return nil, fmt.Errorf("line %d (event %d): event: %w", n, l.Sequence, err)
		}
		if ev.GetRunId() != l.RunID || ev.GetSequence() != l.Sequence {
			return nil, fmt.Errorf("line %d (event %d): run_id and sequence do not match the event's", n, l.Sequence)
		}
		if s := l.Commitment.rootSalt(); s != nil {
			setSalt(ev, s)
		}
		out = append(out, ExportedEvent{Event: ev, Redacted: l.Redacted, Commitment: l.Commitment})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read run log: %w", err)
	}
	return out, nil
}
