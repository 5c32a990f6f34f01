package executor_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/demo"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/stepsign"
	"github.com/planex-dev/planex/internal/tlsconfig"
	"github.com/planex-dev/planex/services/executor"
	"github.com/planex-dev/planex/services/executor/runner/runnertest"
)

// signedFixture is a demo SQLite database, a trusted signing key and an
// untrusted one, and a metric reader for planex.executor.steps.refused.
type signedFixture struct {
	dir, dbPath      string
	signer, attacker *stepsign.Signer
	reader           *sdkmetric.ManualReader
	n                int
}

func newSignedFixture(t *testing.T, ctx context.Context) *signedFixture {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	prev := otel.GetMeterProvider()
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	t.Cleanup(func() { otel.SetMeterProvider(prev) })
	f := &signedFixture{dir: t.TempDir(), reader: reader}
	f.dbPath = filepath.Join(f.dir, "demo.db")
	if err := demo.GenerateDB(ctx, f.dbPath); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+f.dbPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE hits (n int)"); err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	for _, k := range []string{"signing", "attacker"} {
		if _, err := stepsign.GenerateKeyFiles(filepath.Join(f.dir, k+".key"), filepath.Join(f.dir, k+"-pub")); err != nil {
			t.Fatal(err)
		}
	}
	if f.signer, err = stepsign.LoadSigner(filepath.Join(f.dir, "signing.key")); err != nil {
		t.Fatal(err)
	}
	if f.attacker, err = stepsign.LoadSigner(filepath.Join(f.dir, "attacker.key")); err != nil {
		t.Fatal(err)
	}
	return f
}

// step encodes a new step of run "signed" running sqlText with tool.
func (f *signedFixture) step(t *testing.T, tool, sqlText string) (subject string, data []byte) {
	t.Helper()
	f.n++
	args, _ := structpb.NewStruct(map[string]any{"sql": sqlText})
	data, err := proto.Marshal(&planexv1.StepRequest{RunId: "signed", StepId: "s" + strconv.Itoa(f.n), Attempt: 1, PlanRevision: 1,
		Tool: tool, Args: args, Deadline: timestamppb.New(time.Now().Add(time.Minute))})
	if err != nil {
		t.Fatal(err)
	}
	subject, _ = bus.StepSubject(tool)
	return subject, data
}

func (f *signedFixture) hits(t *testing.T) int {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+f.dbPath+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM hits").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (f *signedFixture) waitRefused(t *testing.T, reason string, want int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for refusedCount(t, f.reader, reason) < want {
		if time.Now().After(deadline) {
			t.Fatalf("refused{reason=%s} = %d, want %d", reason, refusedCount(t, f.reader, reason), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReplayToAnotherReplicaIsRefused: replica A of the sql pool runs a
// signed step; the same message published again lands on replica B, whose
// in-memory cache never saw it, and is refused through the shared replay
// bucket. With the bucket gone the next step is neither run nor refused
// for good: it waits (nak) and runs once the bucket is back.
func TestReplayToAnotherReplicaIsRefused(t *testing.T) {
	ns := natstest.Start(t)
	_, res := ns.Setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f := newSignedFixture(t, ctx)
	replica := func() func() error {
		var cfg executor.Config
		fs := pflag.NewFlagSet("executor", pflag.ContinueOnError)
		cfg.RegisterFlags(fs)
		if err := fs.Parse([]string{"--plaintext", "--auth-disabled", "--pool", "sql", "--sql-dsn", "sqlite://" + f.dbPath,
			"--grpc-addr", "127.0.0.1:0", "--nats-url", ns.URL(), "--ack-wait", "2s", "--step-verify-keys", filepath.Join(f.dir, "signing-pub")}); err != nil {
			t.Fatal(err)
		}
		_, stop := serve(t, ctx, cfg)
		return stop
	}
	publish := func(subject string, data []byte, h nats.Header, id string) {
		t.Helper()
		msg := nats.NewMsg(subject)
		msg.Data = data
		for k, v := range h {
			msg.Header[k] = v
		}
		msg.Header.Set(nats.MsgIdHdr, id)
		if _, err := res.JS.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	results := runnertest.Results(t, ctx, res, "signed")
	approval := "gate=g1;decision=approve;by=apikey:alice"

	stopA := replica()
	subject, data := f.step(t, "sql.exec", "INSERT INTO hits VALUES (1)")
	h := f.signer.Sign(subject, data, time.Now().Add(time.Minute), approval)
	publish(subject, data, h, "first")
	if r := runnertest.NextResult(t, ctx, results); r.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
		t.Fatalf("signed step on replica A: %v", r)
	}
	if err := stopA(); err != nil {
		t.Fatalf("replica A: %v", err)
	}

	stopB := replica()
	defer func() {
		if err := stopB(); err != nil {
			t.Errorf("replica B: %v", err)
		}
	}()
	publish(subject, data, h, "replayed")
	f.waitRefused(t, "replayed", 1)
	if n := f.hits(t); n != 1 {
		t.Fatalf("hits has %d rows after the replay, want 1", n)
	}

	// Fail closed: no replay bucket, no execution; the message waits.
	if err := res.JS.DeleteKeyValue(ctx, stepsign.ReplayBucket); err != nil {
		t.Fatal(err)
	}
	subject, data = f.step(t, "sql.exec", "INSERT INTO hits VALUES (2)")
	publish(subject, data, f.signer.Sign(subject, data, time.Now().Add(time.Minute), approval), "while-down")
	f.waitRefused(t, "replay_cache_unavailable", 2) // delivered at least twice: nak'd, not terminated
	if n := f.hits(t); n != 1 {
		t.Fatalf("a step ran while the replay bucket was unreachable (hits = %d)", n)
	}
	if _, err := stepsign.OpenSharedReplays(ctx, res.JS, "sql", 1); err != nil {
		t.Fatal(err)
	}
	if r := runnertest.NextResult(t, ctx, results); r.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
		t.Fatalf("step after the replay bucket came back: %v", r)
	}
	if n := f.hits(t); n != 2 {
		t.Fatalf("hits = %d after the bucket came back, want 2", n)
	}
}

// TestExecuteSignedOrAdmin: with --grpc-execute, Execute (over TLS, API
// keys) needs credentials, then either the admin role or a step the
// supervisor signed. Unsigned from a viewer, an untrusted key, a tampered
// payload, a gated tool without approval, and a signature used twice (by
// Execute or by the queue) are refused and run nothing.
func TestExecuteSignedOrAdmin(t *testing.T) {
	ns := natstest.Start(t)
	_, res := ns.Setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := newSignedFixture(t, ctx)

	ca, err := tlsconfig.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(f.dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	srvFiles, err := ca.IssueFiles(f.dir, "executor", caFile, tlsconfig.Leaf{CommonName: "executor-sql", Hosts: []string{"127.0.0.1"}, Server: true})
	if err != nil {
		t.Fatal(err)
	}
	viewerKey, viewerLine, _ := authn.GenerateAPIKey("bob", authn.RoleViewer)
	adminKey, adminLine, _ := authn.GenerateAPIKey("root", authn.RoleAdmin)
	keysFile := filepath.Join(f.dir, "api-keys")
	if err := os.WriteFile(keysFile, []byte(viewerLine+"\n"+adminLine+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var cfg executor.Config
	fs := pflag.NewFlagSet("executor", pflag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse([]string{"--tls-cert-file", srvFiles.CertFile, "--tls-key-file", srvFiles.KeyFile, "--tls-ca-file", caFile,
		"--auth-api-keys-file", keysFile, "--grpc-execute", "--pool", "sql", "--sql-dsn", "sqlite://" + f.dbPath,
		"--grpc-addr", "127.0.0.1:0", "--nats-url", ns.URL(), "--ack-wait", "2s", "--step-verify-keys", filepath.Join(f.dir, "signing-pub")}); err != nil {
		t.Fatal(err)
	}
	addr, stop := serve(t, ctx, cfg)
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	tc, err := tlsconfig.Flags{Files: tlsconfig.Files{CAFile: caFile}}.ClientCredentials("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	client := func(token string) planexv1.ExecutorServiceClient {
		opts := []grpc.DialOption{grpc.WithTransportCredentials(tc)}
		if token != "" {
			opts = append(opts, grpc.WithPerRPCCredentials(credentials.PerRPCCredentials(authn.Bearer(token))))
		}
		conn, err := grpc.NewClient(addr.String(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return planexv1.NewExecutorServiceClient(conn)
	}
	anon, viewer, admin := client(""), client(viewerKey), client(adminKey)
	approval := "gate=g1;decision=approve;by=apikey:alice"
	soon := time.Now().Add(time.Minute)
	signedReq := func(signer *stepsign.Signer, subject string, data []byte, approval string) *planexv1.ExecuteRequest {
		h := signer.Sign(subject, data, soon, approval)
		exp, _ := strconv.ParseInt(h.Get(stepsign.HeaderExpires), 10, 64)
		return &planexv1.ExecuteRequest{Signed: &planexv1.ExecuteSignedStep{Subject: subject, Payload: data, KeyId: h.Get(stepsign.HeaderKeyID),
			ExpiresUnixMs: exp, Approval: h.Get(stepsign.HeaderApproval), Signature: h.Get(stepsign.HeaderSignature)}}
	}
	unsigned := func(sqlText string) *planexv1.ExecuteRequest {
		_, data := f.step(t, "sql.exec", sqlText)
		step := &planexv1.StepRequest{}
		_ = proto.Unmarshal(data, step)
		return &planexv1.ExecuteRequest{Step: step}
	}
	wantCode := func(name string, c planexv1.ExecutorServiceClient, req *planexv1.ExecuteRequest, want codes.Code) {
		t.Helper()
		if _, err := c.Execute(ctx, req); status.Code(err) != want {
			t.Fatalf("%s: %v, want %s", name, err, want)
		}
	}
	succeeded := func(name string, c planexv1.ExecutorServiceClient, req *planexv1.ExecuteRequest) {
		t.Helper()
		resp, err := c.Execute(ctx, req)
		if err != nil || resp.GetResult().GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
			t.Fatalf("%s: %v %v", name, resp.GetResult(), err)
		}
	}

	subject, data := f.step(t, "sql.exec", "INSERT INTO hits VALUES (1)")
	good := signedReq(f.signer, subject, data, approval)
	wantCode("no credentials", anon, good, codes.Unauthenticated)
	wantCode("viewer, unsigned", viewer, unsigned("INSERT INTO hits VALUES (99)"), codes.PermissionDenied)
	wantCode("viewer, untrusted key", viewer, signedReq(f.attacker, subject, data, approval), codes.PermissionDenied)
	f.waitRefused(t, "unknown_key", 1)
	tampered := signedReq(f.signer, subject, data, approval)
	_, tampered.Signed.Payload = f.step(t, "sql.exec", "INSERT INTO hits VALUES (98)")
	wantCode("viewer, tampered payload", viewer, tampered, codes.PermissionDenied)
	s2, d2 := f.step(t, "sql.exec", "INSERT INTO hits VALUES (97)")
	wantCode("viewer, gated tool without approval", viewer, signedReq(f.signer, s2, d2, ""), codes.PermissionDenied)
	f.waitRefused(t, "no_approval", 1)
	mismatch := signedReq(f.signer, subject, data, approval)
	mismatch.Signed.Subject = "planex.steps.sql.query"
	wantCode("subject of another tool", viewer, mismatch, codes.InvalidArgument)
	if n := f.hits(t); n != 0 {
		t.Fatalf("refused Execute calls inserted %d rows", n)
	}

	succeeded("viewer, signed and approved", viewer, good)
	if n := f.hits(t); n != 1 {
		t.Fatalf("hits = %d after the signed Execute, want 1", n)
	}
	wantCode("the same signature again", viewer, good, codes.PermissionDenied)
	f.waitRefused(t, "replayed", 1)
	// The queue refuses what Execute already used.
	msg := nats.NewMsg(subject)
	msg.Data = data
	msg.Header = nats.Header{stepsign.HeaderKeyID: {good.Signed.KeyId}, stepsign.HeaderExpires: {strconv.FormatInt(good.Signed.ExpiresUnixMs, 10)},
		stepsign.HeaderApproval: {approval}, stepsign.HeaderSignature: {good.Signed.Signature}, nats.MsgIdHdr: {"after-execute"}}
	if _, err := res.JS.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	f.waitRefused(t, "replayed", 2)

	succeeded("admin, unsigned", admin, unsigned("INSERT INTO hits VALUES (2)"))
	if n := f.hits(t); n != 2 {
		t.Fatalf("hits = %d after the admin's Execute, want 2", n)
	}
	if _, err := viewer.Execute(ctx, &planexv1.ExecuteRequest{Step: unsigned("SELECT 1").GetStep(), Signed: good.Signed}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(status.Convert(err).Message(), "step") {
		t.Fatalf("step and signed together: %v, want InvalidArgument naming step", err)
	}
}
