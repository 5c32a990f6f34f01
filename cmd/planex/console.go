package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"

	"github.com/spf13/cobra"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/planex-dev/planex/cmd/internal/devstack"
	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/tlsconfig"
	"github.com/planex-dev/planex/services/console"
)

func consoleCmd() *cobra.Command {
	var (
		addr string
		cfg  console.Config
	)
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the web console (runs, plan DAGs, gates, tools) for a supervisor",
		Long: `Serve the web console: runs with live updates, each run's plan DAG per
revision with step states, inputs, outputs, errors and its event timeline,
the open gates of every run (approve, reject, edit arguments) and the tool
catalog.

The browser calls planex.v1.SupervisorService over the Connect protocol; the
console forwards every call to the supervisor at --addr with the browser's
own bearer token (API key or JWT), so the supervisor authenticates and
authorises it exactly like a CLI call. The console holds no credential: a
browser without a token is asked for one. Against a planex dev stack on this
machine the stack's CA is used automatically; sign in with the key in its
credentials directory (cli.token). A supervisor started with --plaintext
--auth-disabled needs no token (none is ever sent without TLS).

Without --http-tls-cert-file the console listens on loopback only.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, forward, err := consoleDialOptions(addr)
			if err != nil {
				return usageError(cmd, "%v", err)
			}
			cfg.ForwardTokens = forward
			if err := cfg.Validate(); err != nil {
				return usageError(cmd, "%v", err)
			}
			conn, err := grpc.NewClient(addr, append(opts, grpc.WithStatsHandler(otelgrpc.NewClientHandler()))...)
			if err != nil {
				return fmt.Errorf("--addr %q: %w", addr, err)
			}
			defer conn.Close()
			out := cmd.OutOrStdout()
			scheme := "http"
			if cfg.TLSCertFile != "" {
				scheme = "https"
			}
			cfg.OnReady = func(a net.Addr) {
				fmt.Fprintf(out, "planex console on %s://%s/ (supervisor %s)\n", scheme, a, addr)
				if cc, ok := devstack.LookupClientContext(addr); ok && forward {
					fmt.Fprintf(out, "sign in with the dev stack's API key in %s\n", cc.TokenFile)
				}
			}
			logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			return console.Run(cmd.Context(), cfg, planexv1.NewSupervisorServiceClient(conn), logger)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:7400", "supervisor address (host:port)")
	connection.register(cmd.Flags())
	cfg.RegisterFlags(cmd.Flags())
	return cmd
}

// consoleDialOptions are the transport options of the console's
// connection to the supervisor: TLS (the dev stack's CA when it serves
// addr) or explicit plaintext, and never a credential of the console's own
// — a token or client certificate would authenticate every browser as the
// console. forward says whether browsers' tokens may be forwarded (only
// over TLS).
func consoleDialOptions(addr string) (opts []grpc.DialOption, forward bool, err error) {
	c := connection
	switch {
	case c.token != "" || c.tokenFile != "":
		return nil, false, errors.New("--token, --token-file: the console forwards each browser's own token and holds none")
	case c.certFile != "" || c.keyFile != "":
		return nil, false, errors.New("--tls-cert-file: a client certificate would authenticate every browser as the console; browsers sign in with their own token")
	case c.plaintext:
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, false, nil
	}
	if c.caFile == "" {
		if cc, ok := devstack.LookupClientContext(addr); ok {
			c.caFile = cc.CAFile
		}
	}
	r, err := tlsconfig.NewReloader(tlsconfig.Files{CAFile: c.caFile})
	if err != nil {
		return nil, false, fmt.Errorf("--tls-ca-file: %w", err)
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsconfig.ClientConfig(r, c.serverName)))}, true, nil
}
