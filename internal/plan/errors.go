package plan

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

var (
	// ErrInvalidPlan is matched by errors.Is for every error [Validate]
	// returns because of the plan's content (a [*ValidationError]).
	ErrInvalidPlan = errors.New("invalid plan")
	// ErrInvalidArgs is matched by errors.Is for the [*ValidationError]
	// returned by [ValidateArgs] and [SchemaCache.Validate] when arguments do
	// not satisfy the tool's schema.
	ErrInvalidArgs = errors.New("invalid arguments")
)

// Problem is one reason a plan or a set of arguments is invalid.
type Problem struct {
	// Step is the id of the offending step; empty for plan-level problems and
	// for steps without an id (Field then starts with "steps[<index>]").
	Step string
	// Field is the offending field: "depends_on", "expect", "args.to[1]",
	// "confidence", "answer". Argument paths use the StepError.field syntax.
	Field string
	// Message says what is wrong and quotes the offending value.
	Message string
}

// String renders the problem as `step "send": args.to: expected array, got
// string "x"`, leaving out the parts that are empty.
func (p Problem) String() string {
	var b strings.Builder
	if p.Step != "" {
		b.WriteString("step ")
		b.WriteString(strconv.Quote(p.Step))
		b.WriteString(": ")
	}
	if p.Field != "" {
		b.WriteString(p.Field)
		b.WriteString(": ")
	}
	b.WriteString(p.Message)
	return b.String()
}

// ValidationError lists every problem found in one validation. errors.Is
// matches it against [ErrInvalidPlan] (from [Validate]) or [ErrInvalidArgs]
// (from [ValidateArgs]).
type ValidationError struct {
	// Problems in a deterministic order: plan-level checks, then each step
	// in plan order, then dependency cycles and the answer.
	Problems []Problem

	// kind is ErrInvalidArgs for argument validation; nil means
	// ErrInvalidPlan, so a ValidationError built by a caller is a plan error.
	kind error
}

func (e *ValidationError) sentinel() error {
	if e.kind != nil {
		return e.kind
	}
	return ErrInvalidPlan
}

// Error joins the problems: "invalid plan: <problem>; <problem>".
func (e *ValidationError) Error() string {
	var b strings.Builder
	b.WriteString(e.sentinel().Error())
	for i, p := range e.Problems {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// Is reports whether target is the sentinel this error belongs to.
func (e *ValidationError) Is(target error) bool {
	return target == e.sentinel()
}

// EvalError is an expression that could not be evaluated at run time: a
// missing output key, a type error, a cost limit. The engine fails the step
// (for arguments with ERROR_CODE_INVALID_ARGUMENT and Field as
// StepError.field).
type EvalError struct {
	// Field holds the expression: "args.to[0]", "expect" or "answer".
	Field string
	// Expr is the CEL expression without the "${{ }}" delimiters.
	Expr string
	// Err is the cause.
	Err error
}

// Error renders "args.to: ${{ steps.a.output.x }}: no such key: x" for
// references and "expect: output.ok: no such key: ok" otherwise.
func (e *EvalError) Error() string {
	if strings.HasPrefix(e.Field, "args") {
		return fmt.Sprintf("%s: ${{ %s }}: %v", e.Field, e.Expr, e.Err)
	}
	return fmt.Sprintf("%s: %s: %v", e.Field, e.Expr, e.Err)
}

// Unwrap returns the cause.
func (e *EvalError) Unwrap() error { return e.Err }
