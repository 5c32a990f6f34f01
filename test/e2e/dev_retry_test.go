package e2e

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// slowReadPlaybook is one slow read-only query (a recursive count in
// SQLite, a few seconds on a small machine).
const slowReadPlaybook = `name: slow-count
description: Count slowly
examples:
  - Count slowly
match:
  - '(?i)^count slowly$'
steps:
  - id: slow
    tool: sql.query
    args:
      sql: "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1500000) SELECT count(*) AS n FROM c"
answer: "steps.slow.output.rows[0][0]"
`

// TestDevKilledDuringSlowReadRetries is issue 12's acceptance: kill -9 of
// the whole `planex dev` while a slow read-only step runs, then restart on
// the same data dir. The execution that was running is lost with its
// executor. After the restart it is repeated once and the run log shows
// it: JetStream redelivers the attempt to the new executor (recorded as a
// StepStarted restart, its timeouts counted from the new start), or, when
// the redelivery comes too late, the start-to-close timeout fails it and
// the read's default retry policy dispatches attempt 2. The run succeeds:
// no PLANNER_ERROR, no FAILED, no replan.
func TestDevKilledDuringSlowReadRetries(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test; skipped with -short")
	}
	dataDir, addr, start := restartableDev(t, slowReadPlaybook)
	dev := start()
	client := planexv1.NewSupervisorServiceClient(devConn(t, dataDir, addr))
	ctx := ctxT(t, 3*time.Minute)
	// 20s per attempt: ample for the query, short next to the executors'
	// redelivery of the lost attempt.
	started, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: "Count slowly", Budget: &planexv1.Budget{StepTimeout: durationpb.New(20 * time.Second)}})
	if err != nil {
		t.Fatal(err)
	}
	id := started.GetRun().GetId()
	stream, err := client.WatchRun(ctx, &planexv1.WatchRunRequest{RunId: id})
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("run ended before the slow step started: %v", err)
		}
		if s := resp.GetEvent().GetStepStarted(); s != nil && s.GetStepId() == "slow" {
			break
		}
		if resp.GetEvent().GetFinished() != nil {
			t.Fatal("run finished before it could be killed mid-step")
		}
	}
	if err := dev.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-dev.exit
	killed := time.Now()

	start()
	stream, err = client.WatchRun(ctx, &planexv1.WatchRunRequest{RunId: id})
	if err != nil {
		t.Fatal(err)
	}
	var attempts []int32
	retries, restarts := 0, 0
	dispatched := map[string]int{}
	for {
		resp, err := stream.Recv()
		if err != nil {
			break
		}
		ev := resp.GetEvent()
		if d := ev.GetStepDispatched(); d != nil {
			dispatched[fmt.Sprintf("%s/%d", d.GetStepId(), d.GetAttempt())]++
			if d.GetStepId() == "slow" {
				attempts = append(attempts, d.GetAttempt())
			}
		}
		if ev.GetStepRetrying() != nil {
			retries++
		}
		if s := ev.GetStepStarted(); s != nil && s.GetStepId() == "slow" && s.GetRestart() {
			restarts++
		}
	}
	got, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
	if err != nil {
		t.Fatal(err)
	}
	run := got.GetRun()
	t.Logf("after restart: %s in %s, slow attempts %v", run.GetStatus(), time.Since(killed).Round(time.Millisecond), attempts)
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("run after restart: %v %v %s", run.GetStatus(), run.GetStopReason(), run.GetStopMessage())
	}
	// The lost execution is repeated exactly once, and the log shows it:
	// either JetStream redelivered the attempt to the restarted executor
	// (a StepStarted restart of attempt 1), or the attempt timed out and
	// the read's retry policy dispatched attempt 2. Never a replan.
	retried := len(attempts) == 2 && attempts[1] == 2 && retries == 1 && restarts == 0
	restarted := len(attempts) == 1 && retries == 0 && restarts == 1
	if !(retried || restarted) || run.GetUsage().GetReplans() != 0 {
		t.Fatalf("slow attempts %v, %d retries, %d restarts, %d replans: want one more execution in the log (a retry or a restart)", attempts, retries, restarts, run.GetUsage().GetReplans())
	}
	for k, n := range dispatched {
		if n != 1 {
			t.Errorf("attempt %s dispatched %d times", k, n)
		}
	}
}
