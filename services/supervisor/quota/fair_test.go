package quota

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not %s within %s", what, d)
		}
		time.Sleep(time.Millisecond)
	}
}

// queue starts a waiter for tenant that records its name in order when
// granted and holds the slot until released through the returned map.
type grants struct {
	mu       sync.Mutex
	order    []string
	releases map[string]func()
}

func (g *grants) wait(t *testing.T, f *Fair, tenant, name string) {
	t.Helper()
	before := f.Stats().Waiting[tenant]
	go func() {
		rel, err := f.Acquire(context.Background(), tenant)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			return
		}
		g.mu.Lock()
		g.order = append(g.order, name)
		g.releases[name] = rel
		g.mu.Unlock()
	}()
	// Queue them one at a time, so arrival order is known.
	waitFor(t, 2*time.Second, name+" waiting", func() bool { return f.Stats().Waiting[tenant] == before+1 })
}

func (g *grants) releaseNext(t *testing.T, want int) string {
	t.Helper()
	waitFor(t, 2*time.Second, fmt.Sprintf("%d granted", want), func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.order) >= want
	})
	g.mu.Lock()
	name := g.order[want-1]
	rel := g.releases[name]
	g.mu.Unlock()
	rel()
	return name
}

// newTestFair is NewFair(slots) on a clock that stands still, with the
// given tenants seen (so that none counts as alone: see Fair).
func newTestFair(t *testing.T, slots int, seen ...string) *Fair {
	t.Helper()
	f := NewFair(slots)
	t0 := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	f.now = func() time.Time { return t0 }
	for _, tenant := range seen {
		hold(t, f, tenant, 1)[0]()
	}
	return f
}

// hold takes n slots of tenant at once (each must be admitted without
// waiting: a cancelled ctx fails any Acquire that would wait).
func hold(t *testing.T, f *Fair, tenant string, n int) []func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var rels []func()
	for i := range n {
		rel, err := f.Acquire(ctx, tenant)
		if err != nil {
			t.Fatalf("%s's slot %d was not admitted at once: %v", tenant, i+1, err)
		}
		rels = append(rels, rel)
	}
	return rels
}

// TestFairAdmitsATenantHoldingNothing: a tenant arriving behind another's
// backlog of 1,000 waiters, with every slot taken, is admitted at once;
// its second message, while it holds one, waits.
func TestFairAdmitsATenantHoldingNothing(t *testing.T) {
	const slots, backlog = 4, 1000
	f := newTestFair(t, slots, "busy", "quiet")
	held := hold(t, f, "busy", slots)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range backlog {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if rel, err := f.Acquire(ctx, "busy"); err == nil {
				rel()
			}
		}()
	}
	waitFor(t, 5*time.Second, "backlog queued", func() bool { return f.Stats().Waiting["busy"] == backlog })
	quiet := hold(t, f, "quiet", 1)
	if s := f.Stats(); s.Used != slots+1 || s.Held["quiet"] != 1 {
		t.Fatalf("after the quiet tenant's admission: %+v, want %d used, 1 held by quiet", s, slots+1)
	}
	done, stop := context.WithCancel(context.Background())
	stop()
	if _, err := f.Acquire(done, "quiet"); !errors.Is(err, context.Canceled) {
		t.Fatalf("quiet's second slot while it holds one and busy waits: %v, want to wait", err)
	}
	cancel()
	wg.Wait()
	quiet[0]()
	for _, rel := range held {
		rel()
	}
	if s := f.Stats(); s.Used != 0 || len(s.Waiting) != 0 || len(s.Held) != 0 {
		t.Fatalf("after the test: %+v, want nothing used, held or waiting", s)
	}
}

// TestFairLastSlotPassesToOwnWaiter: with one shared slot and three
// tenants each holding one, a tenant's release goes to its own next
// waiter, in arrival order.
func TestFairLastSlotPassesToOwnWaiter(t *testing.T) {
	f := NewFair(1)
	first := map[string]func(){}
	for _, tenant := range []string{"a", "b", "c"} {
		first[tenant] = hold(t, f, tenant, 1)[0]
	}
	g := &grants{releases: map[string]func(){}}
	g.wait(t, f, "a", "a1")
	g.wait(t, f, "a", "a2")
	g.wait(t, f, "b", "b1")
	g.wait(t, f, "c", "c1")
	first["b"]()
	g.granted(t, 1)
	first["a"]()
	g.granted(t, 2)
	first["c"]()
	g.granted(t, 3)
	g.mu.Lock()
	a1 := g.releases["a1"]
	g.mu.Unlock()
	a1()
	got := g.granted(t, 4)
	want := []string{"b1", "a1", "c1", "a2"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("grant order %v, want %v", got, want)
	}
	g.releaseAll()
	if s := f.Stats(); s.Used != 0 || len(s.Waiting) != 0 || len(s.Held) != 0 {
		t.Fatalf("after every release: %+v, want nothing used, held or waiting", s)
	}
}

// granted waits until n waiters were granted and returns their order.
func (g *grants) granted(t *testing.T, n int) []string {
	t.Helper()
	waitFor(t, 2*time.Second, fmt.Sprintf("%d granted", n), func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.order) >= n
	})
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.order)
}

// releaseAll releases every granted waiter.
func (g *grants) releaseAll() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, rel := range g.releases {
		rel()
	}
}

// TestFairFewestHeldFirst: a tenant admitted beyond the slots (it held
// none) is paid back by the next release before any grant; then freed
// slots go to the waiting tenant holding the fewest.
func TestFairFewestHeldFirst(t *testing.T) {
	f := NewFair(4)
	a := hold(t, f, "a", 4)
	b := hold(t, f, "b", 1) // beyond the 4: b held none
	g := &grants{releases: map[string]func(){}}
	g.wait(t, f, "a", "a1")
	g.wait(t, f, "a", "a2")
	g.wait(t, f, "b", "b1")
	a[0]() // 4 used: no grant
	if s := f.Stats(); s.Used != 4 || s.Waiting["a"] != 2 || s.Waiting["b"] != 1 {
		t.Fatalf("after the first release: %+v, want 4 used and every waiter waiting", s)
	}
	a[1]() // a holds 2, b 1
	if got := g.granted(t, 1); got[0] != "b1" {
		t.Fatalf("first grant %v, want b1 (b held 1, a 2)", got)
	}
	a[2]() // a holds 1, b 2
	if got := g.granted(t, 2); got[1] != "a1" {
		t.Fatalf("second grant %v, want a1 (a held 1, b 2)", got)
	}
	b[0]()
	if got := g.granted(t, 3); got[2] != "a2" {
		t.Fatalf("third grant %v, want a2", got)
	}
	a[3]()
	g.releaseAll()
	if s := f.Stats(); s.Used != 0 || len(s.Waiting) != 0 || len(s.Held) != 0 {
		t.Fatalf("after every release: %+v, want nothing used, held or waiting", s)
	}
}

// TestFairRoundRobinAmongEquals: tenants holding as many slots take
// turns, each tenant's waiters in arrival order.
func TestFairRoundRobinAmongEquals(t *testing.T) {
	f := NewFair(4)
	a := hold(t, f, "a", 2)
	b := hold(t, f, "b", 1)
	c := hold(t, f, "c", 1)
	g := &grants{releases: map[string]func(){}}
	g.wait(t, f, "a", "a1")
	g.wait(t, f, "b", "b1")
	g.wait(t, f, "b", "b2")
	g.wait(t, f, "c", "c1")
	a[0]() // every waiting tenant holds 1: a's turn
	g.granted(t, 1)
	a[1]() // b and c hold 1, a 1 with none waiting: b's turn
	g.granted(t, 2)
	b[0]() // b holds 1 (b1), c 1: c's turn (b had the last)
	g.granted(t, 3)
	c[0]() // c held 1 (c1 after), b 1: b2
	got := g.granted(t, 4)
	want := []string{"a1", "b1", "c1", "b2"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("grant order %v, want %v", got, want)
	}
	g.releaseAll()
	if s := f.Stats(); s.Used != 0 || len(s.Waiting) != 0 || len(s.Held) != 0 {
		t.Fatalf("after every release: %+v, want nothing used, held or waiting", s)
	}
}

func TestFairReleaseOnContextEnd(t *testing.T) {
	f := newTestFair(t, 1, "a", "b")
	rel, err := f.Acquire(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := f.Acquire(ctx, "a")
		errc <- err
	}()
	waitFor(t, 2*time.Second, "a's second waiting", func() bool { return f.Stats().Waiting["a"] == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with ctx cancelled: %v, want context.Canceled", err)
	}
	if s := f.Stats(); s.Used != 1 || len(s.Waiting) != 0 {
		t.Fatalf("after the cancelled waiter left: %+v, want 1 used, none waiting", s)
	}
	rel()
	rel() // a second release does nothing
	if s := f.Stats(); s.Used != 0 {
		t.Fatalf("after release twice: %+v, want 0 used", s)
	}
	// The slot is free for the next caller at once.
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	rel2, err := f.Acquire(ctx2, "c")
	if err != nil {
		t.Fatalf("Acquire after release: %v", err)
	}
	rel2()
}

// TestFairNoLeak: many tenants acquiring and releasing concurrently, some
// giving up, leave no slot taken and no waiter behind.
func TestFairNoLeak(t *testing.T) {
	f := newTestFair(t, 3, "t0", "t1", "t2", "t3")
	var wg sync.WaitGroup
	var maxUsed sync.Mutex
	peak := 0
	for i := range 400 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			if i%5 == 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Duration(i%7)*time.Millisecond)
				defer cancel()
			}
			rel, err := f.Acquire(ctx, fmt.Sprint("t", i%4))
			if err != nil {
				return
			}
			maxUsed.Lock()
			peak = max(peak, f.Stats().Used)
			maxUsed.Unlock()
			time.Sleep(100 * time.Microsecond)
			rel()
		}()
	}
	wg.Wait()
	if s := f.Stats(); s.Used != 0 || len(s.Waiting) != 0 {
		t.Fatalf("after every caller: %+v, want nothing used or waiting", s)
	}
	if peak > 6 {
		t.Fatalf("%d slots used at once, want at most 6 (3 slots, one beyond them per further tenant)", peak)
	}
}

// TestFairLoneTenantUnbounded: a tenant alone takes more than the slots
// at once; once another tenant asked for a slot it waits for the shared
// ones, until the other was idle for FairIdle.
func TestFairLoneTenantUnbounded(t *testing.T) {
	const slots = 2
	f := NewFair(slots)
	now := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	f.now = func() time.Time { return now }
	a := hold(t, f, "a", slots+10)
	b := hold(t, f, "b", 1) // b held none
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := f.Acquire(cancelled, "a"); !errors.Is(err, context.Canceled) {
		t.Fatalf("a's slot while b holds one: %v, want to wait", err)
	}
	b[0]()
	now = now.Add(FairIdle / 2)
	if _, err := f.Acquire(cancelled, "a"); !errors.Is(err, context.Canceled) {
		t.Fatalf("a's slot %s after b's last request: %v, want to wait", FairIdle/2, err)
	}
	// a's message queued while b was about is granted with the first
	// request once b was idle for FairIdle.
	g := &grants{releases: map[string]func(){}}
	g.wait(t, f, "a", "queued")
	now = now.Add(FairIdle)
	a = append(a, hold(t, f, "a", 1)...) // b idle for FairIdle: a is alone again
	g.granted(t, 1)
	g.releaseAll()
	for _, rel := range a {
		rel()
	}
	if s := f.Stats(); s.Used != 0 || len(s.Waiting) != 0 || len(s.Held) != 0 {
		t.Fatalf("after every release: %+v, want nothing used, held or waiting", s)
	}
}

func TestNilFairAdmitsAll(t *testing.T) {
	var f *Fair
	rel, err := f.Acquire(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	rel()
}
