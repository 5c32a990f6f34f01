// Command temporal measures Temporal the way `planex bench` measures planex,
// for the anchor column of docs/performance.md. It lives in its own module
// so Temporal's dependency tree never enters planex's go.mod.
//
// # What runs
//
// A real Temporal dev server in its own process, the Temporal CLI pinned as a
// Go tool in this module's go.mod (github.com/temporalio/cli v1.9.1, server
// 1.32.0), started as
//
//	go tool temporal server start-dev --headless --ip 127.0.0.1 \
//	  --port P --http-port H --metrics-port M \
//	  --dynamic-config-value matching.numTaskqueueReadPartitions=1 \
//	  --dynamic-config-value matching.numTaskqueueWritePartitions=1 \
//	  --dynamic-config-value system.enableActivityEagerExecution=true
//
// on free loopback ports, with the dev server's default in-memory SQLite
// store and no UI; --server-arg adds arguments (e.g. --db-filename). The
// harness runs the CLI's binary (`go tool -n temporal` builds it the first
// time and names it) as its own child, waits until the frontend answers and
// the default namespace exists, and ends the server's whole process group
// when it is done; on Linux the server is also killed if the harness dies. --address
// measures an already-running server instead (with --metrics-url to count
// eager activities on it).
//
// In the harness process runs one real Go SDK worker on one task queue, with
// a workflow and its no-op activity (it returns at once) on that same task
// queue, so the worker asks for eager execution of the activities a workflow
// task schedules (DisableEagerActivities false; at most --eager-per-task per
// workflow task, the SDK's default 3). Eager execution hands the activity
// back in the response to the workflow task's completion instead of through
// matching. Whether it happened is read from the server's own
// activity_eager_execution counter on its /metrics endpoint, before and after
// each figure, and printed beside it.
//
// # What is measured (as planex bench measures planex)
//
//   - chain N, per step: a workflow runs N no-op activities one after another.
//     Its per-step cost is the time from its first ActivityTaskScheduled
//     event to its last ActivityTaskCompleted event, on the history's
//     timestamps, divided by N (planex: first StepDispatched to last
//     StepSucceeded on the run log's timestamps). A repetition is the mean
//     over ceil(--steps-per-rep/N) workflows run one after another; before
//     each chain length, ceil(--warmup-steps/N) workflows (at least one) warm
//     up. Printed as min, median and max over --reps repetitions.
//   - chain N, e2e per step: from before ExecuteWorkflow to the workflow's
//     result, divided by N, on the same workflows.
//   - throughput: --runs workflows of one root activity then --fan-out
//     activities in parallel, all started (--in-flight starts at a time, as
//     planex bench's 64 StartRun calls in flight) and then awaited;
//     activities per second from before the first start to the last
//     WorkflowExecutionCompleted event (planex: to the last RunFinished on
//     the run logs). --throughput-reps repetitions.
//
// Every history is read after its workflow ends (outside the timings) and
// must hold the expected number of scheduled and completed activities.
//
// # The history transfer queue's poll rate
//
// The dev server has one history shard, and its transfer-queue reader loads
// new tasks at most history.transferProcessorMaxPollRPS times a second (20 by
// default, with a burst of 20). Every step of a chain needs one
// load (the workflow task that follows an activity's completion is a
// transfer task; an eager activity is not), so once the burst is spent a
// chain pays about 1/20 s per step however fast the rest is. The anchor
// keeps the server's default, as the tuning above; to measure without that
// limit add, for instance,
//
//	--server-arg=--dynamic-config-value --server-arg=history.transferProcessorMaxPollRPS=10000
//
// (the header's tuning line lists every dynamic config value passed).
//
// # Command
//
//	cd tools/anchors/temporal && go run . --chains 10,100 --reps 5
//
// The first run builds the Temporal CLI (minutes on two cores); later runs
// reuse the build cache. --json prints the result as JSON (see [Result]).
//
// # Versions
//
// The CLI v1.9.1 compiles against go.temporal.io/api v1.63 and the SDK's
// client.StartActivityOptions.Details, both gone from the newest SDK
// (v1.49+ drops Details; v1.51 needs api v1.64, which server 1.32.0 does not
// build with), so the module, being one build list, uses SDK v1.48.0. The
// CLI's nested module github.com/temporalio/cli/cliext is not on the module
// proxy and is supplied from third_party/cliext (see its README).
package main
