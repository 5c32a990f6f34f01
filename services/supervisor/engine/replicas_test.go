package engine

import (
	"context"
	"testing"
	"time"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
)

// The live replicas' shares add up: this replica's own share counts
// whether or not its entry is written, an unreadable entry counts as one
// share like ours, a deregistered replica's entry goes at once and an
// entry no longer renewed goes with the bucket's TTL.
func TestReplicaSetSumsLiveShares(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := bus.Setup(ctx, nc, bus.Options{SupervisorsTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := res.SupervisorsBucket(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := &replicaSet{kv: kv, id: "a", share: 10}
	b := &replicaSet{kv: kv, id: "b", share: 30}
	total := func(s *replicaSet, self bool) (int, int) {
		t.Helper()
		n, held, err := s.total(ctx, self)
		if err != nil {
			t.Fatal(err)
		}
		return n, held
	}
	expect := func(s *replicaSet, self bool, wantN, wantHeld int) {
		t.Helper()
		if n, held := total(s, self); n != wantN || held != wantHeld {
			t.Fatalf("%s total(self=%v) = %d replicas holding %d, want %d holding %d", s.id, self, n, held, wantN, wantHeld)
		}
	}

	expect(a, true, 1, 10) // nothing registered yet: this replica alone
	expect(a, false, 0, 0)
	if err := b.deregister(ctx); err != nil { // never registered: nothing to do
		t.Fatal(err)
	}
	for _, s := range []*replicaSet{a, b} {
		if err := s.register(ctx); err != nil {
			t.Fatal(err)
		}
	}
	expect(a, true, 2, 40)
	expect(b, false, 1, 10)
	if _, err := kv.Put(ctx, "c", []byte("many")); err != nil {
		t.Fatal(err)
	}
	expect(a, true, 3, 50)
	if err := b.deregister(ctx); err != nil {
		t.Fatal(err)
	}
	expect(a, true, 2, 20)

	// a stops renewing: its entry and c's expire; a still counts itself.
	deadline := time.Now().Add(10 * time.Second)
	for n, held := total(b, true); n != 1 || held != 30; n, held = total(b, true) {
		if time.Now().After(deadline) {
			t.Fatalf("entries not expired: b sees %d replicas holding %d, want itself alone (30)", n, held)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if every, err := a.renewEvery(ctx); err != nil || every != time.Second/3 {
		t.Fatalf("renewEvery = %s, %v; want a third of the 1s TTL", every, err)
	}
}
