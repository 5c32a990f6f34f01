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
	"github.com/planex-dev/planex/services/executor/emailpool"
	"github.com/planex-dev/planex/services/executor/runner/runnertest"
)

// defaults returns a Config as the flags leave it.
func defaults(t *testing.T, args ...string) executor.Config {
	t.Helper()
	var c executor.Config
	fs := pflag.NewFlagSet("executor", pflag.ContinueOnError)
	c.RegisterFlags(fs)
	if err := fs.Parse(append([]string{"--plaintext", "--auth-disabled", "--allow-unsigned-steps"}, args...)); err != nil {
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
		{name: "jetstream call timeout", args: []string{"--pool", "search", "--search-index", "x", "--jetstream-call-timeout", "1ms"}, want: "--jetstream-call-timeout 1ms"},
		{name: "record grace", args: []string{"--pool", "search", "--search-index", "x", "--record-grace", "1s"}, want: "--record-grace 1s"},
		{name: "inline above cap", args: []string{"--pool", "search", "--search-index", "x", "--max-output-bytes", "10", "--inline-output-bytes", "20"}, want: "--inline-output-bytes 20"},
		{name: "sql without dsn", args: []string{"--pool", "sql"}, want: "--sql-dsn"},
		{name: "sql bad scheme", args: []string{"--pool", "sql", "--sql-dsn", "mysql://u:pw@h/db"}, want: "--sql-dsn"},
		{name: "sql rows", args: []string{"--pool", "sql", "--sql-dsn", "x.db", "--sql-max-rows", "0"}, want: "--sql-max-rows 0"},
		{name: "search without index", args: []string{"--pool", "search"}, want: "--search-index"},
		{name: "email without relay", args: []string{"--pool", "email"}, want: "--smtp-addr"},
		{name: "email starttls", args: []string{"--pool", "email", "--email-outbox", "o", "--smtp-starttls", "maybe"}, want: `--smtp-starttls "maybe"`},
		{name: "email domain", args: []string{"--pool", "email", "--email-outbox", "o", "--email-allowed-domains", "example.com,bad domain"}, want: `"bad domain"`},
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
	ok := defaults(t, "--pool", "email", "--email-outbox", "o", "--email-allowed-domains", "example.com")
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid dev email config rejected: %v", err)
	}
}

// serve runs the executor with cfg the way cmd/planex does, until the
// returned stop is called; stop returns Run's error.
func serve(t *testing.T, ctx context.Context, cfg executor.Config) (net.Addr, func() error) {
	t.Helper()
	ready := make(chan net.Addr, 1)
	cfg.OnReady = func(a net.Addr) { ready <- a }
	runCtx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- executor.Run(runCtx, cfg, natstest.Logger(t), nil) }()
	stop := func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			return errors.New("executor.Run did not return after cancellation")
		}
	}
	select {
	case addr := <-ready:
		return addr, stop
	case err := <-done:
		t.Fatalf("Run returned before ready: %v", err)
	case <-ctx.Done():
		t.Fatal("executor never became ready")
	}
	return nil, nil
}

// runStep publishes a step of run "run1" and returns its result.
func runStep(t *testing.T, ctx context.Context, res *bus.Resources, step, tool string, args map[string]any) *planexv1.StepResult {
	t.Helper()
	results := runnertest.Results(t, ctx, res, "run1")
	a, err := structpb.NewStruct(args)
	if err != nil {
		t.Fatal(err)
	}
	runnertest.PublishStep(t, ctx, res, &planexv1.StepRequest{RunId: "run1", StepId: step, Attempt: 1, PlanRevision: 1, Tool: tool, Args: a})
	return runnertest.NextResult(t, ctx, results)
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
	addr, stop := serve(t, ctx, defaults(t, "--pool", "sql", "--sql-dsn", "sqlite://"+dbPath, "--grpc-addr", "127.0.0.1:0", "--nats-url", ns.URL(), "--ack-wait", "2s"))
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

	got := runStep(t, ctx, res, "count", "sql.query", map[string]any{"sql": "SELECT count(*) AS n FROM customers"})
	rows := got.GetOutput().GetStructValue().GetFields()["rows"].GetListValue().GetValues()
	if got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED || len(rows) != 1 || rows[0].GetListValue().GetValues()[0].GetNumberValue() <= 0 {
		t.Fatalf("result %v", got)
	}

	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := res.Tools.Get(ctx, toolKey); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("registration left after shutdown: %v", err)
	}
}

// TestRunServesEmailPool runs the email pool in dev mode: the drafts go
// to the planex-drafts bucket the service set up, and the sent mail into
// the outbox.
func TestRunServesEmailPool(t *testing.T) {
	ns := natstest.Start(t)
	_, res := ns.Setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	outbox := t.TempDir()
	_, stop := serve(t, ctx, defaults(t, "--pool", "email", "--email-outbox", outbox, "--email-allowed-domains", "example.com",
		"--grpc-addr", "127.0.0.1:0", "--nats-url", ns.URL(), "--ack-wait", "2s"))

	drafted := runStep(t, ctx, res, "draft", "email.draft", map[string]any{"to": []any{"ops@example.com"}, "subject": "Backlog", "body": "10k."})
	id := drafted.GetOutput().GetStructValue().GetFields()["draft_id"].GetStringValue()
	if drafted.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED || id == "" {
		t.Fatalf("draft result %v", drafted)
	}
	if _, err := res.Drafts.Get(ctx, id); err != nil {
		t.Fatalf("draft %s not in %s: %v", id, bus.BucketDrafts, err)
	}
	sent := runStep(t, ctx, res, "send", "email.send", map[string]any{"draft_id": id})
	if sent.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
		t.Fatalf("send result %v", sent)
	}
	if msgs, err := emailpool.ListOutbox(outbox); err != nil || len(msgs) != 1 || msgs[0].Subject != "Backlog" {
		t.Fatalf("outbox %v (%v), want the one message", msgs, err)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}
