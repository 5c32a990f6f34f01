package main

import (
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
		conn consoleConn
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

With --oidc-issuer and --oidc-client-id the console also signs browsers in
through an OpenID Connect provider (authorization code flow with PKCE):
"Sign in with <provider>" on the sign-in page. The tokens stay in the
console's memory; the browser holds an HttpOnly session cookie and a CSRF
token, and every call is forwarded with the session's token (a JWT the
supervisor verifies with --auth-jwks-url, --auth-jwt-issuer and
--auth-jwt-audience). Register <console URL>/auth/callback as the client's
redirect URI and <console URL>/ as its post-logout redirect URI.

Without --http-tls-cert-file the console listens on loopback only.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, forward, err := conn.dialOptions(addr)
			if err != nil {
				return usageError(cmd, "%v", err)
			}
			cfg.ForwardTokens = forward
			if err := cfg.Validate(); err != nil {
				return usageError(cmd, "%v", err)
			}
			cc, err := grpc.NewClient(addr, append(opts, grpc.WithStatsHandler(otelgrpc.NewClientHandler()))...)
			if err != nil {
				return fmt.Errorf("--addr %q: %w", addr, err)
			}
			defer cc.Close()
			out := cmd.OutOrStdout()
			scheme := "http"
			if cfg.TLSCertFile != "" {
				scheme = "https"
			}
			cfg.OnReady = func(a net.Addr) {
				fmt.Fprintf(out, "planex console on %s://%s/ (supervisor %s)\n", scheme, a, addr)
				if cfg.OIDC.Enabled() {
					fmt.Fprintf(out, "single sign-on through %s\n", cfg.OIDC.Issuer)
				}
				if cc, ok := devstack.LookupClientContext(addr); ok && forward {
					fmt.Fprintf(out, "sign in with the dev stack's API key in %s\n", cc.TokenFile)
				}
			}
			logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			cfg.Schedules = planexv1.NewScheduleServiceClient(cc)
			return console.Run(cmd.Context(), cfg, planexv1.NewSupervisorServiceClient(cc), logger)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:7400", "supervisor address (host:port)")
	cmd.Flags().StringVar(&conn.caFile, "tls-ca-file", "", "PEM CA bundle verifying the supervisor (default: the dev stack's CA for its address, else the system roots)")
	cmd.Flags().StringVar(&conn.serverName, "tls-server-name", "", "name to verify in the supervisor's certificate (default: the --addr host)")
	cmd.Flags().BoolVar(&conn.plaintext, "plaintext", false, "connect without TLS to a supervisor started with --plaintext --auth-disabled (browsers' tokens are then never forwarded)")
	cfg.RegisterFlags(cmd.Flags())
	return cmd
}

// consoleConn says how the console reaches the supervisor. It has no
// token or client certificate flags on purpose: a credential of the
// console's own would authenticate every browser as the console.
type consoleConn struct {
	caFile, serverName string
	plaintext          bool
}

// dialOptions are the transport options of the console's connection to the
// supervisor: TLS (the dev stack's CA when it serves addr and --tls-ca-file
// is unset) or explicit plaintext. forward says whether browsers' tokens
// may be forwarded (only over TLS).
func (c consoleConn) dialOptions(addr string) (opts []grpc.DialOption, forward bool, err error) {
	if c.plaintext {
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
