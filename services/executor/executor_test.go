package executor_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/demo"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/executor"
)

// defaults returns a Config as the flags leave it.
func defaults(t *testing.T, args ...string) executor.Config {
	t.Helper()
	var c executor.Config
	fs := pflag.NewFlagSet("executor", pflag.ContinueOnError)
	c.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestValidateNamesFlagAndValue(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{name: "no pool", want: `--pool ""`},
		{name: "unknown pool", args: []string{"--pool", "ftp"}, want: `--pool "ftp"`},
		{name: "concurrency", args: []string{"--pool", "search", "--search-index", "x", "--concurrency", "0"}, want: "--concurrency 0"},
		{name: "ack wait", args: []string{"--pool", "search", "--search-index", "x", "--ack-wait", "1ms"}, want: "--ack-wait 1ms"},
		{name: "max deliver", args: []string{"--pool", "search", "--search-index", "x", "--max-deliver", "0"}, want: "--max-deliver 0"},
		{name: "inline above cap", args: []string{"--pool", "search", "--search-index", "x", "--max-output-bytes", "10", "--inline-output-bytes", "20"}, want: "--inline-output-bytes 20"},
		{name: "sql without dsn", args: []string{"--pool", "sql"}, want: "--sql-dsn"},
		{name: "sql bad scheme", args: []string{"--pool", "sql", "--sql-dsn", "mysql://u:pw@h/db"}, want: "--sql-dsn"},
		{name: "sql rows", args: []string{"--pool", "sql", "--sql-dsn", "x.db", "--sql-max-rows", "0"}, want: "--sql-max-rows 0"},
		{name: "search without index", args: []string{"--pool", "search"}, want: "--search-index"},
		{name: "email without drafts", args: []string{"--pool", "email", "--email-outbox", "o"}, want: "--email-drafts-dir"},
		{name: "email without relay", args: []string{"--pool", "email", "--email-drafts-dir", "d"}, want: "--smtp-addr"},
		{name: "email starttls", args: []string{"--pool", "email", "--email-drafts-dir", "d", "--email-outbox", "o", "--smtp-starttls", "maybe"}, want: `--smtp-starttls "maybe"`},
		{name: "email domain", args: []string{"--pool", "email", "--email-drafts-dir", "d", "--email-outbox", "o", "--email-allowed-domains", "example.com,bad domain"}, want: `"bad domain"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := defaults(t, tt.args...).Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "pw@") {
				t.Fatalf("error leaks the DSN password: %v", err)
			}
		})
	}
	ok := defaults(t, "--pool", "email", "--email-drafts-dir", "d", "--email-outbox", "o", "--email-allowed-domains", "example.com")
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid dev email config rejected: %v", err)
	}
}

// TestRunServesSQLPool runs the executor service the way cmd/planex does,
// on the demo SQLite database: it serves Describe over gRPC, registers its
// tools, runs a step from JetStream and deregisters on shutdown.
func TestRunServesSQLPool(t *testing.T) {
	ns := natstest.Start(t)
	_, res := ns.Setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dbPath := filepath.Join(t.TempDir(), "demo.db")
	if err := demo.GenerateDB(ctx, dbPath); err != nil {
		t.Fatal(err)
	}
	cfg := defaults(t, "--pool", "sql", "--sql-dsn", "sqlite://"+dbPath, "--grpc-addr", "127.0.0.1:0", "--nats-url", ns.URL(), "--ack-wait", "2s")
	ready := make(chan net.Addr, 1)
	cfg.OnReady = func(a net.Addr) { ready <- a }
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- executor.Run(runCtx, cfg, natstest.Logger(t), nil) }()

	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("Run returned before ready: %v", err)
	case <-ctx.Done():
		t.Fatal("executor never became ready")
	}
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	desc, err := planexv1.NewExecutorServiceClient(conn).Describe(ctx, &planexv1.DescribeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range desc.GetTools() {
		names = append(names, s.GetName())
	}
	if desc.GetPool() != "sql" || strings.Join(names, ",") != "sql.exec,sql.query,sql.schema" || desc.GetExecutorId() == "" {
		t.Fatalf("Describe = %v", desc)
	}
	toolKey := bus.ToolKey("sql.query", desc.GetExecutorId())
	if _, err := res.Tools.Get(ctx, toolKey); err != nil {
		t.Fatalf("sql.query not registered: %v", err)
	}

	cons, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamEngine, jetstream.ConsumerConfig{
		Durable: "test", FilterSubject: bus.EngineSubject("run1", bus.KindResult), AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	args, _ := structpb.NewStruct(map[string]any{"sql": "SELECT count(*) AS n FROM customers"})
	req := &planexv1.StepRequest{RunId: "run1", StepId: "count", Attempt: 1, PlanRevision: 1, Tool: "sql.query", Args: args}
	if _, err := bus.Publish(ctx, res.JS, bus.Publication{Subject: "planex.steps.sql.query", Msg: req, MsgID: "run1:count:1"}); err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	var got planexv1.StepResult
	for m := range batch.Messages() {
		if err := bus.Decode(bus.NatsMsg(m), &got); err != nil {
			t.Fatal(err)
		}
	}
	rows := got.GetOutput().GetStructValue().GetFields()["rows"].GetListValue().GetValues()
	if got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED || len(rows) != 1 || rows[0].GetListValue().GetValues()[0].GetNumberValue() <= 0 {
		t.Fatalf("result %v", &got)
	}

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Run did not return after cancellation")
	}
	if _, err := res.Tools.Get(ctx, toolKey); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("registration left after shutdown: %v", err)
	}
}
