package plan

import (
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// Env is what run-time expressions see.
type Env struct {
	// Goal is the run's goal, the CEL variable `goal`.
	Goal string
	// Inputs are the run's inputs, the CEL variable `inputs`; nil is empty.
	Inputs map[string]any
	// Outputs maps a step id to its output as a JSON-like Go value (as
	// produced by encoding/json or structpb's AsInterface); it backs
	// steps.<id>.output.
	Outputs map[string]any
}

// vars builds the CEL activation for kindRun expressions.
func (e Env) vars() map[string]any {
	inputs := e.Inputs
	if inputs == nil {
		inputs = map[string]any{}
	}
	steps := make(map[string]any, len(e.Outputs))
	for id, out := range e.Outputs {
		steps[id] = map[string]any{"output": out}
	}
	return map[string]any{"goal": e.Goal, "inputs": inputs, "steps": steps}
}

// eval runs a cached program and returns its raw CEL value.
func eval(kind exprKind, expr string, vars map[string]any) (ref.Val, error) {
	c := compile(kind, expr)
	if c.err != nil {
		return nil, fmt.Errorf("compile: %w", c.err)
	}
	v, _, err := c.prg.Eval(vars)
	if err != nil {
		return nil, err
	}
	return v, nil
}

// ResolveArgs returns a copy of args with every reference replaced by its
// value in env (see the package documentation for the syntax). A whole-string
// reference takes the expression's JSON value; an embedded one is
// interpolated as text. Nested objects and lists are resolved too; nil args
// give nil. Errors are [*EvalError] values naming the field path (args.a[0])
// and the expression. The result shares sub-values that hold no reference
// with args, so treat both as read-only.
func ResolveArgs(args *structpb.Struct, env Env) (*structpb.Struct, error) {
	if args == nil {
		return nil, nil
	}
	r := resolver{env: env}
	out, changed, err := r.object(args, "args")
	if err != nil {
		return nil, err
	}
	if !changed {
		out = &structpb.Struct{Fields: maps.Clone(args.GetFields())}
	}
	return out, nil
}

// resolver carries the activation, built on the first reference only.
type resolver struct {
	env  Env
	vars map[string]any
}

// object resolves a Struct; changed reports whether anything was replaced.
// An unchanged Struct is returned as is, so unchanged subtrees are shared
// instead of copied.
func (r *resolver) object(s *structpb.Struct, path string) (*structpb.Struct, bool, error) {
	fields := s.GetFields()
	var out map[string]*structpb.Value
	for k, v := range fields {
		nv, changed, err := r.value(v, path+fieldSuffix(k))
		if err != nil {
			return nil, false, err
		}
		if changed {
			if out == nil {
				out = maps.Clone(fields)
			}
			out[k] = nv
		}
	}
	if out == nil {
		return s, false, nil
	}
	return &structpb.Struct{Fields: out}, true, nil
}

func (r *resolver) value(v *structpb.Value, path string) (*structpb.Value, bool, error) {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		if !hasRef(k.StringValue) {
			return v, false, nil
		}
		nv, err := r.template(k.StringValue, path)
		return nv, true, err
	case *structpb.Value_StructValue:
		s, changed, err := r.object(k.StructValue, path)
		if err != nil || !changed {
			return v, false, err
		}
		return structpb.NewStructValue(s), true, nil
	case *structpb.Value_ListValue:
		vals := k.ListValue.GetValues()
		var out []*structpb.Value
		for i, e := range vals {
			ne, changed, err := r.value(e, path+"["+strconv.Itoa(i)+"]")
			if err != nil {
				return nil, false, err
			}
			if changed && out == nil {
				out = make([]*structpb.Value, len(vals))
				copy(out, vals[:i])
			}
			if out != nil {
				out[i] = ne
			}
		}
		if out == nil {
			return v, false, nil
		}
		return structpb.NewListValue(&structpb.ListValue{Values: out}), true, nil
	case nil:
		// A nil or empty Value is JSON null; replace it so the result
		// always marshals.
		return structpb.NewNullValue(), true, nil
	}
	return v, false, nil
}

// template evaluates the references of one string argument.
func (r *resolver) template(s, path string) (*structpb.Value, error) {
	t, err := parseTemplate(s)
	if err != nil {
		return nil, &EvalError{Field: path, Expr: s, Err: err}
	}
	if r.vars == nil {
		r.vars = r.env.vars()
	}
	if t.whole() {
		expr := t.segs[0].text
		v, err := r.evalJSON(expr)
		if err != nil {
			return nil, &EvalError{Field: path, Expr: expr, Err: err}
		}
		nv, err := structpb.NewValue(v)
		if err != nil {
			return nil, &EvalError{Field: path, Expr: expr, Err: err}
		}
		return nv, nil
	}
	var b strings.Builder
	for _, seg := range t.segs {
		if !seg.isExpr {
			b.WriteString(seg.text)
			continue
		}
		v, err := r.evalJSON(seg.text)
		if err == nil {
			var text string
			text, err = jsonText(v)
			b.WriteString(text)
		}
		if err != nil {
			return nil, &EvalError{Field: path, Expr: seg.text, Err: err}
		}
	}
	return structpb.NewStringValue(b.String()), nil
}

func (r *resolver) evalJSON(expr string) (any, error) {
	v, err := eval(kindRun, expr, r.vars)
	if err != nil {
		return nil, err
	}
	return toJSON(v)
}

// CheckExpect evaluates a step's expect expression over the step's output
// and resolved arguments (nil args are an empty map). An empty expression
// holds. A result that is not a bool, or an evaluation error, is returned as
// an [*EvalError] with Field "expect"; the engine fails the step either way.
func CheckExpect(expr string, output any, args map[string]any) (bool, error) {
	if expr == "" {
		return true, nil
	}
	if args == nil {
		args = map[string]any{}
	}
	v, err := eval(kindExpect, expr, map[string]any{"output": output, "args": args})
	if err != nil {
		return false, &EvalError{Field: "expect", Expr: expr, Err: err}
	}
	b, ok := v.(types.Bool)
	if !ok {
		return false, &EvalError{Field: "expect", Expr: expr, Err: fmt.Errorf("result is %s, want bool", v.Type().TypeName())}
	}
	return bool(b), nil
}

// EvalAnswer evaluates a plan's answer expression in env and returns its
// JSON-like value (ints stay int64). Errors are [*EvalError] values with
// Field "answer"; an empty expression is an error (see [Result]).
func EvalAnswer(expr string, env Env) (any, error) {
	if expr == "" {
		return nil, &EvalError{Field: "answer", Expr: expr, Err: errors.New("empty expression")}
	}
	v, err := eval(kindRun, expr, env.vars())
	if err == nil {
		var out any
		if out, err = toJSON(v); err == nil {
			return out, nil
		}
	}
	return nil, &EvalError{Field: "answer", Expr: expr, Err: err}
}

// Result is a finished run's result: the value of the plan's answer
// expression, or, when the plan has none, a map from each leaf step's id to
// its output (a leaf without an output maps to nil).
func Result(p *planexv1.Plan, env Env) (any, error) {
	if a := p.GetAnswer(); a != "" {
		return EvalAnswer(a, env)
	}
	leaves := Leaves(p)
	out := make(map[string]any, len(leaves))
	for _, id := range leaves {
		out[id] = env.Outputs[id]
	}
	return out, nil
}

// fieldSuffix appends an object key to a field path: ".name" for
// identifier-like keys, `["a.b"]` otherwise.
func fieldSuffix(key string) string {
	if isIdent(key) {
		return "." + key
	}
	return "[" + strconv.Quote(key) + "]"
}

func isIdent(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		letter := c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
		if !letter && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}
