package devstack

import (
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/tlsconfig"
)

// TestStartReturnsOnceEveryPoolRegistered: when Start returns (and the
// data directory records the address others join), the supervisor's
// catalog already holds every demo pool's tools, so a run started at once
// never meets an "unknown tool" (issue 27: TestConsole's flake).
func TestStartReturnsOnceEveryPoolRegistered(t *testing.T) {
	var opts ServiceOptions
	opts.RegisterFlags(pflag.NewFlagSet("dev", pflag.ContinueOnError))
	dir := t.TempDir()
	stack, err := Start(t.Context(), Config{
		DataDir: dir, GRPCAddr: "127.0.0.1:0", Command: "dev", Services: opts,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stack.Stop(); err != nil {
			t.Errorf("stop dev stack: %v", err)
		}
	})
	if h, err := ReadHolder(dir); err != nil || h.Addr != stack.Addr {
		t.Fatalf("lock holder %+v %v, want the supervisor's address %s", h, err, stack.Addr)
	}
	tok, err := os.ReadFile(stack.Credentials.CLITokenFile)
	if err != nil {
		t.Fatal(err)
	}
	r, err := tlsconfig.NewReloader(tlsconfig.Files{CAFile: stack.Credentials.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(stack.Addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsconfig.ClientConfig(r, ""))),
		grpc.WithPerRPCCredentials(authn.Bearer(strings.TrimSpace(string(tok)))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := planexv1.NewSupervisorServiceClient(conn).ListTools(t.Context(), &planexv1.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]bool{}
	for _, tool := range resp.GetTools() {
		if len(tool.GetReplicas()) > 0 {
			live[tool.GetSpec().GetPool()] = true
		}
	}
	for _, pool := range DemoPools {
		if !live[pool] {
			t.Errorf("pool %s has no registered tool when Start returned (tools %d)", pool, len(resp.GetTools()))
		}
	}
	if !live["sql"] || !strings.Contains(toolNames(resp), "sql.exec") {
		t.Errorf("sql.exec not in the catalog: %s", toolNames(resp))
	}
}

func toolNames(resp *planexv1.ListToolsResponse) string {
	var names []string
	for _, tool := range resp.GetTools() {
		names = append(names, tool.GetSpec().GetName())
	}
	return strings.Join(names, ",")
}
