package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/planex-dev/planex/internal/devstack"
	"github.com/planex-dev/planex/internal/redact"
	"github.com/planex-dev/planex/internal/telemetry"
	"github.com/planex-dev/planex/services/executor/emailpool"
)

// devFlags configure an in-process dev stack (`planex dev`, `planex run
// --dev`).
type devFlags struct {
	dataDir  string
	redact   []string
	services devstack.ServiceOptions
}

// redactor is the redaction layer of the dev process's logs and spans.
func (f devFlags) redactor() (*redact.Redactor, error) {
	patterns, err := redact.Compile(f.redact)
	if err != nil {
		return nil, fmt.Errorf("--redact-pattern: %w", err)
	}
	return redact.New(patterns...), nil
}

func (f *devFlags) register(fs *pflag.FlagSet, defaultDir string) {
	fs.StringVar(&f.dataDir, "data-dir", devstack.DefaultDataDir(defaultDir), "directory for the dev stack's data (NATS store, demo.db, search index, outbox)")
	fs.StringArrayVar(&f.redact, "redact-pattern", nil, "name=regexp masked in logs and exported spans, in addition to the defaults (repeatable)")
	fs.StringVar(&f.services.MCPConfig, "mcp-config", "", "also serve the tools of the MCP servers in this mcpServers JSON file (an mcp executor pool)")
	f.services.RegisterFlags(fs)
}

// startDevStack starts every service in this process; service logs at
// level go to logw.
func startDevStack(ctx context.Context, f devFlags, grpcAddr string, logw io.Writer, level slog.Level) (*devstack.Stack, error) {
	if err := f.services.Validate(); err != nil {
		return nil, err
	}
	r, err := f.redactor()
	if err != nil {
		return nil, err
	}
	logger, err := telemetry.NewLogger(logw, level.String(), "text", r)
	if err != nil {
		return nil, err
	}
	return devstack.Start(ctx, devstack.Config{
		DataDir:  f.dataDir,
		GRPCAddr: grpcAddr,
		Logger:   logger,
		Services: f.services,
	})
}

func devCmd() *cobra.Command {
	var (
		f        devFlags
		grpcAddr string
		otlp     string
		metrics  string
		logLevel string
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the whole planex system in this process (embedded NATS, demo data)",
		Long: `Run every planex service in this process: an embedded NATS server with
JetStream on local disk, the supervisor, the planner (playbook backend with the
demo playbooks unless configured otherwise) and the sql, email and search
executor pools on a generated demo company. Services talk over real gRPC on
loopback and real JetStream, the same code paths as production.

A restart on the same --data-dir resumes unfinished runs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
				return usageError(cmd, "--log-level %q: want debug, info, warn or error", logLevel)
			}
			ctx := cmd.Context()
			r, err := f.redactor()
			if err != nil {
				return usageError(cmd, "%v", err)
			}
			t, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: "planex-dev", Version: version, OTLPEndpoint: otlp, Insecure: true, Redactor: r})
			if err != nil {
				return err
			}
			defer func() {
				sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				err = errors.Join(err, t.Shutdown(sctx))
			}()
			f.services.Metrics = t.Metrics
			f.services.MetricsAddr = metrics
			stack, err := startDevStack(ctx, f, grpcAddr, os.Stderr, lvl)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "planex dev is running\n\n")
			fmt.Fprintf(out, "  supervisor  %s   (gRPC, reflection on)\n", stack.Addr)
			fmt.Fprintf(out, "  nats        %s\n", stack.NATSURL)
			fmt.Fprintf(out, "  data        %s\n", stack.DataDir)
			fmt.Fprintf(out, "  outbox      %s\n\n", stack.OutboxDir)
			fmt.Fprintf(out, "try, from another terminal:\n")
			fmt.Fprintf(out, "  planex run --addr %s \"How many open support tickets does Acme Corp have?\"\n", stack.Addr)
			fmt.Fprintf(out, "  grpcurl -plaintext %s list\n\n", stack.Addr)
			fmt.Fprintf(out, "Ctrl-C stops; a restart on the same --data-dir resumes unfinished runs.\n")
			select {
			case <-ctx.Done():
			case <-stack.Done():
			}
			return stack.Stop()
		},
	}
	f.register(cmd.Flags(), "dev")
	cmd.Flags().StringVar(&grpcAddr, "grpc-addr", "127.0.0.1:7400", "supervisor gRPC address")
	cmd.Flags().StringVar(&otlp, "otlp-endpoint", "", "export traces over OTLP/gRPC to HOST:PORT (for example Jaeger on 127.0.0.1:4317)")
	cmd.Flags().StringVar(&metrics, "metrics-addr", "", "serve Prometheus /metrics on this address")
	cmd.Flags().StringVar(&logLevel, "log-level", "warn", "service log level: debug, info, warn, error")
	return cmd
}

func outboxCmd() *cobra.Command {
	var (
		dir    string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "outbox",
		Short: "List the mail the email pool wrote to the dev outbox",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			msgs, err := emailpool.ListOutbox(dir)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSONValue(cmd.OutOrStdout(), msgs)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SENT\tTO\tSUBJECT\tFILE")
			for _, m := range msgs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.Date.Local().Format(time.DateTime), strings.Join(m.To, ", "), oneLineText(m.Subject, 60), m.Path)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&dir, "dir", devstack.DefaultDataDir("dev")+"/outbox", "outbox directory (the dev stack's <data-dir>/outbox)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().String("addr", "", "accepted for symmetry with other client commands; the outbox is read from --dir")
	return cmd
}

// printJSONValue writes v as indented JSON.
func printJSONValue(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
