package quota

import (
	"context"
	"sync"
)

// Fair shares engine slots among tenants: at most slots engine messages
// are handled at once across every tenant's engine of the supervisor, and
// when several tenants wait, freed slots go round-robin by tenant (each
// tenant's waiters in arrival order). A tenant with a backlog of thousands
// of messages therefore delays another tenant's next message by at most
// one slot release per tenant waiting, not by its backlog.
//
// A nil *Fair admits everything at once.
type Fair struct {
	mu     sync.Mutex
	slots  int
	used   int
	queues map[string][]*fairWaiter // waiting, per tenant, oldest first
	ring   []string                 // tenants with waiters, in round-robin order
	next   int                      // position in ring of the tenant served next
}

type fairWaiter struct {
	ch      chan struct{} // closed when granted
	granted bool
}

// NewFair returns a scheduler of slots engine messages handled at once
// across every tenant (at least 1).
func NewFair(slots int) *Fair {
	return &Fair{slots: max(slots, 1), queues: map[string][]*fairWaiter{}}
}

// Acquire takes a slot for tenant, waiting for one (its turn among the
// tenants waiting) until ctx ends. release gives the slot back; it must be
// called once, and calling it again does nothing.
func (f *Fair) Acquire(ctx context.Context, tenant string) (release func(), err error) {
	if f == nil {
		return func() {}, nil
	}
	f.mu.Lock()
	if f.used < f.slots && len(f.ring) == 0 {
		f.used++
		f.mu.Unlock()
		return f.releaser(), nil
	}
	w := &fairWaiter{ch: make(chan struct{})}
	if len(f.queues[tenant]) == 0 {
		f.ring = append(f.ring, tenant)
	}
	f.queues[tenant] = append(f.queues[tenant], w)
	f.mu.Unlock()

	select {
	case <-w.ch:
		return f.releaser(), nil
	case <-ctx.Done():
	}
	f.mu.Lock()
	if w.granted {
		// Granted as ctx ended: pass the slot on.
		f.used--
		f.grant()
		f.mu.Unlock()
		return nil, ctx.Err()
	}
	f.remove(tenant, w)
	f.mu.Unlock()
	return nil, ctx.Err()
}

// AdmitStart takes a slot for tenant that StartRun holds while it creates
// a run: api.Config.AdmitStart's ctx ends when the run is created (or the
// call failed), which releases it. Run creations then take turns with
// engine messages, so that one tenant's burst of starts does not hold
// every CPU of the supervisor either.
func (f *Fair) AdmitStart(ctx context.Context, tenant string) error {
	if f == nil {
		return nil
	}
	release, err := f.Acquire(ctx, tenant)
	if err != nil {
		return err
	}
	context.AfterFunc(ctx, release)
	return nil
}

// releaser returns a release for one slot.
func (f *Fair) releaser() func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			f.used--
			f.grant()
			f.mu.Unlock()
		})
	}
}

// grant hands free slots to waiters, one tenant after the other; f.mu is
// held.
func (f *Fair) grant() {
	for f.used < f.slots && len(f.ring) > 0 {
		if f.next >= len(f.ring) {
			f.next = 0
		}
		tenant := f.ring[f.next]
		q := f.queues[tenant]
		w := q[0]
		q[0] = nil
		q = q[1:]
		w.granted = true
		close(w.ch)
		f.used++
		if len(q) == 0 {
			delete(f.queues, tenant)
			f.ring = append(f.ring[:f.next], f.ring[f.next+1:]...)
			// f.next now points at the tenant after the one served.
		} else {
			f.queues[tenant] = q
			f.next++
		}
	}
}

// remove drops a waiter whose ctx ended; f.mu is held.
func (f *Fair) remove(tenant string, w *fairWaiter) {
	q := f.queues[tenant]
	for i, x := range q {
		if x == w {
			q = append(q[:i], q[i+1:]...)
			break
		}
	}
	if len(q) > 0 {
		f.queues[tenant] = q
		return
	}
	delete(f.queues, tenant)
	for i, t := range f.ring {
		if t == tenant {
			f.ring = append(f.ring[:i], f.ring[i+1:]...)
			if i < f.next {
				f.next--
			}
			break
		}
	}
}

// FairStats is a snapshot of a Fair's occupation, for tests and metrics.
type FairStats struct {
	// Slots is the scheduler's capacity; Used the slots taken.
	Slots, Used int
	// Waiting counts the waiters per tenant.
	Waiting map[string]int
}

// Stats returns the scheduler's occupation now.
func (f *Fair) Stats() FairStats {
	if f == nil {
		return FairStats{}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s := FairStats{Slots: f.slots, Used: f.used, Waiting: map[string]int{}}
	for t, q := range f.queues {
		s.Waiting[t] = len(q)
	}
	return s
}
