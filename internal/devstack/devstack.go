// Package devstack runs the whole of planex in one process for `planex
// dev` and `planex run --dev`: an embedded NATS server with JetStream on
// local disk, the planner with the demo playbooks, the sql, email and
// search executor pools on the demo domain, and the supervisor — each a
// real gRPC server on loopback talking over real JetStream, the same code
// paths production uses.
package devstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Config configures a dev stack.
type Config struct {
	// DataDir holds everything the stack keeps: NATS store, demo.db,
	// search index and email outbox (drafts live in JetStream).
	DataDir string
	// GRPCAddr is the supervisor's address ("127.0.0.1:0" picks a port).
	GRPCAddr string
	// NATSPort is the embedded NATS server's port on 127.0.0.1; 0 picks
	// a free one.
	NATSPort int
	// Logger receives the services' logs.
	Logger *slog.Logger
	// Services configures the planex services; see services.go.
	Services ServiceOptions
}

// DefaultDataDir is where `planex dev` keeps its data unless --data-dir is
// set: <user cache dir>/planex/<name>.
func DefaultDataDir(name string) string {
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "planex", name)
}

// Stack is a running dev stack.
type Stack struct {
	// Addr is the supervisor's gRPC address.
	Addr string
	// NATSURL is the embedded NATS server's client URL.
	NATSURL string
	// DataDir is the data directory in use.
	DataDir string
	// OutboxDir is where dev e-mail is written.
	OutboxDir string
	// Credentials are the stack's generated keys and certificates.
	Credentials *Credentials

	contextFile string

	nats   *server.Server
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	errs   []error
	done   chan struct{}
	once   sync.Once
}

// Start brings the stack up and returns once every service is SERVING.
// The stack runs until ctx ends or Stop is called.
func Start(ctx context.Context, cfg Config) (*Stack, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("--data-dir: empty")
	}
	if cfg.GRPCAddr == "" {
		cfg.GRPCAddr = "127.0.0.1:7400"
	}
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("--data-dir %s: %w", cfg.DataDir, err)
	}
	creds, err := EnsureCredentials(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	ns, err := startNATS(cfg, creds)
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s := &Stack{NATSURL: ns.ClientURL(), DataDir: cfg.DataDir, Credentials: creds, nats: ns, cancel: cancel, done: make(chan struct{})}
	stopOnCtx := context.AfterFunc(ctx, func() { s.Stop() })
	if err := s.startServices(runCtx, cfg); err != nil {
		stopOnCtx()
		return nil, errors.Join(err, s.Stop())
	}
	return s, nil
}

func startNATS(cfg Config, creds *Credentials) (*server.Server, error) {
	users, err := creds.natsUsers()
	if err != nil {
		return nil, err
	}
	port := cfg.NATSPort
	if port == 0 {
		port = -1
	}
	opts := &server.Options{
		ServerName: "planex-dev",
		Host:       "127.0.0.1",
		Port:       port,
		JetStream:  true,
		StoreDir:   filepath.Join(cfg.DataDir, "nats"),
		NoSigs:     true,
		NoLog:      true,
		Nkeys:      users,
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(15 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("embedded NATS (store %s) not ready within 15s", opts.StoreDir)
	}
	return ns, nil
}

// goService runs one service in the background and records its error.
func (s *Stack) goService(name string, run func() error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := run(); err != nil {
			s.mu.Lock()
			s.errs = append(s.errs, fmt.Errorf("%s: %w", name, err))
			s.mu.Unlock()
			// One service failing takes the stack down.
			s.cancel()
		}
	}()
}

// waitReady waits for a service's address or for the stack to fail.
func (s *Stack) waitReady(ctx context.Context, name string, ready <-chan net.Addr) (net.Addr, error) {
	t := time.NewTimer(60 * time.Second)
	defer t.Stop()
	select {
	case a := <-ready:
		return a, nil
	case <-ctx.Done():
		s.wg.Wait()
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.errs) > 0 {
			return nil, errors.Join(s.errs...)
		}
		return nil, fmt.Errorf("%s: stopped before it was ready", name)
	case <-t.C:
		return nil, fmt.Errorf("%s: not ready within 60s", name)
	}
}

// Done is closed when the stack stopped.
func (s *Stack) Done() <-chan struct{} { return s.done }

// Err returns the errors services stopped with.
func (s *Stack) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
}

// Stop shuts every service down gracefully, then the NATS server, and
// returns the services' errors. It is safe to call more than once.
func (s *Stack) Stop() error {
	s.once.Do(func() {
		s.cancel()
		s.wg.Wait()
		forgetContext(s.Addr, s.contextFile)
		s.nats.Shutdown()
		s.nats.WaitForShutdown()
		close(s.done)
	})
	return s.Err()
}

// readyChan returns an OnReady callback and the channel it signals.
func readyChan() (func(net.Addr), <-chan net.Addr) {
	ch := make(chan net.Addr, 1)
	return func(a net.Addr) {
		select {
		case ch <- a:
		default:
		}
	}, ch
}
