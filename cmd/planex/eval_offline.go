package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

	"github.com/planex-dev/planex/cmd/internal/devstack"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/cassette"
	"github.com/planex-dev/planex/internal/service"
	"github.com/planex-dev/planex/internal/tlsconfig"
	"github.com/planex-dev/planex/services/executor"
	"github.com/planex-dev/planex/services/executor/runner"
	"github.com/planex-dev/planex/services/planner"
	"github.com/planex-dev/planex/services/supervisor"
	"github.com/planex-dev/planex/services/supervisor/catalog"
)

const levelError = slog.LevelError

// writeCatalog stores the stack's tool catalog in the cassette directory.
func writeCatalog(ctx context.Context, js jetstream.JetStream, cas *cassette.Cassette) error {
	kv, err := js.KeyValue(ctx, bus.BucketTools)
	if err != nil {
		return fmt.Errorf("record the tool catalog: %w", err)
	}
	cat, err := catalog.Load(ctx, kv, slog.New(slog.DiscardHandler))
	if err != nil {
		return fmt.Errorf("record the tool catalog: %w", err)
	}
	return cas.WriteCatalog(cat.Specs())
}

// offlineStack runs a suite with no model and no tool backend: an
// embedded NATS server, the supervisor, the planner service with the
// replay backend (--planner-backend replay --replay DIR) and one executor
// service per pool of the cassette's catalog with --replay DIR, as a
// deployed topology replays a recording. No database, mail relay or
// index is opened. With critic set (the --critic-* flags the recording was
// made with), the supervisor asks the model critic as it did when
// recording, and the replay backend answers with the recorded verdicts.
type offlineStack struct {
	addr string
	js   jetstream.JetStream
	stop func() error
}

func startOffline(ctx context.Context, cas *cassette.Cassette, faults *faultRegistry, critic devstack.CriticOptions) (_ *offlineStack, err error) {
	specs, err := cas.Tools()
	if err != nil {
		return nil, fmt.Errorf("--replay: %w", err)
	}
	store, err := os.MkdirTemp("", "planex-eval-")
	if err != nil {
		return nil, err
	}
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: store, NoLog: true, NoSigs: true})
	if err != nil {
		os.RemoveAll(store)
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(15 * time.Second) {
		ns.Shutdown()
		os.RemoveAll(store)
		return nil, errors.New("embedded NATS not ready within 15s")
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 8)
	var services int
	logger := slog.New(slog.DiscardHandler)
	var nc interface{ Close() }
	stop := func() error {
		var errs []error
		cancel()
		for range services {
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				errs = append(errs, err)
			}
		}
		if nc != nil {
			nc.Close()
		}
		ns.Shutdown()
		ns.WaitForShutdown()
		errs = append(errs, os.RemoveAll(store))
		return errors.Join(errs...)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, stop())
		}
	}()
	common := func() service.Common {
		return service.Common{
			GRPCAddr: "127.0.0.1:0", NATSURL: ns.ClientURL(), LogLevel: "error", LogFormat: "text",
			ShutdownGrace: 5 * time.Second, StreamReplicas: 1,
			TLS: tlsconfig.Flags{Plaintext: true}, Auth: authn.Config{Disabled: true},
		}
	}
	start := func(name string, run func(onReady func(net.Addr)) error) (net.Addr, error) {
		ready := make(chan net.Addr, 1)
		services++
		go func() { done <- run(func(a net.Addr) { ready <- a }) }()
		select {
		case a := <-ready:
			return a, nil
		case err := <-done:
			services--
			return nil, fmt.Errorf("offline %s: %w", name, err)
		case <-time.After(30 * time.Second):
			return nil, fmt.Errorf("offline %s: not serving within 30s", name)
		}
	}

	var pcfg planner.Config
	// Overrides let a request naming the recorded backend (the model
	// critic's) reach the replay backend, which answers for every name.
	if err := parseServiceFlags(pcfg.RegisterFlags, "--planner-backend", planner.BackendReplay, "--replay", cas.Dir(), "--planner-allow-backend-override"); err != nil {
		return nil, err
	}
	pcfg.Common = common()
	pcfg.Backend.Wrap = func(b planner.Backend) planner.Backend { return planner.InvalidPlanFault(b, faults.planInvalid) }
	plannerAddr, err := start("planner", func(onReady func(net.Addr)) error {
		pcfg.OnReady = onReady
		return planner.Run(sctx, pcfg, logger, nil)
	})
	if err != nil {
		return nil, err
	}

	pools := map[string]bool{}
	for _, s := range specs {
		if catalog.Builtin(s.GetName()) {
			continue // served by the supervisor itself
		}
		pools[s.GetPool()] = true
	}
	for pool := range pools {
		var ecfg executor.Config
		if err := parseServiceFlags(ecfg.RegisterFlags, "--pool", pool, "--replay", cas.Dir(), "--allow-unsigned-steps", "--concurrency", "8"); err != nil {
			return nil, err
		}
		ecfg.Common = common()
		ecfg.Runner.WrapTool = func(t runner.Tool) runner.Tool {
			name := t.Spec().GetName()
			return runner.FaultTool(t, func(c runner.Call) runner.Fault { return faults.tool(c, name) })
		}
		if _, err := start("executor "+pool, func(onReady func(net.Addr)) error {
			ecfg.OnReady = onReady
			return executor.Run(sctx, ecfg, logger, nil)
		}); err != nil {
			return nil, err
		}
	}

	conn, err := bus.Connect(sctx, ns.ClientURL(), "planex-eval-offline", logger)
	if err != nil {
		return nil, err
	}
	nc = conn
	res, err := bus.Setup(sctx, conn, bus.Options{})
	if err != nil {
		return nil, err
	}

	var scfg supervisor.Config
	if err := parseServiceFlags(scfg.RegisterFlags); err != nil {
		return nil, err
	}
	scfg.Common = common()
	scfg.PlannerAddr = plannerAddr.String()
	scfg.AutoApprove = devstack.AutoApprove // decide as the dev stack that recorded
	if critic.Backend != "" {
		// Ask for the recorded backend, as the recording did (its name is
		// in the verdicts the planner sees again); the replay backend
		// answers for it.
		scfg.Guardrails.CriticBackend, scfg.Guardrails.CriticTools = critic.Backend, critic.Tools
		scfg.Guardrails.CriticMaxTokens, scfg.Guardrails.CriticOnFail = critic.MaxTokens, critic.OnFail
	}
	addr, err := start("supervisor", func(onReady func(net.Addr)) error {
		scfg.OnReady = onReady
		return supervisor.Run(sctx, scfg, logger, nil)
	})
	if err != nil {
		return nil, err
	}
	return &offlineStack{addr: addr.String(), js: res.JS, stop: stop}, nil
}

// parseServiceFlags fills a service's configuration from its command-line
// flags, as `planex planner`, `planex executor` or `planex supervisor`
// would with these arguments.
func parseServiceFlags(register func(*pflag.FlagSet), args ...string) error {
	fs := pflag.NewFlagSet("service", pflag.ContinueOnError)
	register(fs)
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("offline stack: %v: %w", args, err)
	}
	return nil
}
