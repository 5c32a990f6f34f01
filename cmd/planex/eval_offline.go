package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
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
	"github.com/planex-dev/planex/services/executor/runner"
	"github.com/planex-dev/planex/services/planner"
	"github.com/planex-dev/planex/services/supervisor"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/engine"
)

const levelError = slog.LevelError

// catalogFile is the tool catalog a recording keeps next to its cassette:
// an offline replay registers exactly these tools.
const catalogFile = "tools.json"

// writeCatalog stores the stack's tool catalog in the cassette directory.
func writeCatalog(ctx context.Context, js jetstream.JetStream, dir string) error {
	kv, err := js.KeyValue(ctx, bus.BucketTools)
	if err != nil {
		return fmt.Errorf("record the tool catalog: %w", err)
	}
	cat, err := catalog.Load(ctx, kv, slog.New(slog.DiscardHandler))
	if err != nil {
		return fmt.Errorf("record the tool catalog: %w", err)
	}
	return writeFileWith(filepath.Join(dir, catalogFile), func(w io.Writer) error { return engine.WriteTools(w, cat.Specs()) })
}

// offlineStack runs a suite with no model and no tool backend: an
// embedded NATS server, the supervisor, a planner whose backend answers
// from the cassette, and one runner per pool whose tools answer from it.
// No executor service (and so no database, mail relay or index) runs.
type offlineStack struct {
	addr string
	js   jetstream.JetStream
	stop func() error
}

func startOffline(ctx context.Context, cas *cassette.Cassette, faults *faultRegistry) (_ *offlineStack, err error) {
	f, err := os.Open(filepath.Join(cas.Dir(), catalogFile))
	if err != nil {
		return nil, fmt.Errorf("--replay %s: %w (record the suite with planex eval --dev --record %s)", cas.Dir(), err, cas.Dir())
	}
	specs, err := engine.ReadTools(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("--replay %s: %w", cas.Dir(), err)
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
	var runners []*runner.Runner
	var nc interface{ Close() }
	stop := func() error {
		var errs []error
		for _, r := range runners {
			sc, c := context.WithTimeout(context.Background(), 5*time.Second)
			errs = append(errs, r.Stop(sc))
			c()
		}
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
	pcfg.RegisterFlags(pflag.NewFlagSet("planner", pflag.ContinueOnError))
	pcfg.Common = common()
	pcfg.Backend.Backend = planner.BackendPlaybook // no playbooks: every answer comes from the cassette
	pcfg.Backend.Wrap = func(b planner.Backend) planner.Backend { return faults.wrapPlanner(b, cas, false, false) }
	plannerAddr, err := start("planner", func(onReady func(net.Addr)) error {
		pcfg.OnReady = onReady
		return planner.Run(sctx, pcfg, logger, nil)
	})
	if err != nil {
		return nil, err
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
	pools := map[string][]runner.Tool{}
	for _, s := range specs {
		name := s.GetName()
		t := runner.FaultTool(runner.ReplayTool(s, cas, nil), func(c runner.Call) runner.Fault { return faults.tool(c, name) })
		pools[s.GetPool()] = append(pools[s.GetPool()], t)
	}
	for pool, tools := range pools {
		r, err := runner.New(res, runner.Options{Pool: pool, Tools: tools, Logger: logger, Concurrency: 8})
		if err != nil {
			return nil, fmt.Errorf("offline pool %s: %w", pool, err)
		}
		if err := r.Start(sctx); err != nil {
			return nil, fmt.Errorf("offline pool %s: %w", pool, err)
		}
		runners = append(runners, r)
	}

	var scfg supervisor.Config
	scfg.RegisterFlags(pflag.NewFlagSet("supervisor", pflag.ContinueOnError))
	scfg.Common = common()
	scfg.PlannerAddr = plannerAddr.String()
	scfg.AutoApprove = devstack.AutoApprove // decide as the dev stack that recorded
	addr, err := start("supervisor", func(onReady func(net.Addr)) error {
		scfg.OnReady = onReady
		return supervisor.Run(sctx, scfg, logger, nil)
	})
	if err != nil {
		return nil, err
	}
	return &offlineStack{addr: addr.String(), js: res.JS, stop: stop}, nil
}
