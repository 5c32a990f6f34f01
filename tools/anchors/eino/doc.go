// Command eino measures the per-step overhead of Eino's in-process
// plan-execute agent (github.com/cloudwego/eino/adk/prebuilt/planexecute),
// the way `planex bench` measures planex's chains, so docs/performance.md
// can set the two side by side. It lives in its own module so Eino's
// dependency tree never enters planex's go.mod. Its go.mod raises
// github.com/bytedance/sonic, Eino's JSON library, to v1.15.5: the v1.14.1
// that Eino v0.7.36 requires does not build with Go 1.26. Run it with:
//
//	cd tools/anchors/eino && go run . --chains 10,100,1000 --reps 5
//	cd tools/anchors/eino && go run . --json > eino.json
//
// # What runs
//
// The agent is Eino's own prebuilt one, built with planexecute.NewPlanner,
// NewExecutor, NewReplanner and New, run by an adk.Runner (no streaming,
// no checkpoint store), exactly as Eino's documentation wires it. Only the
// model is replaced: a scripted ToolCallingChatModel that answers at once
// with the messages a real model would send, in the formats the prebuilt
// agent parses:
//
//   - planner: one tool call to "plan" (planexecute.PlanToolInfo) whose
//     arguments are {"steps":["step 1",…,"step N"]};
//   - executor: for the step the executor prompt names (its last line), one
//     tool call to the registered no-op tool "noop" with {"step":"step k"};
//     once the tool result is back, the text "done";
//   - replanner: reading the first step of the plan in its prompt ("step
//     k"), a tool call to "plan" with the remaining steps k+1…N, or after
//     the last step a tool call to "respond" (planexecute.RespondToolInfo)
//     with {"response":"all N steps done"}.
//
// The answers are precomputed per plan length, so what is measured is the
// framework's own work per step: prompt formatting, chain compilation,
// the ReAct graph, the tools node, session and event bookkeeping. The
// no-op tool returns "{}" at once and records when it started and ended.
// Every run checks that each step's tool ran exactly once, in plan order,
// and that the run ended with the replanner's response.
//
// # Figures (as planex bench)
//
//   - chain N, per step: from the start of the first tool call to the end
//     of the last one, divided by N (planex: first StepDispatched to last
//     StepSucceeded over N; planning and the client are left out).
//   - chain N, per step e2e: from before runner.Run to the end of the
//     run's event stream, divided by N.
//
// A repetition is the mean over ceil(--steps-per-rep / N) runs one after
// another; each plan length is preceded by warm-up runs of at least
// --warmup-steps steps in all; min, median and max are over --reps
// repetitions. Nothing is capped: Eino's plan-execute rebuilds every
// sub-agent's input from the whole session history (each earlier event
// rewritten as a "For context: …" message, though the prebuilt executor
// and replanner then build their prompts from session values instead) and
// formats all executed steps into every replanner prompt, so its cost per
// step grows with the plan's length; a 1000-step run takes seconds.
package main
