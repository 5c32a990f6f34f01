package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natsauth"
	"github.com/planex-dev/planex/internal/policy"
	"github.com/planex-dev/planex/internal/tenant"
	"github.com/planex-dev/planex/services/supervisor/api"
	"github.com/planex-dev/planex/services/supervisor/engine"
	"github.com/planex-dev/planex/services/supervisor/quota"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// A supervisor serves every tenant in one process, a cell per tenant: the
// default tenant's on the supervisor's own NATS connection (the global
// account, exactly as before tenants), and one per registered tenant on a
// connection to the tenant's NATS account (natsauth.TenantAccount), with
// the run log, engine, API and quota cell of that account alone. A call
// is routed to the cell of the caller's tenant (router.go), so another
// tenant's runs are not even addressable: they are in another account.

// cellRetryInterval is how often tenants whose cell could not start
// (no credentials yet, account not in the NATS configuration yet) are
// tried again, besides every change of the registry.
const cellRetryInterval = 2 * time.Second

// errNoCredentials marks a connector error that is the not-ready reason
// as it stands (no "connect: " prefix).
type errNoCredentials struct{ msg string }

func (e *errNoCredentials) Error() string { return e.msg }

// tenantConnector returns how the supervisor connects to a tenant's
// account: TenantConnect, else the tenant's seed in --tenant-credentials-dir
// with the other --nats-* settings (URL, TLS) of the supervisor.
func (c Config) tenantConnector(logger *slog.Logger) func(context.Context, string) (*nats.Conn, error) {
	if c.TenantConnect != nil {
		return c.TenantConnect
	}
	return func(ctx context.Context, name string) (*nats.Conn, error) {
		if c.TenantCredentialsDir == "" {
			return nil, &errNoCredentials{fmt.Sprintf("no credentials for tenant %s: the supervisor runs without --tenant-credentials-dir", name)}
		}
		file := filepath.Join(c.TenantCredentialsDir, name, natsauth.Supervisor+".nk")
		if _, err := os.Stat(file); err != nil {
			return nil, &errNoCredentials{fmt.Sprintf("no credentials for tenant %s in --tenant-credentials-dir: %s", name, file)}
		}
		o := natsauth.Options{NKeySeedFile: file, TLS: c.Common.NATS.TLS}
		opts, err := o.NATSOptions()
		if err != nil {
			return nil, fmt.Errorf("tenant %s: %w", name, err)
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return bus.Connect(cctx, c.Common.NATSURL, "planex-"+natsauth.Supervisor, logger.With("tenant", name), opts...)
	}
}

// cellsConfig is what startCells builds the cells from.
type cellsConfig struct {
	// Base is the default tenant's components (on the supervisor's own
	// connection); tenants' cells copy its settings.
	Base Components
	// ExpectPools and Pools are the default cell's readiness wait.
	ExpectPools []string
	Pools       *poolWait
	// BusOptions set a tenant's account up (EventsMaxAge is replaced by
	// the tenant's retention when it has one).
	BusOptions bus.Options
	// Connect connects to a tenant's account.
	Connect func(ctx context.Context, tenant string) (*nats.Conn, error)
	// Prices and Fair are shared by every tenant's quota cell.
	Prices quota.Prices
	Fair   *quota.Fair
	// TenantsFile, when set, is applied to the registry at start and
	// whenever it changes (Config.TenantsFile).
	TenantsFile string
}

// tenantsFileInterval is how often --tenants-file is checked for changes
// (a mounted ConfigMap changes in place).
const tenantsFileInterval = 5 * time.Second

// cell is one tenant's share of the supervisor.
type cell struct {
	name  string
	parts *parts
	key   string     // the spec fields the cell was built from (cellKey)
	nc    *nats.Conn // the tenant's connection (nil for the default)
	// cancel ends the context the cell was started with (nil for the
	// default: the supervisor's own).
	cancel context.CancelFunc
}

// cellState is a tenant's readiness as last reconciled.
type cellState struct {
	ready  bool
	reason string
}

// cells are the supervisor's cells, kept in line with the tenant registry.
type cells struct {
	cfg    cellsConfig
	reg    *tenant.Registry
	logger *slog.Logger

	mu    sync.RWMutex
	cells map[string]*cell // started cells, the default one included
	state map[string]cellState

	cancel context.CancelFunc
	done   chan struct{}
}

// startCells starts the default cell, loads the tenant registry (in the
// default account) and starts a goroutine that keeps a cell per
// registered tenant until stop.
func startCells(ctx context.Context, cfg cellsConfig) (*cells, error) {
	kv, err := cfg.Base.Bus.TenantsBucket(ctx)
	if err != nil {
		return nil, fmt.Errorf("tenant registry: %w", err)
	}
	s := &cells{cfg: cfg, reg: tenant.NewRegistry(kv), logger: cfg.Base.Logger,
		cells: map[string]*cell{}, state: map[string]cellState{}, done: make(chan struct{})}
	def := cfg.Base
	def.ExpectPools, def.pools = cfg.ExpectPools, cfg.Pools
	def.quota = s.quotaFor(tenant.Default, def.Bus)
	p, err := start(ctx, def)
	if err != nil {
		return nil, err
	}
	s.cells[tenant.Default] = &cell{name: tenant.Default, parts: p}
	s.state[tenant.Default] = cellState{ready: true}

	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		_ = s.reg.Run(rctx)
	}()
	// Callers are resolved against the registry: none is served before
	// it is loaded (a member of a tenant would land in the default one).
	select {
	case <-s.reg.Ready():
	case <-ctx.Done():
		cancel()
		<-watched
		return nil, errors.Join(ctx.Err(), p.stop(context.WithoutCancel(ctx)))
	}
	var waitFile func() error
	if cfg.TenantsFile != "" {
		if waitFile, err = s.reg.WatchFile(rctx, cfg.TenantsFile, tenantsFileInterval, s.logger); err != nil {
			cancel()
			<-watched
			return nil, errors.Join(err, p.stop(context.WithoutCancel(ctx)))
		}
	}
	changes := s.reg.Changes()
	go func() {
		defer close(s.done)
		if waitFile != nil {
			defer func() { _ = waitFile() }()
		}
		defer func() { <-watched }()
		t := time.NewTicker(cellRetryInterval)
		defer t.Stop()
		for {
			s.reconcile(rctx)
			select {
			case <-rctx.Done():
				return
			case <-changes:
			case <-t.C:
			}
		}
	}()
	return s, nil
}

// quotaFor builds the quota hook of a tenant's cell; its spec is read live
// from the registry (quotas change without a restart of the cell).
func (s *cells) quotaFor(name string, res *bus.Resources) func(context.Context, *runlog.Log) (*quota.Cell, error) {
	return func(ctx context.Context, log *runlog.Log) (*quota.Cell, error) {
		spec := func() *planexv1.Tenant { return nil }
		if name != tenant.Default {
			spec = func() *planexv1.Tenant { return s.reg.Cached(name) }
		}
		return quota.NewCell(ctx, quota.Deps{Tenant: name, Bus: res, Log: log, Spec: spec,
			Prices: s.cfg.Prices, Fair: s.cfg.Fair, Logger: s.logger.With("tenant", name)})
	}
}

// cellKey is what of a spec a cell is built from: a change restarts it.
func cellKey(t *planexv1.Tenant) string {
	k := &planexv1.Tenant{Retention: t.GetRetention(), Budget: t.GetBudget(), Policies: t.GetPolicies()}
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(k)
	return string(b)
}

// reconcile starts the cells of registered tenants that have none (or
// whose cell was built from another spec) and stops those of tenants no
// longer registered.
func (s *cells) reconcile(ctx context.Context) {
	want := map[string]*planexv1.Tenant{}
	for _, t := range s.reg.List() {
		want[t.GetName()] = t
	}
	s.mu.RLock()
	var stale []*cell
	for name, c := range s.cells {
		if t, ok := want[name]; name != tenant.Default && (!ok || cellKey(t) != c.key) {
			stale = append(stale, c)
		}
	}
	var gone []string
	for name := range s.state {
		if _, ok := want[name]; !ok && name != tenant.Default && s.cells[name] == nil {
			gone = append(gone, name)
		}
	}
	s.mu.RUnlock()
	s.mu.Lock()
	for _, name := range gone {
		delete(s.state, name)
	}
	s.mu.Unlock()
	for _, c := range stale {
		_, still := want[c.name]
		s.mu.Lock()
		delete(s.cells, c.name)
		if still {
			s.state[c.name] = cellState{reason: "restarting: its policies, budget or retention changed"}
		} else {
			delete(s.state, c.name)
		}
		s.mu.Unlock()
		s.stopCell(ctx, c)
		if still {
			s.logger.InfoContext(ctx, "tenant cell stopped to apply its new spec", "tenant", c.name)
		} else {
			s.logger.InfoContext(ctx, "tenant cell stopped: the tenant was deleted", "tenant", c.name)
		}
	}
	for name, t := range want {
		if ctx.Err() != nil {
			return
		}
		s.mu.RLock()
		_, running := s.cells[name]
		prev := s.state[name]
		s.mu.RUnlock()
		if running {
			continue
		}
		c, err := s.startTenant(ctx, t)
		s.mu.Lock()
		if s.reg.Cached(name) == nil && c != nil {
			// Deleted while it started: stop it now.
			s.mu.Unlock()
			s.stopCell(ctx, c)
			continue
		}
		if err != nil {
			s.state[name] = cellState{reason: err.Error()}
		} else {
			s.cells[name] = c
			s.state[name] = cellState{ready: true}
		}
		s.mu.Unlock()
		switch {
		case err != nil && err.Error() != prev.reason:
			s.logger.WarnContext(ctx, "tenant not ready", "tenant", name, "reason", err.Error())
		case err == nil:
			s.logger.InfoContext(ctx, "tenant ready", "tenant", name, "nats_account", natsauth.TenantAccount(name))
		}
	}
}

// startTenant connects to a tenant's account, sets it up and starts its
// cell; the error is the tenant's not-ready reason.
func (s *cells) startTenant(ctx context.Context, t *planexv1.Tenant) (*cell, error) {
	name := t.GetName()
	nc, err := s.cfg.Connect(ctx, name)
	if err != nil {
		var nce *errNoCredentials
		if errors.As(err, &nce) {
			return nil, err
		}
		return nil, fmt.Errorf("connect: %w", err)
	}
	fail := func(err error) (*cell, error) {
		nc.Close()
		return nil, err
	}
	opts := s.cfg.BusOptions
	if r := t.GetRetention().AsDuration(); r > 0 {
		opts.EventsMaxAge = r
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := bus.Setup(sctx, nc, opts)
	if err != nil {
		return fail(fmt.Errorf("set up JetStream in NATS account %s: %w", natsauth.TenantAccount(name), err))
	}
	c := s.cfg.Base
	c.Bus, c.Logger = res, s.logger.With("tenant", name)
	c.Engine.Tenant, c.API.Tenant = name, name
	// The tenant's steps are signed for it: an executor serving another
	// account refuses them (stepsign.ErrWrongTenant).
	c.Engine.Signer = c.Engine.Signer.ForTenant(name)
	c.Engine.Limits = tenantLimits(c.Engine.Limits, t.GetBudget())
	c.API.Limits = c.Engine.Limits
	if t.GetPolicies() != "" {
		ps, err := tenantPolicies(name, t.GetPolicies())
		if err != nil {
			return fail(fmt.Errorf("tenant.policies: %w", err))
		}
		c.Engine.Guardrails.Policies, c.API.Policies = ps, ps
	}
	c.quota = s.quotaFor(name, res)
	// The cell's background work (run index, engine) lives until the cell
	// stops, not with this call.
	cctx, ccancel := context.WithCancel(ctx)
	p, err := start(cctx, c)
	if err != nil {
		ccancel()
		return fail(fmt.Errorf("start: %w", err))
	}
	return &cell{name: name, parts: p, key: cellKey(t), nc: nc, cancel: ccancel}, nil
}

// stopCell drains a tenant's engine, then its connection.
func (s *cells) stopCell(ctx context.Context, c *cell) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if c.cancel != nil {
		c.cancel() // as the supervisor's own context ends before its stop
	}
	if err := c.parts.stop(sctx); err != nil {
		s.logger.WarnContext(ctx, "stop tenant cell", "tenant", c.name, "err", err)
	}
	if c.nc != nil {
		if err := c.nc.Drain(); err != nil {
			c.nc.Close()
		}
		for !c.nc.IsClosed() && sctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		c.nc.Close()
	}
}

// stop stops the registry watch and every cell, tenants' first.
func (s *cells) stop(ctx context.Context) error {
	s.cancel()
	<-s.done
	s.mu.Lock()
	all := s.cells
	s.cells = map[string]*cell{}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for name, c := range all {
		if name == tenant.Default {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.stopCell(ctx, c)
		}()
	}
	wg.Wait()
	if def := all[tenant.Default]; def != nil {
		return def.parts.stop(ctx)
	}
	return nil
}

// errNotReady is a tenant the supervisor does not serve (yet).
type errNotReady struct{ tenant, reason string }

func (e *errNotReady) Error() string {
	return fmt.Sprintf("tenant %s is not ready: %s", e.tenant, e.reason)
}

// cell returns the started cell of a tenant, or an *errNotReady.
func (s *cells) cell(name string) (*cell, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if c, ok := s.cells[name]; ok {
		return c, nil
	}
	reason := s.state[name].reason
	if reason == "" {
		reason = "starting"
	}
	return nil, &errNotReady{tenant: name, reason: reason}
}

// status is a tenant's readiness for Tenant.ready/not_ready_reason.
func (s *cells) status(name string) (bool, string) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if _, ok := s.cells[name]; ok {
		return true, ""
	}
	if r := s.state[name].reason; r != "" {
		return false, r
	}
	return false, "starting"
}

// awaitCell waits (bounded) until the tenant's cell was reconciled with
// spec t: started from it, or not ready for a reason other than starting
// or restarting — so that CreateTenant and UpdateTenant answer with the
// readiness their spec led to.
func (s *cells) awaitCell(ctx context.Context, t *planexv1.Tenant) {
	key := cellKey(t)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		s.mu.RLock()
		c, ok := s.cells[t.GetName()]
		st := s.state[t.GetName()]
		s.mu.RUnlock()
		if ok && c.key == key {
			return
		}
		if !ok && st.reason != "" && !strings.HasPrefix(st.reason, "restarting") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// tenantLimits applies a tenant's budget ceilings over the supervisor's
// limits: a ceiling only goes down, and a default above it comes down
// to it.
func tenantLimits(l engine.Limits, b *planexv1.TenantBudget) engine.Limits {
	if n := b.GetMaxSteps(); n > 0 {
		l.Ceiling.MaxSteps = min(l.Ceiling.MaxSteps, n)
		l.Default.MaxSteps = min(l.Default.MaxSteps, l.Ceiling.MaxSteps)
	}
	if n := b.GetMaxTokens(); n > 0 {
		l.Ceiling.MaxTokens = min(l.Ceiling.MaxTokens, n)
		l.Default.MaxTokens = min(l.Default.MaxTokens, l.Ceiling.MaxTokens)
	}
	if d := b.GetMaxDuration().AsDuration(); d > 0 {
		l.Ceiling.Deadline = min(l.Ceiling.Deadline, d)
		l.Default.Deadline = min(l.Default.Deadline, l.Ceiling.Deadline)
	}
	return l
}

// staticPolicies is a tenant's policy set (it changes with the tenant's
// spec, which restarts the cell).
type staticPolicies struct{ set *policy.Set }

func (p staticPolicies) Current() *policy.Set { return p.set }

// tenantPolicies compiles a tenant's policies (Tenant.policies, one
// policy file's YAML). internal/policy compiles sets from files only, so
// the text goes through a private temporary file named after the tenant
// (the policy's default name).
func tenantPolicies(name, text string) (engine.PolicySource, error) {
	dir, err := os.MkdirTemp("", "planex-tenant-policies-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		return nil, err
	}
	set, err := policy.Load(file)
	if err != nil {
		return nil, err
	}
	return staticPolicies{set: set}, nil
}

// apiOf is the API of a started cell.
func (c *cell) apiOf() *api.Server { return c.parts.api }
