package supervisor_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/authn/authntest"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/tlsconfig"
	"github.com/planex-dev/planex/services/supervisor"
)

// tenantStack is a supervisor serving tenants over real NATS accounts
// (natstest.Tenants), with API keys naming tenants.
type tenantStack struct {
	t       *testing.T
	nats    *natstest.Tenants
	planner *fakePlanner
	f       *authntest.Fixture
	addr    string
	keys    map[string]string // by name
}

// startTenantStack starts NATS with the tenants' accounts, a scripted
// planner, and supervisor.Run with --tenant-credentials-dir pointing at
// the tenants' seeds; keys maps a key name to "<role> [tenant]".
func startTenantStack(t *testing.T, nodes int, tenants map[string][]string, keys map[string]string, extra ...string) *tenantStack {
	t.Helper()
	var ns *natstest.Tenants
	if nodes > 1 {
		ns = natstest.StartTenantCluster(t, nodes, []string{"test"}, tenants)
	} else {
		ns = natstest.StartTenants(t, []string{"test"}, tenants)
	}
	s := &tenantStack{t: t, nats: ns, f: authntest.New(t), keys: map[string]string{}}
	var plannerAddr string
	s.planner, plannerAddr = startPlannerAt(t, tlsconfig.Flags{Files: tlsconfig.Files{CertFile: s.f.Server.CertFile, KeyFile: s.f.Server.KeyFile, CAFile: s.f.CAFile}})

	lines, err := os.ReadFile(s.f.APIKeysFile)
	if err != nil {
		t.Fatal(err)
	}
	for name, spec := range keys {
		f := strings.Fields(spec)
		role, err := authn.ParseRole(f[0])
		if err != nil {
			t.Fatal(err)
		}
		key, line, err := authn.GenerateAPIKey(name, role)
		if err != nil {
			t.Fatal(err)
		}
		if len(f) > 1 {
			line += " tenant=" + f[1]
		}
		lines = append(lines, []byte(line+"\n")...)
		s.keys[name] = key
	}
	if err := os.WriteFile(s.f.APIKeysFile, lines, 0o600); err != nil {
		t.Fatal(err)
	}
	// natstest keeps seeds as <dir>/<tenant>/<identity>.nk: the layout of
	// --tenant-credentials-dir.
	credsDir := filepath.Dir(filepath.Dir(ns.SeedFile(t, "default", "supervisor")))
	args := append([]string{"--grpc-addr", "127.0.0.1:0", "--nats-url", ns.URL(),
		"--nats-nkey-file", ns.SeedFile(t, "default", "supervisor"),
		"--planner-addr", plannerAddr, "--shutdown-grace", "5s", "--allow-self-approval",
		"--tenant-credentials-dir", credsDir, "--stream-replicas", map[bool]string{true: "3", false: "1"}[nodes > 1],
	}, s.f.ServerArgs()...)
	cfg := parse(t, append(args, extra...)...)
	ready := make(chan net.Addr, 1)
	cfg.OnReady = func(a net.Addr) { ready <- a }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- supervisor.Run(ctx, cfg, natstest.Logger(t), nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("supervisor.Run: %v", err)
		}
	})
	select {
	case a := <-ready:
		s.addr = a.String()
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("supervisor not ready")
	}
	return s
}

func (s *tenantStack) conn(key string) *grpc.ClientConn {
	s.t.Helper()
	k, ok := s.keys[key]
	if !ok {
		s.t.Fatalf("no key %s", key)
	}
	return s.f.Dial(s.addr, tlsconfig.Files{}, k)
}

func (s *tenantStack) runs(key string) planexv1.SupervisorServiceClient {
	return planexv1.NewSupervisorServiceClient(s.conn(key))
}

func (s *tenantStack) tenants(key string) planexv1.TenantServiceClient {
	return planexv1.NewTenantServiceClient(s.conn(key))
}

// waitTenant polls GetTenant until the tenant's readiness is ready.
func waitTenant(t *testing.T, c planexv1.TenantServiceClient, name string, ready bool, d time.Duration) *planexv1.Tenant {
	t.Helper()
	var last *planexv1.Tenant
	waitFor(t, d, "tenant "+name+" ready="+map[bool]string{true: "true", false: "false"}[ready], func() bool {
		resp, err := c.GetTenant(testCtx(t, 5*time.Second), &planexv1.GetTenantRequest{Name: name})
		if err != nil {
			return false
		}
		last = resp.GetTenant()
		return last.GetReady() == ready
	})
	return last
}

// startTenantPool is the fake pool "test" in a tenant's account: its tools
// registered in the account's planex-tools, its steps consumed there.
func startTenantPool(t *testing.T, ns *natstest.Tenants, tenantName string) *fakePool {
	t.Helper()
	nc := ns.Connect(t, tenantName, "executor-test", nil)
	ctx := testCtx(t, 20*time.Second)
	res, err := bus.Setup(ctx, nc, bus.Options{})
	if err != nil {
		t.Fatalf("tenant %s: %v", tenantName, err)
	}
	for _, spec := range toolSpecs() {
		if _, err := res.Tools.Put(ctx, bus.ToolKey(spec.GetName(), "fake-"+tenantName), mustMarshal(spec)); err != nil {
			t.Fatal(err)
		}
	}
	p := &fakePool{t: t, js: res.JS, gate: make(chan struct{}), execs: map[string]int{}, args: map[string]*structpb.Struct{}, reports: map[string]bool{}}
	steps, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamSteps, bus.PoolConsumerConfig("test", 64, 30*time.Second, 5))
	if err != nil {
		t.Fatal(err)
	}
	logs, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamEvents, bus.DispatchConsumerConfig("test", 64, 30*time.Second, 5))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var ccs []jetstream.ConsumeContext
	for _, c := range []jetstream.Consumer{steps, logs} {
		cc, err := c.Consume(func(m jetstream.Msg) {
			wg.Add(1)
			defer wg.Done()
			p.handle(runCtx, m)
		})
		if err != nil {
			t.Fatal(err)
		}
		ccs = append(ccs, cc)
	}
	t.Cleanup(func() {
		for _, cc := range ccs {
			cc.Stop()
		}
		cancel()
		wg.Wait()
	})
	return p
}

// startPlannerAt is startPlanner over TLS with its address, for
// supervisor.Run.
func startPlannerAt(t *testing.T, tls tlsconfig.Flags) (*fakePlanner, string) {
	t.Helper()
	p := &fakePlanner{scripts: map[string]script{}, calls: map[string][]*planexv1.PlanRequest{}, critiques: map[string][]*planexv1.CritiqueRequest{}}
	creds, err := tls.ServerCredentials()
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(creds))
	planexv1.RegisterPlannerServiceServer(gs, p)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return p, lis.Addr().String()
}

func wantCode(t *testing.T, what string, err error, code codes.Code, msg ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Errorf("%s: %v, want %s", what, err, code)
		return
	}
	for _, m := range msg {
		if !strings.Contains(status.Convert(err).Message(), m) {
			t.Errorf("%s: %q, want it to contain %q", what, status.Convert(err).Message(), m)
		}
	}
}

// policyApproveEcho is tenant a's policy: test.echo needs an approval.
const policyApproveEcho = `name: a-rules
rules:
  - name: echo-needs-approval
    when: step.tool == "test.echo"
    action: require_approval
    reason: tenant a approves every echo
`

// TestTenantsAreIsolated: two tenants (and the default one) in one
// supervisor, each in its NATS account with its own pool: a's runs finish,
// b cannot reach them by id (NotFound on every RPC) nor list them, a's
// policy gates a's step but not b's same tool, an unregistered tenant is
// refused, a tenant created while running becomes ready once its NATS
// account exists and serves runs, and a deleted tenant's callers are
// refused.
func TestTenantsAreIsolated(t *testing.T) {
	t.Parallel()
	// On a 3-node cluster (R3 streams in every account): about 15s.
	s := startTenantStack(t, 3, map[string][]string{"a": {"test"}, "b": {"test"}}, map[string]string{
		"pa": "platform-admin", "a": "admin a", "b": "admin b", "c": "admin c", "ghost": "runner ghost",
	})
	admin := s.tenants("pa")
	ctx := testCtx(t, 2*time.Minute)
	for _, tn := range []*planexv1.Tenant{
		{Name: "a", Pools: []string{"test"}, Policies: policyApproveEcho, Budget: &planexv1.TenantBudget{MaxSteps: 5}},
		{Name: "b", Pools: []string{"test"}},
	} {
		if _, err := admin.CreateTenant(ctx, &planexv1.CreateTenantRequest{Tenant: tn}); err != nil {
			t.Fatalf("CreateTenant %s: %v", tn.GetName(), err)
		}
	}
	for _, name := range []string{"a", "b"} {
		tn := waitTenant(t, admin, name, true, 30*time.Second)
		if tn.GetNatsAccount() != "planex-tenant-"+name {
			t.Errorf("tenant %s: nats_account %q", name, tn.GetNatsAccount())
		}
	}
	startTenantPool(t, s.nats, "a")
	startTenantPool(t, s.nats, "b")
	a, b := s.runs("a"), s.runs("b")

	s.planner.on("sleep", always(step("s1", "test.sleep", map[string]any{"ms": 1})))
	s.planner.on("echo", always(step("e1", "test.echo", map[string]any{"value": "x"})))
	aRun := start(t, a, &planexv1.StartRunRequest{Goal: "sleep"})
	if run := waitTerminal(t, a, aRun, 30*time.Second); run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("a's run: %s %s %q", run.GetStatus(), run.GetStopReason(), run.GetStopMessage())
	}

	// a's policy gates a's echo, not b's.
	aGated := start(t, a, &planexv1.StartRunRequest{Goal: "echo"})
	bEcho := start(t, b, &planexv1.StartRunRequest{Goal: "echo"})
	if run := waitTerminal(t, b, bEcho, 30*time.Second); run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED || len(run.GetGates()) != 0 {
		t.Fatalf("b's echo: %s, gates %v: a's policy must not gate b", run.GetStatus(), run.GetGates())
	}
	gated := waitRun(t, a, aGated, 30*time.Second, "waiting at a's gate", func(r *planexv1.Run) bool {
		return r.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING && len(r.GetGates()) == 1
	})
	if g := gated.GetGates()[0]; g.GetRule() != "echo-needs-approval" {
		t.Errorf("a's gate: rule %q policy %q", g.GetRule(), g.GetPolicy())
	}

	// b on a's runs: NotFound everywhere, and never listed.
	for _, id := range []string{aRun, aGated} {
		_, err := b.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
		wantCode(t, "b GetRun a's run", err, codes.NotFound)
		if ws, err := b.WatchRun(ctx, &planexv1.WatchRunRequest{RunId: id}); err == nil {
			_, err = ws.Recv()
			wantCode(t, "b WatchRun a's run", err, codes.NotFound)
		} else {
			wantCode(t, "b WatchRun a's run", err, codes.NotFound)
		}
		_, err = b.CancelRun(ctx, &planexv1.CancelRunRequest{RunId: id, Reason: "x"})
		wantCode(t, "b CancelRun a's run", err, codes.NotFound)
		_, err = b.ResetRun(ctx, &planexv1.ResetRunRequest{RunId: id, FromStep: "s1", Reason: "x"})
		wantCode(t, "b ResetRun a's run", err, codes.NotFound)
		_, err = b.ForkRun(ctx, &planexv1.ForkRunRequest{RunId: id, AtSequence: 1})
		wantCode(t, "b ForkRun a's run", err, codes.NotFound)
		gates, err := b.ListGates(ctx, &planexv1.ListGatesRequest{RunId: id})
		if status.Code(err) != codes.NotFound && (err != nil || len(gates.GetGates()) != 0) {
			t.Errorf("b ListGates a's run: %v %v, want NotFound or nothing", gates, err)
		}
	}
	_, err := b.Decide(ctx, &planexv1.DecideRequest{RunId: aGated, GateId: gated.GetGates()[0].GetId(), Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE})
	wantCode(t, "b Decide a's gate", err, codes.NotFound)
	for key, want := range map[string][]string{"b": {bEcho}, "a": {aRun, aGated}, "pa": nil} {
		list, err := s.runs(key).ListRuns(ctx, &planexv1.ListRunsRequest{})
		if err != nil {
			t.Fatalf("%s ListRuns: %v", key, err)
		}
		var got []string
		for _, r := range list.GetRuns() {
			got = append(got, r.GetId())
		}
		if len(got) != len(want) {
			t.Errorf("%s ListRuns: %v, want %v", key, got, want)
		}
		for _, id := range want {
			if !strings.Contains(strings.Join(got, ","), id) {
				t.Errorf("%s ListRuns: %v, want %s", key, got, id)
			}
		}
	}

	// Deleting a tenant with a run not finished needs force.
	_, err = admin.DeleteTenant(ctx, &planexv1.DeleteTenantRequest{Name: "a"})
	wantCode(t, "DeleteTenant a with a waiting run", err, codes.FailedPrecondition, "1 runs")

	// a decides its own gate; the run finishes.
	if _, err := a.Decide(ctx, &planexv1.DecideRequest{RunId: aGated, GateId: gated.GetGates()[0].GetId(), Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE}); err != nil {
		t.Fatalf("a Decide: %v", err)
	}
	succeededOn(t, a, aGated)

	// Usage: one's own; another tenant's only for a platform admin.
	if u, err := s.tenants("a").GetUsage(ctx, &planexv1.GetUsageRequest{}); err != nil || u.GetTenant() != "a" {
		t.Errorf("a GetUsage: %v %v", u, err)
	}
	_, err = s.tenants("a").GetUsage(ctx, &planexv1.GetUsageRequest{Tenant: "b"})
	wantCode(t, "a GetUsage of b", err, codes.PermissionDenied)
	if u, err := admin.GetUsage(ctx, &planexv1.GetUsageRequest{Tenant: "b"}); err != nil || u.GetTenant() != "b" {
		t.Errorf("platform admin GetUsage b: %v %v", u, err)
	}

	// a's budget ceiling is a's alone.
	_, err = a.StartRun(ctx, &planexv1.StartRunRequest{Goal: "sleep", Budget: &planexv1.Budget{MaxSteps: 10}})
	wantCode(t, "a StartRun over its max_steps ceiling", err, codes.InvalidArgument, "max_steps")
	succeededOn(t, b, start(t, b, &planexv1.StartRunRequest{Goal: "sleep", Budget: &planexv1.Budget{MaxSteps: 10}}))

	// New policies restart b's cell; from then on they gate b's echo.
	gotB, err := admin.GetTenant(ctx, &planexv1.GetTenantRequest{Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	nb := gotB.GetTenant()
	nb.Policies = policyApproveEcho
	upd, err := admin.UpdateTenant(ctx, &planexv1.UpdateTenantRequest{Tenant: nb})
	if err != nil || !upd.GetTenant().GetReady() {
		t.Fatalf("UpdateTenant b: %v %v, want ready", upd, err)
	}
	waitRun(t, b, start(t, b, &planexv1.StartRunRequest{Goal: "echo"}), 30*time.Second, "waiting at b's new gate", func(r *planexv1.Run) bool {
		return r.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING && len(r.GetGates()) == 1
	})

	// A credential naming an unregistered tenant is refused.
	_, err = s.runs("ghost").ListRuns(ctx, &planexv1.ListRunsRequest{})
	wantCode(t, "ghost ListRuns", err, codes.PermissionDenied, `"ghost", which is not registered`)

	// A tenant created while running: not ready until its account exists.
	if _, err := admin.CreateTenant(ctx, &planexv1.CreateTenantRequest{Tenant: &planexv1.Tenant{Name: "c", Pools: []string{"test"}}}); err != nil {
		t.Fatal(err)
	}
	tc := waitTenant(t, admin, "c", false, 10*time.Second)
	if !strings.Contains(tc.GetNotReadyReason(), "no credentials for tenant c in --tenant-credentials-dir") {
		t.Errorf("tenant c: not_ready_reason %q", tc.GetNotReadyReason())
	}
	_, err = s.runs("c").ListRuns(ctx, &planexv1.ListRunsRequest{})
	wantCode(t, "c ListRuns before its account", err, codes.Unavailable, "tenant c is not ready", "no credentials")
	s.nats.AddTenant(t, "c", "test")
	waitTenant(t, admin, "c", true, 30*time.Second)
	startTenantPool(t, s.nats, "c")
	succeededOn(t, s.runs("c"), start(t, s.runs("c"), &planexv1.StartRunRequest{Goal: "sleep"}))

	// Deleted: its callers are refused.
	if _, err := admin.DeleteTenant(ctx, &planexv1.DeleteTenantRequest{Name: "c"}); err != nil {
		t.Fatalf("DeleteTenant c: %v", err)
	}
	_, err = s.runs("c").ListRuns(ctx, &planexv1.ListRunsRequest{})
	wantCode(t, "c ListRuns after the delete", err, codes.PermissionDenied, "not registered")
	list, err := admin.ListTenants(ctx, &planexv1.ListTenantsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tn := range list.GetTenants() {
		names = append(names, tn.GetName())
	}
	if strings.Join(names, ",") != "default,a,b" {
		t.Errorf("ListTenants: %v, want default,a,b", names)
	}
}

func succeededOn(t *testing.T, c planexv1.SupervisorServiceClient, id string) {
	t.Helper()
	if run := waitTerminal(t, c, id, 30*time.Second); run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("run %s: %s %s %q", id, run.GetStatus(), run.GetStopReason(), run.GetStopMessage())
	}
}

// TestTenantServiceErrors: each refusal of TenantService has its code and
// names what is wrong.
func TestTenantServiceErrors(t *testing.T) {
	t.Parallel()
	s := startTenantStack(t, 1, nil, map[string]string{"pa": "platform-admin", "adm": "admin", "ta": "admin a"})
	admin := s.tenants("pa")
	ctx := testCtx(t, time.Minute)
	create := func(tn *planexv1.Tenant) error {
		_, err := admin.CreateTenant(ctx, &planexv1.CreateTenantRequest{Tenant: tn})
		return err
	}
	wantCode(t, "bad name", create(&planexv1.Tenant{Name: "Bad_Name"}), codes.InvalidArgument, "tenant.name")
	wantCode(t, "default", create(&planexv1.Tenant{Name: "default"}), codes.InvalidArgument, "tenant.name")
	wantCode(t, "bad pool", create(&planexv1.Tenant{Name: "x", Pools: []string{"a.b"}}), codes.InvalidArgument, "tenant.pools[0]")
	wantCode(t, "bad quota", create(&planexv1.Tenant{Name: "x", Quotas: &planexv1.TenantQuotas{MaxConcurrentRuns: -1}}), codes.InvalidArgument, "tenant.quotas.max_concurrent_runs")
	wantCode(t, "bad policy", create(&planexv1.Tenant{Name: "x", Policies: "rules: [{name: r, when: 'nope(', action: deny}]"}), codes.InvalidArgument, "policy")
	if err := create(&planexv1.Tenant{Name: "a", Description: "team a"}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "again", create(&planexv1.Tenant{Name: "a"}), codes.AlreadyExists)
	_, err := admin.GetTenant(ctx, &planexv1.GetTenantRequest{Name: "nope"})
	wantCode(t, "get missing", err, codes.NotFound)
	got, err := admin.GetTenant(ctx, &planexv1.GetTenantRequest{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	up := got.GetTenant()
	up.Description = "team a, renamed"
	if _, err := admin.UpdateTenant(ctx, &planexv1.UpdateTenantRequest{Tenant: up}); err != nil {
		t.Fatal(err)
	}
	_, err = admin.UpdateTenant(ctx, &planexv1.UpdateTenantRequest{Tenant: up}) // stale revision
	wantCode(t, "stale update", err, codes.Aborted, "revision")
	_, err = admin.UpdateTenant(ctx, &planexv1.UpdateTenantRequest{Tenant: &planexv1.Tenant{Name: "zz"}})
	wantCode(t, "update missing", err, codes.NotFound)
	_, err = admin.DeleteTenant(ctx, &planexv1.DeleteTenantRequest{Name: "default"})
	wantCode(t, "delete default", err, codes.InvalidArgument, "default")
	_, err = admin.DeleteTenant(ctx, &planexv1.DeleteTenantRequest{Name: "zz"})
	wantCode(t, "delete missing", err, codes.NotFound)
	// a has no credentials here: its runs cannot be counted.
	_, err = admin.DeleteTenant(ctx, &planexv1.DeleteTenantRequest{Name: "a"})
	wantCode(t, "delete not ready", err, codes.FailedPrecondition, "force")
	// An admin below platform-admin, and a tenant's, manage no tenants.
	for _, key := range []string{"adm", "ta"} {
		_, err = s.tenants(key).ListTenants(ctx, &planexv1.ListTenantsRequest{})
		wantCode(t, key+" ListTenants", err, codes.PermissionDenied)
	}
	_, err = s.tenants("adm").GetUsage(ctx, &planexv1.GetUsageRequest{Tenant: "a"})
	wantCode(t, "admin GetUsage of a", err, codes.PermissionDenied)
	_, err = s.tenants("ta").GetUsage(ctx, &planexv1.GetUsageRequest{})
	wantCode(t, "a GetUsage while a is not ready", err, codes.Unavailable, "tenant a is not ready")
	_, err = admin.GetUsage(ctx, &planexv1.GetUsageRequest{FromDay: "yesterday"})
	wantCode(t, "bad from_day", err, codes.InvalidArgument, "from_day")
	if _, err := admin.DeleteTenant(ctx, &planexv1.DeleteTenantRequest{Name: "a", Force: true}); err != nil {
		t.Fatal(err)
	}
	// The default tenant is served as before.
	if _, err := s.runs("adm").ListRuns(ctx, &planexv1.ListRunsRequest{}); err != nil {
		t.Fatal(err)
	}
	list, err := admin.ListTenants(ctx, &planexv1.ListTenantsRequest{})
	if err != nil || len(list.GetTenants()) != 1 || !list.GetTenants()[0].GetReady() || list.GetTenants()[0].GetNatsAccount() != "$G" {
		t.Errorf("ListTenants after deleting a: %v %v", list, err)
	}
}

// TestTenantsFile: --tenants-file registers its tenants at start (served
// without any API call), applies an edit of the file, keeps the registry
// as it is when the file breaks, and never deletes a tenant left out.
func TestTenantsFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tenants.yaml")
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(file+".tmp", []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(file+".tmp", file); err != nil {
			t.Fatal(err)
		}
	}
	write("- name: fa\n  description: from the file\n  quotas: {maxConcurrentRuns: 3}\n  retention: 720h\n- name: fb\n")
	s := startTenantStack(t, 1, map[string][]string{"fa": {"test"}, "fb": {"test"}},
		map[string]string{"platform": "platform-admin", "fa-runner": "runner fa"}, "--tenants-file", file)
	tc := s.tenants("platform")
	fa := waitTenant(t, tc, "fa", true, 30*time.Second)
	if fa.GetDescription() != "from the file" || fa.GetQuotas().GetMaxConcurrentRuns() != 3 || fa.GetRetention().AsDuration() != 720*time.Hour {
		t.Fatalf("fa from the file = %v", fa)
	}
	waitTenant(t, tc, "fb", true, 30*time.Second)

	write("- name: fa\n  description: edited\n")
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := tc.GetTenant(testCtx(t, 5*time.Second), &planexv1.GetTenantRequest{Name: "fa"})
		if err == nil && got.GetTenant().GetDescription() == "edited" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the file's edit was not applied within 20s: %v, %v", got, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// fb, left out of the file, stays.
	if _, err := tc.GetTenant(testCtx(t, 5*time.Second), &planexv1.GetTenantRequest{Name: "fb"}); err != nil {
		t.Fatalf("fb was left out of the file and must stay: %v", err)
	}
	// A broken file is logged and skipped; the watch goes on and applies
	// the next good one.
	write("- name: Not-Valid\n")
	write("- name: fa\n  description: after a broken file\n")
	deadline = time.Now().Add(20 * time.Second)
	for {
		got, err := tc.GetTenant(testCtx(t, 5*time.Second), &planexv1.GetTenantRequest{Name: "fa"})
		if err == nil && got.GetTenant().GetDescription() == "after a broken file" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the file after a broken one was not applied within 20s: %v, %v", got, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
