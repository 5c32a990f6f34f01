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

// Tasks that follow each other run on one goroutine.
func TestSequentialTasksReuseOneGoroutine(t *testing.T) {
	p := warm.New(time.Minute, 4)
	for i := range 100 {
		done := make(chan struct{})
		p.Go(func() { close(done) })
		<-done
		waitFor(t, "the goroutine waits again", func() bool { return p.Waiting() == 1 })
		if got := p.Started(); got != 1 {
			t.Fatalf("task %d: %d goroutines started, want 1", i, got)
		}
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

// After a burst, no more than the pool's bound of goroutines wait.
func TestABurstLeavesAtMostTheBoundWaiting(t *testing.T) {
	p := warm.New(time.Minute, 3)
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range 20 {
		wg.Add(1)
		p.Go(func() {
			defer wg.Done()
			<-release
		})
	}
	close(release)
	wg.Wait()
	waitFor(t, "three goroutines wait", func() bool { return p.Waiting() == 3 })
	// The others exited rather than wait: new tasks reuse the three.
	for range 3 {
		wg.Add(1)
		p.Go(func() { wg.Done() })
	}
	wg.Wait()
	if got := p.Started(); got != 20 {
		t.Fatalf("%d goroutines started, want 20 (the three waiting ones reused)", got)
	}
}
