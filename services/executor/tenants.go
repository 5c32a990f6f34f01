package executor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natsauth"
	"github.com/planex-dev/planex/internal/service"
	"github.com/planex-dev/planex/internal/stepsign"
	"github.com/planex-dev/planex/services/executor/runner"
)

// TenantSeedFile is where a replica serving tenant finds the nkey seed of
// its pool's identity in that tenant's NATS account:
// <dir>/<tenant>/executor-<pool>.nk — the layout of the dev credentials
// (credentials/nats/tenants/<tenant>/) and of the Secrets
// planex-tenant-<tenant>-nats (key executor-<pool>.nk) mounted one
// directory per tenant.
func TenantSeedFile(dir, tenant, pool string) string {
	return filepath.Join(dir, tenant, natsauth.Executor+"-"+pool+".nk")
}

// validateTenants checks --serve-tenants, --tenant-credentials-dir and
// --serve-default, naming the flag and value at fault; every tenant's seed
// file must exist and hold a user nkey seed.
func (c Config) validateTenants() error {
	if len(c.ServeTenants) == 0 {
		var errs []error
		if c.TenantCredentialsDir != "" {
			errs = append(errs, errors.New("--tenant-credentials-dir: set without --serve-tenants"))
		}
		if !c.ServeDefault {
			errs = append(errs, errors.New("--serve-default=false: needs --serve-tenants (the replica would serve nobody)"))
		}
		return errors.Join(errs...)
	}
	var errs []error
	if c.TenantCredentialsDir == "" {
		errs = append(errs, errors.New("--tenant-credentials-dir: required with --serve-tenants (seeds at <dir>/<tenant>/executor-<pool>.nk)"))
	}
	seen := map[string]bool{}
	for _, t := range c.ServeTenants {
		if err := natsauth.ValidTenant(t); err != nil {
			errs = append(errs, fmt.Errorf("--serve-tenants: %w", err))
			continue
		}
		if seen[t] {
			errs = append(errs, fmt.Errorf("--serve-tenants: tenant %q listed twice", t))
			continue
		}
		seen[t] = true
		if c.TenantCredentialsDir == "" || !slices.Contains(Pools, c.Pool) {
			continue // reported above
		}
		if err := checkSeedFile(TenantSeedFile(c.TenantCredentialsDir, t, c.Pool)); err != nil {
			errs = append(errs, fmt.Errorf("--tenant-credentials-dir: tenant %q: %w", t, err))
		}
	}
	return errors.Join(errs...)
}

// checkSeedFile reads a user nkey seed file without keeping or showing
// the seed.
func checkSeedFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("seed file: %w", err)
	}
	defer clear(b)
	kp, err := nkeys.ParseDecoratedNKey(b)
	if err != nil {
		return fmt.Errorf("seed file %s: not an nkey seed", path)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil || !nkeys.IsValidPublicUserKey(pub) {
		return fmt.Errorf("seed file %s: not a user nkey seed", path)
	}
	return nil
}

// tenantCell is the pool serving one tenant's account: its own NATS
// connection (the tenant's executor-<pool> user), the account's JetStream
// resources and a runner over the shared tools. Everything a step of the
// tenant produces — effect records, replay claims, outputs, results,
// heartbeats, registrations — goes through this connection, so into this
// account only.
type tenantCell struct {
	tenant string
	nc     *nats.Conn
	closed chan struct{}
	res    *bus.Resources
	r      *runner.Runner
	// closeTools closes tools opened for this tenant alone (the email
	// pool's, whose drafts live in the tenant's account).
	closeTools func() error
}

// tenantSetup is what every tenant's cell shares with the default runner.
type tenantSetup struct {
	cfg     Config
	deps    service.Deps
	tools   []runner.Tool
	probe   func(context.Context) error
	owners  *runOwners
	replica string
	onBack  func(up bool, reason string)
}

// openTenants connects to every --serve-tenants account and builds its
// runner (not started). A tenant that cannot be served fails the whole
// start, naming it; what was opened is closed again.
func openTenants(ctx context.Context, s tenantSetup) (cells []*tenantCell, err error) {
	defer func() {
		if err != nil {
			err = errors.Join(err, closeCells(context.Background(), cells, s.cfg.Common.ShutdownGrace))
			cells = nil
		}
	}()
	for _, t := range s.cfg.ServeTenants {
		c, err := openTenant(ctx, s, t)
		if err != nil {
			return cells, fmt.Errorf("tenant %s: %w", t, err)
		}
		cells = append(cells, c)
	}
	return cells, nil
}

func openTenant(ctx context.Context, s tenantSetup, tenant string) (c *tenantCell, err error) {
	cfg := s.cfg
	logger := s.deps.Logger.With("tenant", tenant)
	// The service's own TLS settings, the tenant's credentials.
	auth := natsauth.Options{NKeySeedFile: TenantSeedFile(cfg.TenantCredentialsDir, tenant, cfg.Pool), TLS: cfg.Common.NATS.TLS}
	opts, err := auth.NATSOptions()
	if err != nil {
		return nil, fmt.Errorf("--tenant-credentials-dir: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	nc, err := bus.Connect(cctx, cfg.Common.NATSURL, "planex-executor-"+cfg.Pool, logger, opts...)
	cancel()
	if err != nil {
		return nil, err
	}
	c = &tenantCell{tenant: tenant, nc: nc, closed: make(chan struct{}), closeTools: func() error { return nil }}
	nc.SetClosedHandler(func(*nats.Conn) { close(c.closed) })
	defer func() {
		if err != nil {
			err = errors.Join(err, c.close(context.Background(), cfg.Common.ShutdownGrace))
		}
	}()
	bo := bus.Options{Replicas: cfg.Common.StreamReplicas}
	if cfg.Common.JetStreamMaxBytes != "" {
		bo.MaxBytes, _ = bus.ParseBytes(cfg.Common.JetStreamMaxBytes) // validated
	}
	// The default account's set-up succeeded before Start: the cluster
	// has formed, so one attempt per tenant account is enough.
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	c.res, err = bus.Setup(sctx, nc, bo)
	cancel()
	if err != nil {
		return c, fmt.Errorf("set up JetStream in account %s: %w", natsauth.TenantAccount(tenant), err)
	}
	tools := s.tools
	if cfg.Pool == "email" && cfg.Replay == "" {
		// Drafts are kept in the account of the tenant whose step wrote
		// them: the tenant gets an email pool of its own (no backend
		// connection is held; the relay is dialled per message).
		var closeFn func() error
		tools, _, closeFn, err = openTools(ctx, cfg, c.res, s.deps.Server, logger)
		if err != nil {
			return c, err
		}
		c.closeTools = closeFn
	}
	verifier, err := cfg.StepVerify.VerifierFor(logger, tenant)
	if err != nil {
		return c, err
	}
	if verifier != nil {
		shared, err := stepsign.OpenSharedReplays(ctx, c.res.JS, cfg.Pool, cfg.Common.StreamReplicas)
		if err != nil {
			return c, err
		}
		verifier.ShareReplays(shared)
	}
	ro := cfg.Runner
	ro.Pool, ro.Tools, ro.Logger, ro.Verifier = cfg.Pool, tools, logger, verifier
	ro.ReplicaID, ro.Probe, ro.OnBackend = s.replica, s.probe, s.onBack
	ro.WrapTool = s.owners.wrap(tenant, ro.WrapTool)
	c.r, err = runner.New(c.res, ro)
	if err != nil {
		return c, err
	}
	return c, nil
}

// close drains the cell's connection (waiting for it within grace) and
// closes its own tools.
func (c *tenantCell) close(ctx context.Context, grace time.Duration) error {
	var err error
	if derr := c.nc.Drain(); derr != nil && !errors.Is(derr, nats.ErrConnectionClosed) {
		err = fmt.Errorf("tenant %s: drain NATS: %w", c.tenant, derr)
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-c.closed:
	case <-t.C:
		c.nc.Close()
	case <-ctx.Done():
		c.nc.Close()
	}
	if cerr := c.closeTools(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("tenant %s: %w", c.tenant, cerr))
	}
	return err
}

// closeCells closes every cell's connection and tools, errors joined.
func closeCells(ctx context.Context, cells []*tenantCell, grace time.Duration) error {
	var errs []error
	for _, c := range cells {
		errs = append(errs, c.close(ctx, grace))
	}
	return errors.Join(errs...)
}

// stopRunners stops every runner at once (each lets its running steps
// finish within ctx and removes its registrations), errors joined and
// naming the tenant.
func stopRunners(ctx context.Context, def *runner.Runner, cells []*tenantCell) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	stop := func(name string, r *runner.Runner) {
		defer wg.Done()
		if err := r.Stop(ctx); err != nil {
			mu.Lock()
			errs = append(errs, fmt.Errorf("tenant %s: %w", name, err))
			mu.Unlock()
		}
	}
	if def != nil {
		wg.Add(1)
		go stop(natsauth.DefaultTenant, def)
	}
	for _, c := range cells {
		if c.r != nil {
			wg.Add(1)
			go stop(c.tenant, c.r)
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// tenantsReady is the further health condition of a replica serving
// tenants: every tenant's connection is up and its streams answer.
type tenantsReady struct {
	cells atomic.Pointer[[]*tenantCell]
}

func (h *tenantsReady) check(ctx context.Context) error {
	p := h.cells.Load()
	if p == nil {
		return errors.New("tenants not started")
	}
	for _, c := range *p {
		if err := bus.Check(ctx, c.nc, c.res.JS); err != nil {
			return fmt.Errorf("tenant %s: %w", c.tenant, err)
		}
	}
	return nil
}

// runOwnersCap bounds the runs runOwners remembers: the oldest is
// forgotten first (a run's steps come close together in time).
const runOwnersCap = 1 << 16

// runOwners remembers, in this process, the tenant whose account each
// run's steps came from. Run ids are ULIDs each tenant's supervisor makes,
// so one run's steps only ever come from one account; a step of a run
// seen in one account and delivered in another is a copy of the first
// tenant's signed step put on the second tenant's queue (the signature does
// not name the account) and is refused before the tool runs. This is a
// second line only: other replicas have not seen the run, and what keeps
// such a copy out is that only the second tenant's supervisor identity may
// publish steps in its account.
type runOwners struct {
	mu    sync.Mutex
	owner map[string]string
	order []string // ring of run ids, oldest at next
	next  int
}

func newRunOwners() *runOwners { return &runOwners{owner: map[string]string{}} }

// claim records tenant as run's owner if it has none and reports the
// owner.
func (o *runOwners) claim(run, tenant string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if owner, ok := o.owner[run]; ok {
		return owner
	}
	if len(o.order) < runOwnersCap {
		o.order = append(o.order, run)
	} else {
		delete(o.owner, o.order[o.next])
		o.order[o.next] = run
		o.next = (o.next + 1) % runOwnersCap
	}
	o.owner[run] = tenant
	return tenant
}

// wrap returns the WrapTool of tenant's runner: inner (when set) first,
// then the run ownership check. A nil runOwners (no tenants served)
// returns inner unchanged.
func (o *runOwners) wrap(tenant string, inner func(runner.Tool) runner.Tool) func(runner.Tool) runner.Tool {
	if o == nil {
		return inner
	}
	return func(t runner.Tool) runner.Tool {
		if inner != nil {
			t = inner(t)
		}
		return ownedTool{Tool: t, tenant: tenant, owners: o}
	}
}

// ownedTool runs a call only for the tenant owning the call's run.
type ownedTool struct {
	runner.Tool
	tenant string
	owners *runOwners
}

// Run refuses a call of a run another tenant's account delivered first.
func (t ownedTool) Run(ctx context.Context, call runner.Call) (any, error) {
	if owner := t.owners.claim(call.RunID, t.tenant); owner != t.tenant {
		return nil, runner.PermissionDenied("run_id", "run %s was delivered in another tenant's account; not executed", call.RunID)
	}
	return t.Tool.Run(ctx, call)
}

// tenantList is the tenants served, for logs.
func tenantList(cells []*tenantCell) string {
	names := make([]string, len(cells))
	for i, c := range cells {
		names[i] = c.tenant
	}
	return strings.Join(names, ",")
}
