package eval

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/google/cel-go/cel"
)

// celEnv declares the variables matchers see.
var celEnv = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(
		cel.CrossTypeNumericComparisons(true),
		cel.OptionalTypes(),
		cel.Variable("run", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("result", cel.DynType),
		cel.Variable("value", cel.DynType),
	)
})

var celPrograms sync.Map // expression → cel.Program

func compileCEL(expr string) (cel.Program, error) {
	if p, ok := celPrograms.Load(expr); ok {
		return p.(cel.Program), nil
	}
	env, err := celEnv()
	if err != nil {
		return nil, err
	}
	ast, iss := env.Compile(expr)
	if iss.Err() != nil {
		return nil, iss.Err()
	}
	if !ast.OutputType().IsAssignableType(cel.BoolType) && ast.OutputType() != cel.DynType {
		return nil, fmt.Errorf("%q is %s, want bool", expr, ast.OutputType())
	}
	prg, err := env.Program(ast, cel.CostLimit(1_000_000))
	if err != nil {
		return nil, err
	}
	celPrograms.Store(expr, prg)
	return prg, nil
}

// matchEnv is what matchers see.
type matchEnv struct {
	run    map[string]any
	result any
}

// check applies m to v (the whole value; m.Path selects inside it) and
// returns "" when it holds, else why not.
func (m *Matcher) check(v any, env matchEnv) string {
	if m.re == nil && m.Regexp != "" {
		if err := m.compile(); err != nil {
			return err.Error()
		}
	}
	sel, ok := at(v, m.Path)
	if !ok && m.CEL == "" {
		return fmt.Sprintf("%s: no such field", pathName(m.Path))
	}
	switch {
	case m.Exact != nil:
		if !sameJSON(sel, m.Exact) {
			return fmt.Sprintf("%s: got %s, want %s", pathName(m.Path), jsonText(sel), jsonText(m.Exact))
		}
	case m.Regexp != "":
		s, isStr := sel.(string)
		if !isStr {
			s = jsonText(sel)
		}
		if !m.re.MatchString(s) {
			return fmt.Sprintf("%s: %s does not match /%s/", pathName(m.Path), jsonText(sel), m.Regexp)
		}
	case m.CEL != "":
		prg, err := compileCEL(m.CEL)
		if err != nil {
			return fmt.Sprintf("cel %q: %v", m.CEL, err)
		}
		out, _, err := prg.Eval(map[string]any{"run": env.run, "result": env.result, "value": sel})
		if err != nil {
			return fmt.Sprintf("cel %q: %v", m.CEL, err)
		}
		if b, isBool := out.Value().(bool); !isBool || !b {
			return fmt.Sprintf("cel %q is %v", m.CEL, out.Value())
		}
	}
	return ""
}

func pathName(p string) string {
	if p == "" {
		return "value"
	}
	return p
}

// at selects a dotted path ("rows.0.name") in a JSON-like value.
func at(v any, path string) (any, bool) {
	if path == "" {
		return v, true
	}
	for _, part := range strings.Split(path, ".") {
		switch t := v.(type) {
		case map[string]any:
			x, ok := t[part]
			if !ok {
				return nil, false
			}
			v = x
		case []any:
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(t) {
				return nil, false
			}
			v = t[i]
		default:
			return nil, false
		}
	}
	return v, true
}

// sameJSON compares two values as JSON (numbers as float64, so 3 == 3.0).
func sameJSON(a, b any) bool {
	return reflect.DeepEqual(normalize(a), normalize(b))
}

func normalize(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var out any
	if json.Unmarshal(b, &out) != nil {
		return v
	}
	return out
}

func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// ToolCall is one step attempt of a run, as its trajectory shows it.
type ToolCall struct {
	// Step is the plan step id.
	Step string `json:"step"`
	// Attempt is the attempt number.
	Attempt int32 `json:"attempt"`
	// Tool is the tool name.
	Tool string `json:"tool"`
	// Args are the resolved arguments.
	Args map[string]any `json:"args,omitempty"`
	// Outcome is succeeded, failed or "" (no result recorded).
	Outcome string `json:"outcome,omitempty"`
	// Error is the failure's code and message.
	Error string `json:"error,omitempty"`
}

func (c ToolCall) String() string {
	s := fmt.Sprintf("%s (step %s, attempt %d)", c.Tool, c.Step, c.Attempt)
	if c.Outcome != "" {
		s += " " + c.Outcome
	}
	if c.Error != "" {
		s += ": " + c.Error
	}
	return s
}

func (c Call) String() string {
	s := c.Tool
	if len(c.Args) > 0 {
		var names []string
		for n := range c.Args {
			names = append(names, n)
		}
		slices.Sort(names)
		s += "(" + strings.Join(names, ", ") + ")"
	}
	if c.Outcome != "" {
		s += " " + c.Outcome
	}
	return s
}

// matches reports whether the actual call satisfies the expected one.
func (c Call) matches(a ToolCall, env matchEnv) bool {
	if c.Tool != a.Tool || (c.Outcome != "" && c.Outcome != a.Outcome) {
		return false
	}
	for name, m := range c.Args {
		v, ok := a.Args[name]
		if !ok && m.CEL == "" {
			return false
		}
		if m.check(v, env) != "" {
			return false
		}
	}
	return true
}

// checkTrajectory returns "" when the calls satisfy t, else a readable
// diff of expected and actual calls.
func checkTrajectory(t *Trajectory, calls []ToolCall, env matchEnv) string {
	switch t.Match {
	case "ordered":
		// Align with a longest common subsequence, then print it as a diff.
		n, m := len(t.Calls), len(calls)
		lcs := make([][]int, n+1)
		for i := range lcs {
			lcs[i] = make([]int, m+1)
		}
		for i := n - 1; i >= 0; i-- {
			for j := m - 1; j >= 0; j-- {
				if t.Calls[i].matches(calls[j], env) {
					lcs[i][j] = lcs[i+1][j+1] + 1
				} else {
					lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
				}
			}
		}
		if lcs[0][0] == n && n == m {
			return ""
		}
		var b strings.Builder
		b.WriteString("trajectory differs (ordered; - expected, + actual):")
		i, j := 0, 0
		for i < n || j < m {
			switch {
			case i < n && j < m && t.Calls[i].matches(calls[j], env):
				fmt.Fprintf(&b, "\n    %s", calls[j])
				i++
				j++
			case j < m && (i == n || lcs[i][j+1] >= lcs[i+1][j]):
				fmt.Fprintf(&b, "\n  + %s", calls[j])
				j++
			default:
				fmt.Fprintf(&b, "\n  - %s", t.Calls[i])
				i++
			}
		}
		return b.String()
	default: // unordered, subset
		used := make([]bool, len(calls))
		var missing []string
		for _, c := range t.Calls {
			found := false
			for j, a := range calls {
				if !used[j] && c.matches(a, env) {
					used[j], found = true, true
					break
				}
			}
			if !found {
				missing = append(missing, c.String())
			}
		}
		var extra []string
		if t.Match == "unordered" {
			for j, a := range calls {
				if !used[j] {
					extra = append(extra, a.String())
				}
			}
		}
		if len(missing) == 0 && len(extra) == 0 {
			return ""
		}
		var b strings.Builder
		fmt.Fprintf(&b, "trajectory differs (%s; - expected but not made, + made but not expected):", t.Match)
		for _, s := range missing {
			b.WriteString("\n  - " + s)
		}
		for _, s := range extra {
			b.WriteString("\n  + " + s)
		}
		b.WriteString("\n  actual:")
		for _, a := range calls {
			b.WriteString("\n    " + a.String())
		}
		return b.String()
	}
}
