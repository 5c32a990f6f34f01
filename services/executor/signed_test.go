package executor_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/demo"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/stepsign"
	"github.com/planex-dev/planex/internal/telemetry/metrictest"
	"github.com/planex-dev/planex/services/executor"
	"github.com/planex-dev/planex/services/executor/runner/runnertest"
)

// refusedCount reads planex.executor.steps.refused{reason}.
func refusedCount(t *testing.T, reader *sdkmetric.ManualReader, reason string) int64 {
	return metrictest.Sum(t, reader, "planex.executor.steps.refused", attribute.String("reason", reason))
}

func tableExists(t *testing.T, dbPath, name string) bool {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+dbPath+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM sqlite_master WHERE type='table' AND name=?", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// TestForgedStepsAreRefused reproduces the attacks on
// planex.steps.sql.exec against a pool that verifies signatures: unsigned,
// signed by an untrusted key, tampered, expired, gated without approval and
// replayed requests execute nothing and are counted by reason; a correctly
// signed and approved request runs.
func TestForgedStepsAreRefused(t *testing.T) {
	reader := metrictest.Global(t)

	ns := natstest.Start(t)
	_, res := ns.Setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "demo.db")
	if err := demo.GenerateDB(ctx, dbPath); err != nil {
		t.Fatal(err)
	}
	if _, err := stepsign.GenerateKeyFiles(filepath.Join(dir, "signing.key"), filepath.Join(dir, "trusted")); err != nil {
		t.Fatal(err)
	}
	if _, err := stepsign.GenerateKeyFiles(filepath.Join(dir, "attacker.key"), filepath.Join(dir, "untrusted")); err != nil {
		t.Fatal(err)
	}
	signer, err := stepsign.LoadSigner(filepath.Join(dir, "signing.key"))
	if err != nil {
		t.Fatal(err)
	}
	attacker, err := stepsign.LoadSigner(filepath.Join(dir, "attacker.key"))
	if err != nil {
		t.Fatal(err)
	}

	var cfg executor.Config
	fs := pflag.NewFlagSet("executor", pflag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse([]string{"--plaintext", "--auth-disabled", "--pool", "sql", "--sql-dsn", "sqlite://" + dbPath,
		"--grpc-addr", "127.0.0.1:0", "--nats-url", ns.URL(), "--ack-wait", "2s", "--step-verify-keys", filepath.Join(dir, "trusted")}); err != nil {
		t.Fatal(err)
	}
	_, stop := serve(t, ctx, cfg)
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	n := 0
	encode := func(tool, sqlText string) (string, []byte) {
		n++
		args, _ := structpb.NewStruct(map[string]any{"sql": sqlText})
		data, err := proto.Marshal(&planexv1.StepRequest{RunId: "forged", StepId: "s" + strconv.Itoa(n), Attempt: 1, PlanRevision: 1,
			Tool: tool, Args: args, Deadline: timestamppb.New(time.Now().Add(time.Minute))})
		if err != nil {
			t.Fatal(err)
		}
		subj, _ := bus.StepSubject(tool)
		return subj, data
	}
	publish := func(subj string, data []byte, h nats.Header) {
		t.Helper()
		msg := nats.NewMsg(subj)
		msg.Data = data
		for k, v := range h {
			msg.Header[k] = v
		}
		msg.Header.Set(nats.MsgIdHdr, "forged-"+strconv.Itoa(n)+"-"+strconv.FormatInt(time.Now().UnixNano(), 10))
		if _, err := res.JS.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	waitRefused := func(reason string, want int64) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for refusedCount(t, reader, reason) < want {
			if time.Now().After(deadline) {
				t.Fatalf("refused{reason=%s} = %d, want %d", reason, refusedCount(t, reader, reason), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	approval := "gate=g1;decision=approve;by=apikey:alice"
	soon := time.Now().Add(time.Minute)

	subj, data := encode("sql.exec", "CREATE TABLE unsigned_t (x int)")
	publish(subj, data, nil)
	waitRefused("unsigned", 1)

	subj, data = encode("sql.exec", "CREATE TABLE wrongkey_t (x int)")
	publish(subj, data, attacker.Sign(subj, data, soon, approval))
	waitRefused("unknown_key", 1)

	subj, data = encode("sql.exec", "SELECT 1")
	h := signer.Sign(subj, data, soon, approval)
	_, tampered := encode("sql.exec", "CREATE TABLE tampered_t (x int)")
	publish(subj, tampered, h)
	waitRefused("bad_signature", 1)

	subj, data = encode("sql.exec", "CREATE TABLE expired_t (x int)")
	publish(subj, data, signer.Sign(subj, data, time.Now().Add(-time.Second), approval))
	waitRefused("expired", 1)

	subj, data = encode("sql.exec", "CREATE TABLE unapproved_t (x int)")
	publish(subj, data, signer.Sign(subj, data, soon, ""))
	waitRefused("no_approval", 1)

	// A correctly signed, approved request runs; the same message
	// published again (another message id) is a replay.
	results := runnertest.Results(t, ctx, res, "forged")
	subj, data = encode("sql.exec", "CREATE TABLE approved_t (x int)")
	h = signer.Sign(subj, data, soon, approval)
	publish(subj, data, h)
	if r := runnertest.NextResult(t, ctx, results); r.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
		t.Fatalf("signed and approved step: %v", r)
	}
	if !tableExists(t, dbPath, "approved_t") {
		t.Fatal("the signed, approved step did not run")
	}
	if _, err := res.JS.PublishMsg(ctx, &nats.Msg{Subject: subj, Data: data, Header: nats.Header{
		stepsign.HeaderSignature: h.Values(stepsign.HeaderSignature), stepsign.HeaderKeyID: h.Values(stepsign.HeaderKeyID),
		stepsign.HeaderExpires: h.Values(stepsign.HeaderExpires), stepsign.HeaderApproval: h.Values(stepsign.HeaderApproval),
		nats.MsgIdHdr: {"replay-1"}}}); err != nil {
		t.Fatal(err)
	}
	waitRefused("replayed", 1)

	// On NATS 2.11+ a step also arrives as the run log's decision that
	// dispatches it: the signature covers that message, checked the same.
	decision := func(sqlText string) (string, []byte) {
		n++
		args, _ := structpb.NewStruct(map[string]any{"sql": sqlText})
		data, err := proto.Marshal(&planexv1.RunEvent{RunId: "forged", Sequence: uint64(n), Time: timestamppb.Now(),
			Payload: &planexv1.RunEvent_StepDispatched{StepDispatched: &planexv1.StepDispatched{
				StepId: "s" + strconv.Itoa(n), Attempt: 1, PlanRevision: 1, Tool: "sql.exec", ResolvedArgs: args,
				Deadline: timestamppb.New(time.Now().Add(time.Minute)), StartToCloseTimeout: durationpb.New(30 * time.Second)}}})
		if err != nil {
			t.Fatal(err)
		}
		return bus.DispatchSubject("forged", "sql"), data
	}
	eventType := nats.Header{bus.HeaderContentType: {string((&planexv1.RunEvent{}).ProtoReflect().Descriptor().FullName())}}
	withType := func(h nats.Header) nats.Header {
		out := nats.Header{}
		for k, v := range h {
			out[k] = v
		}
		for k, v := range eventType {
			out[k] = v
		}
		return out
	}
	subj, data = decision("CREATE TABLE unsigned_decision_t (x int)")
	publish(subj, data, eventType)
	waitRefused("unsigned", 2)
	subj, data = decision("SELECT 1")
	h = signer.Sign(subj, data, soon, approval)
	_, tampered = decision("CREATE TABLE tampered_decision_t (x int)")
	publish(subj, tampered, withType(h))
	waitRefused("bad_signature", 2)
	subj, data = decision("CREATE TABLE signed_decision_t (x int)")
	publish(subj, data, withType(signer.Sign(subj, data, soon, approval)))
	if r := runnertest.NextResult(t, ctx, results); r.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
		t.Fatalf("signed decision dispatching an approved step: %v", r)
	}
	if !tableExists(t, dbPath, "signed_decision_t") {
		t.Fatal("the signed decision's step did not run")
	}

	for _, table := range []string{"unsigned_t", "wrongkey_t", "tampered_t", "expired_t", "unapproved_t", "unsigned_decision_t", "tampered_decision_t"} {
		if tableExists(t, dbPath, table) {
			t.Errorf("forged step created table %s", table)
		}
	}
	info, err := res.JS.Stream(ctx, bus.StreamSteps)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := info.Info(ctx); err != nil || st.State.Msgs != 0 {
		t.Fatalf("steps left in %s: %v (%v); refused requests must be terminated", bus.StreamSteps, st.State.Msgs, err)
	}
}

// TestExecuteOffByDefault: ExecutorService.Execute runs a step without the
// supervisor's gates, so it is refused unless --grpc-execute — even to an
// admin (here: authentication disabled, every caller admin).
func TestExecuteOffByDefault(t *testing.T) {
	ns := natstest.Start(t)
	ns.Setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dbPath := filepath.Join(t.TempDir(), "demo.db")
	if err := demo.GenerateDB(ctx, dbPath); err != nil {
		t.Fatal(err)
	}
	addr, stop := serve(t, ctx, defaults(t, "--pool", "sql", "--sql-dsn", "sqlite://"+dbPath, "--grpc-addr", "127.0.0.1:0", "--nats-url", ns.URL()))
	defer func() { _ = stop() }()
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := planexv1.NewExecutorServiceClient(conn)
	if _, err := c.Describe(ctx, &planexv1.DescribeRequest{}); err != nil {
		t.Fatalf("Describe: %v", err)
	}
	args, _ := structpb.NewStruct(map[string]any{"sql": "CREATE TABLE direct_t (x int)"})
	_, err = c.Execute(ctx, &planexv1.ExecuteRequest{Step: &planexv1.StepRequest{RunId: "r", StepId: "s", Attempt: 1, Tool: "sql.exec", Args: args}})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Execute without --grpc-execute: %v, want PermissionDenied", err)
	}
	if tableExists(t, dbPath, "direct_t") {
		t.Fatal("Execute ran the statement")
	}
}
