package main

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/planex-dev/planex/cmd/internal/devstack"
	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/natstest"
)

// parseDevFlags parses args as `planex dev` flags.
func parseDevFlags(t *testing.T, args ...string) devFlags {
	t.Helper()
	var f devFlags
	fs := pflag.NewFlagSet("dev", pflag.ContinueOnError)
	f.register(fs, "test")
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return f
}

// startDefaultDevStack starts a dev stack with its default flags in a
// data directory of the test's, with the user's cache and config
// directories kept apart, and a context that ends after 3 minutes (or
// with the test); the test is skipped with -short.
func startDefaultDevStack(t *testing.T) (context.Context, *devstack.Stack, planexv1.SupervisorServiceClient) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs the dev stack; skipped with -short")
	}
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	t.Cleanup(cancel)
	stack, client := startTestDevStack(ctx, t, parseDevFlags(t, "--data-dir="+filepath.Join(t.TempDir(), "data")), io.Discard)
	return ctx, stack, client
}

// startTestDevStack starts the dev stack of f in this process, its
// supervisor on a free loopback port and its logs at error level to logw,
// and dials the supervisor. Both are closed when the test ends.
func startTestDevStack(ctx context.Context, t *testing.T, f devFlags, logw io.Writer) (*devstack.Stack, planexv1.SupervisorServiceClient) {
	t.Helper()
	stack, err := startDevStack(ctx, f, "dev", "127.0.0.1:0", logw, slog.LevelError)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stack.Stop() })
	// dial reads the global connection flags, which an earlier in-process
	// CLI call (planexIn ... --plaintext) may have left set: dial this
	// stack as a fresh `planex` would, through its dev context.
	connection = connFlags{}
	client, closeConn, err := dial(stack.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closeConn() })
	return stack, client
}

// startProcessStack starts a planner with the playbooks in books, a sql
// executor over the demo database and a supervisor with supervisorFlags,
// each as a `planex` process, on an in-memory NATS server. The
// supervisor's log lines go to log when it is not nil. It returns the
// supervisor's gRPC address.
func startProcessStack(t *testing.T, books string, log *lines, supervisorFlags ...string) string {
	t.Helper()
	srv := natstest.Start(t)
	common := []string{"--grpc-addr=127.0.0.1:0", "--nats-url=" + srv.URL()}
	_, plannerAddr := startService(t, append([]string{"planner", "--playbooks=" + books}, common...)...)
	startService(t, append([]string{"executor", "--pool=sql", "--sql-dsn=" + demoDB(t)}, common...)...)
	supervisor := append([]string{"supervisor", "--planner-addr=" + plannerAddr}, supervisorFlags...)
	_, addr := startLogged(t, log, append(supervisor, common...)...)
	return addr
}
