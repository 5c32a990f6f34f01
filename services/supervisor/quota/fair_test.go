package quota

import (
	"context"
	"errors"
	"fmt"
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

func TestFairRoundRobinByTenant(t *testing.T) {
	f := NewFair(1)
	first, err := f.Acquire(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	g := &grants{releases: map[string]func(){}}
	for i := 1; i <= 4; i++ {
		g.wait(t, f, "a", fmt.Sprintf("a%d", i))
	}
	g.wait(t, f, "b", "b1")
	g.wait(t, f, "b", "b2")
	g.wait(t, f, "c", "c1")
	first()
	var got []string
	for i := 1; i <= 7; i++ {
		got = append(got, g.releaseNext(t, i))
	}
	want := []string{"a1", "b1", "c1", "a2", "b2", "a3", "a4"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("grant order %v, want %v (round-robin by tenant, FIFO within one)", got, want)
	}
	if s := f.Stats(); s.Used != 0 || len(s.Waiting) != 0 {
		t.Fatalf("after every release: %+v, want nothing used or waiting", s)
	}
}

// TestFairNoStarvation: a tenant arriving behind another's backlog of
// 1,000 waiters gets the second slot freed, not the 1,001st.
func TestFairNoStarvation(t *testing.T) {
	const slots, backlog = 4, 1000
	f := NewFair(slots)
	var held []func()
	for range slots {
		rel, err := f.Acquire(context.Background(), "busy")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, rel)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var busyGrants []func()
	for range backlog {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rel, err := f.Acquire(ctx, "busy")
			if err != nil {
				return
			}
			mu.Lock()
			busyGrants = append(busyGrants, rel)
			mu.Unlock()
		}()
	}
	waitFor(t, 5*time.Second, "backlog queued", func() bool { return f.Stats().Waiting["busy"] == backlog })
	got := make(chan func(), 1)
	go func() {
		rel, err := f.Acquire(context.Background(), "quiet")
		if err == nil {
			got <- rel
		}
	}()
	waitFor(t, 2*time.Second, "quiet waiting", func() bool { return f.Stats().Waiting["quiet"] == 1 })
	released := 0
	for _, rel := range held {
		rel()
		released++
		select {
		case rel := <-got:
			if released > 2 {
				t.Fatalf("quiet tenant granted after %d releases, want at most 2", released)
			}
			rel()
			cancel()
			wg.Wait()
			mu.Lock()
			for _, r := range busyGrants {
				r()
			}
			mu.Unlock()
			for _, r := range held[released:] {
				r()
			}
			if s := f.Stats(); s.Used != 0 || len(s.Waiting) != 0 {
				t.Fatalf("after the test: %+v, want nothing used or waiting", s)
			}
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("quiet tenant not granted after %d releases", released)
}

func TestFairReleaseOnContextEnd(t *testing.T) {
	f := NewFair(1)
	rel, err := f.Acquire(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := f.Acquire(ctx, "b")
		errc <- err
	}()
	waitFor(t, 2*time.Second, "b waiting", func() bool { return f.Stats().Waiting["b"] == 1 })
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
	f := NewFair(3)
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
	if peak > 3 {
		t.Fatalf("%d slots used at once, want at most 3", peak)
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
