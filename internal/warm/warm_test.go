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
	p := warm.New(time.Minute)
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
	p := warm.New(500 * time.Millisecond)
	const n = 50
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
