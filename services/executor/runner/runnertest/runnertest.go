// Package runnertest calls executor tools in tests the way the runner
// does, without JetStream: the arguments are checked against the tool's
// JSON Schema first, and failures come back as *runner.Error. For tests of
// whole replicas it also publishes steps and reads their results the way
// the supervisor does.
package runnertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
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

// PublishStep publishes req on its tool's step subject with the message id
// the supervisor gives it.
func PublishStep(t testing.TB, ctx context.Context, res *bus.Resources, req *planexv1.StepRequest) {
	t.Helper()
	subj, err := bus.StepSubject(req.GetTool())
	if err != nil {
		t.Fatal(err)
	}
	id := bus.MsgID(req.GetRunId(), req.GetStepId(), fmt.Sprint(req.GetAttempt()))
	if _, err := bus.Publish(ctx, res.JS, bus.Publication{Subject: subj, Msg: req, MsgID: id}); err != nil {
		t.Fatalf("publish step %s: %v", id, err)
	}
}

// Results returns a durable consumer of the step results of run on
// PLANEX_ENGINE, standing in for the supervisor.
func Results(t testing.TB, ctx context.Context, res *bus.Resources, runID string) jetstream.Consumer {
	t.Helper()
	cons, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamEngine, jetstream.ConsumerConfig{
		Durable: "test-results-" + runID, FilterSubject: bus.EngineSubject(runID, bus.KindResult), AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	return cons
}

// NextResult waits for the next step result on cons, acknowledges it and
// returns it decoded.
func NextResult(t testing.TB, ctx context.Context, cons jetstream.Consumer) *planexv1.StepResult {
	t.Helper()
	batch, err := cons.Fetch(1, jetstream.FetchContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	m, ok := <-batch.Messages()
	if !ok {
		t.Fatalf("no step result: %v", batch.Error())
	}
	var res planexv1.StepResult
	if err := bus.Decode(bus.NatsMsg(m), &res); err != nil {
		t.Fatal(err)
	}
	_ = m.Ack()
	return &res
}
