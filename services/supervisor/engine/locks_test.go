package engine

import (
	"context"
	"testing"
	"time"

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

// The run lock's next holder takes every decision that joined while it
// was held, in the order they joined; each of them then finds itself
// taken when it gets the lock, and a decision joining after the take
// waits for the next holder. The run's entry goes with its last holder.
func TestRunLockHolderTakesTheJoinedDecisions(t *testing.T) {
	var l runLocks
	l.m = map[string]*runLock{}
	unlock := l.lock("r")
	type out struct {
		j      *joined
		taken  bool
		unlock func()
	}
	got := make(chan out)
	join := func() *joined {
		j := &joined{ctx: context.Background()}
		go func() {
			u, taken := l.lockJoined("r", j)
			got <- out{j, taken, u}
		}()
		return j
	}
	waitJoined := func(n int) {
		t.Helper()
		for range 1000 {
			l.mu.Lock()
			k := len(l.m["r"].joined)
			l.mu.Unlock()
			if k == n {
				return
			}
			time.Sleep(time.Millisecond)
		}
		t.Fatalf("%d decisions never joined", n)
	}
	a := join()
	waitJoined(1)
	b := join()
	waitJoined(2)
	unlock()

	first := <-got
	if first.taken {
		t.Fatal("the lock's next holder found itself taken")
	}
	batch := l.take("r")
	if len(batch) != 2 || batch[0] != a || batch[1] != b {
		t.Fatalf("take = %v, want a then b", batch)
	}
	c := join() // after the take: the next holder's
	waitJoined(1)
	for _, j := range batch {
		j.finish(context.Background(), nil, nil)
	}
	first.unlock()
	// The other of a and b finds itself taken; c (whichever of the two
	// gets the lock first) takes itself.
	for range 2 {
		o := <-got
		switch {
		case o.j == c:
			if o.taken {
				t.Fatal("c, joined after the take, found itself taken")
			}
			if batch := l.take("r"); len(batch) != 1 || batch[0] != c {
				t.Fatalf("take = %v, want c", batch)
			}
		case o.j == first.j:
			t.Fatal("the first holder got the lock twice")
		default:
			if !o.taken || o.j.settle == nil {
				t.Fatalf("the other of a and b: taken %v, finished %v; want both", o.taken, o.j.settle != nil)
			}
		}
		o.unlock()
	}
	if len(l.m) != 0 {
		t.Fatalf("run entries left after the last holder: %v", l.m)
	}
}
