package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cloudwego/eino/adk"
	"github.com/cloudwego/eino/adk/prebuilt/planexecute"
	"github.com/cloudwego/eino/components/model"
	"github.com/cloudwego/eino/components/tool"
	"github.com/cloudwego/eino/compose"
	"github.com/cloudwego/eino/schema"
)

const (
	// noopToolName is the executor's only tool.
	noopToolName = "noop"
	// stepPrefix starts every step of a plan: "step 1", "step 2", …
	stepPrefix = "step "
	// replannerName is the name planexecute gives its replanner agent.
	replannerName = "replanner"
	// planMarker precedes the current plan in planexecute.ReplannerPrompt.
	planMarker = "## ORIGINAL PLAN\n"
	// planPrefix starts a plan's JSON as the plan tool's schema has it.
	planPrefix = `{"steps":["`
)

// planArgs is the plan tool's arguments (planexecute.PlanToolInfo).
type planArgs struct {
	Steps []string `json:"steps"`
}

// stepArgs is the no-op tool's arguments.
type stepArgs struct {
	Step string `json:"step"`
}

func stepName(k int) string { return stepPrefix + strconv.Itoa(k) }

// parseStep returns k of "step k", checking 1 ≤ k ≤ n.
func parseStep(name string, n int) (int, error) {
	num, ok := strings.CutPrefix(name, stepPrefix)
	if !ok {
		return 0, fmt.Errorf("step %q: want %q followed by a number", name, stepPrefix)
	}
	k, err := strconv.Atoi(num)
	if err != nil || k < 1 || k > n {
		return 0, fmt.Errorf("step %q: want a number from 1 to %d", name, n)
	}
	return k, nil
}

// script holds the scripted model's answers for plans of n steps,
// precomputed so that answering costs nothing measurable.
type script struct {
	n int
	// plans[k] is the plan tool's arguments for steps k+1…n: plans[0] is
	// the planner's whole plan, plans[k] the replanner's after step k.
	plans []string
	// response is the respond tool's arguments after the last step.
	response string
}

func newScript(n int) (*script, error) {
	steps := make([]string, n)
	for i := range steps {
		steps[i] = stepName(i + 1)
	}
	s := &script{n: n, plans: make([]string, n)}
	for k := range n {
		b, err := json.Marshal(planArgs{Steps: steps[k:]})
		if err != nil {
			return nil, fmt.Errorf("script for %d steps: %w", n, err)
		}
		s.plans[k] = string(b)
	}
	b, err := json.Marshal(planexecute.Response{Response: fmt.Sprintf("all %d steps done", n)})
	if err != nil {
		return nil, fmt.Errorf("script for %d steps: %w", n, err)
	}
	s.response = string(b)
	return s, nil
}

// role is which of planexecute's three agents a scripted model serves.
type role int

const (
	plannerRole role = iota
	executorRole
	replannerRole
)

func (r role) String() string {
	return [...]string{"planner", "executor", "replanner"}[r]
}

// wantTools are the tools each role's model must be given.
func (r role) wantTools() []string {
	switch r {
	case plannerRole:
		return []string{planexecute.PlanToolInfo.Name}
	case executorRole:
		return []string{noopToolName}
	default:
		return []string{planexecute.PlanToolInfo.Name, planexecute.RespondToolInfo.Name}
	}
}

// scriptedModel is a model.ToolCallingChatModel that answers at once with
// what a real model would send the planner, executor or replanner.
type scriptedModel struct {
	role   role
	script *script
}

var _ model.ToolCallingChatModel = (*scriptedModel)(nil)

// WithTools checks that the agent binds the tools this role answers with.
func (m *scriptedModel) WithTools(tools []*schema.ToolInfo) (model.ToolCallingChatModel, error) {
	for _, want := range m.role.wantTools() {
		found := false
		for _, t := range tools {
			found = found || t.Name == want
		}
		if !found {
			return nil, fmt.Errorf("scripted %s model: tool %q not bound", m.role, want)
		}
	}
	return m, nil
}

// Generate answers the conversation so far.
func (m *scriptedModel) Generate(_ context.Context, input []*schema.Message, _ ...model.Option) (*schema.Message, error) {
	if len(input) == 0 {
		return nil, fmt.Errorf("scripted %s model: no input", m.role)
	}
	last := input[len(input)-1]
	switch m.role {
	case plannerRole:
		return toolCallMessage(planexecute.PlanToolInfo.Name, "call_plan", m.script.plans[0]), nil
	case executorRole:
		return m.execute(last)
	default:
		return m.replan(last)
	}
}

// Stream answers like Generate, as a stream of one message (the planner
// and replanner run their model in a streaming chain).
func (m *scriptedModel) Stream(ctx context.Context, input []*schema.Message, opts ...model.Option) (*schema.StreamReader[*schema.Message], error) {
	msg, err := m.Generate(ctx, input, opts...)
	if err != nil {
		return nil, err
	}
	return schema.StreamReaderFromArray([]*schema.Message{msg}), nil
}

// execute calls the no-op tool for the step the executor prompt names on
// its last line, then reports the step done.
func (m *scriptedModel) execute(last *schema.Message) (*schema.Message, error) {
	switch last.Role {
	case schema.User:
		step := last.Content[strings.LastIndexByte(last.Content, '\n')+1:]
		k, err := parseStep(step, m.script.n)
		if err != nil {
			return nil, fmt.Errorf("scripted executor model: %w", err)
		}
		args, err := json.Marshal(stepArgs{Step: step})
		if err != nil {
			return nil, fmt.Errorf("scripted executor model: %w", err)
		}
		return toolCallMessage(noopToolName, "call_"+strconv.Itoa(k), string(args)), nil
	case schema.Tool:
		return schema.AssistantMessage("done", nil), nil
	default:
		return nil, fmt.Errorf("scripted executor model: unexpected last message role %q", last.Role)
	}
}

// replan reads the current plan's first step, the one just executed, and
// answers with the remaining steps or, after the last one, the response.
func (m *scriptedModel) replan(last *schema.Message) (*schema.Message, error) {
	_, plan, ok := strings.Cut(last.Content, planMarker)
	if !ok {
		return nil, fmt.Errorf("scripted replanner model: no %q in the prompt", strings.TrimSpace(planMarker))
	}
	rest, ok := strings.CutPrefix(plan, planPrefix)
	if !ok {
		return nil, fmt.Errorf("scripted replanner model: plan does not start with %s", planPrefix)
	}
	step, _, _ := strings.Cut(rest, `"`)
	k, err := parseStep(step, m.script.n)
	if err != nil {
		return nil, fmt.Errorf("scripted replanner model: %w", err)
	}
	if k == m.script.n {
		return toolCallMessage(planexecute.RespondToolInfo.Name, "call_respond", m.script.response), nil
	}
	return toolCallMessage(planexecute.PlanToolInfo.Name, "call_replan_"+strconv.Itoa(k), m.script.plans[k]), nil
}

func toolCallMessage(name, id, args string) *schema.Message {
	return schema.AssistantMessage("", []schema.ToolCall{{
		ID:       id,
		Type:     "function",
		Function: schema.FunctionCall{Name: name, Arguments: args},
	}})
}

// toolCall is one call of the no-op tool.
type toolCall struct {
	step       int
	start, end time.Time
}

// noopTool is the executor's tool: it returns "{}" at once and records
// the step it was called for and when.
type noopTool struct {
	n     int
	mu    sync.Mutex
	calls []toolCall
}

var _ tool.InvokableTool = (*noopTool)(nil)

var noopToolInfo = schema.ToolInfo{
	Name: noopToolName,
	Desc: "Does nothing; call it once for the step being executed.",
	ParamsOneOf: schema.NewParamsOneOfByParams(map[string]*schema.ParameterInfo{
		"step": {Type: schema.String, Desc: "the step being executed", Required: true},
	}),
}

// Info describes the tool to the executor's model.
func (t *noopTool) Info(context.Context) (*schema.ToolInfo, error) {
	return &noopToolInfo, nil
}

// InvokableRun records the call and returns "{}".
func (t *noopTool) InvokableRun(_ context.Context, argumentsInJSON string, _ ...tool.Option) (string, error) {
	start := time.Now()
	var args stepArgs
	if err := json.Unmarshal([]byte(argumentsInJSON), &args); err != nil {
		return "", fmt.Errorf("noop tool: arguments %q: %w", argumentsInJSON, err)
	}
	k, err := parseStep(args.Step, t.n)
	if err != nil {
		return "", fmt.Errorf("noop tool: %w", err)
	}
	t.mu.Lock()
	t.calls = append(t.calls, toolCall{step: k, start: start, end: time.Now()})
	t.mu.Unlock()
	return "{}", nil
}

// take returns the calls recorded so far and forgets them.
func (t *noopTool) take() []toolCall {
	t.mu.Lock()
	defer t.mu.Unlock()
	calls := t.calls
	t.calls = nil
	return calls
}

// chain is Eino's plan-execute agent set up to run plans of n no-op steps.
type chain struct {
	n      int
	script *script
	tool   *noopTool
	runner *adk.Runner
	goal   []adk.Message
}

// newChain builds the agent once; runs reuse it, as a service would.
func newChain(ctx context.Context, n int) (*chain, error) {
	s, err := newScript(n)
	if err != nil {
		return nil, err
	}
	c := &chain{
		n:      n,
		script: s,
		tool:   &noopTool{n: n},
		goal:   []adk.Message{schema.UserMessage(fmt.Sprintf("Run a chain of %d no-op steps, calling the %s tool once per step.", n, noopToolName))},
	}
	planner, err := planexecute.NewPlanner(ctx, &planexecute.PlannerConfig{
		ToolCallingChatModel: &scriptedModel{role: plannerRole, script: s},
	})
	if err != nil {
		return nil, fmt.Errorf("eino planner: %w", err)
	}
	executor, err := planexecute.NewExecutor(ctx, &planexecute.ExecutorConfig{
		Model: &scriptedModel{role: executorRole, script: s},
		ToolsConfig: adk.ToolsConfig{
			ToolsNodeConfig: compose.ToolsNodeConfig{Tools: []tool.BaseTool{c.tool}},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("eino executor: %w", err)
	}
	replanner, err := planexecute.NewReplanner(ctx, &planexecute.ReplannerConfig{
		ChatModel: &scriptedModel{role: replannerRole, script: s},
	})
	if err != nil {
		return nil, fmt.Errorf("eino replanner: %w", err)
	}
	agent, err := planexecute.New(ctx, &planexecute.Config{
		Planner:   planner,
		Executor:  executor,
		Replanner: replanner,
		// One execute-replan iteration per step; the replanner ends the
		// loop after the last one.
		MaxIterations: n,
	})
	if err != nil {
		return nil, fmt.Errorf("eino plan-execute agent: %w", err)
	}
	c.runner = adk.NewRunner(ctx, adk.RunnerConfig{Agent: agent})
	return c, nil
}

// runResult is one run's figures and the steps its tool calls were for.
type runResult struct {
	// steps are the tool calls' steps in call order.
	steps []int
	// perStepMs is first tool call's start to last one's end over n.
	perStepMs float64
	// e2ePerStepMs is before runner.Run to the end of its events over n.
	e2ePerStepMs float64
}

// errRun marks a run that did not do what the plan says.
var errRun = errors.New("eino run")

// run runs the plan once and checks each step's tool ran exactly once, in
// plan order, and that the replanner gave the final response.
func (c *chain) run(ctx context.Context) (runResult, error) {
	c.tool.take()
	start := time.Now()
	iter := c.runner.Run(ctx, c.goal)
	var final string
	var runErr error
	for {
		ev, ok := iter.Next()
		if !ok {
			break
		}
		if ev.Err != nil && runErr == nil {
			runErr = ev.Err
		}
		if ev.AgentName == replannerName && ev.Output != nil && ev.Output.MessageOutput != nil && ev.Output.MessageOutput.Message != nil {
			final = ev.Output.MessageOutput.Message.Content
		}
	}
	end := time.Now()
	calls := c.tool.take()
	if runErr != nil {
		return runResult{}, fmt.Errorf("%w of %d steps: %w", errRun, c.n, runErr)
	}
	if final != c.script.response {
		return runResult{}, fmt.Errorf("%w of %d steps: final response %q, want %q", errRun, c.n, final, c.script.response)
	}
	res := runResult{steps: make([]int, len(calls))}
	for i, call := range calls {
		res.steps[i] = call.step
	}
	if len(calls) != c.n {
		return res, fmt.Errorf("%w of %d steps: %d tool calls", errRun, c.n, len(calls))
	}
	for i, call := range calls {
		if call.step != i+1 {
			return res, fmt.Errorf("%w of %d steps: tool call %d was for step %d", errRun, c.n, i+1, call.step)
		}
	}
	n := float64(c.n)
	res.perStepMs = ms(calls[len(calls)-1].end.Sub(calls[0].start)) / n
	res.e2ePerStepMs = ms(end.Sub(start)) / n
	return res, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
