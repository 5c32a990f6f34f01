package executor_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/spf13/pflag"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/demo"
	"github.com/planex-dev/planex/internal/natsauth"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/stepsign"
	"github.com/planex-dev/planex/services/executor"
	"github.com/planex-dev/planex/services/executor/runner/runnertest"
)

// writeSeed writes a fresh user nkey seed to <dir>/<tenant>/executor-<pool>.nk.
func writeSeed(t *testing.T, dir, tenant, pool string) string {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	file := executor.TenantSeedFile(dir, tenant, pool)
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

func TestTenantFlagsNameFlagAndValue(t *testing.T) {
	dir := t.TempDir()
	writeSeed(t, dir, "a", "search")
	writeSeed(t, dir, "b", "search")
	garbage := executor.TenantSeedFile(dir, "junk", "search")
	if err := os.MkdirAll(filepath.Dir(garbage), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(garbage, []byte("not a seed"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--pool", "search", "--search-index", "x"}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{name: "invalid tenant", args: []string{"--serve-tenants", "A_b", "--tenant-credentials-dir", dir}, want: `--serve-tenants: tenant "A_b"`},
		{name: "default tenant", args: []string{"--serve-tenants", "default", "--tenant-credentials-dir", dir}, want: `--serve-tenants: tenant "default": reserved`},
		{name: "twice", args: []string{"--serve-tenants", "a,a", "--tenant-credentials-dir", dir}, want: `tenant "a" listed twice`},
		{name: "no credentials dir", args: []string{"--serve-tenants", "a"}, want: "--tenant-credentials-dir: required"},
		{name: "dir without tenants", args: []string{"--tenant-credentials-dir", dir}, want: "--tenant-credentials-dir: set without --serve-tenants"},
		{name: "missing seed", args: []string{"--serve-tenants", "a,c", "--tenant-credentials-dir", dir}, want: `--tenant-credentials-dir: tenant "c": seed file`},
		{name: "bad seed", args: []string{"--serve-tenants", "junk", "--tenant-credentials-dir", dir}, want: `--tenant-credentials-dir: tenant "junk": seed file`},
		{name: "nobody served", args: []string{"--serve-default=false"}, want: "--serve-default=false: needs --serve-tenants"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := defaults(t, append(base, tt.args...)...).Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "not a seed") {
				t.Fatalf("error shows the seed file's content: %v", err)
			}
		})
	}
	for _, args := range [][]string{
		{"--serve-tenants", "a,b", "--tenant-credentials-dir", dir},
		{"--serve-tenants", "a", "--tenant-credentials-dir", dir, "--serve-default=false"},
	} {
		if err := defaults(t, append(base, args...)...).Validate(); err != nil {
			t.Errorf("%v: valid configuration rejected: %v", args, err)
		}
	}
}

// account is one tenant's account as its supervisor sees it.
type account struct {
	tenant string
	res    *bus.Resources
}

func openAccount(t *testing.T, ctx context.Context, ts *natstest.Tenants, tenant string) account {
	t.Helper()
	nc := ts.Connect(t, tenant, natsauth.Supervisor, nil)
	res, err := bus.Setup(ctx, nc, bus.Options{})
	if err != nil {
		t.Fatalf("tenant %s: set up: %v", tenant, err)
	}
	return account{tenant: tenant, res: res}
}

// registrations are the planex-tools keys of the account starting with
// prefix ("<pool>.<verb>.<replica>").
func (a account) registrations(t *testing.T, ctx context.Context, prefix string) []string {
	t.Helper()
	lister, err := a.res.Tools.ListKeys(ctx)
	if err != nil {
		t.Fatalf("tenant %s: list %s: %v", a.tenant, bus.BucketTools, err)
	}
	var out []string
	for k := range lister.Keys() {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	return out
}

// engineMessages counts the messages about run in the account's
// PLANEX_ENGINE (results, started notices): none may be about another
// tenant's run.
func (a account) engineMessages(t *testing.T, ctx context.Context, run string) uint64 {
	t.Helper()
	s, err := a.res.JS.Stream(ctx, bus.StreamEngine)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter("planex.engine."+run+".>"))
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}

// signedStep is a step request as the supervisor signs it.
type signedStep struct {
	subject string
	data    []byte
	header  nats.Header
}

func sign(t *testing.T, nc *nats.Conn, signer *stepsign.Signer, run, step, tool, sqlText string) signedStep {
	t.Helper()
	args, _ := structpb.NewStruct(map[string]any{"sql": sqlText})
	data, err := proto.Marshal(&planexv1.StepRequest{RunId: run, StepId: step, Attempt: 1, PlanRevision: 1, Tool: tool, Args: args,
		Deadline: timestamppb.New(time.Now().Add(time.Minute))})
	if err != nil {
		t.Fatal(err)
	}
	subj, err := bus.StepSubject(tool)
	if err != nil {
		t.Fatal(err)
	}
	if bus.RoutedLogs(nc) {
		// NATS 2.11+: the pool's queue is its consumer on PLANEX_EVENTS
		// (PLANEX_STEPS is only drained now and then).
		subj = bus.RequestSubject(bus.PoolOf(tool))
	}
	return signedStep{subject: subj, data: data, header: signer.Sign(subj, data, time.Now().Add(time.Minute), "gate=g1;decision=approve;by=apikey:alice")}
}

var published int

// publish puts s on the account's step queue under a new message id (as
// the account's supervisor: nobody else may).
func (a account) publish(t *testing.T, ctx context.Context, s signedStep) {
	t.Helper()
	published++
	msg := nats.NewMsg(s.subject)
	msg.Data = s.data
	for k, v := range s.header {
		msg.Header[k] = v
	}
	msg.Header.Set(nats.MsgIdHdr, "tenants-test-"+strconv.Itoa(published))
	if _, err := a.res.JS.PublishMsg(ctx, msg); err != nil {
		t.Fatalf("tenant %s: publish: %v", a.tenant, err)
	}
}

// waitQueueSettled waits until the pool's consumers in the account have
// nothing pending or unacknowledged (a refused step is terminated).
func (a account) waitQueueSettled(t *testing.T, ctx context.Context, pool string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		settled := true
		for _, stream := range []string{bus.StreamEvents, bus.StreamSteps} {
			c, err := a.res.JS.Consumer(ctx, stream, bus.PoolConsumer(pool))
			if err != nil {
				continue // this NATS version's pools use the other stream
			}
			info, err := c.Info(ctx)
			if err != nil || info.NumPending > 0 || info.NumAckPending > 0 {
				settled = false
			}
		}
		if settled {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("tenant %s: pool %s's queue not settled within 20s", a.tenant, pool)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func rowCount(t *testing.T, dbPath, table string) int {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+dbPath+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM " + table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSharedPoolServesTenants: one sql pool process granted to tenants a
// and b (and serving the default tenant) registers its tools in all three
// accounts, runs each tenant's steps and reports each result into that
// tenant's account only, refuses a's signed step copied onto b's queue,
// and removes its registrations from every account when it stops.
func TestSharedPoolServesTenants(t *testing.T) {
	ts := natstest.StartTenants(t, []string{"sql"}, map[string][]string{"a": {"sql"}, "b": {"sql"}})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "demo.db")
	if err := demo.GenerateDB(ctx, dbPath); err != nil {
		t.Fatal(err)
	}
	if _, err := stepsign.GenerateKeyFiles(filepath.Join(dir, "signing.key"), filepath.Join(dir, "trusted")); err != nil {
		t.Fatal(err)
	}
	signer, err := stepsign.LoadSigner(filepath.Join(dir, "signing.key"))
	if err != nil {
		t.Fatal(err)
	}
	// natstest keeps the seeds as <dir>/<tenant>/<identity>.nk, the
	// layout --tenant-credentials-dir reads.
	credsDir := filepath.Dir(filepath.Dir(ts.SeedFile(t, "a", "executor-sql")))

	var cfg executor.Config
	fs := pflag.NewFlagSet("executor", pflag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse([]string{"--plaintext", "--auth-disabled", "--pool", "sql", "--sql-dsn", "sqlite://" + dbPath,
		"--grpc-addr", "127.0.0.1:0", "--nats-url", ts.URL(), "--nats-nkey-file", ts.SeedFile(t, natsauth.DefaultTenant, "executor-sql"),
		"--ack-wait", "2s", "--step-verify-keys", filepath.Join(dir, "trusted"),
		"--serve-tenants", "a,b", "--tenant-credentials-dir", credsDir}); err != nil {
		t.Fatal(err)
	}
	_, stop := serve(t, ctx, cfg)
	stopped := false
	defer func() {
		if !stopped {
			_ = stop()
		}
	}()

	def, a, b := openAccount(t, ctx, ts, natsauth.DefaultTenant), openAccount(t, ctx, ts, "a"), openAccount(t, ctx, ts, "b")
	accounts := []account{def, a, b}
	for _, acc := range accounts {
		if regs := acc.registrations(t, ctx, "sql.query."); len(regs) != 1 {
			t.Fatalf("tenant %s: sql.query registrations %v, want this replica's", acc.tenant, regs)
		}
	}

	// Each tenant's step runs and its result lands in its account only.
	for _, tc := range []struct {
		acc account
		run string
	}{{a, "RUNA1"}, {b, "RUNB1"}, {def, "RUND1"}} {
		results := runnertest.Results(t, ctx, tc.acc.res, tc.run)
		tc.acc.publish(t, ctx, sign(t, def.res.JS.Conn(), signer.ForTenant(tc.acc.tenant), tc.run, "count", "sql.query", "SELECT count(*) AS n FROM customers"))
		got := runnertest.NextResult(t, ctx, results)
		if got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED || got.GetRunId() != tc.run {
			t.Fatalf("tenant %s: result %v", tc.acc.tenant, got)
		}
		for _, other := range accounts {
			if other.tenant == tc.acc.tenant {
				continue
			}
			if n := other.engineMessages(t, ctx, tc.run); n != 0 {
				t.Fatalf("tenant %s's run %s: %d messages in tenant %s's %s", tc.acc.tenant, tc.run, n, other.tenant, bus.StreamEngine)
			}
		}
	}

	// a's signed side effect, copied onto b's queue (which only b's
	// supervisor identity can publish to), is not executed again.
	results := runnertest.Results(t, ctx, a.res, "RUNA2")
	a.publish(t, ctx, sign(t, def.res.JS.Conn(), signer.ForTenant("a"), "RUNA2", "create", "sql.exec", "CREATE TABLE tenant_t (x int)"))
	if r := runnertest.NextResult(t, ctx, results); r.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
		t.Fatalf("tenant a: create: %v", r)
	}
	insert := sign(t, def.res.JS.Conn(), signer.ForTenant("a"), "RUNA2", "insert", "sql.exec", "INSERT INTO tenant_t VALUES (1)")
	a.publish(t, ctx, insert)
	if r := runnertest.NextResult(t, ctx, results); r.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
		t.Fatalf("tenant a: insert: %v", r)
	}
	// Signed for a, it is refused in b by its signature (wrong tenant):
	// terminated without running, no result.
	b.publish(t, ctx, insert)
	b.waitQueueSettled(t, ctx, "sql")
	if n := rowCount(t, dbPath, "tenant_t"); n != 1 {
		t.Fatalf("tenant_t has %d rows after a's signed step was replayed into b, want 1", n)
	}
	if n := b.engineMessages(t, ctx, "RUNA2"); n != 0 {
		t.Fatalf("a's step replayed into b produced %d engine messages in b", n)
	}
	// Signed for b (b's supervisor key holder re-signing a's step id), the
	// run id a's account delivered first is refused on this replica too.
	inB := runnertest.Results(t, ctx, b.res, "RUNA2")
	b.publish(t, ctx, sign(t, def.res.JS.Conn(), signer.ForTenant("b"), "RUNA2", "insert", "sql.exec", "INSERT INTO tenant_t VALUES (1)"))
	r := runnertest.NextResult(t, ctx, inB)
	if r.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_FAILED || r.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED {
		t.Fatalf("a's run id in b's account: %v, want FAILED with PERMISSION_DENIED", r)
	}
	if strings.Contains(r.GetError().GetMessage(), `"a"`) || strings.Contains(r.GetError().GetMessage(), "tenant a") {
		t.Fatalf("the refusal names the other tenant: %q", r.GetError().GetMessage())
	}
	if n := rowCount(t, dbPath, "tenant_t"); n != 1 {
		t.Fatalf("tenant_t has %d rows after the replay into b, want 1", n)
	}
	if n := def.engineMessages(t, ctx, "RUNA2"); n != 0 {
		t.Fatalf("run RUNA2: %d messages in the default tenant's %s", n, bus.StreamEngine)
	}

	// Stopping the process stops every tenant's runner: registrations go.
	stopped = true
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, acc := range accounts {
		if regs := acc.registrations(t, ctx, "sql."); len(regs) != 0 {
			t.Errorf("tenant %s: registrations left after shutdown: %v", acc.tenant, regs)
		}
	}
}

// TestSharedPoolFailsClosed: a tenant whose account refuses the replica's
// seed fails the start, naming the tenant; nothing keeps serving.
func TestSharedPoolFailsClosed(t *testing.T) {
	ts := natstest.StartTenants(t, []string{"search"}, map[string][]string{"a": {"search"}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	credsDir := t.TempDir()
	seedA, err := os.ReadFile(ts.SeedFile(t, "a", "executor-search"))
	if err != nil {
		t.Fatal(err)
	}
	fileA := executor.TenantSeedFile(credsDir, "a", "search")
	if err := os.MkdirAll(filepath.Dir(fileA), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fileA, seedA, 0o600); err != nil {
		t.Fatal(err)
	}
	ghost, err := os.ReadFile(writeSeed(t, credsDir, "ghost", "search")) // a key the server does not know
	if err != nil {
		t.Fatal(err)
	}

	cfg := defaults(t, "--pool", "search", "--search-index", filepath.Join(t.TempDir(), "index"), "--grpc-addr", "127.0.0.1:0",
		"--nats-url", ts.URL(), "--nats-nkey-file", ts.SeedFile(t, natsauth.DefaultTenant, "executor-search"),
		"--serve-tenants", "a,ghost", "--tenant-credentials-dir", credsDir)
	cfg.OnReady = func(a net.Addr) { t.Errorf("ready at %v although tenant ghost cannot be served", a) }
	err = executor.Run(ctx, cfg, natstest.Logger(t), nil)
	if err == nil || !strings.Contains(err.Error(), "tenant ghost") {
		t.Fatalf("Run = %v, want an error naming tenant ghost", err)
	}
	if strings.Contains(err.Error(), strings.TrimSpace(string(ghost))) {
		t.Fatalf("error shows a seed: %v", err)
	}
	// Tenant a's runner never started (or was stopped): no registration left.
	acc := openAccount(t, ctx, ts, "a")
	if regs := acc.registrations(t, ctx, "search."); len(regs) != 0 {
		t.Fatalf("tenant a: registrations left after the failed start: %v", regs)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("Run did not return before the deadline")
	}
}
