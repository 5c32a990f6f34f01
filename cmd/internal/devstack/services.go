package devstack

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"

	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/demo"
	"github.com/planex-dev/planex/internal/natsauth"
	"github.com/planex-dev/planex/internal/service"
	"github.com/planex-dev/planex/internal/stepsign"
	"github.com/planex-dev/planex/internal/tlsconfig"
	"github.com/planex-dev/planex/services/console"
	"github.com/planex-dev/planex/services/executor"
	"github.com/planex-dev/planex/services/executor/runner"
	"github.com/planex-dev/planex/services/executor/searchpool"
	"github.com/planex-dev/planex/services/planner"
	"github.com/planex-dev/planex/services/planner/playbook"
	"github.com/planex-dev/planex/services/supervisor"
)

// DemoPools are the executor pools of every dev stack; the supervisor
// reports ready once each has registered (supervisor --expect-pools).
var DemoPools = []string{"sql", "email", "search"}

// AutoApprove lists the tools whose approval gate the dev stack waives:
// dev mail only reaches the local outbox and the demo's allowed domains, so
// the demo runs without a human approving each send. Every other gate
// (sql.exec) waits for a decision.
var AutoApprove = []string{"email.send"}

// ServiceOptions configure the services of the dev stack.
type ServiceOptions struct {
	// Planner selects the planner backend; the demo playbooks are always
	// added to it.
	Planner planner.BackendConfig
	// Metrics, when set, is served by the supervisor on MetricsAddr.
	Metrics service.MetricsHandler
	// MetricsAddr serves /metrics for the whole process when set.
	MetricsAddr string
	// LogLevel of the services (default warn: the terminal belongs to the
	// user).
	LogLevel string
	// MCPConfig, when set, adds an mcp pool serving the MCP servers of this
	// mcpServers file (--mcp-config).
	MCPConfig string
	// MCPAddr, when set, serves MCP over streamable HTTP on the supervisor
	// at this address (supervisor --mcp-addr); Stack.MCPURL is its URL.
	MCPAddr string
	// Policies are the supervisor's guardrail policy files (--policy; none
	// by default, see docs/guardrails.md).
	Policies []string
	// Critic is the supervisor's model critic (--critic-backend and the
	// flags beside it; off by default, see docs/guardrails.md).
	Critic CriticOptions
	// WrapTool, when set, wraps every executor tool (`planex eval --dev`
	// records tool calls and injects faults this way).
	WrapTool func(runner.Tool) runner.Tool
	// ConsoleAddr, when set, serves the web console there (--console-addr
	// of planex dev).
	ConsoleAddr string
	// JaegerURL is the Jaeger UI the console links run traces to.
	JaegerURL string
	// PoolIdentities are out-of-tree executor pools given a NATS identity
	// (credentials/nats/executor-<pool>.nk) to join the stack with
	// (--pool-identity).
	PoolIdentities []string
}

// RegisterFlags adds the planner flags shared by `planex dev`, `planex run
// --dev` and `planex planner`.
func (o *ServiceOptions) RegisterFlags(fs *pflag.FlagSet) {
	o.Planner.RegisterFlags(fs)
}

// CriticOptions are the model critic's supervisor flags in `planex dev`.
type CriticOptions struct {
	// Backend is --critic-backend (empty: off).
	Backend string
	// Tools is --critic-tools.
	Tools []string
	// MaxTokens is --critic-max-tokens.
	MaxTokens int64
	// OnFail is --critic-on-fail.
	OnFail string
}

// RegisterFlags adds the model critic's flags with the supervisor's
// defaults.
func (c *CriticOptions) RegisterFlags(fs *pflag.FlagSet) {
	def := supervisorDefaults().Guardrails
	fs.StringVar(&c.Backend, "critic-backend", "", "planner backend of the supervisor's model critic, which judges step results before the run moves on (openai, anthropic, playbook: fails empty results; empty: off)")
	fs.StringSliceVar(&c.Tools, "critic-tools", def.CriticTools, "tools whose results the model critic judges (comma separated; * is every tool)")
	fs.Int64Var(&c.MaxTokens, "critic-max-tokens", def.CriticMaxTokens, "model critic tokens per run, counted apart from the planner's max_tokens")
	fs.StringVar(&c.OnFail, "critic-on-fail", def.CriticOnFail, "what a failing verdict does: replan or escalate")
}

// Validate checks the options.
func (o ServiceOptions) Validate() error {
	if o.ConsoleAddr != "" {
		c := console.Config{HTTPAddr: o.ConsoleAddr, JaegerURL: o.JaegerURL}
		if err := c.Validate(); err != nil {
			return fmt.Errorf("--console-addr: %w", err)
		}
	}
	if err := o.Critic.Validate(o.Planner); err != nil {
		return err
	}
	return o.Planner.Validate()
}

// common is a service's configuration in the dev stack: TLS with the
// stack's certificate (client certificates verified when given), API keys,
// reflection, and the service's own NATS user.
func common(creds *Credentials, name, natsURL, grpcAddr string) service.Common {
	return service.Common{
		GRPCAddr:       grpcAddr,
		NATSURL:        natsURL,
		LogLevel:       "warn",
		LogFormat:      "text",
		ShutdownGrace:  5 * time.Second,
		StreamReplicas: 1,
		TLS:            tlsconfig.Flags{Files: creds.Services, ClientAuth: tlsconfig.ClientAuthVerifyIfGiven},
		Auth:           authn.Config{APIKeysFile: creds.APIKeysFile},
		Reflection:     true,
		NATS:           natsauth.Options{NKeySeedFile: creds.NATSSeedFiles[name]},
	}
}

// startServices lays out the demo domain on first start, then starts the
// planner, the three executor pools and the supervisor, in that order,
// each waiting for the previous to serve; the supervisor serves once every
// pool has registered its tools (supervisor --expect-pools).
func (s *Stack) startServices(ctx context.Context, cfg Config) error {
	dbPath := filepath.Join(cfg.DataDir, "demo.db")
	if err := demo.GenerateDB(ctx, dbPath); err != nil {
		return fmt.Errorf("demo database: %w", err)
	}
	indexDir := filepath.Join(cfg.DataDir, "search")
	if _, err := os.Stat(indexDir); os.IsNotExist(err) {
		var docs []searchpool.Document
		for _, d := range demo.Runbooks() {
			docs = append(docs, searchpool.Document{ID: d.ID, Title: d.Title, Body: d.Body, Tags: d.Tags})
		}
		if _, err := searchpool.IndexDocuments(ctx, indexDir, docs); err != nil {
			return fmt.Errorf("demo search index: %w", err)
		}
	}
	s.OutboxDir = filepath.Join(cfg.DataDir, "outbox")
	logger := cfg.Logger

	pcfg := planner.Config{Common: common(s.Credentials, "planner", s.NATSURL, "127.0.0.1:0"), Backend: cfg.Services.Planner}
	pcfg.Backend.BuiltinPlaybooks = playbook.DemoFS
	onReady, ready := readyChan()
	pcfg.OnReady = onReady
	s.goService("planner", func() error { return planner.Run(ctx, pcfg, logger, nil) })
	plannerAddr, err := s.waitReady(ctx, "planner", ready)
	if err != nil {
		return err
	}

	pools := []executor.Config{
		{Pool: "sql", SQLDSN: dbPath},
		{Pool: "email", EmailOutbox: s.OutboxDir, EmailAllowedDomains: demo.AllowedDomains, EmailFrom: "planex@example.com"},
		{Pool: "search", SearchIndex: indexDir},
	}
	if cfg.Services.MCPConfig != "" {
		pools = append(pools, executor.Config{Pool: "mcp", MCPConfig: cfg.Services.MCPConfig})
	}
	for _, ecfg := range pools {
		defaults := executorDefaults()
		ecfg.Common = common(s.Credentials, "executor-"+ecfg.Pool, s.NATSURL, "127.0.0.1:0")
		ecfg.StepVerify = stepsign.VerifierFlags{KeysPath: s.Credentials.VerifyKeysDir}
		ecfg.Runner = defaults.Runner
		ecfg.Runner.WrapTool = cfg.Services.WrapTool
		ecfg.SQLMaxRows, ecfg.SQLStatementTimeout, ecfg.SMTPStartTLS = defaults.SQLMaxRows, defaults.SQLStatementTimeout, defaults.SMTPStartTLS
		ecfg.ServeDefault = defaults.ServeDefault
		if ecfg.EmailFrom == "" {
			ecfg.EmailFrom = defaults.EmailFrom
		}
		onReady, ready := readyChan()
		ecfg.OnReady = onReady
		s.goService("executor "+ecfg.Pool, func() error { return executor.Run(ctx, ecfg, logger, nil) })
		if _, err := s.waitReady(ctx, "executor "+ecfg.Pool, ready); err != nil {
			return err
		}
	}

	scfg := supervisorDefaults()
	scfg.Common = common(s.Credentials, "supervisor", s.NATSURL, cfg.GRPCAddr)
	scfg.StepSigning = stepsign.SignerFlags{KeyFile: s.Credentials.SigningKeyFile}
	// One user: the dev CLI starts runs and approves them.
	scfg.AllowSelfApproval = true
	// The embedded NATS server's grants are this release's.
	scfg.IndexCheckpoints = true
	scfg.Common.MetricsAddr = cfg.Services.MetricsAddr
	scfg.PlannerAddr = plannerAddr.String()
	scfg.AutoApprove = AutoApprove
	// Ready (and so Start) only once the demo pools have registered: a run
	// started at once never meets an unknown tool. (The mcp pool may
	// serve no tool at all while its servers are unreachable.)
	scfg.ExpectPools = DemoPools
	scfg.Guardrails.Policies = cfg.Services.Policies
	if c := cfg.Services.Critic; c.Backend != "" {
		scfg.Guardrails.CriticBackend, scfg.Guardrails.CriticTools = c.Backend, c.Tools
		scfg.Guardrails.CriticMaxTokens, scfg.Guardrails.CriticOnFail = c.MaxTokens, c.OnFail
	}
	onReady, ready = readyChan()
	scfg.OnReady = onReady
	scfg.MCPAddr = cfg.Services.MCPAddr
	// Tenants created through the API get their NATS account at once.
	scfg.TenantConnect = s.connectTenant(logger)
	scfg.OnMCPReady = func(url string) { s.MCPURL = url } // before OnReady, which waitReady waits for
	s.goService("supervisor", func() error { return supervisor.Run(ctx, scfg, logger, cfg.Services.Metrics) })
	addr, err := s.waitReady(ctx, "supervisor", ready)
	if err != nil {
		return err
	}
	s.Addr = addr.String()
	if cfg.Services.ConsoleAddr != "" {
		if err := s.startConsole(ctx, cfg, logger); err != nil {
			return err
		}
	}
	if s.contextFile, err = writeContext(s.Addr, s.NATSURL, s.Credentials); err != nil {
		logger.Warn("dev stack: could not record the client context; pass --token-file and --tls-ca-file to clients", "err", err)
	}
	return nil
}

// executorDefaults returns an executor Config with every flag default, so
// the dev stack uses exactly what `planex executor` would.
func executorDefaults() executor.Config {
	var c executor.Config
	c.RegisterFlags(pflag.NewFlagSet("defaults", pflag.ContinueOnError))
	return c
}

// supervisorDefaults returns a supervisor Config with every flag default.
func supervisorDefaults() supervisor.Config {
	var c supervisor.Config
	c.RegisterFlags(pflag.NewFlagSet("defaults", pflag.ContinueOnError))
	return c
}
