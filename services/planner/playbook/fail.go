package playbook

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"github.com/google/cel-go/ext"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// StepFailedError is how the playbook planner gives up on a run: a step
// failed and no on_failure branch recovers it, or the branch that matched
// is a `fail` branch. Message is meant for the person who wrote the goal
// ("no data for 2023 (data covers 2024–2025)"); it is the error's whole
// text. errors.Is(err, ErrNoBranch) holds.
type StepFailedError struct {
	// Playbook is the playbook's name.
	Playbook string
	// Step is the id of the failed step.
	Step string
	// Tool is the failed step's tool.
	Tool string
	// Code is the step's error code.
	Code planexv1.ErrorCode
	// Message says what went wrong in the user's terms.
	Message string
}

// Error returns Message.
func (e *StepFailedError) Error() string { return e.Message }

// Is makes errors.Is(err, ErrNoBranch) hold.
func (e *StepFailedError) Is(target error) bool { return target == ErrNoBranch }

// noBranch is the answer when no branch handles failure f: the step's own
// message, which executors write for users (the SQL error, the refused
// recipient and the allowlist), without the planner's internals. The
// supervisor recognises `step "x" (tool) failed: <error>` as a restatement
// of the step's error, not a message of the playbook's own: the run stops
// with that error once (NO_DATA for a refusal or an expect that did not
// hold, STEP_FAILED otherwise), while a fail: branch's message (failWith)
// becomes the whole stop message (docs/engine.md, stop reasons).
func (b *Playbook) noBranch(f *planexv1.StepOutcome) *StepFailedError {
	msg := f.GetError().GetMessage()
	if msg == "" {
		msg = strings.ToLower(strings.TrimPrefix(f.GetError().GetCode().String(), "ERROR_CODE_"))
	}
	step := fmt.Sprintf("step %q", f.GetStepId())
	if f.GetTool() != "" {
		step += " (" + f.GetTool() + ")"
	}
	msg = step + " failed: " + msg
	if f.GetError().GetCode() == planexv1.ErrorCode_ERROR_CODE_REJECTED {
		// The message is the rejection (gate, who, why).
		msg = fmt.Sprintf("%s; playbook %s has no on_failure branch for a rejection of step %q", f.GetError().GetMessage(), b.Name, f.GetStepId())
	}
	return &StepFailedError{
		Playbook: b.Name, Step: f.GetStepId(), Tool: f.GetTool(), Code: f.GetError().GetCode(),
		Message: msg,
	}
}

// maxFailMessage bounds a fail message, which ends up in the run's stop
// message.
const maxFailMessage = 2000

// failWith evaluates a fail branch's message over the run so far.
func (b *Playbook) failWith(br *branch, f *planexv1.StepOutcome, params map[string]any, goal string, inputs map[string]any, h *history) error {
	expr, err := inlineParams(br.fail, params)
	if err != nil {
		return fmt.Errorf("playbook %s, on_failure branch %s: fail: %w", b.Name, br.name, err)
	}
	msg, err := evalFail(expr, failVars(goal, inputs, h.outputs(), f))
	if err != nil {
		// The branch still gives up; say why the message is missing.
		msg = fmt.Sprintf("step %q failed (%s); the playbook's message could not be built: %v", f.GetStepId(), describeError(f.GetError()), err)
	}
	if len(msg) > maxFailMessage {
		cut := maxFailMessage
		for !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "…"
	}
	return &StepFailedError{Playbook: b.Name, Step: f.GetStepId(), Tool: f.GetTool(), Code: f.GetError().GetCode(), Message: msg}
}

func failVars(goal string, inputs, outputs map[string]any, f *planexv1.StepOutcome) map[string]any {
	if inputs == nil {
		inputs = map[string]any{}
	}
	steps := make(map[string]any, len(outputs))
	for id, out := range outputs {
		steps[id] = map[string]any{"output": out}
	}
	return map[string]any{
		"goal":   goal,
		"inputs": inputs,
		"steps":  steps,
		"failure": map[string]any{
			"step":    f.GetStepId(),
			"code":    strings.TrimPrefix(f.GetError().GetCode().String(), "ERROR_CODE_"),
			"message": f.GetError().GetMessage(),
		},
	}
}

// failEnv is the CEL environment of fail messages: the variables of an
// answer (goal, inputs, steps) plus failure {step, code, message} and the
// function closest(candidates, name, n), the at most n candidates nearest
// to name, nearest first.
var failEnv = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(
		cel.OptionalTypes(),
		ext.Strings(), ext.Lists(), ext.Math(), ext.Sets(),
		cel.Variable("goal", cel.StringType),
		cel.Variable("inputs", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("steps", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("failure", cel.MapType(cel.StringType, cel.StringType)),
		cel.Function("closest",
			cel.Overload("closest_list_string_int", []*cel.Type{cel.ListType(cel.DynType), cel.StringType, cel.IntType}, cel.ListType(cel.StringType),
				cel.FunctionBinding(closestBinding))),
	)
})

// compileFail checks a fail expression at load time.
func compileFail(expr string) (cel.Program, error) {
	env, err := failEnv()
	if err != nil {
		return nil, err
	}
	a, iss := env.Compile(expr)
	if iss.Err() != nil {
		return nil, iss.Err()
	}
	if t := a.OutputType(); t != cel.StringType && t != cel.DynType {
		return nil, fmt.Errorf("want a string expression, got %s", t)
	}
	return env.Program(a)
}

func evalFail(expr string, vars map[string]any) (string, error) {
	prg, err := compileFail(expr)
	if err != nil {
		return "", err
	}
	v, _, err := prg.Eval(vars)
	if err != nil {
		return "", err
	}
	s, ok := v.Value().(string)
	if !ok {
		return "", fmt.Errorf("evaluated to %s, want a string", v.Type())
	}
	return s, nil
}

func closestBinding(args ...ref.Val) ref.Val {
	list, ok := args[0].(traits.Lister)
	if !ok {
		return types.NewErr("closest: want a list")
	}
	var cands []string
	it := list.Iterator()
	for it.HasNext() == types.True {
		if s, ok := it.Next().Value().(string); ok {
			cands = append(cands, s)
		}
	}
	name, _ := args[1].Value().(string)
	n, _ := args[2].Value().(int64)
	return types.DefaultTypeAdapter.NativeToValue(Closest(cands, name, int(n)))
}

// Closest returns the at most n candidates nearest to name, nearest
// first, compared without case: those containing name or contained in
// it, then those sharing a distinctive word with it ("Acme" in "Acme
// Corporation"; not "Corp" or "Inc"), then by edit distance. Candidates
// further than a quarter of their length and sharing no word are left out.
func Closest(candidates []string, name string, n int) []string {
	type scored struct {
		s    string
		dist float64
	}
	want := strings.ToLower(strings.Join(strings.Fields(name), " "))
	var out []scored
	for _, c := range candidates {
		lc := strings.ToLower(c)
		var d float64
		switch {
		case lc == want:
			d = 0
		case want != "" && (strings.Contains(lc, want) || strings.Contains(want, lc)):
			d = 0.1
		case shareWord(lc, want):
			d = 0.2
		default:
			longer := max(utf8.RuneCountInString(lc), utf8.RuneCountInString(want))
			d = 0.2 + float64(levenshtein(lc, want))/float64(max(longer, 1))
		}
		if d <= 0.2+0.25 {
			out = append(out, scored{c, d})
		}
	}
	slices.SortStableFunc(out, func(a, b scored) int {
		switch {
		case a.dist < b.dist:
			return -1
		case a.dist > b.dist:
			return 1
		}
		return strings.Compare(a.s, b.s)
	})
	names := make([]string, 0, min(n, len(out)))
	for _, s := range out[:min(n, len(out))] {
		names = append(names, s.s)
	}
	return names
}

// genericWords do not make two company names alike.
var genericWords = []string{"corp", "corporation", "inc", "co", "company", "industries", "ltd", "llc", "group", "the", "and", "&", "of"}

// shareWord reports whether a and b have a distinctive word of at least
// three letters in common.
func shareWord(a, b string) bool {
	words := strings.Fields(b)
	for _, w := range strings.Fields(a) {
		if len(w) >= 3 && !slices.Contains(genericWords, w) && slices.Contains(words, w) {
			return true
		}
	}
	return false
}

// levenshtein is the edit distance between a and b, in runes.
func levenshtein(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}
