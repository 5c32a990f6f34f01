package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/natsauth"
)

// firstTenant is the tenant the upgraded installation gets, with the pool
// it owns.
const firstTenant, firstTenantPool = "team-a", "sql"

// plainBearer sends an API key over the topology's plaintext loopback
// connections (--plaintext supervisors). authn.Bearer refuses to, and so
// does the planex CLI: that is why this phase calls TenantService itself
// where docs/tenancy.md says `planex tenants create`.
type plainBearer string

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b plainBearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials.
func (plainBearer) RequireTransportSecurity() bool { return false }

// withoutAuthDisabled drops --auth-disabled from args.
func withoutAuthDisabled(args []string) []string {
	return slices.DeleteFunc(slices.Clone(args), func(a string) bool { return a == "--auth-disabled" })
}

// halt ends p for now, as a Deployment scaled to zero does (SIGTERM, then
// SIGKILL after grace); the keeper does not restart it, p.start does.
func halt(p *proc, grace time.Duration) {
	p.mu.Lock()
	p.killing = true
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// deleteGlobalStreams deletes every stream of the account url's
// anonymous user is in (the global account of the topology's NATS,
// which has no authorization) and returns how many.
func deleteGlobalStreams(ctx context.Context, t *testing.T, url string) int {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	names := js.StreamNames(cctx)
	var all []string
	for name := range names.Name() {
		all = append(all, name)
	}
	if err := names.Err(); err != nil {
		t.Fatalf("list the global account's streams: %v", err)
	}
	for _, name := range all {
		if err := js.DeleteStream(cctx, name); err != nil {
			t.Fatalf("delete stream %s of the global account: %v", name, err)
		}
	}
	return len(all)
}

// tenantClients are the clients of one tenant, one per supervisor.
type tenantClients struct {
	runs    []planexv1.SupervisorServiceClient
	tenants []planexv1.TenantServiceClient
}

func (w *upgradeWorkload) clientsWithKey(key string) tenantClients {
	var c tenantClients
	for _, addr := range w.top.supAddrs {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(plainBearer(key)))
		if err != nil {
			w.t.Fatal(err)
		}
		w.conns = append(w.conns, conn)
		c.runs = append(c.runs, planexv1.NewSupervisorServiceClient(conn))
		c.tenants = append(c.tenants, planexv1.NewTenantServiceClient(conn))
	}
	return c
}

// addFirstTenant gives the upgraded installation its first tenant the way
// docs/tenancy.md ("Adding the first tenant to an existing installation")
// tells an operator to, while two runs wait at a gate (a plan gate before
// a mail, a step gate): `planex auth k8s-secrets --tenant team-a=sql
// --nats-admin`; the planex services stopped; `planex backup`; every NATS
// node restarted, one at a time, with the generated auth.conf (the
// default tenant's users in planex-default, team-a's in its account);
// `planex restore` as the account admin into planex-default; the services
// started with their NATS identities (the supervisors also with team-a's
// credentials) and team-a's own sql pool; the tenant created
// (TenantService.CreateTenant, what `planex tenants create` calls). Then:
// every run of before is listed and reads as it ended, through both
// supervisors, with the default tenant's unchanged API key; the two gated
// runs are decided and end, the mail sent once; a new run of the default
// tenant and one of team-a end; neither tenant sees the other's runs
// (NotFound); every run log verifies with `planex audit verify`.
//
// The topology's NATS has no authorization before this phase, so the
// backup needs no account admin (the procedure's step 1 assumes one).
func (w *upgradeWorkload) addFirstTenant(ctx context.Context, cur *release, natsBin, dir string) {
	t := w.t
	t.Helper()
	top := w.top
	start := time.Now()
	step := func(format string, args ...any) {
		t.Logf("tenants +%s: %s", time.Since(start).Round(100*time.Millisecond), fmt.Sprintf(format, args...))
	}
	cli := func(args ...string) (string, error) {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(cctx, cur.bin, args...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	top.sink.setDelay(0)

	// Runs that wait at a gate across the move.
	mail := &upRun{key: "tenants-plan-mail", kind: kindMail, to: "upgrade-tenants@example.com", wave: -1}
	closing := &upRun{key: "tenants-close", kind: kindCloseApprove, ticket: w.tickets[len(w.tickets)-1], wave: -1}
	crossing := []*upRun{mail, closing}
	for i, r := range crossing {
		req := &planexv1.StartRunRequest{IdempotencyKey: r.key}
		if r == mail {
			req.Goal, req.ApprovePlans = "Email "+r.to+" a summary of the top 5 customers by revenue in 2025", true
		} else {
			req.Goal = fmt.Sprintf("Close support ticket %d", r.ticket)
		}
		r.goal = req.Goal
		if err := w.call(ctx, i, func(ctx context.Context, c planexv1.SupervisorServiceClient) error {
			resp, err := c.StartRun(ctx, req)
			r.id = resp.GetRun().GetId()
			return err
		}); err != nil {
			t.Fatalf("StartRun %s: %v", r.key, err)
		}
	}
	for _, r := range crossing {
		if err := w.waitFor(ctx, r, func(run *planexv1.Run) bool { return openGate(run) != nil }, time.Minute); err != nil {
			t.Fatalf("before the move: %v", err)
		}
	}
	before := append(slices.Clone(w.runs), crossing...)
	step("%d runs of the default tenant, 2 waiting at a gate", len(before))

	// 1. Credentials: the accounts, every identity's nkey, an account admin.
	creds := filepath.Join(dir, "credentials")
	out, err := cli("auth", "k8s-secrets", "--namespace=planex", "--out-dir="+creds, "--tenant="+firstTenant+"="+firstTenantPool, "--nats-admin")
	if err != nil {
		t.Fatalf("planex auth k8s-secrets --tenant %s=%s --nats-admin: %v\n%s", firstTenant, firstTenantPool, err, out)
	}
	secret := func(name, key string) string { return filepath.Join(creds, "secrets", name, key) }
	authConf, err := os.ReadFile(secret("nats-auth", "auth.conf"))
	if err != nil {
		t.Fatal(err)
	}
	tenantCreds := filepath.Join(dir, "tenant-credentials")
	tenantSeed := func(id string) string { return secret("planex-tenant-"+firstTenant+"-nats", id+".nk") }
	if err := os.MkdirAll(filepath.Join(tenantCreds, firstTenant), 0o700); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(tenantSeed(natsauth.Supervisor)); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(filepath.Join(tenantCreds, firstTenant, natsauth.Supervisor+".nk"), b, 0o600); err != nil {
		t.Fatal(err)
	}

	// 2. Stop the planex services, back up.
	var wg sync.WaitGroup
	for _, p := range top.procs {
		wg.Add(1)
		go func() { defer wg.Done(); halt(p.proc, 30*time.Second) }()
	}
	wg.Wait()
	step("planex services stopped")
	backup := filepath.Join(dir, "backup")
	if out, err := cli("backup", "--out="+backup, "--nats-url="+top.url); err != nil || !strings.Contains(out, "backed up") {
		t.Fatalf("planex backup: %v\n%s", err, out)
	}
	step("backed up")
	// The global account's streams go before NATS restarts with accounts:
	// kept, their assignments stay in the cluster's meta layer, and every
	// node's /healthz reports them "not current" (JetStream not enabled
	// for account) for good, so a node never passes a startup probe on
	// /healthz again. Without NATS authorization anyone may delete them;
	// with it, the account admin of step 1.
	n := deleteGlobalStreams(ctx, t, top.url)
	step("deleted the %d streams of the global account", n)

	// 3. NATS with the accounts: each node restarted with auth.conf.
	conf := filepath.Join(dir, "nats-auth.conf")
	if err := os.WriteFile(conf, authConf, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, n := range top.nats { // a rolling restart, as a StatefulSet's
		args := append(slices.Clone(n.args), "--config", conf)
		if _, err := n.replace(natsBin, args, 10*time.Second); err != nil {
			t.Fatalf("restart %s with accounts: %v", n.name, err)
		}
		rctx, rcancel := context.WithTimeout(ctx, time.Minute)
		err := n.waitReady(rctx)
		rcancel()
		if err != nil {
			t.Fatalf("%s with accounts: %v", n.name, err)
		}
	}
	step("NATS restarted with the accounts %s and %s", natsauth.DefaultAccount, natsauth.TenantAccount(firstTenant))

	// 4. Restore into planex-default as its account admin.
	admin := []string{"--nats-url=" + top.url, "--nats-nkey-file=" + secret("planex-nats-admin", "nkey"), "--nats-identity=" + natsauth.AccountAdmin}
	out, err = cli(append([]string{"restore", "--in=" + backup, "--replicas=3"}, admin...)...)
	if want := fmt.Sprintf("%d runs: %d logs verified", len(before), len(before)); err != nil || !strings.Contains(out, want) {
		t.Fatalf("planex restore as the admin of %s: %v, want %q\n%s", natsauth.DefaultAccount, err, want, out)
	}
	step("restored into %s", natsauth.DefaultAccount)

	// 5. The services with their NATS identities; team-a's keys and pool.
	platformKey, platformLine, err := authn.GenerateAPIKey("platform", authn.RolePlatformAdmin)
	if err != nil {
		t.Fatal(err)
	}
	tenantKey, tenantLine, err := authn.GenerateAPIKey(firstTenant+"-ci", authn.RoleApprover)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(top.keysFile, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fmt.Fprintf(f, "%s\n%s tenant=%s\n", platformLine, tenantLine, firstTenant)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	identity := func(p *upProc) string {
		if p.role != "executor" {
			return p.role
		}
		for _, a := range p.base {
			if pool, ok := strings.CutPrefix(a, "--pool="); ok {
				return natsauth.Executor + "-" + pool
			}
		}
		t.Fatalf("%s: no --pool", p.name)
		return ""
	}
	var tenantPool *upProc
	for _, p := range top.procs {
		p.base = append(p.base, "--nats-nkey-file="+secret("planex-nats-"+identity(p), "nkey"))
		switch {
		case p.role == "supervisor":
			p.base = append(p.base, "--tenant-credentials-dir="+tenantCreds)
		case tenantPool == nil && identity(p) == natsauth.Executor+"-"+firstTenantPool:
			base := slices.DeleteFunc(slices.Clone(p.base), func(a string) bool { return strings.HasPrefix(a, "--nats-nkey-file=") })
			tenantPool = &upProc{role: p.role, rel: cur, base: append(base, "--tenant="+firstTenant, "--nats-nkey-file="+tenantSeed(natsauth.Executor+"-"+firstTenantPool))}
			name := "executor-" + firstTenant + "-" + firstTenantPool
			tenantPool.proc = &proc{name: name, bin: cur.bin, logPath: filepath.Join(dir, name+".log"), ready: serving}
		}
	}
	procs := append(slices.Clone(top.procs), tenantPool)
	for _, p := range procs {
		checkFlags(t, cur, p.role, p.argsFor(cur))
		p.mu.Lock()
		p.args = p.argsFor(cur)
		p.mu.Unlock()
		if err := p.start(); err != nil {
			t.Fatal(err)
		}
	}
	errs := make([]error, len(procs))
	for i, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, rcancel := context.WithTimeout(ctx, 90*time.Second)
			defer rcancel()
			errs[i] = p.waitReady(rctx)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("services with their NATS identities: %v", err)
	}
	tenantPool.keep(ctx, t.Logf)
	top.procs = append(top.procs, tenantPool)
	step("%d planex services started with NATS identities", len(procs))

	// 6. The tenant.
	platform, team := w.clientsWithKey(platformKey), w.clientsWithKey(tenantKey)
	for try := 0; ; try++ {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := platform.tenants[try%2].CreateTenant(cctx, &planexv1.CreateTenantRequest{Tenant: &planexv1.Tenant{Name: firstTenant, Pools: []string{firstTenantPool}}})
		cancel()
		if err == nil || (try > 0 && status.Code(err) == codes.AlreadyExists) { // AlreadyExists: an attempt that timed out was recorded
			break
		}
		if !retryable(err) || try == 3 {
			t.Fatalf("CreateTenant %s (attempt %d): %v", firstTenant, try+1, err)
		}
		t.Logf("CreateTenant %s (attempt %d): %v; retrying", firstTenant, try+1, err)
	}
	// Ready within seconds, as docs/tenancy.md says. Both supervisors set
	// up the new account's streams at once, and on this 3-node cluster
	// that has taken ~10 s per stream (a create whose reply never comes
	// within bus.Setup's request timeout): waited for, so that the checks
	// below run, but an error.
	created := time.Now()
	for i, c := range platform.tenants {
		deadline := time.Now().Add(4 * time.Minute)
		for {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			resp, err := c.GetTenant(cctx, &planexv1.GetTenantRequest{Name: firstTenant})
			cancel()
			if err == nil && resp.GetTenant().GetReady() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("tenant %s not ready on supervisor-%d within 4m: %v (%s)", firstTenant, i+1, err, resp.GetTenant().GetNotReadyReason())
			}
			time.Sleep(200 * time.Millisecond)
		}
		if d := time.Since(created); d > 30*time.Second {
			t.Errorf("tenant %s ready on supervisor-%d %s after its creation, want within 30s", firstTenant, i+1, d.Round(time.Second))
		}
	}
	step("tenant %s created and ready on both supervisors", firstTenant)

	// Every run of before: listed, and read as it was, through both
	// supervisors with the default tenant's key of before.
	listed := map[string]bool{}
	for page := ""; ; {
		var resp *planexv1.ListRunsResponse
		if err := w.call(ctx, 0, func(ctx context.Context, c planexv1.SupervisorServiceClient) error {
			var err error
			resp, err = c.ListRuns(ctx, &planexv1.ListRunsRequest{PageSize: 100, PageToken: page})
			return err
		}); err != nil {
			t.Fatalf("ListRuns after the move: %v", err)
		}
		for _, r := range resp.GetRuns() {
			listed[r.GetId()] = true
		}
		if page = resp.GetNextPageToken(); page == "" {
			break
		}
	}
	for _, r := range before {
		if !listed[r.id] {
			t.Errorf("%s is not listed after the move", r)
		}
		for i := range w.clients {
			run, err := w.get(ctx, i, r.id)
			switch {
			case err != nil:
				t.Errorf("supervisor-%d cannot read %s after the move: %v", i+1, r, err)
			case r.last != nil && terminal(r.last.GetStatus()) && (run.GetStatus() != r.last.GetStatus() || run.GetLastSequence() != r.last.GetLastSequence()):
				t.Errorf("%s reads %s at event %d through supervisor-%d after the move, %s at event %d before", r,
					run.GetStatus(), run.GetLastSequence(), i+1, r.last.GetStatus(), r.last.GetLastSequence())
			}
		}
	}
	step("%d runs of before listed and read through both supervisors", len(before))

	// The gated runs go on; a new run in each tenant.
	fresh := &upRun{key: "tenants-default-new", kind: kindSQL, goal: "How many open support tickets does Acme Corp have?", wave: -1}
	mine := &upRun{key: "tenants-" + firstTenant + "-new", kind: kindSQL, goal: "How many open support tickets does Acme Corp have?", wave: -1}
	if err := w.call(ctx, 1, func(ctx context.Context, c planexv1.SupervisorServiceClient) error {
		resp, err := c.StartRun(ctx, &planexv1.StartRunRequest{Goal: fresh.goal, IdempotencyKey: fresh.key})
		fresh.id = resp.GetRun().GetId()
		return err
	}); err != nil {
		t.Fatalf("StartRun in the default tenant after the move: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	resp, err := team.runs[0].StartRun(cctx, &planexv1.StartRunRequest{Goal: mine.goal, IdempotencyKey: mine.key})
	cancel()
	if err != nil {
		t.Fatalf("StartRun in tenant %s: %v", firstTenant, err)
	}
	mine.id = resp.GetRun().GetId()
	deadline := time.Now().Add(2 * time.Minute)
	for n := 0; ; n++ {
		open := 0
		for _, r := range append(slices.Clone(crossing), fresh) {
			if r.last != nil && terminal(r.last.GetStatus()) {
				continue
			}
			if run, err := w.get(ctx, n, r.id); err == nil {
				r.last = run
				if g := openGate(run); g != nil {
					w.decide(ctx, r, g, n%len(w.clients))
				}
			}
			if !terminal(r.last.GetStatus()) {
				open++
			}
		}
		if mine.last == nil || !terminal(mine.last.GetStatus()) {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			resp, err := team.runs[n%2].GetRun(cctx, &planexv1.GetRunRequest{RunId: mine.id})
			cancel()
			if err == nil {
				mine.last = resp.GetRun()
			} else if !retryable(err) {
				t.Fatalf("tenant %s cannot read its run %s: %v", firstTenant, mine.id, err)
			}
			if !terminal(mine.last.GetStatus()) {
				open++
			}
		}
		if open == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("runs after the move not ended within 2m: %s %s, %s %s, %s %s, %s %s", mail, mail.last.GetStatus(), closing, closing.last.GetStatus(),
				fresh, fresh.last.GetStatus(), mine, mine.last.GetStatus())
		}
		time.Sleep(200 * time.Millisecond)
	}
	mails := top.sink.byRecipient()
	for _, r := range []*upRun{mail, closing, fresh, mine} {
		got := fmt.Sprintf("%s/%s", strings.TrimPrefix(r.last.GetStatus().String(), "RUN_STATUS_"), strings.TrimPrefix(r.last.GetStopReason().String(), "STOP_REASON_"))
		result := r.last.GetResult().GetStringValue()
		switch {
		case got != "SUCCEEDED/SUCCEEDED":
			t.Errorf("%s ended %s (%q, answer %q), want SUCCEEDED", r, got, r.last.GetStopMessage(), result)
		case r == closing && !strings.Contains(result, fmt.Sprintf("Closed support ticket %d ", r.ticket)):
			t.Errorf("%s answered %q, want \"Closed support ticket %d ...\"", r, result, r.ticket)
		}
	}
	if mails[mail.to] != 1 {
		t.Errorf("%s: want exactly one mail to %s, the sink got %d", mail, mail.to, mails[mail.to])
	}
	step("the gated runs decided and ended, one mail; a new run ended in each tenant")

	// Neither tenant sees the other's runs.
	for _, id := range []string{fresh.id, before[0].id, mail.id} {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := team.runs[1].GetRun(cctx, &planexv1.GetRunRequest{RunId: id})
		cancel()
		if status.Code(err) != codes.NotFound {
			t.Errorf("tenant %s reads the default tenant's run %s: %v, want NotFound", firstTenant, id, err)
		}
	}
	if _, err := w.get(ctx, 0, mine.id); status.Code(err) != codes.NotFound {
		t.Errorf("the default tenant reads %s's run %s: %v, want NotFound", firstTenant, mine.id, err)
	}
	cctx, cancel = context.WithTimeout(ctx, 10*time.Second)
	list, err := team.runs[0].ListRuns(cctx, &planexv1.ListRunsRequest{PageSize: 100})
	cancel()
	if err != nil || len(list.GetRuns()) != 1 || list.GetRuns()[0].GetId() != mine.id {
		var ids []string
		for _, r := range list.GetRuns() {
			ids = append(ids, r.GetId())
		}
		t.Errorf("tenant %s lists %v (%v), want only its run %s", firstTenant, ids, err, mine.id)
	}

	// Every log verifies, read as the tenant's supervisor.
	verify := func(r *upRun, seed string) error {
		out, err := cli("audit", "verify", r.id, "--nats-url="+top.url, "--nats-nkey-file="+seed)
		if err != nil || !strings.Contains(out, " verified (finished)") {
			return fmt.Errorf("%s: audit verify by %s as %s: %v: %s", r, cur.name, filepath.Base(filepath.Dir(seed)), err, out)
		}
		return nil
	}
	all := append(before, fresh)
	errs = make([]error, len(all)+1)
	sem := make(chan struct{}, 2)
	for i, r := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = verify(r, secret("planex-nats-"+natsauth.Supervisor, "nkey"))
		}()
	}
	errs[len(all)] = verify(mine, tenantSeed(natsauth.Supervisor))
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Error(err)
	}
	step("%d run logs verified after the move", len(all)+1)
}
