package supervisor_test

import (
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// BenchmarkRunsWaitingAtGates parks PLANEX_GATE_RUNS runs (default 1000;
// docs/guardrails.md reports 10000) at a step gate in one supervisor
// replica and reports what they hold once all wait: goroutines (compared
// with the count before the first run) and the memory of the whole test
// process (embedded NATS server, fake planner and pool included): RSS
// from /proc and the Go heap after a GC. A waiting run holds no goroutine
// and no timer in the supervisor: it is a snapshot and a log.
//
//	PLANEX_GATE_RUNS=10000 go test -run '^$' -bench RunsWaitingAtGates -benchtime 1x ./services/supervisor
//
// PLANEX_GATE_HEAP_PROFILE=FILE writes the heap profile at that moment.
func BenchmarkRunsWaitingAtGates(b *testing.B) {
	n := 1000
	if v := os.Getenv("PLANEX_GATE_RUNS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("PLANEX_GATE_RUNS=%q: want a positive number", v)
		}
	}
	h := newHarness(b)
	r := h.startReplica()
	h.planner.on("gate scale*", always(step("send", "test.approve", map[string]any{"value": 1})))
	// Warm up (catalog, consumers) with one run, then measure the base.
	first := start(b, r.client, &planexv1.StartRunRequest{Goal: "gate scale warm-up"})
	waitRun(b, r.client, first, 30*time.Second, "waiting", func(run *planexv1.Run) bool { return run.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING })
	baseG, baseRSS, baseHeap := sample()
	b.ResetTimer()
	for range b.N {
		began := time.Now()
		var next atomic.Int64
		var wg sync.WaitGroup
		ids := make([]string, n)
		for range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
					ids[i] = start(b, r.client, &planexv1.StartRunRequest{Goal: "gate scale " + strconv.Itoa(i)})
				}
			}()
		}
		wg.Wait()
		started := time.Since(began)
		for _, id := range ids {
			waitRun(b, r.client, id, 10*time.Minute, "waiting", func(run *planexv1.Run) bool { return run.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING })
		}
		all := time.Since(began)
		// The fake planner keeps a copy of every request (catalog included)
		// for other tests; that is not what a waiting run holds.
		h.planner.mu.Lock()
		h.planner.calls = map[string][]*planexv1.PlanRequest{}
		h.planner.mu.Unlock()
		// Let the engine go idle (acks, snapshot writes, gRPC streams of
		// the clients above) before sampling, up to 20s.
		g, rss, heap := sample()
		for idle := time.Now().Add(20 * time.Second); g > baseG+8 && time.Now().Before(idle); g, rss, heap = sample() {
			time.Sleep(500 * time.Millisecond)
		}
		if path := os.Getenv("PLANEX_GATE_HEAP_PROFILE"); path != "" {
			writeHeapProfile(b, path)
		}
		b.ReportMetric(float64(n), "runs")
		b.ReportMetric(float64(g), "goroutines")
		b.ReportMetric(float64(g-baseG), "goroutines-added")
		b.ReportMetric(float64(rss)/(1<<20), "RSS-MiB")
		b.ReportMetric(float64(rss-baseRSS)/float64(n), "RSS-B/run")
		b.ReportMetric(float64(heap)/(1<<20), "heap-MiB")
		b.ReportMetric(float64(heap-baseHeap)/float64(n), "heap-B/run")
		b.ReportMetric(started.Seconds(), "s-to-start")
		b.ReportMetric(all.Seconds(), "s-all-waiting")
		gates, err := r.client.ListGates(testCtx(b, time.Minute), &planexv1.ListGatesRequest{})
		if err != nil || len(gates.GetGates()) != n+1 {
			b.Fatalf("ListGates: %d open gates, %v; want %d", len(gates.GetGates()), err, n+1)
		}
	}
}

// writeHeapProfile writes the heap profile of the moment (to attribute the
// memory the waiting runs hold: supervisor, NATS server, test doubles).
func writeHeapProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		b.Fatal(err)
	}
}

// sample returns the goroutines, the RSS (bytes, from /proc/self/status)
// and the Go heap in use after a GC.
func sample() (int, int64, int64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	var rss int64
	if data, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				rss = kb << 10
			}
		}
	}
	return runtime.NumGoroutine(), rss, int64(ms.HeapInuse)
}
