package runner

import (
	"context"
	"fmt"
	"math"

	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// Tool is one tool of a pool. The runner validates the arguments against
// Spec().ArgsSchema, applies the timeout and the idempotency protocol before
// it calls Run, so Run sees only well-formed arguments of a live attempt.
type Tool interface {
	// Spec describes the tool; it must not change after the runner started.
	Spec() *planexv1.ToolSpec
	// Run performs the call and returns its output: a value that encodes to
	// JSON (maps, slices, strings, numbers, bools, nil, or structs with JSON
	// tags). Failures are returned as *Error where the tool knows the class.
	Run(ctx context.Context, call Call) (any, error)
}

// Call is one invocation of a tool.
type Call struct {
	// RunID, StepID and Attempt identify the attempt; side-effecting tools
	// derive deterministic identifiers (a Message-ID) from them.
	RunID  string
	StepID string
	// Attempt is 1-based.
	Attempt int32
	// Args are the validated arguments.
	Args *structpb.Struct
}

// Truncatable is implemented by outputs made of a list of items (rows,
// hits) that can be cut when the output exceeds the pool's size cap.
type Truncatable interface {
	// Len is the number of items.
	Len() int
	// Cut returns the output keeping the first n items, marked truncated.
	Cut(n int) any
}

// SchemaBuilder turns literal JSON Schemas into the structs a ToolSpec
// carries, keeping the first conversion error for the pool constructor to
// return.
type SchemaBuilder struct {
	// Err is the first error met.
	Err error
}

// Of converts m; on error it records it and returns nil.
func (b *SchemaBuilder) Of(m map[string]any) *structpb.Struct {
	s, err := structpb.NewStruct(m)
	if err != nil && b.Err == nil {
		b.Err = fmt.Errorf("tool schema: %w", err)
	}
	return s
}

// IntArg reads the optional integer argument name, def when it is absent,
// and checks that it lies between lo and hi.
func IntArg(args *structpb.Struct, name string, def, lo, hi int) (int, *Error) {
	v, ok := args.GetFields()[name]
	if !ok {
		return def, nil
	}
	num, isNum := v.GetKind().(*structpb.Value_NumberValue)
	if !isNum {
		return 0, InvalidArgument("args."+name, "want an integer from %d to %d, got a non-number", lo, hi)
	}
	if n := num.NumberValue; n < float64(lo) || n > float64(hi) || n != math.Trunc(n) {
		return 0, InvalidArgument("args."+name, "%v: want an integer from %d to %d", n, lo, hi)
	}
	return int(num.NumberValue), nil
}

// NewTool returns a Tool with a fixed spec that runs run.
func NewTool(spec *planexv1.ToolSpec, run func(ctx context.Context, c Call) (any, error)) Tool {
	return funcTool{spec: spec, run: run}
}

type funcTool struct {
	spec *planexv1.ToolSpec
	run  func(ctx context.Context, c Call) (any, error)
}

func (f funcTool) Spec() *planexv1.ToolSpec { return f.spec }

func (f funcTool) Run(ctx context.Context, c Call) (any, error) { return f.run(ctx, c) }
