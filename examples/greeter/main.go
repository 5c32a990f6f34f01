// Command greeter is an out-of-tree planex executor pool: a separate Go
// module that depends on planex and serves one custom tool, greeter.hello,
// through the executor runtime (services/executor/runner): validation,
// timeouts, heartbeats, retries and the tool catalog come with it.
//
//	go run . --nats-url nats://127.0.0.1:4222
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/executor/runner"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "greeter:", err)
		os.Exit(1)
	}
}

func run() error {
	natsURL := flag.String("nats-url", "nats://127.0.0.1:4222", "NATS server of the planex deployment")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))

	tool, err := helloTool()
	if err != nil {
		return err
	}
	logger.Info("greeter serving", "tool", tool.Spec().GetName())
	return runner.Serve(ctx, *natsURL, runner.Options{Pool: "greeter", Tools: []runner.Tool{tool}, Logger: logger})
}

// helloTool greets someone; it reads nothing and changes nothing.
func helloTool() (runner.Tool, error) {
	var b runner.SchemaBuilder
	spec := &planexv1.ToolSpec{
		Name:        "greeter.hello",
		Pool:        "greeter",
		Description: "Greets a person by name. Returns {greeting}.",
		SideEffect:  planexv1.SideEffect_SIDE_EFFECT_READ,
		Idempotent:  true,
		Version:     "1.0.0",
		ArgsSchema: b.Of(map[string]any{
			"type":                 "object",
			"required":             []any{"name"},
			"additionalProperties": false,
			"properties": map[string]any{
				"name": map[string]any{"type": "string", "minLength": 1, "maxLength": 100},
			},
		}),
		OutputSchema: b.Of(map[string]any{
			"type":       "object",
			"properties": map[string]any{"greeting": map[string]any{"type": "string"}},
		}),
	}
	if b.Err != nil {
		return nil, b.Err
	}
	return runner.NewTool(spec, func(_ context.Context, c runner.Call) (any, error) {
		name := strings.TrimSpace(c.Args.GetFields()["name"].GetStringValue())
		return map[string]any{"greeting": "Hello, " + name + "!"}, nil
	}), nil
}
