package chaos

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/freeport"
	"github.com/planex-dev/planex/internal/natsauth"
	"github.com/planex-dev/planex/internal/quantile"
)

var fairnessFlag = flag.Bool("fairness", false, "run the deployed-shape fairness measurement of issue 31 (NATS, supervisor, planner and the tenants' pools as separate processes; tenant A starts 5,000 runs at once, tenant B's first-step latency is measured); also PLANEX_FAIRNESS=1")

// The measurement's tenants, each owning an sql pool of its own.
const (
	fairTenantA = "tenant-a"
	fairTenantB = "tenant-b"
	fairPool    = "sql"
)

const (
	// fairClients is how many clients start A's backlog at once.
	fairClients = 64
	// fairGap is the time between two of B's probes.
	fairGap = 10 * time.Millisecond
	// fairPoolConcurrency is each tenant pool's --concurrency: the steps
	// deploy/k8s's sql pool runs at once (2 replicas of 4), in one process.
	fairPoolConcurrency = 8
)

// fairPlaybook is the planner's only playbook: one sql.query step that
// selects a constant, so that a run's cost is the platform's (StartRun,
// planning, the run log, dispatch, the result) and not the tool's.
const fairPlaybook = `name: fair-probe
description: One cheap SQL step, for the fairness measurement
examples:
  - fair tenant-a probe 1
match:
  - '^fair [a-z-]+ [a-z-]+ \d+$'
steps:
  - id: one
    description: Select a constant
    tool: sql.query
    args:
      sql: SELECT 1
`

// fairEnv is the positive number in the environment variable name, else def.
func fairEnv(name string, def float64) float64 {
	if n, err := strconv.ParseFloat(os.Getenv(name), 64); err == nil && n > 0 {
		return n
	}
	return def
}

// TestTenantFairnessDeployed is issue 31's fairness measurement in the
// deployed shape (docs/performance.md, "Tenants: fairness"): one
// nats-server with the default tenant and tenants A and B each in its own
// account, one supervisor serving all three (default --fair-slots), the
// playbook planner, and A's and B's own sql pools, every one an OS process
// of the release binary, as Kubernetes runs them. B's first-step latency
// (StartRun called → the run's first step's dispatched_at) is measured
// unloaded (half of the probes before A's load, half after A's runs all
// finished) and while A starts its backlog at once from 64 clients, B's
// probes starting one second later, one every 10 ms (or as fast as
// StartRun answers). Case fair runs the supervisor without pacing
// (--fair-pace-target 0), fair+pace with it (the default target), and
// fair+quota without pacing but with a starts_per_second quota for A;
// A's clients retry after the RetryInfo delay, as the SDKs do. Each case
// logs a row of the table in docs/performance.md, where B's time went,
// B's slowest probes, the supervisor's pacing gauges while B probed
// under load, and the CPU each process used and waited for while
// A's backlog started (one case: -run 'TestTenantFairnessDeployed/^fair$').
//
// It is a measurement, not a pass/fail test: it fails only on errors (a
// run that does not reach its first step, a run that does not succeed, a
// process that exits). Sizes: $PLANEX_BENCH_FAIR_BACKLOG (A's runs, 5000),
// $PLANEX_BENCH_FAIR_PROBES (B's runs under load, and unloaded in all;
// 400), $PLANEX_BENCH_FAIR_RATE (A's quota in fair+quota, 100),
// $PLANEX_BENCH_FAIR_PACE (--fair-pace-target in fair+pace, 1.3) and
// $PLANEX_BENCH_FAIR_SLOTS (--fair-slots; default the supervisor's).
// $PLANEX_CHAOS_DIR keeps the processes' logs.
func TestTenantFairnessDeployed(t *testing.T) {
	if !*fairnessFlag && os.Getenv("PLANEX_FAIRNESS") != "1" {
		t.Skip("fairness measurement (deployed shape): run with `go test -count=1 -timeout 40m -run TestTenantFairnessDeployed ./test/chaos -fairness -v` (or PLANEX_FAIRNESS=1)")
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir := workDir(t)
	t.Logf("building planex and nats-server; logs in %s", dir)
	planexBin, natsBin := build(t, dir)
	creds := fairCredentials(t, ctx, planexBin, dir)
	dd := prepareDemoData(t, ctx, dir)
	books := filepath.Join(dir, "fair-playbooks")
	if err := os.MkdirAll(books, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(books, "fair.yaml"), []byte(fairPlaybook), 0o644); err != nil {
		t.Fatal(err)
	}
	size := fairSize{
		backlog: int(fairEnv("PLANEX_BENCH_FAIR_BACKLOG", 5000)),
		probes:  int(fairEnv("PLANEX_BENCH_FAIR_PROBES", 400)),
		slots:   int(fairEnv("PLANEX_BENCH_FAIR_SLOTS", 0)),
	}
	if size.probes < 2 {
		t.Fatalf("PLANEX_BENCH_FAIR_PROBES=%d: want at least 2 (half of the unloaded probes run before A's load, half after)", size.probes)
	}
	rate := fairEnv("PLANEX_BENCH_FAIR_RATE", 100)
	pace := fairEnv("PLANEX_BENCH_FAIR_PACE", 1.3)
	for _, tc := range []struct {
		name string
		pace float64 // --fair-pace-target; 0: no pacing
		rate float64 // A's starts_per_second quota; 0: none
	}{
		{"fair", 0, 0},
		{"fair+pace", pace, 0},
		{"fair+quota", 0, rate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			caseDir := filepath.Join(dir, strings.ReplaceAll(tc.name, "+", "-"))
			if err := os.RemoveAll(caseDir); err != nil { // a kept dir of an earlier run
				t.Fatal(err)
			}
			top := startFairTopology(t, ctx, fairBins{planex: planexBin, nats: natsBin}, creds, dd, books, caseDir, size.slots, tc.pace, tc.rate)
			measureFairness(t, ctx, top, tc.name, size, tc.rate).log(t)
		})
	}
}

// fairSize sizes one measurement.
type fairSize struct {
	backlog, probes int
	slots           int // --fair-slots; 0: the supervisor's default
}

// fairBins are the binaries the topology runs.
type fairBins struct{ planex, nats string }

// fairCreds are the NATS credentials `planex auth k8s-secrets --tenant`
// generates for the default tenant and tenants A and B.
type fairCreds struct {
	authConf  string // nats-server configuration: an account per tenant
	tenantDir string // --tenant-credentials-dir: <dir>/<tenant>/supervisor.nk
	secrets   string // secrets/<name>/<key> of the generated Secrets
}

// seed is the nkey seed file of the default tenant's identity.
func (c fairCreds) seed(identity string) string {
	return filepath.Join(c.secrets, "planex-nats-"+identity, "nkey")
}

// tenantSeed is the nkey seed file of a tenant's identity in its account.
func (c fairCreds) tenantSeed(tenant, identity string) string {
	return filepath.Join(c.secrets, "planex-tenant-"+tenant+"-nats", identity+".nk")
}

// fairCredentials runs `planex auth k8s-secrets --tenant A=sql --tenant
// B=sql` into dir and lays the supervisor's tenant seeds out as
// --tenant-credentials-dir wants them.
func fairCredentials(t *testing.T, ctx context.Context, planexBin, dir string) fairCreds {
	t.Helper()
	out := filepath.Join(dir, "credentials")
	c := fairCreds{secrets: filepath.Join(out, "secrets"), tenantDir: filepath.Join(dir, "tenant-credentials")}
	c.authConf = filepath.Join(c.secrets, "nats-auth", "auth.conf")
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	args := []string{"auth", "k8s-secrets", "--namespace=planex", "--out-dir=" + out,
		"--tenant=" + fairTenantA + "=" + fairPool, "--tenant=" + fairTenantB + "=" + fairPool}
	if b, err := exec.CommandContext(cctx, planexBin, args...).CombinedOutput(); err != nil {
		t.Fatalf("planex %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	for _, tn := range []string{fairTenantA, fairTenantB} {
		b, err := os.ReadFile(c.tenantSeed(tn, natsauth.Supervisor))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(c.tenantDir, tn), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(c.tenantDir, tn, natsauth.Supervisor+".nk"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// fairTopology is the running deployed shape: its processes and the
// clients of tenants A and B and of a platform admin.
type fairTopology struct {
	procs      []*proc // in start order: nats, planner, pools, supervisor
	supervisor *proc
	a, b       planexv1.SupervisorServiceClient
	tenants    planexv1.TenantServiceClient // as platform-admin
	// metricsAddr serves the supervisor's Prometheus metrics.
	metricsAddr string
}

// startFairTopology starts nats-server with the accounts, the planner,
// A's and B's sql pools and the supervisor (tenants A and B registered by
// --tenants-file, A with a starts_per_second quota of rateA when > 0,
// --fair-pace-target pace), each serving before the next starts; every process is stopped in
// t.Cleanup, the supervisor first and NATS last.
func startFairTopology(t *testing.T, ctx context.Context, bins fairBins, creds fairCreds, dd demoData, books, dir string, slots int, pace, rateA float64) *fairTopology {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tp := &fairTopology{}
	startReady := func(p *proc) {
		t.Helper()
		if err := p.start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.stop(10 * time.Second) })
		tp.procs = append(tp.procs, p)
		if err := waitServing(sctx, p); err != nil {
			t.Fatal(err)
		}
	}

	monitor := freeport.Port(t)
	client := freeport.Port(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", client)
	startReady(&proc{name: "nats", bin: bins.nats, logPath: filepath.Join(dir, "nats.log"), ready: natsReady(monitor),
		args: []string{"--addr", "127.0.0.1", "--port", fmt.Sprint(client), "--http_port", fmt.Sprint(monitor),
			"--server_name", "nats-fair", "--jetstream", "--store_dir", filepath.Join(dir, "nats"), "--config", creds.authConf}})

	newProc := func(name string, args ...string) *proc {
		return &proc{name: name, bin: bins.planex, args: args, logPath: filepath.Join(dir, name+".log"), ready: serving}
	}
	common := func(addr string) []string {
		return []string{"--grpc-addr=" + addr, "--nats-url=" + url, "--log-format=json", "--log-level=info", "--shutdown-grace=3s", "--plaintext"}
	}
	plannerAddr := freeport.Addr(t)
	startReady(newProc("planner", append([]string{"planner", "--playbooks=" + books, "--auth-disabled",
		"--nats-nkey-file=" + creds.seed(natsauth.Planner)}, common(plannerAddr)...)...))
	for _, tn := range []string{fairTenantA, fairTenantB} {
		startReady(newProc("executor-"+tn+"-"+fairPool, append([]string{"executor", "--pool=" + fairPool, "--tenant=" + tn,
			"--nats-nkey-file=" + creds.tenantSeed(tn, natsauth.Executor+"-"+fairPool), "--auth-disabled",
			"--concurrency=" + fmt.Sprint(fairPoolConcurrency), "--sql-dsn=" + dd.dbPath, "--step-verify-keys=" + dd.verifyKeys},
			common("127.0.0.1:0")...)...)) // nobody dials executors here
	}

	// Callers: an API key per tenant, and a platform admin that reads the
	// tenants' readiness.
	var keys []string
	key := func(name string, role authn.Role, tenant string) string {
		k, line, err := authn.GenerateAPIKey(name, role)
		if err != nil {
			t.Fatal(err)
		}
		if tenant != "" {
			line += " tenant=" + tenant
		}
		keys = append(keys, line)
		return k
	}
	keyA, keyB := key("fair-a", authn.RoleRunner, fairTenantA), key("fair-b", authn.RoleRunner, fairTenantB)
	keyPlatform := key("fair-platform", authn.RolePlatformAdmin, "")
	keysFile := filepath.Join(dir, "api-keys")
	if err := os.WriteFile(keysFile, []byte(strings.Join(keys, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var tenantsJSON []string
	for _, tn := range []string{fairTenantA, fairTenantB} {
		spec := &planexv1.Tenant{Name: tn, Pools: []string{fairPool}}
		if tn == fairTenantA && rateA > 0 {
			spec.Quotas = &planexv1.TenantQuotas{StartsPerSecond: rateA}
		}
		b, err := protojson.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		tenantsJSON = append(tenantsJSON, string(b))
	}
	tenantsFile := filepath.Join(dir, "tenants.json")
	if err := os.WriteFile(tenantsFile, []byte("["+strings.Join(tenantsJSON, ",")+"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	supAddr := freeport.Addr(t)
	tp.metricsAddr = freeport.Addr(t)
	tp.supervisor = newProc("supervisor", append([]string{"supervisor", "--planner-addr=" + plannerAddr,
		"--nats-nkey-file=" + creds.seed(natsauth.Supervisor), "--step-signing-key-file=" + dd.signingKey,
		"--auth-api-keys-file=" + keysFile, "--tenant-credentials-dir=" + creds.tenantDir, "--tenants-file=" + tenantsFile,
		"--fair-slots=" + fmt.Sprint(slots), "--fair-pace-target=" + fmt.Sprint(pace), "--metrics-addr=" + tp.metricsAddr},
		common(supAddr)...)...)
	startReady(tp.supervisor)

	dial := func(key string) *grpc.ClientConn {
		conn, err := grpc.NewClient(supAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(plainBearer(key)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	tp.a = planexv1.NewSupervisorServiceClient(dial(keyA))
	tp.b = planexv1.NewSupervisorServiceClient(dial(keyB))
	tp.tenants = planexv1.NewTenantServiceClient(dial(keyPlatform))

	// Ready: both tenants connected, each one's pool in its catalog.
	for _, tn := range []string{fairTenantA, fairTenantB} {
		if err := poll(sctx, 200*time.Millisecond, func(ctx context.Context) error {
			resp, err := tp.tenants.GetTenant(ctx, &planexv1.GetTenantRequest{Name: tn})
			if err == nil && !resp.GetTenant().GetReady() {
				err = fmt.Errorf("not ready: %s", resp.GetTenant().GetNotReadyReason())
			}
			return err
		}); err != nil {
			t.Fatalf("tenant %s: %v\n%s", tn, err, tp.supervisor.tail(20))
		}
	}
	for tn, c := range map[string]planexv1.SupervisorServiceClient{fairTenantA: tp.a, fairTenantB: tp.b} {
		if err := poll(sctx, 200*time.Millisecond, func(ctx context.Context) error {
			resp, err := c.ListTools(ctx, &planexv1.ListToolsRequest{})
			if err != nil {
				return err
			}
			for _, tool := range resp.GetTools() {
				if tool.GetSpec().GetName() == "sql.query" {
					return nil
				}
			}
			return fmt.Errorf("no sql.query in the catalog yet")
		}); err != nil {
			t.Fatalf("tenant %s's pool: %v", tn, err)
		}
	}
	return tp
}

// waitServing waits until p is ready, failing at once, with its log, if
// it exits first.
func waitServing(ctx context.Context, p *proc) error {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-exited:
			cancel()
		case <-wctx.Done():
		}
	}()
	err := p.waitReady(wctx)
	select {
	case <-exited:
		return fmt.Errorf("%s exited before it was ready:\n%s", p.name, p.tail(20))
	default:
		return err
	}
}

// poll calls fn, each call with a 10 s timeout, every interval until it
// succeeds or ctx ends (then it returns fn's last error).
func poll(ctx context.Context, interval time.Duration, fn func(context.Context) error) error {
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := fn(cctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}

// exited reports which processes are no longer running, with their logs.
func (tp *fairTopology) exited() []string {
	var out []string
	for _, p := range tp.procs {
		p.mu.Lock()
		ch := p.exited
		p.mu.Unlock()
		select {
		case <-ch:
			out = append(out, fmt.Sprintf("%s exited:\n%s", p.name, p.tail(15)))
		default:
		}
	}
	return out
}

// fairProbe is one run of B's.
type fairProbe struct {
	id                  string
	at                  time.Time     // StartRun called
	answered            time.Duration // until StartRun answered
	created, dispatched time.Time     // the run's created_at, its first step's dispatched_at
}

// latency is the probe's first-step latency.
func (p fairProbe) latency() time.Duration { return p.dispatched.Sub(p.at) }

// probe starts n runs of a tenant, one every gap, then waits until each
// one's first step was dispatched; it fails the test on an error or a run
// without a dispatched step within 10 minutes.
func probe(t *testing.T, ctx context.Context, c planexv1.SupervisorServiceClient, tenant, label string, n int, gap time.Duration) []fairProbe {
	t.Helper()
	probes := make([]fairProbe, 0, n)
	tick := time.NewTicker(gap)
	defer tick.Stop()
	for i := range n {
		at := time.Now()
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		resp, err := c.StartRun(cctx, &planexv1.StartRunRequest{Goal: fmt.Sprintf("fair %s %s %d", tenant, label, i)})
		cancel()
		if err != nil {
			t.Fatalf("%s: StartRun of %s %d: %v", tenant, label, i, err)
		}
		probes = append(probes, fairProbe{id: resp.GetRun().GetId(), at: at, answered: time.Since(at)})
		<-tick.C
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	for i := range probes {
		p := &probes[i]
		err := poll(wctx, 50*time.Millisecond, func(ctx context.Context) error {
			resp, err := c.GetRun(ctx, &planexv1.GetRunRequest{RunId: p.id})
			if err != nil {
				return err
			}
			run := resp.GetRun()
			if terminal(run.GetStatus()) && run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
				return fmt.Errorf("run ended %s: %s", run.GetStatus(), run.GetStopMessage())
			}
			if len(run.GetSteps()) == 0 || run.GetSteps()[0].GetDispatchedAt() == nil {
				return fmt.Errorf("first step not dispatched (run %s)", run.GetStatus())
			}
			p.created, p.dispatched = run.GetCreatedAt().AsTime(), run.GetSteps()[0].GetDispatchedAt().AsTime()
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %s %d (run %s): %v", tenant, label, i, p.id, err)
		}
	}
	return probes
}

// startRetrying starts a run, retrying a RESOURCE_EXHAUSTED refusal after
// its RetryInfo delay (as the SDKs do) for up to five minutes.
func startRetrying(ctx context.Context, c planexv1.SupervisorServiceClient, goal string) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		_, err := c.StartRun(cctx, &planexv1.StartRunRequest{Goal: goal})
		cancel()
		st, _ := status.FromError(err)
		if err == nil || st.Code() != codes.ResourceExhausted || time.Now().After(deadline) {
			return err
		}
		wait := 10 * time.Millisecond
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				wait = ri.GetRetryDelay().AsDuration()
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// unfinished are the statuses of a run that has not ended.
var unfinished = []planexv1.RunStatus{planexv1.RunStatus_RUN_STATUS_PENDING, planexv1.RunStatus_RUN_STATUS_PLANNING,
	planexv1.RunStatus_RUN_STATUS_RUNNING, planexv1.RunStatus_RUN_STATUS_WAITING}

// waitAllFinished waits until no run of the client's tenant is unfinished.
func waitAllFinished(ctx context.Context, c planexv1.SupervisorServiceClient, d time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return poll(wctx, 250*time.Millisecond, func(ctx context.Context) error {
		resp, err := c.ListRuns(ctx, &planexv1.ListRunsRequest{PageSize: 1, Statuses: unfinished, View: planexv1.RunView_RUN_VIEW_BASIC})
		if err == nil && len(resp.GetRuns()) > 0 {
			err = fmt.Errorf("run %s is %s", resp.GetRuns()[0].GetId(), resp.GetRuns()[0].GetStatus())
		}
		return err
	})
}

// notSucceeded lists up to five finished runs of the client's tenant
// that did not succeed.
func notSucceeded(ctx context.Context, c planexv1.SupervisorServiceClient) ([]string, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := c.ListRuns(cctx, &planexv1.ListRunsRequest{PageSize: 5, Statuses: []planexv1.RunStatus{
		planexv1.RunStatus_RUN_STATUS_FAILED, planexv1.RunStatus_RUN_STATUS_ESCALATED, planexv1.RunStatus_RUN_STATUS_CANCELLED}})
	var out []string
	for _, r := range resp.GetRuns() {
		out = append(out, fmt.Sprintf("%s %q %s: %s", r.GetId(), r.GetGoal(), r.GetStatus(), r.GetStopMessage()))
	}
	return out, err
}

// schedStat is what the kernel counted for a process's threads
// (/proc/<pid>/task/*/schedstat): time on a CPU, and time runnable but
// waiting for one.
type schedStat struct{ cpu, wait time.Duration }

// readSchedStat sums the schedstat of pid's live threads (zero when the
// kernel does not expose it).
func readSchedStat(pid int) schedStat {
	var s schedStat
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		fs := strings.Fields(string(b))
		if len(fs) < 2 {
			continue
		}
		cpu, _ := strconv.ParseInt(fs[0], 10, 64)
		wait, _ := strconv.ParseInt(fs[1], 10, 64)
		s.cpu += time.Duration(cpu)
		s.wait += time.Duration(wait)
	}
	return s
}

// schedAll reads the schedstat of the topology's processes and of this
// one (the clients), by name.
func (tp *fairTopology) schedAll() map[string]schedStat {
	out := map[string]schedStat{"test clients": readSchedStat(os.Getpid())}
	for _, p := range tp.procs {
		p.mu.Lock()
		pid := p.cmd.Process.Pid
		p.mu.Unlock()
		out[p.name] = readSchedStat(pid)
	}
	return out
}

// cpuStat is the machine's CPU time from /proc/stat's first line, in
// USER_HZ (100 a second on Linux): busy (user, nice, system, irq,
// softirq, steal) and idle (idle, iowait), all CPUs together.
type cpuStat struct{ busy, idle time.Duration }

// readCPUStat reads the machine's CPU time (zero when /proc/stat is
// unreadable).
func readCPUStat() cpuStat {
	var s cpuStat
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return s
	}
	tick := func(i int) time.Duration {
		n, _ := strconv.ParseInt(f[i], 10, 64)
		return time.Duration(n) * 10 * time.Millisecond
	}
	s.busy = tick(1) + tick(2) + tick(3) + tick(6) + tick(7) + tick(8)
	s.idle = tick(4) + tick(5)
	return s
}

// loadavg is the machine's load average (/proc/loadavg's first three).
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}

// fairResult is what one measurement gathered.
type fairResult struct {
	name                    string // the case, with A's quota
	size                    fairSize
	unloaded, loaded        []fairProbe // B's probes, in start order
	aStart, probesEnd       time.Time   // A's first start, B's last probe's dispatch seen
	aStartedIn, aFinishedIn time.Duration
	aAtProbe, aAfterProbe   int64  // A's runs started when B's loaded probes began and ended
	pacing                  string // the supervisor's pacing while B probed under load
	// Over [aStart, probesEnd]: each process's schedstat, the machine's CPU.
	schedBefore, schedAfter map[string]schedStat
	cpuBefore, cpuAfter     cpuStat
}

// measureFairness warms both tenants up, probes B unloaded, starts A's
// backlog and B's probes one second later, probes B unloaded again once
// A's runs have all finished, and checks that every run succeeded and
// every process still runs.
func measureFairness(t *testing.T, ctx context.Context, tp *fairTopology, name string, size fairSize, rateA float64) fairResult {
	res := fairResult{name: name, size: size}
	if rateA > 0 {
		res.name = fmt.Sprintf("%s (A: %g starts/s)", name, rateA)
	}
	t.Logf("%s: load average %s before", name, loadavg())
	probe(t, ctx, tp.a, fairTenantA, "warm-up", 5, 20*time.Millisecond)
	probe(t, ctx, tp.b, fairTenantB, "warm-up", 5, 20*time.Millisecond)
	res.unloaded = probe(t, ctx, tp.b, fairTenantB, "unloaded", size.probes/2, fairGap)

	// A's backlog: size.backlog StartRun calls at once from fairClients
	// clients; B's probes start a second later.
	var startedA, next atomic.Int64
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var errA error
	res.schedBefore, res.cpuBefore = tp.schedAll(), readCPUStat()
	res.aStart = time.Now()
	for range fairClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(size.backlog) {
					return
				}
				if err := startRetrying(ctx, tp.a, fmt.Sprintf("fair %s backlog %d", fairTenantA, i)); err != nil {
					errMu.Lock()
					errA = cmp.Or(errA, fmt.Errorf("%s: StartRun of backlog %d: %w", fairTenantA, i, err))
					errMu.Unlock()
					return
				}
				startedA.Add(1)
			}
		}()
	}
	select {
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	case <-time.After(time.Until(res.aStart.Add(time.Second))):
	}
	res.aAtProbe = startedA.Load()
	pacing := tp.watchPacing(ctx)
	res.loaded = probe(t, ctx, tp.b, fairTenantB, "loaded", size.probes, fairGap)
	res.pacing = pacing()
	res.probesEnd = time.Now()
	res.schedAfter, res.cpuAfter = tp.schedAll(), readCPUStat()
	res.aAfterProbe = startedA.Load()
	wg.Wait()
	res.aStartedIn = time.Since(res.aStart)
	if errA != nil {
		t.Fatal(errA)
	}
	if err := waitAllFinished(ctx, tp.a, 20*time.Minute); err != nil {
		t.Fatalf("%s's runs not finished: %v", fairTenantA, err)
	}
	res.aFinishedIn = time.Since(res.aStart)
	// B unloaded again (the baseline is taken before and after, as other
	// load on the machine varies).
	res.unloaded = append(res.unloaded, probe(t, ctx, tp.b, fairTenantB, "unloaded-after", size.probes-size.probes/2, fairGap)...)
	if err := waitAllFinished(ctx, tp.b, 5*time.Minute); err != nil {
		t.Fatalf("%s's runs not finished: %v", fairTenantB, err)
	}
	for _, c := range []planexv1.SupervisorServiceClient{tp.a, tp.b} {
		bad, err := notSucceeded(ctx, c)
		if err != nil {
			t.Fatalf("list runs that did not succeed: %v", err)
		}
		if len(bad) > 0 {
			t.Errorf("runs that did not succeed: %s", strings.Join(bad, "; "))
		}
	}
	if gone := tp.exited(); len(gone) > 0 {
		t.Fatalf("processes exited during the measurement:\n%s", strings.Join(gone, "\n"))
	}
	return res
}

// watchPacing scrapes the supervisor's pacing gauges every 200ms until
// the returned function is called, which summarizes them: how often
// tenant A was paced and at what rates, and the engine messages' median
// handling time over its floor.
func (tp *fairTopology) watchPacing(ctx context.Context) func() string {
	ctx, cancel := context.WithCancel(ctx)
	var (
		wg              sync.WaitGroup
		samples         int
		rates, ratios   []float64
		errs            int
		rateRe, ratioRe = regexp.MustCompile(`^planex_tenant_fair_paced_rate\{[^}]*tenant="` + fairTenantA + `"[^}]*\} (\S+)`),
			regexp.MustCompile(`^planex_fair_handling_ratio(?:\{[^}]*\})? (\S+)`)
	)
	wg.Go(func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			body, err := scrape(ctx, "http://"+tp.metricsAddr+"/metrics")
			if err != nil {
				errs++
				continue
			}
			samples++
			for line := range strings.Lines(body) {
				for re, dst := range map[*regexp.Regexp]*[]float64{rateRe: &rates, ratioRe: &ratios} {
					if m := re.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
						if v, err := strconv.ParseFloat(m[1], 64); err == nil {
							*dst = append(*dst, v)
						}
					}
				}
			}
		}
	})
	return func() string {
		cancel()
		wg.Wait()
		q := quantile.Of[float64]
		return fmt.Sprintf("A paced in %d of %d scrapes (%d failed), at %.0f/%.0f/%.0f admissions/s (min/median/max); engine messages' median over their floor %.2f/%.2f/%.2f",
			len(rates), samples, errs, q(rates, 0), q(rates, 0.5), q(rates, 1), q(ratios, 0), q(ratios, 0.5), q(ratios, 1))
	}
}

// scrape GETs url's body.
func scrape(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), nil
}

// latencies are the probes' first-step latencies.
func latencies(ps []fairProbe) []time.Duration {
	out := make([]time.Duration, len(ps))
	for i, p := range ps {
		out[i] = p.latency()
	}
	return out
}

// log logs the summary table row, where B's time went, B's slowest
// probes under load and the CPU of the window.
func (res fairResult) log(t *testing.T) {
	u, l := latencies(res.unloaded), latencies(res.loaded)
	r := func(d time.Duration) string { return d.Round(100 * time.Microsecond).String() }
	ms := func(d time.Duration) string {
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64)
	}
	u50, u90, u99 := quantile.Of(u, 0.5), quantile.Of(u, 0.9), quantile.Of(u, 0.99)
	l50, l90, l99 := quantile.Of(l, 0.5), quantile.Of(l, 0.9), quantile.Of(l, 0.99)
	n := res.size.backlog
	t.Logf("summary (%d probes each; load average %s after)\n"+
		"| case | B unloaded p50 / p90 / p99 | B under A's %d, p50 / p90 / p99 | ratio p50 | ratio p90 | ratio p99 | A's %d started in | A's %d finished in |\n"+
		"| %s | %s / %s / %s ms | %s / %s / %s ms | %.2f | %.2f | %.2f | %s | %s |",
		res.size.probes, loadavg(), n, n, n,
		res.name, ms(u50), ms(u90), ms(u99), ms(l50), ms(l90), ms(l99),
		float64(l50)/float64(u50), float64(l90)/float64(u90), float64(l99)/float64(u99),
		res.aStartedIn.Round(100*time.Millisecond), res.aFinishedIn.Round(100*time.Millisecond))

	// Where B's time goes: StartRun's answer, until the run was created,
	// from there to the first step's dispatch.
	parts := func(ps []fairProbe) string {
		part := func(f func(fairProbe) time.Duration) string {
			ds := make([]time.Duration, len(ps))
			for i, p := range ps {
				ds[i] = f(p)
			}
			return fmt.Sprintf("p50 %s p99 %s", r(quantile.Of(ds, 0.5)), r(quantile.Of(ds, 0.99)))
		}
		return fmt.Sprintf("StartRun answered %s; called → created_at %s; created_at → dispatched_at %s",
			part(func(p fairProbe) time.Duration { return p.answered }),
			part(func(p fairProbe) time.Duration { return p.created.Sub(p.at) }),
			part(func(p fairProbe) time.Duration { return p.dispatched.Sub(p.created) }))
	}
	half := res.size.probes / 2
	t.Logf("B unloaded: %s; p50 before A's load %s, after it %s", parts(res.unloaded), r(quantile.Of(u[:half], 0.5)), r(quantile.Of(u[half:], 0.5)))
	t.Logf("B under load: %s; A had started %d runs when B began, %d when B's probes ended", parts(res.loaded), res.aAtProbe, res.aAfterProbe)
	t.Logf("pacing while B probed under load: %s", res.pacing)

	slow := make([]int, len(l))
	for i := range slow {
		slow[i] = i
	}
	slices.SortFunc(slow, func(x, y int) int { return cmp.Compare(l[y], l[x]) })
	var tail []string
	for _, i := range slow[:min(5, len(slow))] {
		p := res.loaded[i]
		tail = append(tail, fmt.Sprintf("#%d %s (started at %s UTC, A's start +%s; StartRun %s, created +%s, dispatched +%s)", i, r(l[i]),
			p.at.UTC().Format("15:04:05.000"), p.at.Sub(res.aStart).Round(time.Millisecond), r(p.answered), r(p.created.Sub(p.at)), r(p.dispatched.Sub(p.created))))
	}
	t.Logf("B's slowest probes under load (start order): %s", strings.Join(tail, ", "))

	// CPU and run-queue wait of each process while A started its backlog
	// and B probed (summed over its threads: a wait is time a thread was
	// runnable and no CPU was free), and the machine's CPU.
	names := make([]string, 0, len(res.schedAfter))
	for name := range res.schedAfter {
		names = append(names, name)
	}
	slices.Sort(names)
	var cpu []string
	var ours time.Duration
	for _, name := range names {
		used := res.schedAfter[name].cpu - res.schedBefore[name].cpu
		ours += used
		cpu = append(cpu, fmt.Sprintf("%s %.2f s CPU / %.2f s waiting", name, used.Seconds(), (res.schedAfter[name].wait-res.schedBefore[name].wait).Seconds()))
	}
	t.Logf("in the %s from A's first start to B's last probe: %s", res.probesEnd.Sub(res.aStart).Round(10*time.Millisecond), strings.Join(cpu, "; "))
	busy, idle := res.cpuAfter.busy-res.cpuBefore.busy, res.cpuAfter.idle-res.cpuBefore.idle
	t.Logf("machine in that window: %.2f s CPU busy, %.2f s idle; the topology and its clients %.2f s, everything else %.2f s",
		busy.Seconds(), idle.Seconds(), ours.Seconds(), max(busy-ours, 0).Seconds())
}
