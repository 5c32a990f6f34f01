// Package runnertest calls executor tools in tests the way the runner
// does, without JetStream: the arguments are checked against the tool's
// JSON Schema first, and failures come back as *runner.Error.
package runnertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/planex-dev/planex/services/executor/runner"
)

// Call runs the tool named name among tools with args. An attempt without
// a run id runs as run "run", step "step", attempt 1. It fails the test
// when the tool does not exist or returns an error that is not a
// *runner.Error.
func Call(t testing.TB, tools []runner.Tool, name string, c runner.Call, args map[string]any) (any, *runner.Error) {
	t.Helper()
	a, err := structpb.NewStruct(args)
	if err != nil {
		t.Fatalf("args of %s: %v", name, err)
	}
	c.Args = a
	if c.RunID == "" {
		c.RunID, c.StepID, c.Attempt = "run", "step", 1
	}
	for _, tool := range tools {
		if tool.Spec().GetName() != name {
			continue
		}
		if terr := runner.CheckArgs(tool.Spec(), a); terr != nil {
			return nil, terr
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := tool.Run(ctx, c)
		if err == nil {
			return out, nil
		}
		var te *runner.Error
		if !errors.As(err, &te) {
			t.Fatalf("%s returned an unclassified error: %v", name, err)
		}
		return nil, te
	}
	t.Fatalf("no tool %s", name)
	return nil, nil
}

// Context returns a context that ends after 30 seconds or with the test.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
