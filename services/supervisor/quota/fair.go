package quota

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"
)

// Fair shares engine slots among tenants, max-min fair: every tenant
// with work holds at least one slot — a tenant holding none is admitted at
// once, and a tenant's last slot passes straight to its next waiter — and
// the slots beyond those go, as they are freed, to the waiting tenant
// holding the fewest (round-robin among equals; each tenant's waiters in
// arrival order). Engine messages and run creations hold a slot while they
// are handled, so a tenant with a backlog of thousands delays another
// tenant's next message by nothing but the CPU its own slots use, not by
// its backlog.
//
// At most slots plus one per further tenant with work are held at once: a
// tenant admitted beyond slots because it held none makes the next
// releases bring the count back down before a waiter gets a shared slot.
//
// A tenant alone is not bounded: while no other tenant holds or waits
// for a slot, or asked for one within FairIdle, its messages are admitted
// at once (the engine's own worker count bounds them), so a single-tenant
// supervisor keeps its throughput. Once another tenant shows up, the
// lone tenant's slots beyond the shared ones drain as its messages end.
//
// With Pace, a backlogged tenant is also paced while another tenant has
// work and engine messages take longer than the target over their floor
// (see pacer).
//
// A nil *Fair admits everything at once.
type Fair struct {
	mu       sync.Mutex
	slots    int
	used     int
	lastSeen map[string]time.Time // when each tenant last asked for a slot
	now      func() time.Time
	held     map[string]int           // slots held, per tenant
	queues   map[string][]*fairWaiter // waiting, per tenant, oldest first
	ring     []string                 // tenants with waiters, in arrival order
	next     int                      // position in ring where ties start
	pace     pacer                    // pacing of backlogged tenants (Pace)
}

type fairWaiter struct {
	ch      chan struct{} // closed when granted
	granted bool
}

// NewFair returns a scheduler of slots engine messages handled at once
// across every tenant (at least 1; see Fair for the one slot each tenant
// with work holds beyond them).
func NewFair(slots int) *Fair {
	return &Fair{slots: max(slots, 1), held: map[string]int{}, queues: map[string][]*fairWaiter{}, lastSeen: map[string]time.Time{}, now: time.Now}
}

// FairIdle is how long after its last request for a slot a tenant still
// counts as sharing the supervisor: B's runs a few milliseconds apart keep
// A held to the shared slots between them.
const FairIdle = time.Second

// alone reports whether tenant is the only one that holds a slot, waits
// for one or asked for one within FairIdle; f.mu is held.
func (f *Fair) alone(tenant string, now time.Time) bool {
	for t, at := range f.lastSeen {
		if t == tenant {
			continue
		}
		if f.held[t] > 0 || len(f.queues[t]) > 0 || now.Sub(at) < FairIdle {
			return false
		}
		delete(f.lastSeen, t) // idle: forgotten until it asks again
	}
	return true
}

// Acquire takes a slot for tenant, waiting for one (its turn among the
// tenants waiting) until ctx ends. release gives the slot back; it must be
// called once, and calling it again does nothing.
func (f *Fair) Acquire(ctx context.Context, tenant string) (release func(), err error) {
	return f.acquire(ctx, tenant, true)
}

// acquire is Acquire; timed says whether the slot's holding time is an
// engine message's, which pacing compares with its floor.
func (f *Fair) acquire(ctx context.Context, tenant string, timed bool) (release func(), err error) {
	if f == nil {
		return func() {}, nil
	}
	f.mu.Lock()
	now := f.now()
	f.lastSeen[tenant] = now
	f.decide(now)
	if err := f.waitToken(ctx, tenant, now); err != nil {
		f.mu.Unlock()
		return nil, err
	}
	now = f.now()
	f.lastSeen[tenant] = now
	if f.held[tenant] == 0 || (f.used < f.slots && len(f.ring) == 0) || f.alone(tenant, now) {
		// A tenant holding nothing has no waiter either (its last slot
		// went to its next waiter): it is admitted at once, as is a
		// tenant alone — with its waiters first, queued while another
		// tenant was about.
		for len(f.queues[tenant]) > 0 {
			f.grantTo(tenant)
		}
		f.take(tenant)
		f.mu.Unlock()
		return f.releaser(tenant, now, timed), nil
	}
	w := &fairWaiter{ch: make(chan struct{})}
	if len(f.queues[tenant]) == 0 {
		f.ring = append(f.ring, tenant)
	}
	f.queues[tenant] = append(f.queues[tenant], w)
	f.mu.Unlock()

	select {
	case <-w.ch:
		return f.releaser(tenant, f.now(), timed), nil
	case <-ctx.Done():
	}
	f.mu.Lock()
	if w.granted {
		// Granted as ctx ended: pass the slot on.
		f.put(tenant)
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
	release, err := f.acquire(ctx, tenant, false)
	if err != nil {
		return err
	}
	context.AfterFunc(ctx, release)
	return nil
}

// releaser returns a release for one slot of tenant granted at from;
// timed records how long it was held (see acquire).
func (f *Fair) releaser(tenant string, from time.Time, timed bool) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			if timed {
				f.sample(f.now().Sub(from))
			}
			f.put(tenant)
			f.mu.Unlock()
		})
	}
}

// take counts a slot held by tenant; f.mu is held.
func (f *Fair) take(tenant string) {
	f.used++
	f.held[tenant]++
}

// put gives back a slot of tenant: its last one goes straight to its next
// waiter, any other to the waiters by grant; f.mu is held.
func (f *Fair) put(tenant string) {
	f.used--
	if len(f.queues[tenant]) > 0 && f.alone(tenant, f.now()) {
		// Alone again: its waiters need not wait for the shared slots.
		for len(f.queues[tenant]) > 0 {
			f.grantTo(tenant)
		}
	}
	if f.held[tenant]--; f.held[tenant] > 0 {
		f.grant()
		return
	}
	delete(f.held, tenant)
	if len(f.queues[tenant]) > 0 {
		f.grantTo(tenant)
	}
	f.grant()
}

// grant hands free shared slots to waiters, each to the waiting tenant
// holding the fewest (the first such from f.next on, so that equals take
// turns); f.mu is held.
func (f *Fair) grant() {
	for f.used < f.slots && len(f.ring) > 0 {
		if f.next >= len(f.ring) {
			f.next = 0
		}
		best := f.next
		for k := 1; k < len(f.ring); k++ {
			i := (f.next + k) % len(f.ring)
			if f.held[f.ring[i]] < f.held[f.ring[best]] {
				best = i
			}
		}
		f.next = best
		f.grantTo(f.ring[best])
	}
}

// grantTo hands a slot to tenant's oldest waiter and moves f.next past
// tenant; tenant has a waiter and f.mu is held.
func (f *Fair) grantTo(tenant string) {
	q := f.queues[tenant]
	w := q[0]
	q[0] = nil
	q = q[1:]
	w.granted = true
	close(w.ch)
	f.take(tenant)
	i := slices.Index(f.ring, tenant)
	if len(q) > 0 {
		f.queues[tenant] = q
		if i == f.next {
			f.next++
		}
		return
	}
	delete(f.queues, tenant)
	f.ring = slices.Delete(f.ring, i, i+1)
	if i < f.next {
		f.next--
	}
	// f.next now points at the tenant after the one served.
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
	// Held counts the slots held per tenant.
	Held map[string]int
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
	s := FairStats{Slots: f.slots, Used: f.used, Held: maps.Clone(f.held), Waiting: map[string]int{}}
	for t, q := range f.queues {
		s.Waiting[t] = len(q)
	}
	return s
}
