package plan

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/ext"
)

const (
	// maxEvalCost bounds one evaluation (CEL cost units, roughly one per
	// visited value), so a runaway comprehension cannot stall the engine.
	maxEvalCost = 10_000_000
	// maxPrograms bounds the program cache.
	maxPrograms = 4096
)

// exprKind selects the variables an expression sees.
type exprKind uint8

const (
	// kindRun: goal, inputs, steps (references and the plan's answer).
	kindRun exprKind = iota
	// kindExpect: output, args.
	kindExpect
)

// compiled is a cached compilation result, successful or not.
type compiled struct {
	prg cel.Program
	out *cel.Type
	// steps lists the ids used as steps.<id>.output, sorted and unique.
	steps []string
	// misuse is non-empty when `steps` is used other than steps.<id>.output.
	misuse string
	err    error
}

type envs struct {
	run, expect *cel.Env
}

// celEnvs builds the two CEL environments once, on first use.
var celEnvs = sync.OnceValues(func() (*envs, error) {
	common := []cel.EnvOption{
		cel.CrossTypeNumericComparisons(true),
		cel.OptionalTypes(),
		ext.Strings(),
		ext.Encoders(),
		ext.Math(),
		ext.Lists(),
		ext.Sets(),
	}
	run, err := cel.NewEnv(append(slices.Clip(common),
		cel.Variable("goal", cel.StringType),
		cel.Variable("inputs", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("steps", cel.MapType(cel.StringType, cel.DynType)),
	)...)
	if err != nil {
		return nil, fmt.Errorf("cel environment: %w", err)
	}
	expect, err := cel.NewEnv(append(slices.Clip(common),
		cel.Variable("output", cel.DynType),
		cel.Variable("args", cel.MapType(cel.StringType, cel.DynType)),
	)...)
	if err != nil {
		return nil, fmt.Errorf("cel expect environment: %w", err)
	}
	return &envs{run: run, expect: expect}, nil
})

type progKey struct {
	kind exprKind
	expr string
}

// progCache is a bounded two-generation cache: lookups hit the current
// generation or promote from the previous one; when the current generation
// is full it becomes the previous one, so the least recently used half is
// dropped in one step and the size stays below maxPrograms.
type progCache struct {
	mu       sync.RWMutex
	cur, old map[progKey]*compiled
	limit    int
}

var programs = &progCache{limit: maxPrograms / 2}

func (c *progCache) get(k progKey) *compiled {
	c.mu.RLock()
	p := c.cur[k]
	c.mu.RUnlock()
	if p != nil {
		return p
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if p = c.cur[k]; p == nil {
		if p = c.old[k]; p != nil {
			c.putLocked(k, p)
		}
	}
	return p
}

func (c *progCache) put(k progKey, p *compiled) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(k, p)
}

func (c *progCache) putLocked(k progKey, p *compiled) {
	if c.cur == nil || len(c.cur) >= c.limit {
		c.old, c.cur = c.cur, make(map[progKey]*compiled, c.limit)
	}
	c.cur[k] = p
}

// compile returns the cached compilation of expr for kind, compiling it on a
// miss. Compilation errors are cached as well.
func compile(kind exprKind, expr string) *compiled {
	k := progKey{kind, expr}
	if p := programs.get(k); p != nil {
		return p
	}
	p := compileUncached(kind, expr)
	programs.put(k, p)
	return p
}

func compileUncached(kind exprKind, expr string) *compiled {
	e, err := celEnvs()
	if err != nil {
		return &compiled{err: err}
	}
	env := e.run
	if kind == kindExpect {
		env = e.expect
	}
	a, iss := env.Compile(expr)
	if iss != nil && iss.Err() != nil {
		return &compiled{err: issuesError(iss)}
	}
	prg, err := env.Program(a, cel.EvalOptions(cel.OptOptimize), cel.CostLimit(maxEvalCost))
	if err != nil {
		return &compiled{err: fmt.Errorf("program: %w", err)}
	}
	c := &compiled{prg: prg, out: a.OutputType()}
	if kind == kindRun {
		c.steps, c.misuse = stepRefs(a.NativeRep())
	}
	return c
}

// issuesError condenses CEL issues to one line per error, without the source
// excerpt CEL prints by default.
func issuesError(iss *cel.Issues) error {
	var b strings.Builder
	for i, e := range iss.Errors() {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%d:%d: %s", e.Location.Line(), e.Location.Column()+1, e.Message)
	}
	return errors.New(b.String())
}

// stepRefs lists the step ids an expression reads as steps.<id>.output and
// describes the first use of `steps` in any other shape.
func stepRefs(a *ast.AST) (ids []string, misuse string) {
	root := ast.NavigateAST(a)
	uses := ast.MatchDescendants(root, func(e ast.NavigableExpr) bool {
		return e.Kind() == ast.IdentKind && e.AsIdent() == "steps" && !shadowed(e)
	})
	for _, use := range uses {
		id, idNode, ok := member(use)
		if !ok {
			return ids, "steps may only be used as steps.<id>.output"
		}
		field, _, ok := member(idNode)
		if !ok || field != "output" {
			return ids, fmt.Sprintf("steps.%s may only be used as steps.%s.output", id, id)
		}
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, ""
}

// member returns the constant field or key selected from e by its parent
// (e.f, e["f"], e.?f, e[?"f"]) and the parent node.
func member(e ast.NavigableExpr) (string, ast.NavigableExpr, bool) {
	p, ok := e.Parent()
	if !ok {
		return "", nil, false
	}
	switch p.Kind() {
	case ast.SelectKind:
		s := p.AsSelect()
		if s.Operand().ID() == e.ID() && !s.IsTestOnly() {
			return s.FieldName(), p, true
		}
		// has(steps.a.output) tests presence without reading further.
		if s.Operand().ID() == e.ID() && s.FieldName() == "output" {
			return s.FieldName(), p, true
		}
	case ast.CallKind:
		c := p.AsCall()
		switch c.FunctionName() {
		case operators.Index, operators.OptIndex, operators.OptSelect:
			args := c.Args()
			if len(args) == 2 && args[0].ID() == e.ID() && args[1].Kind() == ast.LiteralKind {
				if s, ok := args[1].AsLiteral().(types.String); ok {
					return string(s), p, true
				}
			}
		}
	}
	return "", nil, false
}

// shadowed reports whether an identifier `steps` names a comprehension
// variable (for example in [1].map(steps, steps + 1)) rather than the
// plan's steps.
func shadowed(e ast.NavigableExpr) bool {
	for p, ok := e.Parent(); ok; p, ok = p.Parent() {
		if p.Kind() != ast.ComprehensionKind {
			continue
		}
		c := p.AsComprehension()
		if c.IterVar() == "steps" || c.AccuVar() == "steps" || (c.HasIterVar2() && c.IterVar2() == "steps") {
			return true
		}
	}
	return false
}
