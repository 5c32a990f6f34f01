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

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protojson"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
)

// BrokenEventError names the first event of a run log that fails
// verification. It matches ErrBrokenChain with errors.Is.
type BrokenEventError struct {
	// RunID is the run.
	RunID string
	// Sequence is the per-run sequence of the broken event: the one whose
	// content, link or place in the log is wrong.
	Sequence uint64
	// Reason says what is wrong, for people.
	Reason string
}

func (e *BrokenEventError) Error() string {
	return fmt.Sprintf("run %s: event %d: %s", e.RunID, e.Sequence, e.Reason)
}

// Unwrap makes the error match ErrBrokenChain.
func (e *BrokenEventError) Unwrap() error { return ErrBrokenChain }

// Verified describes a run log that passed [Verify].
type Verified struct {
	// RunID is the run.
	RunID string
	// Events is the number of events.
	Events int
	// LastHash is the hash of the last event, which commits to the whole log.
	LastHash []byte
	// Finished reports whether the log ends with RunFinished.
	Finished bool
	// Unchecked lists the events whose content was redacted: their links
	// were checked but their hashes cannot be recomputed from the export.
	Unchecked []uint64
}

// Verify checks a run log in stored order: it starts with event 1, the
// per-run sequence has no gap, repeat or reordering, every prev_hash is the
// hash of the event before, every hash matches its event's content (except
// events redacted[i] marks, whose content an export replaced) and the
// events fold (nothing after RunFinished, one RunCreated). The error is a
// *BrokenEventError naming the first broken event.
func Verify(events []*planexv1.RunEvent, redacted []bool) (*Verified, error) {
	if len(events) == 0 {
		return nil, fmt.Errorf("verify run log: %w: no events", ErrBrokenChain)
	}
	v := &Verified{RunID: events[0].GetRunId()}
	broken := func(seq uint64, format string, args ...any) error {
		return &BrokenEventError{RunID: v.RunID, Sequence: seq, Reason: fmt.Sprintf(format, args...)}
	}
	var (
		run  *planexv1.Run
		prev []byte
	)
	for i, ev := range events {
		want := uint64(i) + 1
		if ev.GetRunId() != v.RunID {
			return nil, broken(want, "stored event %d belongs to run %q", ev.GetSequence(), ev.GetRunId())
		}
		if got := ev.GetSequence(); got != want {
			return nil, broken(want, "%s", misplaced(events, i, want))
		}
		if !bytes.Equal(ev.GetPrevHash(), prev) {
			return nil, broken(want, "prev_hash does not match the hash of event %d", want-1)
		}
		if i < len(redacted) && redacted[i] {
			v.Unchecked = append(v.Unchecked, want)
		} else {
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
	v.Finished = events[len(events)-1].GetFinished() != nil
	return v, nil
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
// order, without verifying them (see [Verify]). It returns ErrRunNotFound
// for a run without events.
func ReadStored(ctx context.Context, js jetstream.JetStream, runID string) ([]*planexv1.RunEvent, error) {
	if !bus.ValidRunID(runID) {
		return nil, fmt.Errorf("read run %q: %w", runID, ErrRunNotFound)
	}
	stream, err := js.Stream(ctx, bus.StreamEvents)
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", bus.StreamEvents, err)
	}
	// Both layouts, in stream order: a run's messages are on one of them,
	// and a message forged on the other is read (and refused by Verify)
	// rather than hidden.
	type stored struct {
		seq uint64
		evs []*planexv1.RunEvent
	}
	var msgs []stored
	for _, subj := range []string{bus.EventSubject(runID), bus.RunLogFilter(runID)} {
		for seq := uint64(1); ; {
			m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("read run %s: event after stream sequence %d: %w", runID, seq-1, err)
			}
			evs, err := decodeRaw(m) // one message holds one event or a decision's batch
			if err != nil {
				return nil, &BrokenEventError{RunID: runID, Sequence: uint64(len(msgs)) + 1, Reason: fmt.Sprintf("undecodable at stream sequence %d: %v", m.Sequence, err)}
			}
			msgs = append(msgs, stored{m.Sequence, evs})
			seq = m.Sequence + 1
		}
	}
	slices.SortFunc(msgs, func(a, b stored) int { return cmp.Compare(a.seq, b.seq) })
	var out []*planexv1.RunEvent
	for _, m := range msgs {
		out = append(out, m.evs...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("read run %s: %w", runID, ErrRunNotFound)
	}
	return out, nil
}

// ExportedEvent is one line of an exported run log (`planex runs export`):
// the event as protojson, and whether the export redacted its content (its
// hash is the stored one, so its link is still checked).
type ExportedEvent struct {
	// Event is the event.
	Event *planexv1.RunEvent
	// Redacted reports that sensitive fields were masked on export.
	Redacted bool
}

type exportLine struct {
	RunID    string          `json:"run_id"`
	Sequence uint64          `json:"sequence"`
	Redacted bool            `json:"redacted,omitempty"`
	Event    json.RawMessage `json:"event"`
}

// WriteExport writes events as JSON lines, one object per event with
// run_id, sequence, redacted and event (protojson).
func WriteExport(w io.Writer, events []ExportedEvent) error {
	bw := bufio.NewWriter(w)
	for _, e := range events {
		data, err := protojson.Marshal(e.Event)
		if err != nil {
			return fmt.Errorf("encode event %d: %w", e.Event.GetSequence(), err)
		}
		line, err := json.Marshal(exportLine{RunID: e.Event.GetRunId(), Sequence: e.Event.GetSequence(), Redacted: e.Redacted, Event: data})
		if err != nil {
			return fmt.Errorf("encode event %d: %w", e.Event.GetSequence(), err)
		}
		bw.Write(line)
		bw.WriteByte('\n')
	}
	return bw.Flush()
}

// ReadExport reads a run log written by WriteExport. A line that is not an
// exported event is an error naming the line.
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
			return nil, fmt.Errorf("line %d: no event", n)
		}
		ev := &planexv1.RunEvent{}
		if err := protojson.Unmarshal(l.Event, ev); err != nil {
			return nil, fmt.Errorf("line %d: event: %w", n, err)
		}
		out = append(out, ExportedEvent{Event: ev, Redacted: l.Redacted})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read run log: %w", err)
	}
	return out, nil
}
