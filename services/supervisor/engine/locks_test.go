package engine

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// stubMsg stands for a delivered message; hand only keeps it.
type stubMsg struct {
	jetstream.Msg
	name string
}

// A run takes at most perRun places in hand; its further messages queue,
// in order, behind the ones in hand without taking a place, so other runs
// still get places; a run's entry goes when its last message is settled.
func TestHandQueuesARunsMessagesBeyondItsPlaces(t *testing.T) {
	h := newHand(3, 2)
	ctx := context.Background()
	admit := func(run, name string) (*stubMsg, bool) {
		m := &stubMsg{name: name}
		return m, h.admit(ctx, run, m)
	}
	for _, tc := range []struct {
		run, name string
		handle    bool
	}{
		{"hot", "h1", true}, {"hot", "h2", true}, {"hot", "h3", false}, {"hot", "h4", false}, {"cold", "c1", true},
	} {
		if _, got := admit(tc.run, tc.name); got != tc.handle {
			t.Fatalf("admit %s of %s = %v, want %v", tc.name, tc.run, got, tc.handle)
		}
	}
	if n := len(h.places); n != 3 {
		t.Fatalf("%d places taken, want 3 (two of hot, one of cold)", n)
	}
	if q := h.queuedMsgs(); len(q) != 2 {
		t.Fatalf("%d messages queued, want 2", len(q))
	}
	// h1's handler takes over h3, h2's h4; then both find nothing left.
	for _, want := range []string{"h3", "h4"} {
		if m, ok := h.next("hot").(*stubMsg); !ok || m.name != want {
			t.Fatalf("next of hot = %v, want %s", m, want)
		}
	}
	for range 2 {
		if m := h.next("hot"); m != nil {
			t.Fatalf("next of hot = %v, want none", m)
		}
		h.leave()
	}
	if m := h.next("cold"); m != nil {
		t.Fatalf("next of cold = %v, want none", m)
	}
	h.leave()
	if len(h.runs) != 0 || len(h.places) != 0 {
		t.Fatalf("after every message settled: runs %v, %d places taken", h.runs, len(h.places))
	}

	// A full hand: admit waits for a place and gives up when ctx ends,
	// leaving no trace of the run.
	for i := range 3 {
		if _, ok := admit("r"+string(rune('0'+i)), "x"); !ok {
			t.Fatal("admit into a free place refused")
		}
	}
	done, stop := context.WithCancel(ctx)
	stop()
	if h.admit(done, "late", &stubMsg{name: "late"}) {
		t.Fatal("admit into a full hand with ctx ended succeeded")
	}
	if _, ok := h.runs["late"]; ok {
		t.Fatal("a message never admitted left its run's entry behind")
	}
}
