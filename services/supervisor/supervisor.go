// Package supervisor is planex's run engine and public API
// (planex.v1.SupervisorService): it owns every run from goal to stop
// reason, folding each run's event log from JetStream, dispatching ready
// steps to executor pools and asking the planner to replan on failure.
//
// The work is split in small packages: runlog (the event-sourced run log),
// engine (the consumers that advance runs), api (the gRPC service) and
// catalog (the tool registry). See docs/engine.md.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"google.golang.org/grpc"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/plan"
	"github.com/planex-dev/planex/internal/service"
	"github.com/planex-dev/planex/internal/stepsign"
	"github.com/planex-dev/planex/services/supervisor/api"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/engine"
	"github.com/planex-dev/planex/services/supervisor/quota"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// DefaultGRPCAddr is the supervisor's default listen address (loopback:
// expose it deliberately).
const DefaultGRPCAddr = "127.0.0.1:7400"

// DefaultPlannerAddr is where the supervisor finds the planner by default.
const DefaultPlannerAddr = "127.0.0.1:7401"

// Config configures a supervisor replica.
type Config struct {
	// Common service flags.
	Common service.Common
	// OnReady, when set, is called with the gRPC address once SERVING.
	OnReady func(net.Addr)

	// PlannerAddr is the planner's gRPC address (host:port).
	PlannerAddr string
	// PlannerTimeout bounds one planner call.
	PlannerTimeout time.Duration
	// EngineWorkers bounds the engine messages this replica handles at once.
	EngineWorkers int
	// FairSlots is the engine messages and run creations handled at once
	// across tenants while more than one has work (quota.Fair); 0 means
	// twice GOMAXPROCS.
	FairSlots int
	// FairPaceTarget paces a backlogged tenant while another tenant has
	// work and engine messages take more than this many times their
	// recent floor to handle (quota.Fair.Pace); 0 turns pacing off.
	FairPaceTarget float64
	// EngineAckWait is how long an engine message may be handled before it
	// is redelivered to another replica.
	EngineAckWait time.Duration
	// EngineMaxAckPending bounds unacknowledged engine messages across all
	// replicas; 0 scales it with the live replicas (engine.Config).
	EngineMaxAckPending int
	// DirectDispatch lets a decision that dispatches one step be that
	// step's request, consumed by its pool from the run log (NATS 2.11+,
	// pools whose consumer is on PLANEX_EVENTS); off, every request is
	// published to PLANEX_STEPS after the decision's append.
	DirectDispatch bool
	// RunLogHashVersion is the hash version of the events this replica
	// appends: 2 (the default) commits to each field, so a redacted export
	// verifies every field it shows; 1 is the hash of releases before it,
	// for a rolling upgrade while replicas of such a release still run
	// (they cannot verify version 2 events). See docs/deploy.md.
	RunLogHashVersion int
	// EventsMaxAge is how long run logs (and snapshots, idempotency keys and
	// stored outputs) are kept; 0 keeps them forever.
	EventsMaxAge time.Duration
	// HoldTimers hands run deadlines and gate SLAs due later than a minute
	// to NATS as message schedules in PLANEX_TIMERS (NATS 2.12+), instead
	// of parking each as a pending delivery of the timers consumer. Off by
	// default in this release: supervisors of the previous release neither
	// read PLANEX_TIMERS nor hold the grants it needs (docs/deploy.md).
	HoldTimers bool
	// IndexCheckpoints keeps checkpoints of the run index in the
	// planex-run-index object store, which a restarted replica loads
	// instead of every run's snapshot (a million waiting runs: well under
	// a second instead of 8 to 15). Off by default in this release: NATS
	// authorization blocks of the previous release do not grant the
	// bucket's subjects (docs/deploy.md).
	IndexCheckpoints bool
	// InlineOutputBytes is the largest step output kept in the run log;
	// larger ones go to the planex-outputs object store.
	InlineOutputBytes int
	// Limits are the budget defaults and ceilings.
	Limits engine.Limits
	// DefaultPlanningMode is "full" or "next-step".
	DefaultPlanningMode string
	// MaxPlanSteps bounds the steps of one plan revision.
	MaxPlanSteps int
	// ScheduleToStartTimeout is how long a step attempt may wait in its
	// pool's queue when the step sets none; 0 waits for capacity.
	ScheduleToStartTimeout time.Duration
	// SweepInterval is how often a replica looks for stranded runs (0
	// disables the sweeper).
	SweepInterval time.Duration
	// StrandedAfter is how long a run may go without an event and with
	// nothing pending before the sweeper re-drives it.
	StrandedAfter time.Duration
	// StepSigning is --step-signing-key-file.
	StepSigning stepsign.SignerFlags
	// AllowSelfApproval lets the identity that started a run approve it.
	AllowSelfApproval bool
	// AutoApprove lists tools whose default approval (ToolSpec
	// requires_approval) is waived; a step that asks for approval itself
	// still waits. `planex dev` waives email.send, whose outbox and
	// example.com allowlist make it harmless.
	AutoApprove []string
	// MCPAddr, when set, serves MCP over streamable HTTP there (path /mcp)
	// with the gRPC API's TLS and authentication; see internal/mcpserver.
	MCPAddr string
	// OnMCPReady, when set, is called with the MCP endpoint's URL.
	OnMCPReady func(url string)
	// Guardrails are the policy, stall and critic settings.
	Guardrails GuardrailFlags
	// ExpectPools are executor pools the replica waits for before it
	// reports SERVING (and calls OnReady): each must have registered a
	// tool once, now or before (planex-tool-floors keeps the tools the
	// supervisors served, so a pool whose replicas restart stays known).
	// `planex dev` expects its own pools.
	ExpectPools []string
	// TenantCredentialsDir holds the supervisor's nkey seed of each
	// tenant's NATS account, <dir>/<tenant>/supervisor.nk (read again
	// whenever a tenant is not connected yet); empty: tenants other than
	// the default one are served only through TenantConnect.
	TenantCredentialsDir string
	// TenantConnect, when set, connects to a tenant's NATS account as its
	// supervisor instead of TenantCredentialsDir (`planex dev`, tests);
	// the supervisor owns the connection it returns and closes it when the
	// tenant's cell stops.
	TenantConnect func(ctx context.Context, tenant string) (*nats.Conn, error)
	// ModelPrices is the model price table file (quota.LoadPrices; empty:
	// no prices, costs count 0).
	ModelPrices string
	// WebhookAddr, when set, serves trigger webhooks there (POST
	// /v1/hooks/<tenant>/<trigger>, with the gRPC API's TLS); see
	// docs/triggers.md.
	WebhookAddr string
	// WebhookSecretsDir holds the webhook secrets, a file per
	// TriggerWebhook.secret_ref (a mounted Secret).
	WebhookSecretsDir string
	// OnWebhookReady, when set, is called with the webhook endpoint's base
	// URL.
	OnWebhookReady func(url string)
	// TenantsFile is a declarative list of tenants (internal/tenant
	// ParseFile) applied to the registry at start and whenever the file
	// changes; tenants absent from it are never deleted by it.
	TenantsFile string
}

// RegisterFlags adds the supervisor's flags to fs.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	c.Common.RegisterFlags(fs, DefaultGRPCAddr)
	def := engine.DefaultLimits()
	fs.StringVar(&c.PlannerAddr, "planner-addr", DefaultPlannerAddr, "planner gRPC address (host:port)")
	fs.DurationVar(&c.PlannerTimeout, "planner-timeout", 2*time.Minute, "timeout of one planner call")
	fs.IntVar(&c.EngineWorkers, "engine-workers", 32, "engine messages handled at once by this replica")
	fs.Float64Var(&c.FairPaceTarget, "fair-pace-target", 1.3, "while more than one tenant has work and engine messages take more than this many times their floor of the last 5 minutes to handle, pace each tenant with at least --fair-slots admissions queued (0: never pace)")
	fs.IntVar(&c.FairSlots, "fair-slots", 0, "engine messages and run creations handled at once across tenants while more than one tenant has work; each tenant with work holds at least one, a tenant alone is bounded only by --engine-workers (0: twice the CPUs Go uses)")
	fs.DurationVar(&c.EngineAckWait, "engine-ack-wait", 30*time.Second, "time an engine message may be handled before another replica gets it")
	fs.IntVar(&c.RunLogHashVersion, "run-log-hash-version", 2, "hash version of appended run-log events: 2 commits to each field (redacted exports verify every shown field); 1 while supervisors of an earlier release still run during a rolling upgrade")
	fs.BoolVar(&c.DirectDispatch, "direct-dispatch", true, "on NATS 2.11+, append a decision that dispatches one step as that step's request, read by its pool from the run log (one publish less per step); false publishes every request to PLANEX_STEPS after the append")
	fs.IntVar(&c.EngineMaxAckPending, "engine-max-ack-pending", 0, "unacknowledged engine messages across all replicas (same value on every replica; 0: live replicas × --engine-workers × 16, following the supervisors as they scale)")
	fs.BoolVar(&c.IndexCheckpoints, "index-checkpoints", false, "keep checkpoints of the run index in the planex-run-index object store, so that a restarted replica loads its index in well under a second instead of reading every run's snapshot; turn on once NATS has this release's grants ($O.planex-run-index.>)")
	fs.BoolVar(&c.HoldTimers, "hold-timers", false, "on NATS 2.12+, hand run deadlines and gate SLAs due later than a minute to NATS as message schedules (PLANEX_TIMERS) instead of parking each in the timers consumer; turn on once every supervisor runs this release and NATS has its grants")
	fs.DurationVar(&c.EventsMaxAge, "events-max-age", 30*24*time.Hour, "retention of run logs, snapshots and stored outputs (0: forever)")
	fs.IntVar(&c.InlineOutputBytes, "inline-output-bytes", 64<<10, "largest step output kept inline in the run log; larger ones go to the object store")
	fs.StringVar(&c.DefaultPlanningMode, "default-planning-mode", "full", "planning mode of runs that do not choose one: full or next-step")
	fs.IntVar(&c.MaxPlanSteps, "max-plan-steps", plan.DefaultLimits().MaxSteps, "largest number of steps in one plan revision")
	c.StepSigning.RegisterFlags(fs)
	fs.BoolVar(&c.AllowSelfApproval, "allow-self-approval", false, "let the identity that started a run approve its gates (single-user setups)")
	fs.StringSliceVar(&c.AutoApprove, "auto-approve", nil, "tools whose default approval gate is waived (comma separated, e.g. email.send); steps that ask for approval still wait")
	fs.DurationVar(&c.ScheduleToStartTimeout, "default-schedule-to-start-timeout", 0, "time a step attempt may wait in its pool's queue for an executor when the step sets none (0: wait for capacity until the run's deadline)")
	fs.DurationVar(&c.SweepInterval, "engine-sweep-interval", time.Minute, "how often a replica looks for stranded runs to re-drive (0: never)")
	fs.DurationVar(&c.StrandedAfter, "engine-stranded-after", 5*time.Minute, "time without a new event, with nothing pending, after which a run counts as stranded and is re-driven")
	fs.StringSliceVar(&c.ExpectPools, "expect-pools", nil, "executor pools that must have registered (now or before: planex-tool-floors remembers them) before this replica reports SERVING, e.g. sql,email,search (empty: none)")
	fs.StringVar(&c.TenantCredentialsDir, "tenant-credentials-dir", "", "directory of the supervisor's NATS nkey seed in each tenant's account, <dir>/<tenant>/supervisor.nk (empty: only the default tenant is served)")
	fs.StringVar(&c.TenantsFile, "tenants-file", "", "YAML or JSON list of tenants (planex.v1.Tenant in protobuf JSON form, durations like 720h allowed) applied to the tenant registry at start and when the file changes; a tenant left out is not deleted (planex tenants delete)")
	fs.StringVar(&c.ModelPrices, "model-prices", "", "JSON file of model prices: {\"<model>\": {\"input_per_million_micros\": N, \"output_per_million_micros\": N}} for tenants' money quotas and usage (empty: costs count 0)")
	fs.StringVar(&c.WebhookAddr, "webhook-addr", "", "serve trigger webhooks at this host:port (POST /v1/hooks/<tenant>/<trigger>, signed GitHub- or Stripe-style), with the gRPC API's TLS (empty: off)")
	fs.StringVar(&c.WebhookSecretsDir, "webhook-secrets-dir", "", "directory of webhook secrets, a file per trigger's webhook.secret_ref (a mounted Secret; read on every request)")
	fs.StringVar(&c.MCPAddr, "mcp-addr", "", "serve MCP over streamable HTTP at this host:port (path /mcp), with the gRPC API's TLS and authentication (empty: off)")
	c.Guardrails.registerFlags(fs)
	budgetFlags(fs, "default", "default", &c.Limits.Default, def.Default)
	budgetFlags(fs, "ceiling", "largest allowed", &c.Limits.Ceiling, def.Ceiling)
}

func budgetFlags(fs *pflag.FlagSet, prefix, what string, b *engine.BudgetLimits, def engine.BudgetLimits) {
	fs.Int32Var(&b.MaxSteps, prefix+"-max-steps", def.MaxSteps, what+" step attempts per run")
	fs.Int32Var(&b.MaxReplans, prefix+"-max-replans", def.MaxReplans, what+" replans per run (rejected plans included)")
	fs.Int32Var(&b.MaxParallelism, prefix+"-max-parallelism", def.MaxParallelism, what+" steps in flight per run")
	fs.Int64Var(&b.MaxTokens, prefix+"-max-tokens", def.MaxTokens, what+" planner tokens per run")
	fs.DurationVar(&b.Deadline, prefix+"-deadline", def.Deadline, what+" run deadline")
	fs.DurationVar(&b.StepTimeout, prefix+"-step-timeout", def.StepTimeout, what+" step attempt timeout")
}

// Validate checks the configuration, naming the flag and value at fault.
func (c Config) Validate() error {
	errs := append([]error{c.Common.Validate(), c.Limits.Validate()}, c.Guardrails.validate()...)
	if _, _, err := net.SplitHostPort(c.PlannerAddr); err != nil {
		errs = append(errs, fmt.Errorf("--planner-addr %q: want host:port", c.PlannerAddr))
	}
	if c.RunLogHashVersion != 1 && c.RunLogHashVersion != 2 {
		errs = append(errs, fmt.Errorf("--run-log-hash-version %d: want 1 or 2", c.RunLogHashVersion))
	}
	if c.PlannerTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--planner-timeout %s: must be positive", c.PlannerTimeout))
	}
	if c.FairSlots < 0 || c.FairSlots > 4096 {
		errs = append(errs, fmt.Errorf("--fair-slots %d: want 0 (twice the CPUs) to 4096", c.FairSlots))
	}
	if c.FairPaceTarget != 0 && !(c.FairPaceTarget >= 1.1 && c.FairPaceTarget <= 100) { // NaN too
		errs = append(errs, fmt.Errorf("--fair-pace-target %g: want 0 (never pace) or 1.1 to 100", c.FairPaceTarget))
	}
	if c.EngineWorkers < 1 || c.EngineWorkers > 4096 {
		errs = append(errs, fmt.Errorf("--engine-workers %d: want 1 to 4096", c.EngineWorkers))
	}
	if c.EngineAckWait < time.Second {
		errs = append(errs, fmt.Errorf("--engine-ack-wait %s: want at least 1s", c.EngineAckWait))
	}
	if c.EngineMaxAckPending < 0 {
		errs = append(errs, fmt.Errorf("--engine-max-ack-pending %d: must not be negative", c.EngineMaxAckPending))
	}
	if c.EventsMaxAge < 0 || (c.EventsMaxAge > 0 && c.EventsMaxAge < time.Hour) {
		errs = append(errs, fmt.Errorf("--events-max-age %s: want 0 (forever) or at least 1h", c.EventsMaxAge))
	}
	if c.InlineOutputBytes < 1024 || c.InlineOutputBytes > 512<<10 {
		errs = append(errs, fmt.Errorf("--inline-output-bytes %d: want 1024 to 524288", c.InlineOutputBytes))
	}
	if _, err := ParsePlanningMode(c.DefaultPlanningMode); err != nil {
		errs = append(errs, fmt.Errorf("--default-planning-mode %q: want full or next-step", c.DefaultPlanningMode))
	}
	for _, tool := range c.AutoApprove {
		if _, err := bus.StepSubject(tool); err != nil {
			errs = append(errs, fmt.Errorf("--auto-approve %q: want tool names like email.send", tool))
		}
	}
	if c.ScheduleToStartTimeout < 0 {
		errs = append(errs, fmt.Errorf("--default-schedule-to-start-timeout %s: must not be negative", c.ScheduleToStartTimeout))
	}
	if c.SweepInterval < 0 || (c.SweepInterval > 0 && c.SweepInterval < time.Second) {
		errs = append(errs, fmt.Errorf("--engine-sweep-interval %s: want 0 (off) or at least 1s", c.SweepInterval))
	}
	if c.StrandedAfter < 10*time.Second {
		errs = append(errs, fmt.Errorf("--engine-stranded-after %s: want at least 10s", c.StrandedAfter))
	}
	if c.MCPAddr != "" {
		if _, _, err := net.SplitHostPort(c.MCPAddr); err != nil {
			errs = append(errs, fmt.Errorf("--mcp-addr %q: want host:port", c.MCPAddr))
		}
	}
	if c.WebhookAddr != "" {
		if _, _, err := net.SplitHostPort(c.WebhookAddr); err != nil {
			errs = append(errs, fmt.Errorf("--webhook-addr %q: want host:port", c.WebhookAddr))
		}
	}
	if c.WebhookSecretsDir != "" {
		if fi, err := os.Stat(c.WebhookSecretsDir); err != nil || !fi.IsDir() {
			errs = append(errs, fmt.Errorf("--webhook-secrets-dir %q: want a directory of secret files", c.WebhookSecretsDir))
		}
	}
	for _, pool := range c.ExpectPools {
		if !bus.ValidToken(pool) {
			errs = append(errs, fmt.Errorf("--expect-pools %q: want pool names like sql", pool))
		}
	}
	if c.TenantCredentialsDir != "" {
		if fi, err := os.Stat(c.TenantCredentialsDir); err != nil || !fi.IsDir() {
			errs = append(errs, fmt.Errorf("--tenant-credentials-dir %q: want a directory of <tenant>/supervisor.nk files", c.TenantCredentialsDir))
		}
	}
	if c.MaxPlanSteps < 1 {
		errs = append(errs, fmt.Errorf("--max-plan-steps %d: must be positive", c.MaxPlanSteps))
	}
	return errors.Join(errs...)
}

// ParsePlanningMode parses "full" or "next-step".
func ParsePlanningMode(s string) (planexv1.PlanningMode, error) {
	switch strings.ToLower(s) {
	case "full":
		return planexv1.PlanningMode_PLANNING_MODE_FULL, nil
	case "next-step", "next_step":
		return planexv1.PlanningMode_PLANNING_MODE_NEXT_STEP, nil
	}
	return 0, fmt.Errorf("planning mode %q: want full or next-step", s)
}

// Run serves the supervisor until ctx ends, then shuts down gracefully.
func Run(ctx context.Context, cfg Config, logger *slog.Logger, metrics service.MetricsHandler) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	mode, _ := ParsePlanningMode(cfg.DefaultPlanningMode)
	signer, err := cfg.StepSigning.Signer()
	if err != nil {
		return err
	}
	policies, err := cfg.Guardrails.policies(ctx, logger)
	if err != nil {
		return err
	}
	var policySource engine.PolicySource
	if policies != nil {
		policySource = policies
	}
	prices, err := quota.LoadPrices(cfg.ModelPrices)
	if err != nil {
		return fmt.Errorf("--model-prices: %w", err)
	}
	var pools poolWait // set by Start, read by the health checks after it
	return service.Serve(ctx, service.Params{
		Name:       "supervisor",
		Common:     cfg.Common,
		Logger:     logger,
		Metrics:    metrics,
		Ready:      cfg.OnReady,
		ReadyCheck: pools.check,
		Bus:        bus.Options{EventsMaxAge: cfg.EventsMaxAge, Update: true, HoldTimers: cfg.HoldTimers},
		Start: func(ctx context.Context, d service.Deps) (func(context.Context) error, error) {
			creds, err := cfg.Common.ClientCredentials()
			if err != nil {
				return nil, err
			}
			conn, err := grpc.NewClient(cfg.PlannerAddr,
				grpc.WithTransportCredentials(creds),
				grpc.WithStatsHandler(otelgrpc.NewClientHandler()))
			if err != nil {
				return nil, fmt.Errorf("--planner-addr %q: %w", cfg.PlannerAddr, err)
			}
			base := Components{
				Bus: d.Bus, Logger: d.Logger, Planner: planexv1.NewPlannerServiceClient(conn),
				Engine: engine.Config{
					Workers: cfg.EngineWorkers, AckWait: cfg.EngineAckWait, MaxAckPending: cfg.EngineMaxAckPending,
					NoDirectDispatch:  !cfg.DirectDispatch,
					InlineOutputBytes: cfg.InlineOutputBytes, PlannerTimeout: cfg.PlannerTimeout, Limits: cfg.Limits,
					PlanLimits: planLimits(cfg.MaxPlanSteps), AutoApprove: cfg.AutoApprove, Signer: signer,
					ScheduleToStartTimeout: cfg.ScheduleToStartTimeout, SweepInterval: sweepInterval(cfg.SweepInterval),
					StrandedAfter: cfg.StrandedAfter,
					Guardrails:    engine.Guardrails{Policies: policySource, StallLimit: cfg.Guardrails.StallLimit, Critic: cfg.Guardrails.critic()},
				},
				API:              api.Config{Limits: cfg.Limits, DefaultMode: mode, AllowSelfApproval: cfg.AllowSelfApproval, Policies: policySource, PlanLimits: planLimits(cfg.MaxPlanSteps)},
				LegacyHashes:     cfg.RunLogHashVersion == 1,
				Schedules:        ScheduleConfig{MaxCatchUp: cfg.EventsMaxAge},
				IndexCheckpoints: cfg.IndexCheckpoints,
			}
			fair := quota.NewFair(cfg.fairSlots()).Pace(cfg.FairPaceTarget)
			cells, err := startCells(ctx, cellsConfig{
				Base: base, ExpectPools: cfg.ExpectPools, Pools: &pools,
				BusOptions: bus.Options{EventsMaxAge: cfg.EventsMaxAge, Update: true, Replicas: cfg.Common.StreamReplicas, MaxBytes: maxBytes(cfg.Common), HoldTimers: cfg.HoldTimers},
				Connect:    cfg.tenantConnector(d.Logger),
				Prices:     prices, Fair: fair,
				TenantsFile: cfg.TenantsFile,
			})
			if err != nil {
				return nil, errors.Join(err, conn.Close())
			}
			router := &router{cells: cells}
			planexv1.RegisterSupervisorServiceServer(d.Server.GRPC, router)
			planexv1.RegisterTenantServiceServer(d.Server.GRPC, &tenantService{cells: cells, logger: d.Logger})
			planexv1.RegisterTriggerServiceServer(d.Server.GRPC, &triggerRouter{cells: cells})
			planexv1.RegisterScheduleServiceServer(d.Server.GRPC, &scheduleRouter{cells: cells, logger: d.Logger})
			stopMCP, err := serveMCP(ctx, cfg, router, d.Logger)
			if err != nil {
				return nil, errors.Join(err, cells.stop(ctx), conn.Close())
			}
			stopHooks, err := serveWebhooks(cfg, cells, d.Logger)
			if err != nil {
				return nil, errors.Join(err, stopMCP(ctx), cells.stop(ctx), conn.Close())
			}
			gauges, err := fair.Instrument(otel.GetMeterProvider())
			if err != nil {
				return nil, errors.Join(fmt.Errorf("fair scheduler metrics: %w", err), stopHooks(ctx), stopMCP(ctx), cells.stop(ctx), conn.Close())
			}
			return func(ctx context.Context) error {
				return errors.Join(gauges.Unregister(), stopHooks(ctx), stopMCP(ctx), cells.stop(ctx), conn.Close())
			}, nil
		},
	})
}

// maxBytes is --jetstream-max-bytes (validated) as bus.Options.MaxBytes.
func maxBytes(c service.Common) int64 {
	if c.JetStreamMaxBytes == "" {
		return 0
	}
	n, _ := bus.ParseBytes(c.JetStreamMaxBytes)
	return n
}

// sweepInterval maps the flag (0: off) to engine.Config (negative: off).
func sweepInterval(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

func planLimits(maxSteps int) plan.Limits {
	l := plan.DefaultLimits()
	l.MaxSteps = maxSteps
	return l
}

// Components are what a supervisor replica is built from; Start wires
// them. Tests use it to run replicas on their own NATS connections.
type Components struct {
	// Bus holds the JetStream resources (after bus.Setup).
	Bus *bus.Resources
	// Logger for the replica.
	Logger *slog.Logger
	// Planner is the PlannerService client.
	Planner planexv1.PlannerServiceClient
	// GRPC is where SupervisorService is registered.
	GRPC grpc.ServiceRegistrar
	// Engine tunes the engine.
	Engine engine.Config
	// API tunes the public API.
	API api.Config
	// LegacyHashes appends version 1 events (Config.RunLogHashVersion 1).
	LegacyHashes bool
	// ExpectPools are the executor pools the readiness of Run waits for
	// (Config.ExpectPools); replicas started with Start alone do not wait.
	ExpectPools []string
	// Triggers are the trigger consumer's test seams (triggers.go).
	Triggers TriggerHooks
	// Schedules tunes the cell's schedules (schedules.go).
	Schedules ScheduleConfig
	// IndexCheckpoints is Config.IndexCheckpoints.
	IndexCheckpoints bool
	// OnIndexed, when set, is called once the run index (what ListRuns,
	// the quotas and the sweeper read) has loaded.
	OnIndexed func(IndexLoaded)

	pools *poolWait // Run's readiness check, pointed at this replica's catalog
	// quota, when set, builds the tenant's quota cell once the run log
	// exists; its hooks go into Engine and API.
	quota func(ctx context.Context, log *runlog.Log) (*quota.Cell, error)
}

// poolWait is the readiness condition of Config.ExpectPools: every
// expected pool has a tool in the replica's catalog, live or known from
// planex-tool-floors. Once met it stays met: a pool whose replicas all
// restart keeps its tools in the catalog (catalog.Catalog.Absent), and
// taking every replica out of service for it would stop the runs of the
// other pools too.
type poolWait struct {
	mu      sync.Mutex
	tools   *catalog.Cache // nil until Start
	expect  []string
	logger  *slog.Logger
	met     bool
	waiting string // the pools last reported as awaited
}

// check returns nil once every expected pool has registered, else an
// error naming the pools awaited (logged once per change at INFO).
func (w *poolWait) check(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.met {
		return nil
	}
	if w.tools != nil && len(w.expect) == 0 {
		w.met = true
		return nil
	}
	if w.tools == nil {
		return errors.New("supervisor starting")
	}
	cat, err := w.tools.Fresh(ctx)
	if err != nil {
		return fmt.Errorf("read tool catalog for --expect-pools: %w", err)
	}
	if missing := cat.MissingPools(w.expect); len(missing) > 0 {
		names := strings.Join(missing, ", ")
		if names != w.waiting {
			w.waiting = names
			w.logger.InfoContext(ctx, "waiting for executor pools to register before reporting SERVING (--expect-pools)", "pools", names)
		}
		return fmt.Errorf("%w: %s", ErrPoolsNotRegistered, names)
	}
	w.met = true
	return nil
}

// ErrPoolsNotRegistered is the readiness error of a replica whose
// --expect-pools have not all registered yet.
var ErrPoolsNotRegistered = errors.New("executor pools not registered yet (--expect-pools)")

// Start builds the run log, the engine and the API of one replica,
// registers the API on c.GRPC and starts consuming. The returned stop
// drains the engine.
func Start(ctx context.Context, c Components) (stop func(context.Context) error, err error) {
	p, err := start(ctx, c)
	if err != nil {
		return nil, err
	}
	return p.stop, nil
}

// parts are what start built: a tenant's cell as the supervisor routes
// calls to it.
type parts struct {
	api   *api.Server
	log   *runlog.Log
	quota *quota.Cell // nil without Components.quota
	// triggers are the cell's event triggers (triggers.go).
	triggers *triggers
	// schedules are the cell's schedules and their scheduler.
	schedules *scheduleCell
	stop      func(context.Context) error
}

func start(ctx context.Context, c Components) (*parts, error) {
	// The run index's checkpoints: a cache; without them (or without
	// their bucket) the index loads from planex-runs as before.
	var idx jetstream.ObjectStore
	if c.IndexCheckpoints {
		var err error
		if idx, err = c.Bus.RunIndexBucket(ctx); err != nil {
			c.Logger.WarnContext(ctx, "run index checkpoints off; a restart loads the index from planex-runs", "err", err)
		}
	}
	log, err := runlog.New(ctx, c.Bus, c.Logger, runlog.Options{Now: c.Engine.Now, LegacyHashes: c.LegacyHashes,
		IndexCheckpoints: runlog.IndexCheckpoints{Store: idx}})
	if err != nil {
		return nil, err
	}
	log.IndexRuns() // ListRuns' first page without listing every snapshot
	floors, err := c.Bus.ToolFloorsBucket(ctx)
	if err != nil {
		return nil, err
	}
	tools := catalog.NewCache(c.Bus.Tools, c.Logger, time.Second, catalog.Trust{Floors: floors})
	if c.pools != nil {
		c.pools.mu.Lock()
		c.pools.tools, c.pools.expect, c.pools.logger = tools, c.ExpectPools, c.Logger
		c.pools.mu.Unlock()
	}
	var qc *quota.Cell
	stopQuota := func() {}
	if c.quota != nil {
		if qc, err = c.quota(ctx, log); err != nil {
			return nil, err
		}
		c.Engine.Admit, c.Engine.PoolLimit, c.Engine.OnEvents = qc.Admit, qc.PoolLimit, qc.OnEvents
		c.API.AdmitStart = qc.AdmitStart
		qctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := qc.Run(qctx); err != nil {
				c.Logger.ErrorContext(qctx, "quota cell stopped", "err", err)
			}
		}()
		stopQuota = func() { cancel(); <-done }
	}
	eng, err := engine.New(ctx, c.Engine, c.Bus, log, tools, c.Planner, c.Logger)
	if err != nil {
		stopQuota()
		return nil, err
	}
	apiCfg := c.API
	apiCfg.Tools = tools
	srv, err := api.New(apiCfg, c.Bus, log, c.Logger)
	if err != nil {
		stopQuota()
		return nil, err
	}
	if err := eng.Start(ctx); err != nil {
		stopQuota()
		return nil, err
	}
	trg, err := startTriggers(ctx, c.Bus, srv, c.Logger, c.Triggers)
	if err != nil {
		stopQuota()
		return nil, errors.Join(err, eng.Stop(context.WithoutCancel(ctx)))
	}
	scheds, err := startSchedules(ctx, c, srv)
	if err != nil {
		stopQuota()
		return nil, errors.Join(err, trg.stop(ctx), eng.Stop(context.WithoutCancel(ctx)))
	}
	if c.GRPC != nil {
		srv.Register(c.GRPC)
		planexv1.RegisterTriggerServiceServer(c.GRPC, trg)
		planexv1.RegisterScheduleServiceServer(c.GRPC, &scheduleServer{cell: scheds, logger: c.Logger})
	}
	// Record the floors of tools as executors register them, not only
	// when a run first asks for the catalog (which could be after the
	// honest registrations expired and a lowered one was written).
	refreshCtx, stopRefresh := context.WithCancel(context.WithoutCancel(ctx))
	refreshed := make(chan struct{})
	go func() {
		defer close(refreshed)
		tools.Refresh(refreshCtx, catalogRefreshInterval)
	}()
	ictx, stopIndexed := context.WithCancel(ctx)
	go func() {
		took, err := log.WaitIndexed(ictx)
		if err != nil {
			return // the replica stopped first
		}
		il := IndexLoaded{Runs: log.IndexedRuns(), Took: took}
		il.FromCheckpoint, il.CheckpointTook = log.IndexRestored()
		c.Logger.InfoContext(ictx, "run index loaded", "runs", il.Runs, "took", took,
			"from_checkpoint", il.FromCheckpoint, "checkpoint_took", il.CheckpointTook)
		if c.OnIndexed != nil {
			c.OnIndexed(il)
		}
	}()
	return &parts{api: srv, log: log, quota: qc, triggers: trg, schedules: scheds, stop: func(ctx context.Context) error {
		stopIndexed()
		scheds.stop() // no firing starts a run once the engine drains
		stopRefresh()
		<-refreshed
		// Triggers first: the runs their last events start still reach
		// the engine through the log.
		err := errors.Join(trg.stop(ctx), eng.Stop(ctx))
		stopQuota() // after the engine: its last events are counted
		// A checkpoint of the run index, so that the next start (a
		// rolling upgrade's) loads it rather than every snapshot;
		// bounded, as a cache must not hold a shutdown up.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), indexCheckpointTimeout)
		if n, cerr := log.CheckpointIndex(cctx); cerr != nil {
			c.Logger.WarnContext(ctx, "run index checkpoint not written at stop", "err", cerr)
		} else if n > 0 {
			c.Logger.InfoContext(ctx, "run index checkpoint written", "runs", n)
		}
		cancel()
		return err
	}}, nil
}

// IndexLoaded describes a replica's run index once loaded.
type IndexLoaded struct {
	// Runs is how many runs it holds.
	Runs int
	// Took is how long loading took from Start.
	Took time.Duration
	// FromCheckpoint is how many runs it read from the last checkpoint
	// (0: none was usable; every snapshot was read), and CheckpointTook
	// how long reading them took; the rest of Took replayed planex-runs
	// after the checkpoint's revision.
	FromCheckpoint int
	CheckpointTook time.Duration
}

// indexCheckpointTimeout bounds the run index checkpoint a stopping
// replica writes (about a second per million runs).
const indexCheckpointTimeout = 10 * time.Second

// catalogRefreshInterval is how often a replica reloads the tool catalog
// in the background (executors renew their registrations every 10s).
const catalogRefreshInterval = 5 * time.Second

// fairSlots is --fair-slots, or twice GOMAXPROCS when it is 0: enough
// messages in flight to keep every CPU busy while each waits on NATS,
// few enough that another tenant's message finds a CPU
// (BenchmarkTenantFairness, docs/performance.md).
func (c Config) fairSlots() int {
	if c.FairSlots > 0 {
		return c.FairSlots
	}
	return 2 * runtime.GOMAXPROCS(0)
}
