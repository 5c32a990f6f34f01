package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	// The image has no OS files: embed the Mozilla CA roots, used when the
	// system has none (TLS to LLM APIs, SMTP relays, managed PostgreSQL).
	_ "golang.org/x/crypto/x509roots/fallback"
)

// commit is set at build time with -ldflags "-X main.commit=..."; when
// empty it is read from the VCS stamp of the build.
var commit = ""

// buildInfo is what `planex version` reports.
type buildInfo struct {
	Version, Commit, Go, Platform string
}

// readBuildInfo combines the -ldflags stamps with the Go build info.
func readBuildInfo() buildInfo {
	b := buildInfo{Version: version, Commit: commit, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if b.Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			b.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && b.Commit == "" {
				b.Commit = s.Value
			}
		}
	}
	if b.Commit == "" {
		b.Commit = "unknown"
	}
	return b
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and Go version of this binary",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			printVersion(cmd.OutOrStdout(), readBuildInfo())
			return nil
		},
	}
}

func printVersion(w io.Writer, b buildInfo) {
	fmt.Fprintf(w, "planex %s\ncommit: %s\ngo: %s\nplatform: %s\n", b.Version, b.Commit, b.Go, b.Platform)
}

// healthCmd asks a planex service for its gRPC health: the check a
// container image without a shell or grpcurl can still run.
func healthCmd() *cobra.Command {
	var (
		addr    string
		service string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Check a planex service's gRPC health (exit 0 when SERVING)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			st, err := checkHealth(ctx, addr, service)
			if err != nil {
				return &exitError{code: exitUsage, msg: fmt.Sprintf("health %s: %v", addr, err)}
			}
			fmt.Fprintln(cmd.OutOrStdout(), st)
			if st != healthpb.HealthCheckResponse_SERVING {
				return &exitError{code: exitFailed, msg: "not serving: " + st.String()}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:7400", "service gRPC address (host:port)")
	cmd.Flags().StringVar(&service, "service", "", "service name to check (empty: the whole server)")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "give up after this long")
	// TLS and token like every client command; a planex dev stack on this
	// machine supplies its CA and token, --plaintext checks a plaintext
	// --health-addr.
	connection.register(cmd.Flags())
	return cmd
}

// checkHealth calls grpc.health.v1.Health/Check.
func checkHealth(ctx context.Context, addr, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	opts, err := connection.options(addr)
	if err != nil {
		return 0, err
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return 0, err
	}
	return resp.GetStatus(), nil
}
