// Package devstack runs the whole of planex in one process for `planex
// dev` and `planex run --dev`: an embedded NATS server with JetStream on
// local disk, the planner with the demo playbooks, the sql, email and
// search executor pools on the demo domain, and the supervisor — each a
// real gRPC server on loopback talking over real JetStream, the same code
// paths production uses.
//
// A data directory belongs to one process at a time: Start takes an
// exclusive lock on <data-dir>/planex.lock and fails at once with an
// [*InUseError] naming the holder's pid when another process has it.
package devstack

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
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
	// Command names the process in the data directory's lock file: "dev"
	// (a long-running stack others may join) or "run".
	Command string
}

// DefaultDataDir is where `planex dev` keeps its data unless --data-dir is
// set: <user cache dir>/planex/<name>.
func DefaultDataDir(name string) string {
	return filepath.Join(stateDir(), name)
}

// DefaultDataDirHelp is DefaultDataDir as help text shows it, without the
// user's own home: $XDG_CACHE_HOME/planex/<name> on Linux and BSD,
// ~/Library/Caches/planex/<name> on macOS, %LocalAppData%\planex\<name>
// on Windows.
func DefaultDataDirHelp(name string) string {
	switch runtime.GOOS {
	case "darwin", "ios":
		return "~/Library/Caches/planex/" + name
	case "windows":
		return `%LocalAppData%\planex\` + name
	case "plan9":
		return "$home/lib/cache/planex/" + name
	}
	return "$XDG_CACHE_HOME/planex/" + name
}

// stateDir is <user cache dir>/planex.
func stateDir() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "planex")
}

// lastUsedFile records the data directory of the last dev stack started.
const lastUsedFile = "last-data-dir"

// LastDataDir returns the data directory of the dev stack this user
// started last (`planex dev` or `planex run --dev`), so that `planex
// outbox` reads the outbox the mail went to.
func LastDataDir() (string, error) {
	b, err := os.ReadFile(filepath.Join(stateDir(), lastUsedFile))
	if err != nil {
		return "", err
	}
	dir := strings.TrimSpace(string(b))
	if dir == "" {
		return "", errors.New("no dev stack recorded")
	}
	return dir, nil
}

// recordLastUsed remembers dir for LastDataDir; failing to is not worth
// failing the stack for.
func recordLastUsed(dir string) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return
	}
	if err := os.MkdirAll(stateDir(), 0o750); err != nil {
		return
	}
	tmp := filepath.Join(stateDir(), fmt.Sprintf(".%s.%d", lastUsedFile, os.Getpid()))
	if err := os.WriteFile(tmp, []byte(abs+"\n"), 0o600); err != nil {
		return
	}
	_ = os.Rename(tmp, filepath.Join(stateDir(), lastUsedFile))
}

// Stack is a running dev stack.
type Stack struct {
	// Addr is the supervisor's gRPC address.
	Addr string
	// MCPURL is the supervisor's MCP endpoint (streamable HTTP), when
	// ServiceOptions.MCPAddr is set.
	MCPURL string
	// NATSURL is the embedded NATS server's client URL.
	NATSURL string
	// DataDir is the data directory in use.
	DataDir string
	// OutboxDir is where dev e-mail is written.
	OutboxDir string
	// Credentials are the stack's generated keys and certificates.
	Credentials *Credentials
	// ConsoleURL is the web console's URL when ServiceOptions.ConsoleAddr
	// is set.
	ConsoleURL string

	contextFile string

	nats   *server.Server
	lock   *dirLock
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	errs   []error
	done   chan struct{}
	once   sync.Once

	// tenantMu serializes tenants' admissions to the embedded server
	// (tenants.go).
	tenantMu sync.Mutex
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
	lock, err := lockDir(cfg.DataDir, cmp.Or(cfg.Command, "dev"))
	if err != nil {
		return nil, err
	}
	recordLastUsed(cfg.DataDir)
	creds, err := EnsureCredentials(cfg.DataDir, cfg.Services.PoolIdentities...)
	if err == nil {
		err = cliPlatformAdmin(creds.APIKeysFile)
	}
	if err != nil {
		lock.release()
		return nil, err
	}
	ns, err := startNATS(cfg, creds)
	if err != nil {
		lock.release()
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s := &Stack{NATSURL: ns.ClientURL(), DataDir: cfg.DataDir, Credentials: creds, nats: ns,
		lock: lock, cancel: cancel, done: make(chan struct{})}
	stopOnCtx := context.AfterFunc(ctx, func() { s.Stop() })
	if err := s.startServices(runCtx, cfg); err != nil {
		stopOnCtx()
		// err already holds the errors the services stopped with; Stop
		// would report them a second time.
		_ = s.Stop()
		return nil, err
	}
	if err := lock.setAddr(s.Addr); err != nil {
		stopOnCtx()
		return nil, errors.Join(err, s.Stop())
	}
	return s, nil
}

// startNATS starts the embedded server with the stack's users and the
// accounts of the tenants it knows (Credentials.ServeNATS).
func startNATS(cfg Config, creds *Credentials) (*server.Server, error) {
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
	}
	creds.ConfigureNATS(opts)
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(15 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("embedded NATS (store %s) not ready within 15s", opts.StoreDir)
	}
	if err := creds.ServeNATS(ns); err != nil {
		ns.Shutdown()
		return nil, err
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

// Stop shuts every service down gracefully, then the NATS server, releases
// the data directory and returns the services' errors. It is safe to call
// more than once.
func (s *Stack) Stop() error {
	s.once.Do(func() {
		s.cancel()
		s.wg.Wait()
		forgetContext(s.Addr, s.contextFile)
		s.nats.Shutdown()
		s.nats.WaitForShutdown()
		s.lock.release()
		close(s.done)
	})
	return s.Err()
}

// ErrShutdownTimeout is returned by Shutdown when the stack did not stop
// within the caller's deadline.
var ErrShutdownTimeout = errors.New("dev stack did not stop in time")

// Shutdown stops the stack like Stop but returns when ctx ends even if a
// service is still stopping, so that a process asked to end (SIGTERM)
// exits within its grace period; the kernel then releases the data
// directory's lock.
func (s *Stack) Shutdown(ctx context.Context) error {
	stopped := make(chan error, 1)
	go func() { stopped <- s.Stop() }()
	select {
	case err := <-stopped:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrShutdownTimeout, context.Cause(ctx))
	}
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
