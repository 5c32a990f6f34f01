// Package policy evaluates guardrail policies written in CEL. A policy file
// is YAML: a name, optional params (constants visible to every rule as
// `params`) and a list of rules. Each rule applies to steps (`on: step`,
// the default: evaluated before every dispatch) or to plans (`on: plan`:
// evaluated on every plan revision) or to step results (`on: result`: the
// critic's verifiers, after every succeeded step, seeing `output`,
// `output_empty` and `output_schema_errors`); when its `when` expression
// holds it yields its action:
//
//   - allow: nothing to do (useful only to document intent);
//   - require_approval: a gate opens (a step gate, or a plan gate for plan
//     rules) with the rule's reason and approvers;
//   - deny: the step fails before it reaches a pool (a plan rule rejects
//     the revision; a result rule fails the step's result, which replans,
//     or escalates with on_fail: escalate), with the policy name, rule and
//     reason.
//
// Combination: every matching rule of every loaded file counts and the
// most restrictive action wins (deny > require_approval > allow); among
// rules with the same action the first one (files in the order given,
// rules in file order) gives the reason. A rule whose expression fails at
// evaluation denies (fail closed). See docs/guardrails.md.
package policy

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/ext"
	"go.yaml.in/yaml/v3"
)

// Action is what a rule asks for. Larger is more restrictive.
type Action int

// Actions, least restrictive first.
const (
	// Allow lets the step or plan go on.
	Allow Action = iota
	// RequireApproval opens a gate.
	RequireApproval
	// Deny fails the step (or rejects the plan).
	Deny
)

// String is the action as written in policy files.
func (a Action) String() string {
	switch a {
	case RequireApproval:
		return "require_approval"
	case Deny:
		return "deny"
	}
	return "allow"
}

// Scope says what a rule is evaluated on.
type Scope string

// Scopes.
const (
	// ScopeStep rules run before each step's dispatch.
	ScopeStep Scope = "step"
	// ScopePlan rules run on each plan revision.
	ScopePlan Scope = "plan"
	// ScopeResult rules judge a step's result (the critic's verifiers):
	// deny is a failing verdict.
	ScopeResult Scope = "result"
)

// OnTimeout says what happens to a gate whose SLA passes undecided.
type OnTimeout string

// Gate SLA outcomes.
const (
	// TimeoutEscalate stops the run ESCALATED.
	TimeoutEscalate OnTimeout = "escalate"
	// TimeoutReject rejects the gate (and replans or stops per on_reject).
	TimeoutReject OnTimeout = "reject"
)

// Settings are what a rule says beyond its action: who may decide the gate
// it opens, its SLA, and what a rejection or a failing verdict does.
type Settings struct {
	// Approvers lists who may decide the gate (empty: anyone allowed to
	// decide gates).
	Approvers []string
	// StopOnReject makes a rejection of the gate stop the run instead of
	// replanning (on_reject: stop).
	StopOnReject bool
	// GateTimeout is the gate's SLA (0: none).
	GateTimeout time.Duration
	// OnTimeout is what an expired SLA does (default escalate).
	OnTimeout OnTimeout
	// Escalate: a failing verdict of a result rule stops the run ESCALATED
	// instead of replanning (on_fail: escalate).
	Escalate bool
}

// Decision is the combined verdict of a Set on one step, plan or result.
type Decision struct {
	// Action is the most restrictive action of the matching rules.
	Action Action
	// Policy and Rule name the rule that decided (empty for a default
	// allow).
	Policy, Rule string
	// Reason is the rule's reason.
	Reason string
	// Settings of the deciding rule.
	Settings
}

// Message is the decision for people and planners:
// `policy "default" rule "sql-exec": sql.exec changes the database`.
func (d Decision) Message() string {
	if d.Rule == "" {
		return d.Reason
	}
	return fmt.Sprintf("policy %q rule %q: %s", d.Policy, d.Rule, d.Reason)
}

// Rule is one compiled rule.
type Rule struct {
	// Name identifies the rule in decisions and errors.
	Name string
	// On is the rule's scope.
	On Scope
	// When is the CEL condition (bool).
	When string
	// Action is applied when When holds.
	Action Action
	// Reason explains the action.
	Reason string
	// Settings of the rule.
	Settings

	line int
	prg  cel.Program
}

// Policy is one compiled policy file.
type Policy struct {
	// Name is the file's name field, else its base name without extension.
	Name string
	// File is where the policy was read from.
	File string
	// Rules in file order.
	Rules []*Rule

	params map[string]any
}

// Set is the policies in force, evaluated together. The zero Set (and a
// nil one) allows everything.
type Set struct {
	policies []*Policy
}

// Policies returns the set's policies in load order.
func (s *Set) Policies() []*Policy {
	if s == nil {
		return nil
	}
	return s.policies
}

// Empty reports whether the set has no rule.
func (s *Set) Empty() bool {
	for _, p := range s.Policies() {
		if len(p.Rules) > 0 {
			return false
		}
	}
	return true
}

// Builtin is the name that loads the embedded default policy.
const Builtin = "builtin:default"

// Load reads and compiles policy files (Builtin names the embedded default
// policy). Errors name the file, the line and the CEL error.
func Load(paths ...string) (*Set, error) {
	s := &Set{}
	for _, p := range paths {
		data, name := DefaultYAML, "builtin:default"
		if p != Builtin {
			var err error
			if data, err = os.ReadFile(p); err != nil {
				return nil, fmt.Errorf("read policy: %w", err)
			}
			name = p
		}
		pol, err := Parse(name, data)
		if err != nil {
			return nil, err
		}
		s.policies = append(s.policies, pol)
	}
	return s, nil
}

// file is the YAML form of a policy file.
type file struct {
	Name   string         `yaml:"name"`
	Params map[string]any `yaml:"params"`
	Rules  []yaml.Node    `yaml:"rules"`
}

type ruleYAML struct {
	Name        string   `yaml:"name"`
	On          string   `yaml:"on"`
	When        string   `yaml:"when"`
	Action      string   `yaml:"action"`
	Reason      string   `yaml:"reason"`
	Approvers   []string `yaml:"approvers"`
	OnReject    string   `yaml:"on_reject"`
	GateTimeout string   `yaml:"gate_timeout"`
	OnTimeout   string   `yaml:"on_timeout"`
	OnFail      string   `yaml:"on_fail"`
}

// ParseError is a policy file that cannot be compiled.
type ParseError struct {
	// File and Line locate the problem (Line 0: the whole file).
	File string
	Line int
	// Rule names the rule, when known.
	Rule string
	// Msg is the problem.
	Msg string
}

func (e *ParseError) Error() string {
	loc := e.File
	if e.Line > 0 {
		loc = fmt.Sprintf("%s:%d", e.File, e.Line)
	}
	if e.Rule != "" {
		return fmt.Sprintf("policy %s: rule %q: %s", loc, e.Rule, e.Msg)
	}
	return fmt.Sprintf("policy %s: %s", loc, e.Msg)
}

// Parse compiles one policy file's contents; name is used in errors and as
// the default policy name.
func Parse(name string, data []byte) (*Policy, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &ParseError{File: name, Msg: err.Error()}
	}
	var f file
	if err := doc.Decode(&f); err != nil {
		return nil, &ParseError{File: name, Msg: err.Error()}
	}
	p := &Policy{Name: f.Name, File: name, params: f.Params}
	if p.Name == "" {
		p.Name = strings.TrimSuffix(filepath.Base(name), filepath.Ext(name))
	}
	if p.params == nil {
		p.params = map[string]any{}
	}
	env, err := environment()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for i := range f.Rules {
		node := &f.Rules[i]
		r, err := compileRule(env, name, node)
		if err != nil {
			return nil, err
		}
		if r.Name == "" {
			r.Name = fmt.Sprintf("rule-%d", i+1)
		}
		if seen[r.Name] {
			return nil, &ParseError{File: name, Line: node.Line, Rule: r.Name, Msg: "duplicate rule name"}
		}
		seen[r.Name] = true
		p.Rules = append(p.Rules, r)
	}
	return p, nil
}

func compileRule(env *cel.Env, file string, node *yaml.Node) (*Rule, error) {
	var ry ruleYAML
	if err := node.Decode(&ry); err != nil {
		return nil, &ParseError{File: file, Line: node.Line, Msg: err.Error()}
	}
	bad := func(line int, format string, args ...any) error {
		return &ParseError{File: file, Line: line, Rule: ry.Name, Msg: fmt.Sprintf(format, args...)}
	}
	r := &Rule{Name: ry.Name, When: ry.When, Reason: ry.Reason, Settings: Settings{Approvers: ry.Approvers}, line: node.Line}
	switch Scope(cmp.Or(ry.On, string(ScopeStep))) {
	case ScopeStep:
		r.On = ScopeStep
	case ScopePlan:
		r.On = ScopePlan
	case ScopeResult:
		r.On = ScopeResult
	default:
		return nil, bad(node.Line, "on %q: want step, plan or result", ry.On)
	}
	switch ry.OnFail {
	case "", "replan":
	case "escalate":
		r.Escalate = true
	default:
		return nil, bad(node.Line, "on_fail %q: want replan or escalate", ry.OnFail)
	}
	if r.On == ScopeResult && ry.Action == "require_approval" {
		return nil, bad(node.Line, "action require_approval: result rules allow or deny (a failing verdict)")
	}
	switch ry.Action {
	case "allow":
		r.Action = Allow
	case "deny":
		r.Action = Deny
	case "require_approval":
		r.Action = RequireApproval
	default:
		return nil, bad(node.Line, "action %q: want allow, deny or require_approval", ry.Action)
	}
	if r.Action != Allow && strings.TrimSpace(r.Reason) == "" {
		return nil, bad(node.Line, "reason: required with action %s", r.Action)
	}
	switch ry.OnReject {
	case "", "replan":
	case "stop":
		r.StopOnReject = true
	default:
		return nil, bad(node.Line, "on_reject %q: want replan or stop", ry.OnReject)
	}
	if ry.GateTimeout != "" {
		d, err := time.ParseDuration(ry.GateTimeout)
		if err != nil || d <= 0 {
			return nil, bad(node.Line, "gate_timeout %q: want a positive duration like 30m", ry.GateTimeout)
		}
		r.GateTimeout = d
	}
	switch OnTimeout(ry.OnTimeout) {
	case "", TimeoutEscalate:
		r.OnTimeout = TimeoutEscalate
	case TimeoutReject:
		r.OnTimeout = TimeoutReject
	default:
		return nil, bad(node.Line, "on_timeout %q: want escalate or reject", ry.OnTimeout)
	}
	whenNode := valueNode(node, "when")
	if whenNode == nil || strings.TrimSpace(ry.When) == "" {
		return nil, bad(node.Line, "when: required (a CEL expression; use `true` to always apply)")
	}
	a, iss := env.Compile(ry.When)
	if iss != nil && iss.Err() != nil {
		e := iss.Errors()[0]
		return nil, bad(exprLine(whenNode, e.Location.Line()), "when: %d:%d: %s", e.Location.Line(), e.Location.Column()+1, e.Message)
	}
	if a.OutputType() != cel.BoolType && a.OutputType() != cel.DynType {
		return nil, bad(whenNode.Line, "when: evaluates to %s, want bool", a.OutputType())
	}
	prg, err := env.Program(a, cel.EvalOptions(cel.OptOptimize), cel.CostLimit(maxCost))
	if err != nil {
		return nil, bad(whenNode.Line, "when: %v", err)
	}
	r.prg = prg
	return r, nil
}

// valueNode returns the value node of key in a YAML mapping.
func valueNode(m *yaml.Node, key string) *yaml.Node {
	if m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// exprLine maps a line of a CEL expression to its line in the file: a
// block scalar (| or >) starts on the line after its key.
func exprLine(n *yaml.Node, celLine int) int {
	if n.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
		return n.Line + celLine
	}
	return n.Line + max(celLine, 1) - 1
}

// maxCost bounds one rule evaluation (CEL cost units).
const maxCost = 1_000_000

func environment() (*cel.Env, error) {
	env, err := cel.NewEnv(
		cel.CrossTypeNumericComparisons(true),
		cel.OptionalTypes(),
		ext.Strings(),
		ext.Lists(),
		ext.Sets(),
		ext.Math(),
		cel.Variable("step", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("tool", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("plan", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("run", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("params", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("now", cel.TimestampType),
		cel.Variable("output", cel.DynType),
		cel.Variable("output_empty", cel.BoolType),
		cel.Variable("output_schema_errors", cel.ListType(cel.StringType)),
	)
	if err != nil {
		return nil, fmt.Errorf("policy cel environment: %w", err)
	}
	return env, nil
}

// Input is what rules see. Step and Tool are empty for plan rules.
type Input struct {
	// Step: id, tool, args (resolved), description, requires_approval.
	Step map[string]any
	// Tool: name, side_effect (READ, WRITE, EXTERNAL), pool, idempotent,
	// requires_approval.
	Tool map[string]any
	// Plan: revision, confidence, rationale, steps (id, tool, args).
	Plan map[string]any
	// Run: id, goal, labels, mode, started_by, usage, budget.
	Run map[string]any
	// Now is the evaluation time.
	Now time.Time
	// Output is a step's result, for result rules (null otherwise).
	Output any
	// OutputEmpty: the result is null, "", [], {} or an object or list
	// of empty values only.
	OutputEmpty bool
	// OutputSchemaErrors are the problems of the result against the
	// tool's output_schema (empty when it matches or there is none).
	OutputSchemaErrors []string
}

// EvalStep evaluates the step rules.
func (s *Set) EvalStep(in Input) Decision { return s.eval(ScopeStep, in) }

// EvalPlan evaluates the plan rules.
func (s *Set) EvalPlan(in Input) Decision { return s.eval(ScopePlan, in) }

// EvalResult evaluates the result rules (deny is a failing verdict).
func (s *Set) EvalResult(in Input) Decision { return s.eval(ScopeResult, in) }

// Has reports whether the set has a rule of scope.
func (s *Set) Has(scope Scope) bool {
	for _, p := range s.Policies() {
		for _, r := range p.Rules {
			if r.On == scope {
				return true
			}
		}
	}
	return false
}

func (s *Set) eval(scope Scope, in Input) Decision {
	best := Decision{Action: Allow}
	for _, m := range s.Matches(scope, in) {
		if m.Action > best.Action || (best.Rule == "" && m.Action == best.Action) {
			best = m
		}
	}
	return best
}

// Matches lists the verdicts of every matching rule of scope, in order.
func (s *Set) Matches(scope Scope, in Input) []Decision {
	vars := map[string]any{
		"step": orEmpty(in.Step), "tool": orEmpty(in.Tool), "plan": orEmpty(in.Plan), "run": orEmpty(in.Run),
		"now": in.Now, "output": in.Output, "output_empty": in.OutputEmpty, "output_schema_errors": orNone(in.OutputSchemaErrors),
	}
	var out []Decision
	for _, p := range s.Policies() {
		vars["params"] = p.params
		for _, r := range p.Rules {
			if r.On != scope {
				continue
			}
			d := Decision{Action: r.Action, Policy: p.Name, Rule: r.Name, Reason: r.Reason, Settings: r.Settings}
			d.Approvers = slices.Clone(r.Approvers)
			v, _, err := r.prg.Eval(vars)
			if err != nil {
				// Fail closed: a rule that cannot be evaluated denies.
				d.Action, d.Reason = Deny, fmt.Sprintf("rule cannot be evaluated (%v); denied", err)
				out = append(out, d)
				continue
			}
			b, ok := v.Value().(bool)
			if !ok {
				d.Action, d.Reason = Deny, fmt.Sprintf("rule evaluated to %v, not a bool; denied", v.Value())
				out = append(out, d)
				continue
			}
			if b {
				out = append(out, d)
			}
		}
	}
	return out
}

func orNone(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// IsEmpty reports whether a JSON-like value carries nothing: null, "", an
// empty list or object, or lists and objects of empty values only.
func IsEmpty(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case string:
		return x == ""
	case []any:
		for _, e := range x {
			if !IsEmpty(e) {
				return false
			}
		}
		return true
	case map[string]any:
		for _, e := range x {
			if !IsEmpty(e) {
				return false
			}
		}
		return true
	}
	return false
}

func orEmpty(m map[string]any) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	return m
}
