package warm_test

import (
	"sync"
	"testing"
	"time"

	"github.com/planex-dev/planex/internal/warm"
)

// waitFor polls cond until it holds or a minute passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// Tasks that follow each other reuse the waiting goroutine. (A task
// given while the goroutine is between counting itself waiting and
// receiving starts another, so this counts, not insists on one.)
func TestSequentialTasksReuseAWaitingGoroutine(t *testing.T) {
	p := warm.New(time.Minute, 4)
	for range 100 {
		done := make(chan struct{})
		p.Go(func() { close(done) })
		<-done
		waitFor(t, "a goroutine waits again", func() bool { return p.Waiting() >= 1 })
	}
	if got := p.Started(); got > 50 {
		t.Fatalf("%d goroutines started for 100 tasks one after another, want most tasks on a waiting one", got)
	}
	if got := p.Waiting(); got > 4 {
		t.Fatalf("%d goroutines waiting, bound 4", got)
	}
}

// Tasks at once each get a goroutine; they all run, and the goroutines
// exit once idle.
func TestConcurrentTasksRunAndGoroutinesExit(t *testing.T) {
	const n = 50
	p := warm.New(500*time.Millisecond, n)
	var wg sync.WaitGroup
	release := make(chan struct{})
	var ran sync.Map
	for i := range n {
		wg.Add(1)
		p.Go(func() {
			defer wg.Done()
			<-release
			ran.Store(i, true)
		})
	}
	if got := p.Started(); got != n {
		t.Fatalf("%d goroutines for %d blocked tasks, want %d", got, n, n)
	}
	close(release)
	wg.Wait()
	for i := range n {
		if _, ok := ran.Load(i); !ok {
			t.Fatalf("task %d did not run", i)
		}
	}
	waitFor(t, "every goroutine waits for a task", func() bool { return p.Waiting() == n })
	waitFor(t, "idle goroutines exit", func() bool { return p.Waiting() == 0 })
}

// burst gives p n tasks that all block until released, then releases
// them and waits until they ran.
func burst(p *warm.Pool, n int) {
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range n {
		wg.Add(1)
		p.Go(func() {
			defer wg.Done()
			<-release
		})
	}
	close(release)
	wg.Wait()
}

// After a burst, no more than the pool's bound of goroutines wait.
func TestABurstLeavesAtMostTheBoundWaiting(t *testing.T) {
	p := warm.New(time.Minute, 3)
	burst(p, 20)
	waitFor(t, "three goroutines wait", func() bool { return p.Waiting() == 3 })
	// The others exited rather than wait; a second burst leaves three too.
	burst(p, 20)
	waitFor(t, "three goroutines wait", func() bool { return p.Waiting() == 3 })
	if got := p.Started(); got > 40 {
		t.Fatalf("%d goroutines started for two bursts of 20", got)
	}
}
