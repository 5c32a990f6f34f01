package playbook

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/ast"
	"google.golang.org/protobuf/types/known/structpb"
)

// placeholder is a parameter reference in an argument string. The planner
// replaces it; every other "${{ ... }}" is left for the engine.
var placeholder = regexp.MustCompile(`\$\{\{\s*params\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}`)

// paramRef is params.<name> at the start of a CEL identifier node.
var paramRef = regexp.MustCompile(`^params\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)`)

// substArgs returns a copy of args with every ${{ params.x }} replaced: a
// string that is exactly one placeholder takes the parameter's typed value
// (null when an optional parameter is absent), a placeholder inside a longer
// string is interpolated as text.
func substArgs(args *structpb.Struct, params map[string]any) (*structpb.Struct, error) {
	if args == nil {
		return &structpb.Struct{Fields: map[string]*structpb.Value{}}, nil
	}
	out := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(args.GetFields()))}
	for k, v := range args.GetFields() {
		nv, err := substValue(v, params, "args"+fieldSuffix(k))
		if err != nil {
			return nil, err
		}
		out.Fields[k] = nv
	}
	return out, nil
}

func substValue(v *structpb.Value, params map[string]any, path string) (*structpb.Value, error) {
	switch x := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return substString(x.StringValue, params, path)
	case *structpb.Value_StructValue:
		out := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(x.StructValue.GetFields()))}
		for k, fv := range x.StructValue.GetFields() {
			nv, err := substValue(fv, params, path+fieldSuffix(k))
			if err != nil {
				return nil, err
			}
			out.Fields[k] = nv
		}
		return structpb.NewStructValue(out), nil
	case *structpb.Value_ListValue:
		out := &structpb.ListValue{Values: make([]*structpb.Value, len(x.ListValue.GetValues()))}
		for i, lv := range x.ListValue.GetValues() {
			nv, err := substValue(lv, params, fmt.Sprintf("%s[%d]", path, i))
			if err != nil {
				return nil, err
			}
			out.Values[i] = nv
		}
		return structpb.NewListValue(out), nil
	default:
		return v, nil
	}
}

func substString(s string, params map[string]any, path string) (*structpb.Value, error) {
	locs := placeholder.FindAllStringSubmatchIndex(s, -1)
	if len(locs) == 0 {
		return structpb.NewStringValue(s), nil
	}
	for _, l := range locs {
		if name := s[l[2]:l[3]]; !hasKey(params, name) {
			return nil, fmt.Errorf("%s: unknown parameter %q in %q", path, name, s[l[0]:l[1]])
		}
	}
	if len(locs) == 1 && locs[0][0] == 0 && locs[0][1] == len(s) {
		return toValue(params[s[locs[0][2]:locs[0][3]]])
	}
	out := placeholder.ReplaceAllStringFunc(s, func(m string) string {
		return text(params[placeholder.FindStringSubmatch(m)[1]])
	})
	// A parameter must not complete a reference with the text around it.
	if strings.Count(out, "${{") != strings.Count(s, "${{")-len(locs) {
		return nil, fmt.Errorf("%s: a parameter value would form a \"${{\" reference", path)
	}
	return structpb.NewStringValue(out), nil
}

func hasKey(m map[string]any, k string) bool {
	_, ok := m[k]
	return ok
}

// text renders a parameter value inside a longer string.
func text(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case bool:
		return strconv.FormatBool(x)
	default:
		return fmt.Sprint(x)
	}
}

// celLiteral renders a parameter value as a CEL literal.
func celLiteral(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		return strconv.Quote(x)
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		s := strconv.FormatFloat(x, 'g', -1, 64)
		if !strings.ContainsAny(s, ".eE") && !math.IsInf(x, 0) && !math.IsNaN(x) {
			s += ".0"
		}
		return s
	case bool:
		return strconv.FormatBool(x)
	default:
		return strconv.Quote(fmt.Sprint(x))
	}
}

var parserEnv = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(cel.OptionalTypes())
})

// inlineParams replaces every params.<name> in a CEL expression by the
// parameter's value as a literal, so that the engine, which knows nothing
// of parameters, can evaluate it. Identifiers are found in the parsed
// expression, so text inside string literals is never touched.
func inlineParams(expr string, params map[string]any) (string, error) {
	if !strings.Contains(expr, "params") {
		return expr, nil
	}
	env, err := parserEnv()
	if err != nil {
		return "", err
	}
	parsed, iss := env.Parse(expr)
	if iss.Err() != nil {
		return "", fmt.Errorf("parse %q: %v", expr, iss.Err())
	}
	native := parsed.NativeRep()
	runes := []rune(expr)
	type repl struct {
		start, end int
		lit        string
	}
	var repls []repl
	var problem error
	seen := map[int32]bool{}
	ast.PostOrderVisit(native.Expr(), ast.NewExprVisitor(func(e ast.Expr) {
		if e.Kind() != ast.IdentKind || e.AsIdent() != "params" || problem != nil {
			return
		}
		r, ok := native.SourceInfo().GetOffsetRange(e.ID())
		if !ok || r.Start < 0 || int(r.Start) >= len(runes) || seen[r.Start] {
			return
		}
		seen[r.Start] = true
		rest := string(runes[r.Start:])
		m := paramRef.FindStringSubmatch(rest)
		if m == nil {
			problem = fmt.Errorf("%q: use params.<name> to read a parameter", expr)
			return
		}
		if !hasKey(params, m[1]) {
			problem = fmt.Errorf("%q: unknown parameter %q", expr, m[1])
			return
		}
		n := len([]rune(m[0]))
		repls = append(repls, repl{start: int(r.Start), end: int(r.Start) + n, lit: celLiteral(params[m[1]])})
	}))
	if problem != nil {
		return "", problem
	}
	slices.SortFunc(repls, func(a, b repl) int { return b.start - a.start })
	for _, r := range repls {
		runes = slices.Concat(runes[:r.start], []rune(r.lit), runes[r.end:])
	}
	return string(runes), nil
}

// stepRefs returns the ids used as steps.<id> in a CEL expression.
func stepRefs(expr string) []string {
	if !strings.Contains(expr, "steps") {
		return nil
	}
	env, err := parserEnv()
	if err != nil {
		return nil
	}
	parsed, iss := env.Parse(expr)
	if iss.Err() != nil {
		return nil
	}
	var ids []string
	ast.PostOrderVisit(parsed.NativeRep().Expr(), ast.NewExprVisitor(func(e ast.Expr) {
		if e.Kind() != ast.SelectKind {
			return
		}
		sel := e.AsSelect()
		if op := sel.Operand(); op.Kind() == ast.IdentKind && op.AsIdent() == "steps" && !slices.Contains(ids, sel.FieldName()) {
			ids = append(ids, sel.FieldName())
		}
	}))
	return ids
}

// fieldSuffix appends an object key to a field path.
func fieldSuffix(key string) string {
	if paramName.MatchString(key) {
		return "." + key
	}
	return "[" + strconv.Quote(key) + "]"
}
