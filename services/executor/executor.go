// Package executor is planex's executor service: one pool of tools (sql,
// email or search) consuming planex.steps.<pool>.> through the pool's
// durable pull consumer, validating, running and reporting each step, and
// serving ExecutorService (Describe, Execute) over gRPC.
//
// The runtime shared by the pools lives in services/executor/runner; the
// pools in sqlpool, emailpool and searchpool.
package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/cassette"
	"github.com/planex-dev/planex/internal/grpcserver"
	"github.com/planex-dev/planex/internal/natsauth"
	"github.com/planex-dev/planex/internal/service"
	"github.com/planex-dev/planex/internal/stepsign"
	"github.com/planex-dev/planex/services/executor/emailpool"
	"github.com/planex-dev/planex/services/executor/mcppool"
	"github.com/planex-dev/planex/services/executor/runner"
	"github.com/planex-dev/planex/services/executor/searchpool"
	"github.com/planex-dev/planex/services/executor/sqlpool"
)

// DefaultGRPCAddr is the executor's default listen address.
const DefaultGRPCAddr = "127.0.0.1:7402"

// PasswordEnv is the environment variable read for the SMTP password when
// --smtp-password-file is not set.
const PasswordEnv = "PLANEX_SMTP_PASSWORD"

// BackendHealthService is the grpc.health.v1 service name under which a
// replica reports its pool's backend (SMTP relay, database, index): SERVING
// while it answers, NOT_SERVING during an outage. The overall status ("")
// does not follow it — liveness and readiness probes must not restart or
// unroute a replica because its backend is away; its steps fail with
// retryable UNAVAILABLE errors meanwhile. The same state is the metric
// planex.executor.backend.up.
const BackendHealthService = "planex.executor.backend"

// Pools lists the pool names the runtime knows.
var Pools = []string{"sql", "email", "search", "mcp"}

// Config configures an executor replica.
type Config struct {
	// Common service flags.
	Common service.Common
	// Pool is the pool this replica serves.
	Pool string
	// Runner holds the runtime options (--concurrency, --ack-wait,
	// --max-deliver, --max-ack-pending, --max-output-bytes,
	// --inline-output-bytes, --jetstream-call-timeout, --record-grace,
	// --started-notice-delay);
	// Run fills in Pool, Tools, Logger, Probe and OnBackend.
	Runner runner.Options

	// SQLDSN selects the database of the sql pool.
	SQLDSN string
	// SQLWriteDSN is the PostgreSQL connection of sql.exec (a role that may
	// write); empty: sql.exec uses SQLDSN.
	SQLWriteDSN string
	// SQLAllowPrivilegedRole starts the sql pool although the PostgreSQL
	// role of SQLDSN is a superuser or may write (development only).
	SQLAllowPrivilegedRole bool
	// SQLMaxRows caps rows returned by sql.query.
	SQLMaxRows int
	// SQLStatementTimeout bounds one statement.
	SQLStatementTimeout time.Duration

	// EmailOutbox selects dev mode: mail is written there, not sent.
	EmailOutbox string
	// EmailAllowedDomains are the recipient domains mail may go to.
	EmailAllowedDomains []string
	// EmailFrom is the sender address.
	EmailFrom string
	// SMTPAddr is the relay's host:port.
	SMTPAddr string
	// SMTPUser enables SMTP AUTH.
	SMTPUser string
	// SMTPPasswordFile holds the AUTH password; PLANEX_SMTP_PASSWORD is
	// read when it is empty.
	SMTPPasswordFile string
	// SMTPStartTLS is mandatory, opportunistic or none.
	SMTPStartTLS string

	// SearchIndex is the bleve index directory of the search pool.
	SearchIndex string

	// MCPConfig is the mcpServers JSON file of the mcp pool.
	MCPConfig string

	// OnReady, when set, is called with the gRPC address once SERVING.
	OnReady func(net.Addr)

	// StepVerify are --step-verify-keys and --allow-unsigned-steps.
	StepVerify stepsign.VerifierFlags
	// Replay, when set, is a cassette directory: the pool's tools (from its
	// tools.json) answer from the recorded results, and no backend
	// (database, mail relay, index, MCP server) is opened. A step the
	// cassette has no result for fails TOOL_FAILED naming the request.
	Replay string
	// GRPCExecute serves ExecutorService.Execute (off by default: it runs
	// a step outside the queue); then a call needs the admin role or the
	// step as the supervisor signed it.
	GRPCExecute bool

	// ServeTenants are the tenants, besides the default one, whose NATS
	// accounts this replica serves too (--serve-tenants): a pool granted
	// to several tenants runs one deployment, connects once per tenant
	// and keeps each tenant's steps, effects, outputs and results in that
	// tenant's account.
	ServeTenants []string
	// TenantCredentialsDir holds each served tenant's seed of this pool's
	// identity at <dir>/<tenant>/executor-<pool>.nk (TenantSeedFile).
	TenantCredentialsDir string
	// ServeDefault serves the default tenant's steps on the service's own
	// connection (--serve-default, true); false serves ServeTenants only.
	ServeDefault bool
	// Tenant is the tenant whose NATS account the service's own
	// connection is in (--tenant): a pool a tenant owns runs with that
	// tenant's executor-<pool> credentials and verifies that its steps
	// were signed for that tenant. Empty: the default tenant.
	Tenant string
}

// RegisterFlags adds the executor's flags to fs.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	c.Common.RegisterFlags(fs, DefaultGRPCAddr)
	fs.StringVar(&c.Pool, "pool", "", "executor pool to serve: sql, email, search or mcp (required)")
	fs.IntVar(&c.Runner.Concurrency, "concurrency", runner.DefaultConcurrency, "steps this replica runs at once")
	fs.DurationVar(&c.Runner.AckWait, "ack-wait", runner.DefaultAckWait, "redeliver a step to another replica after this long without an ack or heartbeat")
	fs.IntVar(&c.Runner.MaxDeliver, "max-deliver", runner.DefaultMaxDeliver, "deliveries of one step before a retryable failure (UNAVAILABLE) is reported to the engine")
	fs.IntVar(&c.Runner.MaxAckPending, "max-ack-pending", 0, "unacknowledged steps across the whole pool (0: replicas registered × --concurrency, following the pool as it scales)")
	fs.IntVar(&c.Runner.MaxOutputBytes, "max-output-bytes", runner.DefaultMaxOutputBytes, "cap on a step's JSON output; rows and hits beyond it are cut and marked truncated")
	fs.IntVar(&c.Runner.InlineOutputBytes, "inline-output-bytes", runner.DefaultInlineOutputBytes, "outputs larger than this go to the planex-outputs object store")
	fs.DurationVar(&c.Runner.KVTimeout, "jetstream-call-timeout", runner.DefaultKVTimeout, "deadline of one JetStream call (effect record, output, result); failed calls are tried again within the step's budget")
	fs.DurationVar(&c.Runner.RecordGrace, "record-grace", runner.DefaultRecordGrace, "least time spent recording and reporting the result of a side effect that happened, past the step's timeout if need be")
	fs.DurationVar(&c.Runner.StartedNoticeDelay, "started-notice-delay", runner.DefaultStartedNoticeDelay, "a step running this long reports its start to the supervisor (and starts heartbeating); a faster one reports it with its result (negative: report every start at once)")

	fs.StringVar(&c.SQLDSN, "sql-dsn", "", "sql pool database: postgres://user@host/db, sqlite:///path/demo.db or a SQLite file path")
	fs.StringVar(&c.SQLWriteDSN, "sql-write-dsn", "", "PostgreSQL connection of sql.exec, a role that may write (default: --sql-dsn, whose role must then be allowed with --sql-allow-privileged-role)")
	fs.BoolVar(&c.SQLAllowPrivilegedRole, "sql-allow-privileged-role", false, "development only: start although the PostgreSQL role of --sql-dsn is a superuser or may write (a warning is logged); see `planex sql grant-readonly`")
	fs.IntVar(&c.SQLMaxRows, "sql-max-rows", sqlpool.DefaultMaxRows, "rows sql.query returns at most")
	fs.DurationVar(&c.SQLStatementTimeout, "sql-statement-timeout", sqlpool.DefaultStatementTimeout, "time one SQL statement may run")

	fs.StringVar(&c.EmailOutbox, "email-outbox", "", "dev mode: write sent mail as .eml files into this directory instead of using SMTP")
	fs.StringSliceVar(&c.EmailAllowedDomains, "email-allowed-domains", nil, "recipient domains mail may be sent to (comma separated; none by default)")
	fs.StringVar(&c.EmailFrom, "email-from", "planex@example.com", "sender address of the email pool")
	fs.StringVar(&c.SMTPAddr, "smtp-addr", "", "SMTP relay host:port")
	fs.StringVar(&c.SMTPUser, "smtp-user", "", "SMTP AUTH user (password from --smtp-password-file or "+PasswordEnv+")")
	fs.StringVar(&c.SMTPPasswordFile, "smtp-password-file", "", "file holding the SMTP AUTH password")
	fs.StringVar(&c.SMTPStartTLS, "smtp-starttls", emailpool.StartTLSMandatory, "STARTTLS policy: mandatory, opportunistic or none")

	fs.StringVar(&c.MCPConfig, "mcp-config", "", "mcp pool: JSON file of MCP servers in the mcpServers shape of MCP clients (stdio command/args/env or url/headers/bearerTokenFile)")
	fs.StringVar(&c.SearchIndex, "search-index", "", "bleve index directory of the search pool (created if missing)")
	c.StepVerify.RegisterFlags(fs)
	fs.StringVar(&c.Replay, "replay", "", "answer the pool's steps from this cassette directory (planex eval --dev --record, planex dev --record) instead of opening its backend")
	fs.BoolVar(&c.GRPCExecute, "grpc-execute", false, "serve ExecutorService.Execute to admin callers and to callers sending a step the supervisor signed (off by default)")
	fs.StringSliceVar(&c.ServeTenants, "serve-tenants", nil, "also serve the steps of these tenants (comma separated), each in its own NATS account with the seed in --tenant-credentials-dir: a pool granted to several tenants")
	fs.StringVar(&c.TenantCredentialsDir, "tenant-credentials-dir", "", "directory of the served tenants' NATS seeds, <dir>/<tenant>/executor-<pool>.nk (planex auth k8s-secrets --tenant <tenant>=<pool>)")
	fs.StringVar(&c.Tenant, "tenant", "", "the tenant whose NATS account --nats-nkey-file's user is in (a pool the tenant owns): its steps must be signed for that tenant; empty: the default tenant")
	fs.BoolVar(&c.ServeDefault, "serve-default", true, "serve the default tenant's steps on the service's own NATS connection (false: --serve-tenants only)")
}

// Validate checks the configuration, naming the flag and value at fault.
func (c Config) Validate() error {
	errs := []error{c.StepVerify.Validate()}
	if c.Tenant != "" && c.Tenant != natsauth.DefaultTenant {
		if err := natsauth.ValidTenant(c.Tenant); err != nil {
			errs = append(errs, fmt.Errorf("--tenant: %w", err))
		}
		if len(c.ServeTenants) > 0 {
			errs = append(errs, errors.New("--tenant: conflicts with --serve-tenants (a shared pool serves the default tenant on its own connection)"))
		}
	}
	r := c.Runner
	if !slices.Contains(Pools, c.Pool) {
		errs = append(errs, fmt.Errorf("--pool %q: want one of %s", c.Pool, strings.Join(Pools, ", ")))
	}
	if r.Concurrency < 1 || r.Concurrency > 1024 {
		errs = append(errs, fmt.Errorf("--concurrency %d: want 1 to 1024", r.Concurrency))
	}
	if r.AckWait < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("--ack-wait %s: want at least 100ms", r.AckWait))
	}
	if r.KVTimeout < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("--jetstream-call-timeout %s: want at least 10ms", r.KVTimeout))
	}
	if r.StartedNoticeDelay > 10*time.Second {
		errs = append(errs, fmt.Errorf("--started-notice-delay %s: want at most 10s", r.StartedNoticeDelay))
	}
	if r.RecordGrace < r.KVTimeout {
		errs = append(errs, fmt.Errorf("--record-grace %s: want at least --jetstream-call-timeout (%s)", r.RecordGrace, r.KVTimeout))
	}
	if r.MaxDeliver < 1 && r.MaxDeliver != -1 {
		errs = append(errs, fmt.Errorf("--max-deliver %d: want at least 1 (or -1 for unlimited)", r.MaxDeliver))
	}
	if r.MaxAckPending < 0 {
		errs = append(errs, fmt.Errorf("--max-ack-pending %d: must not be negative", r.MaxAckPending))
	}
	if r.MaxOutputBytes < 1 {
		errs = append(errs, fmt.Errorf("--max-output-bytes %d: must be positive", r.MaxOutputBytes))
	}
	if r.InlineOutputBytes < 1 || r.InlineOutputBytes > r.MaxOutputBytes {
		errs = append(errs, fmt.Errorf("--inline-output-bytes %d: want 1 to --max-output-bytes (%d)", r.InlineOutputBytes, r.MaxOutputBytes))
	}
	pool := c.Pool
	if c.Replay != "" {
		pool = "" // no backend to configure
	}
	switch pool {
	case "sql":
		if _, err := sqlpool.Kind(c.SQLDSN); err != nil {
			errs = append(errs, fmt.Errorf("--sql-dsn: %w", err))
		}
		if c.SQLWriteDSN != "" {
			if k, err := sqlpool.Kind(c.SQLWriteDSN); err != nil || k != "postgresql" {
				errs = append(errs, errors.New("--sql-write-dsn: want a postgres:// DSN (a separate write role is a PostgreSQL feature)"))
			}
		}
		if c.SQLMaxRows < 1 || c.SQLMaxRows > 1_000_000 {
			errs = append(errs, fmt.Errorf("--sql-max-rows %d: want 1 to 1000000", c.SQLMaxRows))
		}
		if c.SQLStatementTimeout <= 0 {
			errs = append(errs, fmt.Errorf("--sql-statement-timeout %s: must be positive", c.SQLStatementTimeout))
		}
	case "email":
		errs = append(errs, c.emailConfig("", nil).Validate())
	case "search":
		if c.SearchIndex == "" {
			errs = append(errs, errors.New("--search-index: required for the search pool"))
		}
	case "mcp":
		if _, err := mcppool.LoadConfig(c.MCPConfig); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(append(errs, c.validateTenants(), c.Common.Validate())...)
}

func (c Config) emailConfig(password string, logger *slog.Logger) emailpool.Config {
	return emailpool.Config{
		OutboxDir: c.EmailOutbox, AllowedDomains: c.EmailAllowedDomains,
		SMTPAddr: c.SMTPAddr, SMTPUser: c.SMTPUser, SMTPPassword: password, StartTLS: c.SMTPStartTLS,
		From: c.EmailFrom, Logger: logger,
	}
}

// smtpPassword reads the password from --smtp-password-file or the
// environment.
func (c Config) smtpPassword() (string, error) {
	if c.SMTPPasswordFile == "" {
		return os.Getenv(PasswordEnv), nil
	}
	b, err := os.ReadFile(c.SMTPPasswordFile)
	if err != nil {
		return "", fmt.Errorf("--smtp-password-file %s: %w", c.SMTPPasswordFile, err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// prober is a pool that can check its backend without running a step.
type prober interface {
	Probe(ctx context.Context) error
}

// toolWatcher is a pool whose tools change while it runs (the MCP pool).
type toolWatcher interface {
	OnToolsChanged(fn func(ctx context.Context, tools []runner.Tool) error)
}

// openPool opens the backend of the configured pool; the email pool keeps
// its drafts in res.Drafts. probe is nil when the pool cannot check its
// backend by itself (its health then follows its steps only).
func openPool(ctx context.Context, c Config, res *bus.Resources, srv *grpcserver.Server, logger *slog.Logger) (tools []runner.Tool, pool any, probe func(context.Context) error, closeFn func() error, err error) {
	tools, p, closeFn, err := openTools(ctx, c, res, srv, logger)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if pr, ok := p.(prober); ok {
		probe = pr.Probe
	}
	return tools, p, probe, closeFn, nil
}

func openTools(ctx context.Context, c Config, res *bus.Resources, srv *grpcserver.Server, logger *slog.Logger) (tools []runner.Tool, pool any, closeFn func() error, err error) {
	noop := func() error { return nil }
	if c.Replay != "" {
		tools, err := replayTools(c.Replay, c.Pool)
		return tools, nil, noop, err
	}
	switch c.Pool {
	case "sql":
		p, err := sqlpool.Open(ctx, sqlpool.Config{DSN: c.SQLDSN, WriteDSN: c.SQLWriteDSN, AllowPrivilegedRole: c.SQLAllowPrivilegedRole, MaxRows: c.SQLMaxRows, StatementTimeout: c.SQLStatementTimeout, Logger: logger})
		if err != nil {
			return nil, nil, nil, err
		}
		return p.Tools(), p, p.Close, nil
	case "email":
		pw, err := c.smtpPassword()
		if err != nil {
			return nil, nil, nil, err
		}
		ec := c.emailConfig(pw, logger)
		ec.Drafts = res.Drafts
		p, err := emailpool.New(ec)
		if err != nil {
			return nil, nil, nil, err
		}
		return p.Tools(), p, noop, nil
	case "search":
		p, err := searchpool.Open(searchpool.Config{IndexDir: c.SearchIndex, Logger: logger})
		if err != nil {
			return nil, nil, nil, err
		}
		return p.Tools(), p, p.Close, nil
	case "mcp":
		fc, err := mcppool.LoadConfig(c.MCPConfig)
		if err != nil {
			return nil, nil, nil, err
		}
		// Each server's health is reported as service "planex.mcp.<server>".
		onHealth := func(server string, err error) { srv.SetStatus("planex.mcp."+server, err == nil) }
		p, err := mcppool.Open(ctx, mcppool.Config{Pool: c.Pool, File: fc, Logger: logger, OnHealth: onHealth})
		if err != nil {
			return nil, nil, nil, err
		}
		return p.Tools(), p, p.Close, nil
	}
	return nil, nil, nil, fmt.Errorf("--pool %q: unknown pool", c.Pool)
}

// replayTools are the tools of pool recorded in the cassette in dir,
// answering from it.
func replayTools(dir, pool string) ([]runner.Tool, error) {
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("--replay %s: not a cassette directory (record one with planex eval --dev --record or planex dev --record)", dir)
	}
	cas, err := cassette.Open(dir, nil)
	if err != nil {
		return nil, fmt.Errorf("--replay: %w", err)
	}
	specs, err := cas.Tools()
	if err != nil {
		return nil, fmt.Errorf("--replay: %w", err)
	}
	var tools []runner.Tool
	for _, s := range specs {
		if s.GetPool() == pool {
			tools = append(tools, runner.ReplayTool(s, cas, nil))
		}
	}
	if len(tools) == 0 {
		return nil, fmt.Errorf("--replay %s: the cassette's catalog has no tool of pool %q", dir, pool)
	}
	return tools, nil
}

// Run serves the pool until ctx ends, then shuts down gracefully: it stops
// fetching steps, lets running steps finish within --shutdown-grace, and
// removes the replica's tool registrations.
//
// With --serve-tenants the replica also serves each listed tenant's NATS
// account over a connection of its own (the tenant's executor-<pool>
// user): one runner per account over the same tools, with the account's
// own replay cache, effect records, outputs, registrations and results. A
// tenant that cannot be served fails the start, naming it; the replica is
// SERVING only while every tenant's connection and streams answer.
// ExecutorService (Describe, Execute) serves the default tenant's runner
// only.
func Run(ctx context.Context, cfg Config, logger *slog.Logger, metrics service.MetricsHandler) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	var disabled []string
	if !cfg.GRPCExecute {
		disabled = append(disabled, planexv1.ExecutorService_Execute_FullMethodName)
	}
	verifier, err := cfg.StepVerify.VerifierFor(logger, cfg.Tenant)
	if err != nil {
		return err
	}
	var (
		owners *runOwners // nil when serving the default tenant alone
		ready  func(context.Context) error
		health tenantsReady
	)
	if len(cfg.ServeTenants) > 0 {
		owners, ready = newRunOwners(), health.check
	}
	return service.Serve(ctx, service.Params{
		DisabledMethods: disabled,
		Name:            "executor-" + cfg.Pool,
		Common:          cfg.Common,
		Logger:          logger,
		Metrics:         metrics,
		Ready:           cfg.OnReady,
		ReadyCheck:      ready,
		Start: func(ctx context.Context, d service.Deps) (func(context.Context) error, error) {
			tools, pool, probe, closeTools, err := openPool(ctx, cfg, d.Bus, d.Server, d.Logger)
			if err != nil {
				return nil, err
			}
			d.Server.SetStatus(BackendHealthService, true)
			onBackend := func(up bool, _ string) { d.Server.SetStatus(BackendHealthService, up) }
			replica := cfg.Runner.ReplicaID
			if replica == "" {
				// One id for the replica in every account it serves.
				replica = runner.NewReplicaID()
			}
			var r *runner.Runner // the default tenant's; nil with --serve-default=false
			if cfg.ServeDefault {
				if verifier != nil {
					// A replay delivered to another replica of the pool is
					// refused too: replicas share the accepted signatures.
					shared, err := stepsign.OpenSharedReplays(ctx, d.Bus.JS, cfg.Pool, cfg.Common.StreamReplicas)
					if err != nil {
						return nil, errors.Join(err, closeTools())
					}
					verifier.ShareReplays(shared)
				}
				opts := cfg.Runner
				opts.Pool, opts.Tools, opts.Logger, opts.Verifier = cfg.Pool, tools, d.Logger, verifier
				opts.Probe, opts.OnBackend, opts.ReplicaID = probe, onBackend, replica
				opts.WrapTool = owners.wrap(natsauth.DefaultTenant, opts.WrapTool)
				if r, err = runner.New(d.Bus, opts); err != nil {
					return nil, errors.Join(err, closeTools())
				}
				planexv1.RegisterExecutorServiceServer(d.Server.GRPC, &executeService{Service: runner.NewService(r, d.Logger), r: r, verifier: verifier})
			}
			cells, err := openTenants(ctx, tenantSetup{cfg: cfg, deps: d, tools: tools, probe: probe, owners: owners, replica: replica, onBack: onBackend})
			if err != nil {
				return nil, errors.Join(err, closeTools())
			}
			runners := make([]*runner.Runner, 0, len(cells)+1)
			if r != nil {
				runners = append(runners, r)
			}
			for _, c := range cells {
				runners = append(runners, c.r)
			}
			if w, ok := pool.(toolWatcher); ok {
				w.OnToolsChanged(func(ctx context.Context, tools []runner.Tool) error {
					var errs []error
					for _, r := range runners {
						errs = append(errs, r.SetTools(ctx, tools))
					}
					return errors.Join(errs...)
				})
			}
			stop := func(ctx context.Context) error {
				err := stopRunners(ctx, r, cells)
				return errors.Join(err, closeCells(ctx, cells, cfg.Common.ShutdownGrace), closeTools())
			}
			if r != nil {
				if err := r.Start(ctx); err != nil {
					return nil, errors.Join(err, closeCells(context.Background(), cells, cfg.Common.ShutdownGrace), closeTools())
				}
			}
			for i, c := range cells {
				if err := c.r.Start(ctx); err != nil {
					// Fail closed: a replica never serves some of its
					// tenants only. Stop what started, close the rest.
					sctx, cancel := context.WithTimeout(context.Background(), cfg.Common.ShutdownGrace)
					err = errors.Join(fmt.Errorf("tenant %s: %w", c.tenant, err), stopRunners(sctx, r, cells[:i]),
						closeCells(sctx, cells, cfg.Common.ShutdownGrace), closeTools())
					cancel()
					return nil, err
				}
			}
			health.cells.Store(&cells)
			if len(cells) > 0 {
				d.Logger.Info("serving tenants", "tenants", tenantList(cells), "default", r != nil)
			}
			return stop, nil
		},
	})
}

// executeService is ExecutorService with Execute open to two kinds of
// callers: an admin (any step), and any authenticated caller sending a
// step exactly as the supervisor signed it for the queue — verified like
// a delivered message, approval proof and replay check included (a
// signed step runs at most once, from the queue or from here).
type executeService struct {
	*runner.Service
	r        *runner.Runner
	verifier *stepsign.Verifier
}

// Execute checks the caller's right to run the step, then runs it.
func (s *executeService) Execute(ctx context.Context, req *planexv1.ExecuteRequest) (*planexv1.ExecuteResponse, error) {
	signed := req.GetSigned()
	if signed == nil {
		if id, ok := authn.FromContext(ctx); !ok || !id.Has(authn.RoleAdmin) {
			return nil, authn.Denied()
		}
		return s.Service.Execute(ctx, req)
	}
	if req.GetStep() != nil {
		return nil, status.Error(codes.InvalidArgument, "step: leave empty when signed is set (the step is signed.payload)")
	}
	if s.verifier == nil {
		// --allow-unsigned-steps: no keys to check a signature with.
		return nil, status.Error(codes.FailedPrecondition, "signed: this executor verifies no signatures (--allow-unsigned-steps)")
	}
	step := &planexv1.StepRequest{}
	if err := proto.Unmarshal(signed.GetPayload(), step); err != nil {
		return nil, status.Error(codes.InvalidArgument, "signed.payload: not a StepRequest")
	}
	if want, err := bus.StepSubject(step.GetTool()); err != nil || signed.GetSubject() != want {
		return nil, status.Error(codes.InvalidArgument, "signed.subject: must be the step subject of the payload's tool")
	}
	h := nats.Header{}
	h.Set(stepsign.HeaderKeyID, signed.GetKeyId())
	h.Set(stepsign.HeaderExpires, strconv.FormatInt(signed.GetExpiresUnixMs(), 10))
	h.Set(stepsign.HeaderSignature, signed.GetSignature())
	if signed.GetApproval() != "" {
		h.Set(stepsign.HeaderApproval, signed.GetApproval())
	}
	requiresApproval := true // unknown tools as gated, like the queue
	for _, spec := range s.r.Specs() {
		if spec.GetName() == step.GetTool() {
			requiresApproval = spec.GetRequiresApproval()
		}
	}
	// Stream sequence 0: never a redelivery, so a second Execute of the
	// same signature, or one the queue already delivered, is a replay.
	err := s.verifier.Verify(ctx, stepsign.Request{Subject: signed.GetSubject(), Header: h, Data: signed.GetPayload(),
		Tool: step.GetTool(), RequiresApproval: requiresApproval})
	switch {
	case errors.Is(err, stepsign.ErrReplayCacheUnavailable):
		return nil, status.Error(codes.Unavailable, "replay cache unreachable; retry later")
	case err != nil:
		return nil, authn.Denied() // the reason is logged and counted by the verifier
	}
	return s.Service.Execute(ctx, &planexv1.ExecuteRequest{Step: step})
}
