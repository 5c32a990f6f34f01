package chaos

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/freeport"
	"github.com/planex-dev/planex/services/executor/searchpool"
)

var (
	upgradeFlag = flag.Bool("upgrade", false, "run the rolling-upgrade test: the previous release's processes (.ci/previous-release, built from its commit) replaced one by one, in random order, by this commit's while runs are in flight; also PLANEX_UPGRADE=1")
	upgradeSeed = flag.Uint64("upgrade-seed", 0, "with -upgrade: seed of the replacement order (0: from the clock; the seed is printed)")
)

// upgradeEnabled reports whether the upgrade tests run: -upgrade or
// PLANEX_UPGRADE=1.
func upgradeEnabled() bool {
	return *upgradeFlag || os.Getenv("PLANEX_UPGRADE") == "1"
}

// previousReleaseFile names the release the upgrade test starts from: one
// line, "<tag> <commit>". CI's `buf breaking` compares against the same
// commit.
const previousReleaseFile = ".ci/previous-release"

// flagsOnlyInNew lists, per role ("supervisor", "planner", "executor"),
// production flags of the topology that this commit knows and the previous
// release does not: processes of the previous release start without them.
// Empty while the topology uses only flags both know. TestUpgrade checks
// each binary's --help against the flags it is given, so a flag added to
// the topology without an entry here fails, naming the flag and release.
//
// The documented upgrade procedure from the previous release
// (docs/deploy.md, "Upgrades and compatibility") needs no flag during the
// rollout: v0.1.0 and later already append version 2 run-log hashes, so
// --run-log-hash-version 1 is only for deployments older than it. A
// procedure flag of a later release (given to new processes only while
// old ones run) would need its own list here and a last pass restarting
// those processes without it.
var flagsOnlyInNew = map[string][]string{}

// release is one version of the planex binary.
type release struct {
	name string // for logs: "v0.2.0 (a5f302fc1707)", "this commit"
	bin  string
	new  bool
	help map[string]string // --help of each subcommand, read once
}

// TestUpgrade is the rolling-upgrade test of docs/deploy.md ("Upgrades
// and compatibility"): the chaos topology (3 NATS nodes, 2 supervisors,
// the planner, 2 replicas of each pool, the SMTP sink) starts on the
// previous release's binary; runs are started and held at plan and step
// gates and in slow sends; then every planex process is replaced, one at a
// time in a seeded random order, by this commit's binary (SIGTERM, the
// replacement serving before the next). After each replacement both
// supervisors must read every run, more runs start and the gates of the
// runs before are decided, so runs written by one release are read,
// advanced and decided by the other. At the end every run must have ended
// as it would have without the upgrade, each mail sent exactly once, and
// every run log must verify with both releases' `planex audit verify`
// (stored and exported). Then the upgraded installation gets its first
// tenant as docs/tenancy.md says (addFirstTenant).
func TestUpgrade(t *testing.T) {
	if !upgradeEnabled() {
		t.Skip("upgrade test: run with `go test ./test/chaos -run '^TestUpgrade$' -upgrade -v -timeout 20m` (or PLANEX_UPGRADE=1)")
	}
	testStart := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := workDir(t)

	tag, commit := previousRelease(t)
	old := &release{name: fmt.Sprintf("%s (%s)", tag, commit[:12]), bin: buildPrevious(t, tag, commit)}
	t.Logf("building this commit's planex and nats-server; logs in %s", dir)
	newBin, natsBin := build(t, dir)
	cur := &release{name: "this commit", bin: newBin, new: true}

	top := startUpgradeTopology(t, ctx, old, natsBin, dir)
	defer top.stop()
	for _, p := range top.procs { // fail now, naming the flag, rather than in a replacement
		checkFlags(t, cur, p.role, p.argsFor(cur))
	}
	// Every send takes over 4 s (three commands at 1.5 s): sends are in
	// flight when processes are replaced.
	top.sink.setDelay(1500 * time.Millisecond)

	w := newUpgradeWorkload(t, top)
	defer w.close()
	// One ticket per wave, and one for the run that waits at its gate
	// across the move to tenants.
	w.tickets = openTickets(t, ctx, filepath.Join(dir, "demo.db"), len(top.procs)+2)

	seed := *upgradeSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	rng := rand.New(rand.NewPCG(seed, 28))
	order := slices.Clone(top.procs)
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	names := make([]string, len(order))
	for i, p := range order {
		names[i] = p.name
	}
	t.Logf("upgrade %s -> %s; replacement order (seed %d; rerun with -upgrade-seed=%d): %s", old.name, cur.name, seed, seed, strings.Join(names, ", "))

	start := time.Now()
	w.wave(ctx, 0)
	for i, p := range order {
		rstart := time.Now()
		graceful, err := p.replace(cur.bin, p.argsFor(cur), 30*time.Second)
		if err != nil {
			t.Fatalf("replace %s: %v", p.name, err)
		}
		if !graceful {
			t.Errorf("%s did not stop within 30s of SIGTERM (killed): a rolling update would have cut its work", p.name)
		}
		rctx, rcancel := context.WithTimeout(ctx, 90*time.Second)
		err = p.waitReady(rctx)
		rcancel()
		if err != nil {
			t.Fatalf("%s of %s after replacement: %v", p.name, cur.name, err)
		}
		p.rel = cur
		t.Logf("%d/%d %s now runs %s (%s; %s)", i+1, len(order), p.name, cur.name, time.Since(rstart).Round(100*time.Millisecond), top.versions())
		w.decideWave(ctx, i)
		w.wave(ctx, i+1)
		// Runs started, advanced and decided under this mix of releases,
		// and those before it, read through both supervisors.
		w.crossRead(ctx, top, false)
	}
	w.decideWave(ctx, len(order))
	t.Logf("every process replaced in %s; deciding the last gates, waiting for the runs to end", time.Since(start).Round(time.Second))
	w.decideRest(ctx, 2*time.Minute)
	w.await(ctx, 3*time.Minute)
	t.Logf("runs ended %s after the first replacement", time.Since(start).Round(time.Second))
	w.crossRead(ctx, top, true)
	w.check()
	w.audit(ctx, old, cur, top.url, filepath.Join(dir, "exports"))
	t.Logf("upgrade done %s after the start", time.Since(testStart).Round(time.Second))
	tstart := time.Now()
	w.addFirstTenant(ctx, cur, natsBin, dir)
	t.Logf("first tenant added in %s (test %s)", time.Since(tstart).Round(100*time.Millisecond), time.Since(testStart).Round(time.Second))
	for _, p := range top.procs {
		if p.selfExits > 0 {
			t.Logf("%s exited by itself %d times (restarted)", p.name, p.selfExits)
		}
	}
}

// previousRelease reads .ci/previous-release and resolves it in this
// clone: the tag when it exists (it must point at the commit the file
// names), else the commit. Neither (a shallow clone) fails, saying what to
// fetch, unless PLANEX_UPGRADE_SKIP_NO_PREVIOUS=1 asks to skip.
func previousRelease(t *testing.T) (tag, commit string) {
	t.Helper()
	root := repoRoot()
	b, err := os.ReadFile(filepath.Join(root, previousReleaseFile))
	if err != nil {
		t.Fatalf("previous release: %v", err)
	}
	f := strings.Fields(string(b))
	if len(f) != 2 || !regexp.MustCompile(`^[0-9a-f]{40}$`).MatchString(f[1]) {
		t.Fatalf("%s: want one line \"<tag> <40-hex commit>\", got %q", previousReleaseFile, strings.TrimSpace(string(b)))
	}
	tag, commit = f[0], f[1]
	git := func(args ...string) (string, error) {
		cmd := exec.Command("git", args...)
		cmd.Dir = root
		out, err := cmd.Output()
		return strings.TrimSpace(string(out)), err
	}
	if got, err := git("rev-parse", "--verify", "--quiet", "refs/tags/"+tag+"^{commit}"); err == nil {
		if got != commit {
			t.Fatalf("tag %s points at %s but %s says %s: correct one of them", tag, got, previousReleaseFile, commit)
		}
		return tag, commit
	}
	if _, err := git("cat-file", "-e", commit+"^{commit}"); err == nil {
		return tag, commit
	}
	msg := fmt.Sprintf("previous release %s (%s, from %s) is not in this clone (shallow?): fetch it with `git fetch origin %s` or `git fetch --unshallow --tags`",
		tag, commit, previousReleaseFile, commit)
	if os.Getenv("PLANEX_UPGRADE_SKIP_NO_PREVIOUS") == "1" {
		t.Skip(msg + "; skipped because PLANEX_UPGRADE_SKIP_NO_PREVIOUS=1")
	}
	t.Fatal(msg + " (or set PLANEX_UPGRADE_SKIP_NO_PREVIOUS=1 to skip the test)")
	return "", ""
}

// buildPrevious builds the previous release's planex from its commit
// (git archive, so no worktree is registered in .git) with the module
// cache of this one, and keeps it under
// $PLANEX_UPGRADE_CACHE/<commit>/planex (default: the user cache
// directory's planex/prev), so that a rerun reuses it.
func buildPrevious(t *testing.T, tag, commit string) string {
	t.Helper()
	cache := os.Getenv("PLANEX_UPGRADE_CACHE")
	if cache == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			t.Fatalf("no cache directory for the previous release's binary (set PLANEX_UPGRADE_CACHE): %v", err)
		}
		cache = filepath.Join(base, "planex", "prev")
	}
	dir := filepath.Join(cache, commit)
	bin := filepath.Join(dir, "planex")
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		t.Logf("previous release %s: %s (cached)", tag, bin)
		return bin
	}
	start := time.Now()
	src := t.TempDir()
	archive := exec.Command("git", "archive", "--format=tar", commit)
	archive.Dir = repoRoot()
	untar := exec.Command("tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var aerr, uerr bytes.Buffer
	archive.Stderr, untar.Stdin, untar.Stderr = &aerr, pipe, &uerr
	if err := untar.Start(); err != nil {
		t.Fatalf("tar: %v", err)
	}
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", commit, err, aerr.String())
	}
	if err := untar.Wait(); err != nil {
		t.Fatalf("tar -x of %s: %v\n%s", commit, err, uerr.String())
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.CreateTemp(dir, "planex-*.tmp")
	if err != nil {
		t.Fatal(err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags", "-X main.version="+tag+" -X main.commit="+commit, "-o", tmp.Name(), "./cmd/planex")
	cmd.Dir = src
	// The release's own settings (CGO_ENABLED=0 -trimpath, as make
	// release builds): the modules both releases share come from the
	// compiles of this commit's release binary in the build cache.
	cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the previous release %s (%s): %v\n%s", tag, commit, err, out)
	}
	if err := os.Rename(tmp.Name(), bin); err != nil {
		t.Fatal(err)
	}
	t.Logf("previous release %s: built %s in %s", tag, bin, time.Since(start).Round(100*time.Millisecond))
	return bin
}

// checkFlags fails when the release's binary does not know a flag it is
// given: the previous release must get only flags it knows.
func checkFlags(t *testing.T, r *release, role string, args []string) {
	t.Helper()
	if r.help == nil {
		r.help = map[string]string{}
	}
	help, ok := r.help[role]
	if !ok {
		out, err := exec.Command(r.bin, role, "--help").CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s --help: %v\n%s", r.name, role, err, out)
		}
		help = string(out)
		r.help[role] = help
	}
	for _, a := range args {
		name, ok := strings.CutPrefix(a, "--")
		if !ok {
			continue
		}
		name, _, _ = strings.Cut(name, "=")
		if !strings.Contains(help, "--"+name+" ") {
			t.Fatalf("planex %s of %s has no flag --%s: give it only to the release that has it (flagsOnlyInNew in upgrade_test.go)", role, r.name, name)
		}
	}
}

// upProc is one planex process of the upgrade topology.
type upProc struct {
	*proc
	role string   // the subcommand: supervisor, planner, executor
	base []string // arguments of every release, the subcommand first
	rel  *release // the release it runs
}

// argsFor is the process's arguments under release r.
func (u *upProc) argsFor(r *release) []string {
	args := slices.Clone(u.base)
	if r.new {
		args = append(args, flagsOnlyInNew[u.role]...)
	}
	return args
}

// upgradeTopology is the chaos topology of one release or a mix.
type upgradeTopology struct {
	nats        []*natsNode
	procs       []*upProc // planex processes, in start order
	supervisors []*upProc
	sink        *smtpSink
	supAddrs    []string
	url         string
	// apiKey is the default tenant's clients' key (role approver), in
	// keysFile (--auth-api-keys-file of the supervisors).
	apiKey, keysFile string
}

// startUpgradeTopology starts the chaos topology (docs/chaos.md) with rel's
// binary: the same flags, with a shutdown grace that lets an executor
// finish a slow send when it is replaced.
func startUpgradeTopology(t *testing.T, ctx context.Context, rel *release, natsBin, dir string) *upgradeTopology {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	tp := &upgradeTopology{sink: startSink(t)}
	tp.nats = startNATSCluster(t, sctx, natsBin, dir)
	tp.url = natsURL(tp.nats)
	// The supervisors authenticate their callers with an API key that
	// both releases read (three fields), so that the default tenant's
	// clients are shown to keep theirs when tenants come.
	key, line, err := authn.GenerateAPIKey("upgrade-client", authn.RoleApprover)
	if err != nil {
		t.Fatal(err)
	}
	tp.apiKey, tp.keysFile = key, filepath.Join(dir, "api-keys")
	if err := os.WriteFile(tp.keysFile, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	dd := prepareDemoData(t, sctx, dir)
	dbPath, books, docs, signingKey, verifyKeys := dd.dbPath, dd.books, dd.docs, dd.signingKey, dd.verifyKeys
	common := func(addr string) []string {
		return []string{"--grpc-addr=" + addr, "--nats-url=" + tp.url, "--stream-replicas=3", "--log-format=json", "--log-level=info",
			"--shutdown-grace=20s", "--plaintext", "--auth-disabled"}
	}
	add := func(name string, args ...string) *upProc {
		t.Helper()
		p := &upProc{role: args[0], base: args, rel: rel}
		checkFlags(t, rel, p.role, p.argsFor(rel))
		p.proc = &proc{name: name, bin: rel.bin, args: p.argsFor(rel), logPath: filepath.Join(dir, name+".log"), ready: serving}
		if err := p.start(); err != nil {
			t.Fatal(err)
		}
		if err := p.waitReady(sctx); err != nil {
			t.Fatal(err)
		}
		tp.procs = append(tp.procs, p)
		return p
	}

	plannerAddr := freeport.Addr(t)
	add("planner", append([]string{"planner", "--playbooks=" + books}, common(plannerAddr)...)...)
	const concurrency, replicas = 4, 2
	pending := fmt.Sprint(concurrency * replicas)
	for _, pool := range []string{"sql", "email", "search"} {
		for i := 1; i <= replicas; i++ {
			name := fmt.Sprintf("executor-%s-%d", pool, i)
			args := append([]string{"executor", "--pool=" + pool, "--concurrency=" + fmt.Sprint(concurrency), "--max-ack-pending=" + pending, "--step-verify-keys=" + verifyKeys},
				common("127.0.0.1:0")...)
			switch pool {
			case "sql":
				args = append(args, "--sql-dsn="+dbPath)
			case "email":
				args = append(args, "--smtp-addr="+tp.sink.addr, "--smtp-starttls=none", "--email-allowed-domains=example.com")
			case "search":
				idx := filepath.Join(dir, name+"-index")
				if _, err := os.Stat(idx); os.IsNotExist(err) {
					if _, err := searchpool.IndexDocuments(sctx, idx, docs); err != nil {
						t.Fatal(err)
					}
				}
				args = append(args, "--search-index="+idx)
			}
			add(name, args...)
		}
	}
	for i := 1; i <= 2; i++ {
		addr := freeport.Addr(t)
		// The workload's one key starts runs and decides their gates.
		auth := []string{"--auth-api-keys-file=" + tp.keysFile, "--allow-self-approval"}
		p := add(fmt.Sprintf("supervisor-%d", i),
			append(append([]string{"supervisor", "--planner-addr=" + plannerAddr, "--auto-approve=email.send", "--step-signing-key-file=" + signingKey,
				"--engine-stranded-after=20s", "--engine-sweep-interval=5s"}, withoutAuthDisabled(common(addr))...), auth...)...)
		tp.supervisors = append(tp.supervisors, p)
		tp.supAddrs = append(tp.supAddrs, addr)
	}
	for _, n := range tp.nats {
		n.keep(ctx, t.Logf)
	}
	for _, p := range tp.procs {
		p.keep(ctx, t.Logf)
	}
	return tp
}

// versions says which planex processes run this commit.
func (tp *upgradeTopology) versions() string {
	var cur []string
	for _, p := range tp.procs {
		if p.rel.new {
			cur = append(cur, p.name)
		}
	}
	return fmt.Sprintf("%d of %d on this commit", len(cur), len(tp.procs))
}

func (tp *upgradeTopology) supVersion(i int) string {
	if tp.supervisors[i].rel.new {
		return "this commit"
	}
	return "previous release"
}

// stop ends every process, supervisors first.
func (tp *upgradeTopology) stop() {
	var wg sync.WaitGroup
	for i := len(tp.procs) - 1; i >= 0; i-- {
		p := tp.procs[i]
		wg.Add(1)
		go func() { defer wg.Done(); p.stop(25 * time.Second) }()
	}
	wg.Wait()
	for _, n := range tp.nats {
		wg.Add(1)
		go func() { defer wg.Done(); n.stop(5 * time.Second) }()
	}
	wg.Wait()
}

// upKind is what a run of the upgrade workload does and how it must end.
type upKind int

const (
	kindMail         upKind = iota // sql, draft, a slow send: SUCCEEDED, one mail
	kindRunbook                    // search, draft, a slow send: SUCCEEDED, one mail
	kindSQL                        // queries only: SUCCEEDED
	kindPlanApprove                // a plan gate, approved: SUCCEEDED
	kindPlanReject                 // a plan gate, rejected with stop_run: FAILED/REJECTED
	kindCloseApprove               // close-ticket's step gate, approved: the ticket closed
	kindCloseReject                // close-ticket's step gate, rejected: replanned, the ticket left open
)

func (k upKind) String() string {
	return [...]string{"mail", "runbook", "sql", "plan-approve", "plan-reject", "close-approve", "close-reject"}[k]
}

func (k upKind) gated() bool { return k >= kindPlanApprove }

// upRun is one run of the upgrade workload.
type upRun struct {
	key, goal, to string
	kind          upKind
	wave          int
	ticket        int
	id            string
	last          *planexv1.Run
}

func (r *upRun) String() string {
	return fmt.Sprintf("%s (%s, wave %d, run %s)", r.key, r.kind, r.wave, r.id)
}

// upgradeWorkload starts, follows and decides the runs.
type upgradeWorkload struct {
	t       *testing.T
	top     *upgradeTopology
	conns   []*grpc.ClientConn
	clients []planexv1.SupervisorServiceClient
	tickets []int
	runs    []*upRun
}

func newUpgradeWorkload(t *testing.T, top *upgradeTopology) *upgradeWorkload {
	w := &upgradeWorkload{t: t, top: top}
	for _, addr := range top.supAddrs {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(plainBearer(top.apiKey)))
		if err != nil {
			t.Fatal(err)
		}
		w.conns = append(w.conns, conn)
		w.clients = append(w.clients, planexv1.NewSupervisorServiceClient(conn))
	}
	return w
}

func (w *upgradeWorkload) close() {
	for _, c := range w.conns {
		c.Close()
	}
}

// openTickets returns n open support tickets of the demo database, one per
// close-ticket run.
func openTickets(t *testing.T, ctx context.Context, dbPath string, n int) []int {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+dbPath+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, `SELECT id FROM support_tickets WHERE status <> 'closed' ORDER BY id LIMIT ?`, n)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []int
	for rows.Next() {
		var id int
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(ids) < n {
		t.Fatalf("the demo database has %d open tickets, want %d", len(ids), n)
	}
	return ids
}

// retryable are the errors of a supervisor being replaced.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return false
}

// call runs fn on supervisor first, failing over to the other while one is
// being replaced.
func (w *upgradeWorkload) call(ctx context.Context, first int, fn func(context.Context, planexv1.SupervisorServiceClient) error) error {
	deadline := time.Now().Add(time.Minute)
	for try := 0; ; try++ {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := fn(cctx, w.clients[(first+try)%len(w.clients)])
		cancel()
		if err == nil || !retryable(err) || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (w *upgradeWorkload) get(ctx context.Context, first int, id string) (*planexv1.Run, error) {
	var run *planexv1.Run
	err := w.call(ctx, first, func(ctx context.Context, c planexv1.SupervisorServiceClient) error {
		resp, err := c.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
		run = resp.GetRun()
		return err
	})
	return run, err
}

// wave starts wave n's runs, alternately through each supervisor, and
// waits until each shows the state it is to cross replacements in: a
// gate open (plan or step), a send started (the sink holds it over 4 s).
func (w *upgradeWorkload) wave(ctx context.Context, n int) {
	t := w.t
	t.Helper()
	kinds := []upKind{kindMail, kindSQL, kindPlanApprove, kindCloseApprove}
	if n%2 == 1 {
		kinds = append(kinds, kindRunbook)
	}
	switch n % 3 {
	case 1:
		kinds[3] = kindCloseReject
	case 2:
		kinds[2] = kindPlanReject
	}
	var wave []*upRun
	for i, k := range kinds {
		r := &upRun{key: fmt.Sprintf("upgrade-%02d-%s", n, k), kind: k, wave: n}
		req := &planexv1.StartRunRequest{IdempotencyKey: r.key}
		switch k {
		case kindMail:
			r.to = fmt.Sprintf("upgrade-%02d@example.com", n)
			req.Goal = "Email " + r.to + " a summary of the top 5 customers by revenue in 2025"
		case kindRunbook:
			r.to = fmt.Sprintf("upgrade-%02d-runbook@example.com", n)
			req.Goal = "Send the runbook for failed payment retries to " + r.to
		case kindSQL:
			req.Goal = "How many open support tickets does Acme Corp have?"
			if n%2 == 1 {
				req.Goal = "Compare revenue and open tickets for Acme Corp and Globex"
			}
		case kindPlanApprove, kindPlanReject:
			req.Goal, req.ApprovePlans = "What is the average order value by region in 2025?", true
		case kindCloseApprove, kindCloseReject:
			r.ticket = w.tickets[n]
			req.Goal = fmt.Sprintf("Close support ticket %d", r.ticket)
		}
		r.goal = req.Goal
		err := w.call(ctx, n+i, func(ctx context.Context, c planexv1.SupervisorServiceClient) error {
			resp, err := c.StartRun(ctx, req)
			r.id = resp.GetRun().GetId()
			return err
		})
		if err != nil {
			t.Fatalf("StartRun %s: %v", r.key, err)
		}
		wave = append(wave, r)
		w.runs = append(w.runs, r)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(wave))
	for i, r := range wave {
		var want func(*planexv1.Run) bool
		switch {
		case r.kind == kindMail || r.kind == kindRunbook:
			want = func(run *planexv1.Run) bool {
				return stepIs(run, "email.send", planexv1.StepStatus_STEP_STATUS_RUNNING)
			}
		case r.kind.gated():
			want = func(run *planexv1.Run) bool { return openGate(run) != nil }
		default:
			continue // just started
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = w.waitFor(ctx, r, want, time.Minute)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("wave %d: %v", n, err)
	}
}

// stepIs reports whether the run's step of tool is in state s.
func stepIs(run *planexv1.Run, tool string, s planexv1.StepStatus) bool {
	for _, st := range run.GetSteps() {
		if st.GetTool() == tool && st.GetStatus() == s {
			return true
		}
	}
	return false
}

// openGate is the run's undecided gate, or nil.
func openGate(run *planexv1.Run) *planexv1.Gate {
	for _, g := range run.GetGates() {
		if g.GetDecision() == planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED {
			return g
		}
	}
	return nil
}

// waitFor polls the run, through each supervisor in turn, until want
// holds. A supervisor that answers with an error other than being
// replaced (DataLoss for a log it cannot verify) fails it at once, naming
// the supervisor's release.
func (w *upgradeWorkload) waitFor(ctx context.Context, r *upRun, want func(*planexv1.Run) bool, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last error
	for n := 0; ; n++ {
		sup := n % len(w.clients)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := w.clients[sup].GetRun(cctx, &planexv1.GetRunRequest{RunId: r.id})
		cancel()
		switch {
		case err == nil:
			r.last = resp.GetRun()
			if want(r.last) {
				return nil
			}
			if terminal(r.last.GetStatus()) {
				return fmt.Errorf("%s ended %s/%s (%q) before reaching the awaited state", r, r.last.GetStatus(), r.last.GetStopReason(), r.last.GetStopMessage())
			}
		case !retryable(err):
			return fmt.Errorf("supervisor-%d (%s) cannot read %s: %w", sup+1, w.top.supVersion(sup), r, err)
		default:
			last = err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s: awaited state not reached within %s: last %s (last error %v)", r, d, r.last.GetStatus(), last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// decideWave decides the open gates of the runs of waves up to n, through
// supervisor n%2, whichever release each supervisor runs at that point:
// wave n's first gates (which must be open), and the later plan revisions'
// gates of earlier waves, so that a run's gates are decided across
// several replacements.
func (w *upgradeWorkload) decideWave(ctx context.Context, n int) {
	w.t.Helper()
	sup := n % len(w.clients)
	for _, r := range w.runs {
		if r.wave > n || !r.kind.gated() || (r.last != nil && terminal(r.last.GetStatus())) {
			continue
		}
		if r.wave == n {
			if err := w.waitFor(ctx, r, func(run *planexv1.Run) bool { return openGate(run) != nil }, time.Minute); err != nil {
				w.t.Fatalf("decide: %v", err)
			}
		} else if run, err := w.get(ctx, sup, r.id); err == nil {
			r.last = run
		}
		if g := openGate(r.last); g != nil {
			w.decide(ctx, r, g, sup)
		}
	}
}

// decideRest decides the gates still to come (later plan revisions) until
// every gated run has ended or d has passed.
func (w *upgradeWorkload) decideRest(ctx context.Context, d time.Duration) {
	deadline := time.Now().Add(d)
	for n := 0; time.Now().Before(deadline) && ctx.Err() == nil; n++ {
		open := 0
		for _, r := range w.runs {
			if !r.kind.gated() || (r.last != nil && terminal(r.last.GetStatus())) {
				continue
			}
			open++
			if run, err := w.get(ctx, n, r.id); err == nil {
				r.last = run
				if g := openGate(run); g != nil {
					w.decide(ctx, r, g, n%len(w.clients))
				}
			}
		}
		if open == 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// decide answers gate g of r through supervisor sup as r's kind says:
// approve; reject with stop_run (plan-reject); reject, which replans
// (close-reject).
func (w *upgradeWorkload) decide(ctx context.Context, r *upRun, g *planexv1.Gate, sup int) {
	t := w.t
	t.Helper()
	req := &planexv1.DecideRequest{RunId: r.id, GateId: g.GetId(), Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE, Actor: "upgrade-test"}
	switch r.kind {
	case kindPlanReject:
		req.Decision, req.StopRun, req.Comment = planexv1.DecisionKind_DECISION_KIND_REJECT, true, "not during the upgrade"
	case kindCloseReject:
		req.Decision, req.Comment = planexv1.DecisionKind_DECISION_KIND_REJECT, "keep it open"
	}
	err := w.call(ctx, sup, func(ctx context.Context, c planexv1.SupervisorServiceClient) error {
		_, err := c.Decide(ctx, req)
		return err
	})
	if err != nil && status.Code(err) == codes.FailedPrecondition {
		// A retried Decide whose first attempt was recorded.
		if run, gerr := w.get(ctx, sup, r.id); gerr == nil && gateDecided(run, g.GetId(), req.GetDecision()) {
			err = nil
		}
	}
	if err != nil {
		t.Fatalf("decide gate %s of %s through supervisor-%d (%s): %v", g.GetId(), r, sup+1, w.top.supVersion(sup), err)
	}
	t.Logf("gate %s of %s: %s through supervisor-%d (%s)", g.GetId(), r, strings.TrimPrefix(req.GetDecision().String(), "DECISION_KIND_"), sup+1, w.top.supVersion(sup))
}

func gateDecided(run *planexv1.Run, id string, d planexv1.DecisionKind) bool {
	for _, g := range run.GetGates() {
		if g.GetId() == id {
			return g.GetDecision() == d
		}
	}
	return false
}

// crossRead reads every run through each supervisor (GetRun). While the
// two supervisors run different releases, and with full, each also
// watches every run's log from its first event, which checks each event's
// hash as its release computes it (GetRun may answer from the run's
// snapshot): with one supervisor of each release, each reads the runs the
// other wrote; at the end (full, both on this commit) every run the
// previous release wrote is read. A run one cannot read fails the test,
// naming the supervisor's release.
func (w *upgradeWorkload) crossRead(ctx context.Context, top *upgradeTopology, full bool) {
	t := w.t
	t.Helper()
	watch := full || top.supervisors[0].rel != top.supervisors[1].rel
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for _, r := range w.runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			var seen []*planexv1.Run
			for i, c := range w.clients {
				var run *planexv1.Run
				var err error
				for try := 0; try < 20; try++ {
					cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					var resp *planexv1.GetRunResponse
					resp, err = c.GetRun(cctx, &planexv1.GetRunRequest{RunId: r.id})
					cancel()
					run = resp.GetRun()
					if err == nil || !retryable(err) {
						break
					}
					time.Sleep(250 * time.Millisecond)
				}
				if err != nil {
					t.Errorf("supervisor-%d (%s) cannot read %s: %v", i+1, top.supVersion(i), r, err)
					continue
				}
				if watch {
					if err := watchLog(ctx, c, r.id, run.GetLastSequence()); err != nil {
						t.Errorf("supervisor-%d (%s) cannot read the log of %s: %v", i+1, top.supVersion(i), r, err)
						continue
					}
				}
				seen = append(seen, run)
			}
			if len(seen) == 2 && terminal(seen[0].GetStatus()) && terminal(seen[1].GetStatus()) &&
				(seen[0].GetStatus() != seen[1].GetStatus() || seen[0].GetLastSequence() != seen[1].GetLastSequence()) {
				t.Errorf("%s: supervisor-1 (%s) reads %s at event %d, supervisor-2 (%s) %s at event %d", r,
					top.supVersion(0), seen[0].GetStatus(), seen[0].GetLastSequence(), top.supVersion(1), seen[1].GetStatus(), seen[1].GetLastSequence())
			}
		}()
	}
	wg.Wait()
}

// watchLog reads a run's events 1 to last through WatchRun.
func watchLog(ctx context.Context, c planexv1.SupervisorServiceClient, id string, last uint64) error {
	var err error
	for try := 0; try < 20; try++ {
		if err = watchOnce(ctx, c, id, last); err == nil || !retryable(err) {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
	return err
}

func watchOnce(ctx context.Context, c planexv1.SupervisorServiceClient, id string, last uint64) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := c.WatchRun(cctx, &planexv1.WatchRunRequest{RunId: id, FromSequence: 1})
	if err != nil {
		return err
	}
	var seen uint64
	for seen < last {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("the watch ended at event %d of %d", seen, last)
		}
		if err != nil {
			return err
		}
		seen = resp.GetEvent().GetSequence()
	}
	return nil
}

// await polls every run until all are terminal or d has passed.
func (w *upgradeWorkload) await(ctx context.Context, d time.Duration) {
	deadline := time.Now().Add(d)
	for n := 0; ; n++ {
		open := 0
		for _, r := range w.runs {
			if r.last != nil && terminal(r.last.GetStatus()) {
				continue
			}
			if run, err := w.get(ctx, n, r.id); err == nil {
				r.last = run
			}
			if !terminal(r.last.GetStatus()) {
				open++
			}
		}
		if open == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// check requires every run to have ended as it would have without the
// upgrade and every mail to have been sent exactly once.
func (w *upgradeWorkload) check() {
	t := w.t
	t.Helper()
	mails := w.top.sink.byRecipient()
	want := map[string]bool{}
	byKind := map[upKind]int{}
	for _, r := range w.runs {
		byKind[r.kind]++
		run := r.last
		if run == nil || !terminal(run.GetStatus()) {
			t.Errorf("%s did not end: %s", r, run.GetStatus())
			continue
		}
		got := fmt.Sprintf("%s/%s", strings.TrimPrefix(run.GetStatus().String(), "RUN_STATUS_"), strings.TrimPrefix(run.GetStopReason().String(), "STOP_REASON_"))
		result := run.GetResult().GetStringValue()
		var problem string
		switch r.kind {
		case kindPlanReject:
			if got != "FAILED/REJECTED" {
				problem = "want FAILED/REJECTED (the plan gate rejected with stop_run)"
			}
		default:
			if got != "SUCCEEDED/SUCCEEDED" {
				problem = "want SUCCEEDED"
			}
		}
		switch {
		case problem != "":
		case r.kind == kindCloseApprove && !strings.Contains(result, fmt.Sprintf("Closed support ticket %d ", r.ticket)):
			problem = fmt.Sprintf("want the answer \"Closed support ticket %d ...\"", r.ticket)
		case r.kind == kindCloseReject && !strings.Contains(result, "was left "):
			problem = "want the answer that the ticket was left open (the rejection replanned)"
		case r.to != "" && mails[r.to] != 1:
			problem = fmt.Sprintf("want exactly one mail to %s, the sink got %d", r.to, mails[r.to])
		}
		if problem != "" {
			t.Errorf("%s ended %s (%q, answer %q): %s", r, got, run.GetStopMessage(), result, problem)
		}
		if r.to != "" {
			want[r.to] = true
		}
	}
	for to, n := range mails {
		if !want[to] {
			t.Errorf("%d mails to %s, which no run was to send", n, to)
		}
	}
	var kinds []string
	for k := kindMail; k <= kindCloseReject; k++ {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, byKind[k]))
	}
	t.Logf("%d runs (%s); %d mails to %d recipients", len(w.runs), strings.Join(kinds, ", "), len(mails), len(want))
}

// audit verifies every run's stored log with both releases' `planex
// audit verify RUN_ID`, exports it (redacted, with this commit's `planex
// runs export`) and verifies the export with both releases' `planex audit
// verify FILE`: a log this commit wrote must verify with the previous
// release's verifier during the N-1 window, and the reverse.
func (w *upgradeWorkload) audit(ctx context.Context, old, cur *release, url, dir string) {
	t := w.t
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	run := func(r *release, args ...string) (string, error) {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		out, err := exec.CommandContext(cctx, r.bin, args...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	var mu sync.Mutex
	checked := 0
	sem := make(chan struct{}, 2)
	var wg sync.WaitGroup
	for _, rr := range w.runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			file := filepath.Join(dir, rr.id+".jsonl")
			var problems []string
			for _, r := range []*release{old, cur} {
				if out, err := run(r, "audit", "verify", rr.id, "--nats-url="+url); err != nil || !strings.Contains(out, " verified (finished)") {
					problems = append(problems, fmt.Sprintf("audit verify RUN_ID by %s: %v: %s", r.name, err, out))
				}
			}
			if out, err := run(cur, "runs", "export", rr.id, "--nats-url="+url, "-o", file); err != nil {
				problems = append(problems, fmt.Sprintf("runs export by %s: %v: %s", cur.name, err, out))
			} else {
				for _, r := range []*release{old, cur} {
					if out, err := run(r, "audit", "verify", file); err != nil || !strings.Contains(out, " verified (finished)") {
						problems = append(problems, fmt.Sprintf("audit verify FILE by %s: %v: %s", r.name, err, out))
					}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for _, p := range problems {
				t.Errorf("%s: %s", rr, p)
			}
			checked++
		}()
	}
	wg.Wait()
	t.Logf("audit: %d run logs verified by %s and %s, stored and exported, in %s", checked, old.name, cur.name, time.Since(start).Round(100*time.Millisecond))
}
