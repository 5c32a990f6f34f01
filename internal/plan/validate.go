package plan

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/google/cel-go/cel"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// Limits bounds the size of a plan. A zero or negative field means no
// limit.
type Limits struct {
	// MaxSteps is the largest number of steps in one plan.
	MaxSteps int
	// MaxArgsBytes bounds the compact JSON encoding of one step's args.
	MaxArgsBytes int
	// MaxPlanBytes bounds the protobuf encoding of the whole plan.
	MaxPlanBytes int
	// MaxExpressionLength bounds each CEL expression in bytes: every
	// reference, expect and the answer.
	MaxExpressionLength int
}

// DefaultLimits returns the limits the supervisor and the planner apply
// unless configured otherwise: 50 steps, 64 KiB of args per step, 1 MiB per
// plan, 2 KiB per expression.
func DefaultLimits() Limits {
	return Limits{
		MaxSteps:            50,
		MaxArgsBytes:        64 << 10,
		MaxPlanBytes:        1 << 20,
		MaxExpressionLength: 2 << 10,
	}
}

// Validate checks a plan before anything runs and returns nil or a
// [*ValidationError] (matching [ErrInvalidPlan]) listing every problem:
//   - the plan has steps, within lim, and a confidence in [0, 1];
//   - step ids are unique and match ^[a-z][a-z0-9_]{0,62}$;
//   - depends_on names other, existing steps, without repeats or cycles
//     (reported as a path, "a -> b -> a");
//   - every tool is in cat (a nil cat holds no tools) and the args satisfy
//     its args_schema, except where a value is a reference (see the package
//     documentation) and cannot be known yet;
//   - every reference compiles and reads only goal, inputs and
//     steps.<id>.output of the step's transitive dependencies;
//   - expect compiles over output and args to a bool (or dyn);
//   - set timeouts (start-to-close, schedule-to-start, heartbeat) are
//     positive;
//   - a retry policy is within bounds and never retries what cannot
//     change (INVALID_ARGUMENT, ...) nor, for a tool that is neither
//     READ nor idempotent, an uncertain side effect (TIMEOUT,
//     OUTCOME_UNKNOWN, ...);
//   - the answer compiles and reads only steps of the plan.
//
// Validate never panics, whatever the plan holds, and never runs an
// expression.
func Validate(p *planexv1.Plan, cat Catalog, lim Limits) error {
	v := validator{lim: lim, cat: cat}
	v.plan(p)
	if len(v.problems) == 0 {
		return nil
	}
	return &ValidationError{Problems: v.problems}
}

type validator struct {
	lim       Limits
	cat       Catalog
	problems  []Problem
	index     map[string]*planexv1.Step // first step of each id
	ancestors map[string]map[string]bool
}

// where addresses a problem: the step's id or, for a step without one, its
// position.
type where struct {
	step   string
	prefix string
}

func stepWhere(i int, s *planexv1.Step) where {
	if id := s.GetId(); id != "" {
		return where{step: id}
	}
	return where{prefix: fmt.Sprintf("steps[%d]", i)}
}

func (v *validator) add(w where, field, format string, args ...any) {
	if w.prefix != "" && field != "" {
		field = w.prefix + "." + field
	} else if w.prefix != "" {
		field = w.prefix
	}
	v.problems = append(v.problems, Problem{Step: w.step, Field: field, Message: fmt.Sprintf(format, args...)})
}

func (v *validator) plan(p *planexv1.Plan) {
	plan := where{}
	if p == nil {
		v.add(plan, "plan", "missing")
		return
	}
	if v.lim.MaxPlanBytes > 0 {
		if n := proto.Size(p); n > v.lim.MaxPlanBytes {
			v.add(plan, "plan", "%d bytes encoded, limit is %d", n, v.lim.MaxPlanBytes)
		}
	}
	if c := p.GetConfidence(); math.IsNaN(c) || c < 0 || c > 1 {
		v.add(plan, "confidence", "must be in [0, 1], got %v", c)
	}
	steps := p.GetSteps()
	switch {
	case len(steps) == 0:
		v.add(plan, "steps", "plan has no steps")
	case v.lim.MaxSteps > 0 && len(steps) > v.lim.MaxSteps:
		v.add(plan, "steps", "%d steps, limit is %d", len(steps), v.lim.MaxSteps)
	}
	v.index = make(map[string]*planexv1.Step, len(steps))
	for i, s := range steps {
		w := stepWhere(i, s)
		switch id := s.GetId(); {
		case s == nil:
			v.add(w, "", "missing step")
		case !validID(id):
			v.add(w, "id", "%q does not match ^[a-z][a-z0-9_]{0,62}$", id)
		case v.index[id] != nil:
			v.add(w, "id", "duplicate step id %q", id)
		default:
			v.index[id] = s
		}
	}
	for i, s := range steps {
		if s != nil {
			v.step(i, s)
		}
	}
	v.cycles(steps)
	if a := p.GetAnswer(); a != "" {
		v.runExpr(plan, "answer", a, func(id string) string {
			if v.index[id] == nil {
				return fmt.Sprintf("unknown step %q", id)
			}
			return ""
		})
	}
}

// validID reports whether id matches ^[a-z][a-z0-9_]{0,62}$.
func validID(id string) bool {
	if len(id) == 0 || len(id) > 63 || id[0] < 'a' || id[0] > 'z' {
		return false
	}
	for i := 1; i < len(id); i++ {
		c := id[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

func (v *validator) step(i int, s *planexv1.Step) {
	w := stepWhere(i, s)
	deps := s.GetDependsOn()
	for j, d := range deps {
		switch {
		case d == s.GetId():
			v.add(w, "depends_on", "step depends on itself")
		case v.index[d] == nil:
			v.add(w, "depends_on", "unknown step %q", d)
		case slices.Contains(deps[:j], d):
			v.add(w, "depends_on", "duplicate dependency %q", d)
		}
	}

	var spec *planexv1.ToolSpec
	switch tool := s.GetTool(); {
	case tool == "":
		v.add(w, "tool", "missing")
	case v.cat == nil:
		v.add(w, "tool", "unknown tool %q", tool)
	default:
		var ok bool
		if spec, ok = v.cat.Tool(tool); !ok {
			v.add(w, "tool", "unknown tool %q", tool)
		}
	}

	v.args(w, s, spec)

	if e := s.GetExpect(); e != "" && v.exprLength(w, "expect", e) {
		c := compile(kindExpect, e)
		switch {
		case c.err != nil:
			v.add(w, "expect", "%q: %v", e, c.err)
		case !c.out.IsExactType(cel.BoolType) && !c.out.IsExactType(cel.DynType):
			v.add(w, "expect", "%q: result is %s, want bool", e, c.out)
		}
	}

	for _, t := range []struct {
		field string
		d     *durationpb.Duration
	}{{"timeout", s.GetTimeout()}, {"schedule_to_start_timeout", s.GetScheduleToStartTimeout()}, {"heartbeat_timeout", s.GetHeartbeatTimeout()}} {
		if t.d != nil {
			if err := t.d.CheckValid(); err != nil || t.d.AsDuration() <= 0 {
				v.add(w, t.field, "must be positive, got %v", t.d.AsDuration())
			}
		}
	}
	checkRetry(func(field, format string, args ...any) { v.add(w, field, format, args...) }, "retry", s.GetRetry(), spec)
}

// args checks size, references and the tool's schema.
func (v *validator) args(w where, s *planexv1.Step, spec *planexv1.ToolSpec) {
	var aw argWalker
	inst := aw.object(s.GetArgs())
	if v.lim.MaxArgsBytes > 0 && aw.size > v.lim.MaxArgsBytes {
		v.add(w, "args", "%d bytes of JSON, limit is %d", aw.size, v.lim.MaxArgsBytes)
	}
	for _, p := range aw.problems {
		v.add(w, p.Field, "%s", p.Message)
	}
	id := s.GetId()
	for _, e := range aw.exprs {
		v.runExpr(w, e.field, e.expr, func(ref string) string {
			switch {
			case ref == id:
				return fmt.Sprintf("step %q cannot read its own output", id)
			case v.index[ref] == nil:
				return fmt.Sprintf("unknown step %q", ref)
			case !v.dependsOn(id, ref):
				return fmt.Sprintf("step %q is not a dependency of %q", ref, id)
			}
			return ""
		})
	}
	if spec == nil {
		return
	}
	sch, err := schemas.schema(spec)
	if err != nil {
		v.add(w, "args", "%v", err)
		return
	}
	if sch == nil {
		return
	}
	for _, p := range schemaProblems(sch, inst, &aw.refs) {
		v.add(w, p.Field, "%s", p.Message)
	}
}

// runExpr checks a goal/inputs/steps expression; stepErr explains why a
// referenced step id is not allowed, or returns "".
func (v *validator) runExpr(w where, field, expr string, stepErr func(id string) string) {
	if !v.exprLength(w, field, expr) {
		return
	}
	c := compile(kindRun, expr)
	if c.err != nil {
		v.add(w, field, "${{ %s }}: %v", expr, c.err)
		return
	}
	if c.misuse != "" {
		v.add(w, field, "${{ %s }}: %s", expr, c.misuse)
	}
	for _, id := range c.steps {
		if msg := stepErr(id); msg != "" {
			v.add(w, field, "${{ %s }}: %s", expr, msg)
		}
	}
}

// exprLength reports whether expr is within the limit, adding a problem
// when it is not.
func (v *validator) exprLength(w where, field, expr string) bool {
	if v.lim.MaxExpressionLength <= 0 || len(expr) <= v.lim.MaxExpressionLength {
		return true
	}
	shown := expr
	if len(shown) > 32 {
		shown = shown[:32] + "…"
	}
	v.add(w, field, "expression %q is %d bytes, limit is %d", shown, len(expr), v.lim.MaxExpressionLength)
	return false
}

// dependsOn reports whether step id depends on ref, directly or not.
func (v *validator) dependsOn(id, ref string) bool {
	if v.ancestors == nil {
		v.ancestors = make(map[string]map[string]bool)
	}
	anc, ok := v.ancestors[id]
	if !ok {
		anc = make(map[string]bool)
		stack := slices.Clone(v.index[id].GetDependsOn())
		for len(stack) > 0 {
			d := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if anc[d] {
				continue
			}
			anc[d] = true
			stack = append(stack, v.index[d].GetDependsOn()...)
		}
		v.ancestors[id] = anc
	}
	return anc[ref]
}

// cycles reports each dependency cycle once, as the path a -> b -> a where
// each step depends on the next.
func (v *validator) cycles(steps []*planexv1.Step) {
	const (
		visiting = 1
		visited  = 2
	)
	state := make(map[string]uint8, len(v.index))
	reported := make(map[string]bool)
	var path []string
	var visit func(id string)
	visit = func(id string) {
		state[id] = visiting
		path = append(path, id)
		for _, d := range v.index[id].GetDependsOn() {
			if d == id || v.index[d] == nil {
				continue // reported by step
			}
			switch state[d] {
			case 0:
				visit(d)
			case visiting:
				cycle := append(slices.Clone(path[slices.Index(path, d):]), d)
				if key := cycleKey(cycle[:len(cycle)-1]); !reported[key] {
					reported[key] = true
					v.add(where{step: d}, "depends_on", "dependency cycle %s", strings.Join(cycle, " -> "))
				}
			}
		}
		path = path[:len(path)-1]
		state[id] = visited
	}
	for _, s := range steps {
		if id := s.GetId(); v.index[id] == s && s != nil && state[id] == 0 {
			visit(id)
		}
	}
}

// cycleKey identifies a cycle whatever step it starts at.
func cycleKey(nodes []string) string {
	start := 0
	for i, n := range nodes {
		if n < nodes[start] {
			start = i
		}
	}
	return strings.Join(append(slices.Clone(nodes[start:]), nodes[:start]...), " ")
}

// argWalker converts args to the JSON-like value the schema validates,
// measuring their JSON size and collecting references on the way.
type argWalker struct {
	path     []pathElem
	refs     refSet
	exprs    []argExpr
	problems []Problem
	size     int
}

// pathElem is an object key or, when isIdx, a list index.
type pathElem struct {
	key   string
	index int
	isIdx bool
}

type argExpr struct {
	field string
	expr  string
}

func (w *argWalker) object(s *structpb.Struct) map[string]any {
	fields := s.GetFields()
	out := make(map[string]any, len(fields))
	w.size += 2 + max(len(fields)-1, 0)
	// Sorted, so problems come out in a stable order.
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		w.size += jsonStringLen(k) + 1
		w.path = append(w.path, pathElem{key: k})
		out[k] = w.value(fields[k])
		w.path = w.path[:len(w.path)-1]
	}
	return out
}

func (w *argWalker) value(v *structpb.Value) any {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		w.size += jsonStringLen(k.StringValue)
		w.str(k.StringValue)
		return k.StringValue
	case *structpb.Value_NumberValue:
		var buf [32]byte
		w.size += len(strconv.AppendFloat(buf[:0], k.NumberValue, 'g', -1, 64))
		return k.NumberValue
	case *structpb.Value_BoolValue:
		w.size += len(strconv.FormatBool(k.BoolValue))
		return k.BoolValue
	case *structpb.Value_StructValue:
		return w.object(k.StructValue)
	case *structpb.Value_ListValue:
		vals := k.ListValue.GetValues()
		w.size += 2 + max(len(vals)-1, 0)
		out := make([]any, len(vals))
		for i, e := range vals {
			w.path = append(w.path, pathElem{index: i, isIdx: true})
			out[i] = w.value(e)
			w.path = w.path[:len(w.path)-1]
		}
		return out
	}
	w.size += len("null")
	return nil
}

// str records the references of one string argument.
func (w *argWalker) str(s string) {
	if !hasRef(s) {
		return
	}
	t, err := parseTemplate(s)
	if err != nil {
		w.problems = append(w.problems, Problem{Field: w.field(), Message: err.Error()})
		w.refs.add(w.tokens(), refWhole) // unknown intent: skip the schema
		return
	}
	k := refText
	if t.whole() {
		k = refWhole
	}
	w.refs.add(w.tokens(), k)
	field := w.field()
	for _, seg := range t.segs {
		if seg.isExpr {
			w.exprs = append(w.exprs, argExpr{field: field, expr: seg.text})
		}
	}
}

// field renders the current path as args.a[0].b.
func (w *argWalker) field() string {
	var b strings.Builder
	b.WriteString("args")
	for _, e := range w.path {
		if e.isIdx {
			b.WriteString("[" + strconv.Itoa(e.index) + "]")
		} else {
			b.WriteString(fieldSuffix(e.key))
		}
	}
	return b.String()
}

// tokens renders the current path as JSON pointer tokens.
func (w *argWalker) tokens() []string {
	out := make([]string, len(w.path))
	for i, e := range w.path {
		if e.isIdx {
			out[i] = strconv.Itoa(e.index)
		} else {
			out[i] = e.key
		}
	}
	return out
}

// jsonStringLen is the length of s as a JSON string literal.
func jsonStringLen(s string) int {
	n := len(s) + 2
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t':
			n++
		case c < 0x20:
			n += 5
		}
	}
	return n
}
