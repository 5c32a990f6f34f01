package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/planex-dev/planex/cmd/internal/devstack"
	"github.com/planex-dev/planex/internal/demo"
	"github.com/planex-dev/planex/internal/redact"
	"github.com/planex-dev/planex/internal/telemetry"
)

// devFlags configure an in-process dev stack (`planex dev`, `planex run
// --dev`).
type devFlags struct {
	dataDir    string
	defaultDir string // name of the default data directory: dev or run-dev
	redact     []string
	services   devstack.ServiceOptions
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
	f.defaultDir = defaultDir
	fs.StringVar(&f.dataDir, "data-dir", "", "directory for the dev stack's data (NATS store, demo.db, search index, outbox); one process at a time")
	// Help shows the rule, not this user's resolved home directory.
	fs.Lookup("data-dir").DefValue = devstack.DefaultDataDirHelp(defaultDir)
	fs.StringArrayVar(&f.redact, "redact-pattern", nil, "name=regexp masked in logs and exported spans, in addition to the defaults (repeatable)")
	fs.StringVar(&f.services.MCPConfig, "mcp-config", "", "also serve the tools of the MCP servers in this mcpServers JSON file (an mcp executor pool)")
	fs.StringSliceVar(&f.services.PoolIdentities, "pool-identity", nil, "give an out-of-tree executor pool of this name a NATS identity: its nkey seed is <data-dir>/credentials/nats/executor-<pool>.nk (repeatable)")
	fs.StringSliceVar(&f.services.Policies, "policy", nil, "guardrail policy files for the supervisor (builtin:default is the embedded default policy; none by default)")
	f.services.Critic.RegisterFlags(fs)
	f.services.RegisterFlags(fs)
}

// dir is --data-dir, or the default data directory of the command.
func (f devFlags) dir() string {
	if f.dataDir != "" {
		return f.dataDir
	}
	return devstack.DefaultDataDir(f.defaultDir)
}

// devShutdownGrace bounds how long a dev process takes to stop after
// SIGTERM or Ctrl-C: the services' own grace (5s) plus the NATS server's
// shutdown.
const devShutdownGrace = 10 * time.Second

// stopDevStack stops the stack within devShutdownGrace.
func stopDevStack(ctx context.Context, stack *devstack.Stack) error {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), devShutdownGrace)
	defer cancel()
	return stack.Shutdown(sctx)
}

// startDevStack starts every service in this process; service logs at
// level go to logw. command names the process in the data directory's
// lock file ("dev" or "run").
func startDevStack(ctx context.Context, f devFlags, command, grpcAddr string, logw io.Writer, level slog.Level) (*devstack.Stack, error) {
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
		DataDir:  f.dir(),
		GRPCAddr: grpcAddr,
		Logger:   logger,
		Services: f.services,
		Command:  command,
	})
}

func devCmd() *cobra.Command {
	var (
		f         devFlags
		cf        devCassette
		grpcAddr  string
		otlp      string
		metrics   string
		logLevel  string
		mcpAddr   string
		noConsole bool
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the whole planex system in this process (embedded NATS, demo data)",
		Long: `Run every planex service in this process: an embedded NATS server with
JetStream on local disk, the supervisor, the planner (playbook backend with the
demo playbooks unless configured otherwise) and the sql, email and search
executor pools on a generated demo company. Services talk over real gRPC on
loopback and real JetStream, the same code paths as production.

A restart on the same --data-dir resumes unfinished runs. A data directory
belongs to one process at a time: a second planex dev or planex run --dev on
it stops at once with "data dir ... in use by pid N; use --data-dir".

Approval gates: tools that require approval wait for planex runs approve,
except email.send, which planex dev auto-approves (dev mail only reaches the
local outbox and the demo's example.com addresses).`,
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
			f.services.MCPAddr = devMCPAddr(mcpAddr, cmd.Flags().Changed("mcp-addr"), grpcAddr)
			consoleAddr, consoleNote := devConsoleAddr(f.services.ConsoleAddr, cmd.Flags().Changed("console-addr"), noConsole, grpcAddr)
			f.services.ConsoleAddr = consoleAddr
			cas, err := cf.wire(&f)
			if err != nil {
				return usageError(cmd, "%v", err)
			}
			stack, err := startDevStack(ctx, f, "dev", grpcAddr, os.Stderr, lvl)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "planex dev is running\n\n")
			if err := cf.started(ctx, stack, cas, out); err != nil {
				return errors.Join(err, stopDevStack(ctx, stack))
			}
			fmt.Fprintf(out, "  supervisor  %s   (gRPC over TLS, API key auth, reflection on)\n", stack.Addr)
			if stack.MCPURL != "" {
				fmt.Fprintf(out, "  mcp         %s   (MCP over streamable HTTP, same TLS and API key)\n", stack.MCPURL)
			}
			fmt.Fprintf(out, "  nats        %s\n", stack.NATSURL)
			fmt.Fprintf(out, "  data        %s\n", stack.DataDir)
			fmt.Fprintf(out, "  outbox      %s   (planex outbox)\n", stack.OutboxDir)
			fmt.Fprintf(out, "  credentials %s   (the CLI on this machine uses them automatically)\n", stack.Credentials.Dir)
			if stack.ConsoleURL != "" {
				fmt.Fprint(out, consoleBanner(stack.ConsoleURL, stack.Credentials.CLITokenFile, consoleNote))
			}
			fmt.Fprintln(out)
			fmt.Fprintf(out, "auto-approved: %s (dev mail only reaches the outbox and %s); every other approval gate waits for planex runs approve\n\n",
				strings.Join(devstack.AutoApprove, ", "), strings.Join(demo.AllowedDomains, ", "))
			fmt.Fprintf(out, "try, from another terminal:\n")
			fmt.Fprintf(out, "  planex run --addr %s \"How many open support tickets does Acme Corp have?\"\n", stack.Addr)
			fmt.Fprintf(out, "  grpcurl -cacert %s -H \"authorization: Bearer $(cat %s)\" %s list\n\n", stack.Credentials.CAFile, stack.Credentials.CLITokenFile, stack.Addr)
			fmt.Fprintf(out, "Ctrl-C stops; a restart on the same --data-dir resumes unfinished runs.\n")
			select {
			case <-ctx.Done():
			case <-stack.Done():
			}
			return stopDevStack(ctx, stack)
		},
	}
	f.register(cmd.Flags(), "dev")
	cf.register(cmd.Flags())
	cmd.Flags().StringVar(&grpcAddr, "grpc-addr", defaultDevGRPCAddr, "supervisor gRPC address")
	cmd.Flags().StringVar(&mcpAddr, "mcp-addr", defaultDevMCPAddr, "supervisor's MCP endpoint (streamable HTTP at /mcp; when unset and --grpc-addr is not the default, a free port; empty: off)")
	cmd.Flags().StringVar(&otlp, "otlp-endpoint", "", "export traces over OTLP/gRPC to HOST:PORT (for example Jaeger on 127.0.0.1:4317)")
	cmd.Flags().StringVar(&metrics, "metrics-addr", "", "serve Prometheus /metrics on this address")
	cmd.Flags().StringVar(&logLevel, "log-level", "warn", "service log level: debug, info, warn, error")
	cmd.Flags().StringVar(&f.services.ConsoleAddr, "console-addr", defaultDevConsoleAddr, "serve the web console on this loopback address (by default: a free port instead when 7480 is taken, or when --grpc-addr is not the default; empty: off)")
	cmd.Flags().BoolVar(&noConsole, "no-console", false, "do not serve the web console (same as --console-addr \"\")")
	cmd.Flags().StringVar(&f.services.JaegerURL, "jaeger-url", "", "Jaeger UI the console links run traces to (for example http://127.0.0.1:16686)")
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
		Long: `List the mail the dev stack's email pool "sent": .eml files in <data-dir>/outbox.

Without --dir, the outbox of the dev stack started last (planex dev or
planex run --dev, whatever its --data-dir) is read; the directory read is
printed on stderr.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			flag := "--dir"
			if dir == "" {
				flag = ""
				data, err := devstack.LastDataDir()
				if err != nil {
					data = devstack.DefaultDataDir("dev")
				}
				dir = filepath.Join(data, "outbox")
				fmt.Fprintf(cmd.ErrOrStderr(), "outbox %s\n", dir)
			}
			msgs, err := readOutbox(dir, flag)
			if err != nil {
				return err
			}
			if asJSON {
				out := make([]outboxJSON, 0, len(msgs))
				for _, m := range msgs {
					out = append(out, outboxJSON{Path: m.Path, MessageID: m.MessageID, From: m.From, To: m.To, Cc: m.Cc,
						Subject: m.Subject, Date: m.Date.UTC().Format(time.RFC3339), Size: m.Size})
				}
				return printJSONValue(cmd.OutOrStdout(), out)
			}
			if len(msgs) == 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "no mail in %s\n", dir)
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SENT\tTO\tSUBJECT\tFILE")
			for _, m := range msgs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.Date.Local().Format(time.DateTime), strings.Join(m.To, ", "), oneLineText(m.Subject, 60), m.Path)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "outbox directory (default: <data-dir>/outbox of the dev stack started last)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (lowerCamelCase names, like the other --json outputs)")
	cmd.Flags().String("addr", "", "accepted for symmetry with other client commands; the outbox is read from --dir")
	return cmd
}

// outboxJSON is one outbox message in `planex outbox --json`, named like
// protojson names the other commands' fields.
type outboxJSON struct {
	Path      string   `json:"path"`
	MessageID string   `json:"messageId"`
	From      string   `json:"from"`
	To        []string `json:"to"`
	Cc        []string `json:"cc,omitempty"`
	Subject   string   `json:"subject"`
	Date      string   `json:"date"`
	Size      int64    `json:"size"`
}

// printJSONValue writes v as indented JSON, without HTML escapes
// (<msg@host> stays as is).
func printJSONValue(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// defaultDevGRPCAddr and defaultDevMCPAddr are where `planex dev` serves
// the supervisor's gRPC API and MCP over HTTP.
const (
	defaultDevGRPCAddr = "127.0.0.1:7400"
	defaultDevMCPAddr  = "127.0.0.1:7403"
)

// defaultDevConsoleAddr is where `planex dev` serves the web console.
const defaultDevConsoleAddr = "127.0.0.1:7480"

// devConsoleAddr is the dev stack's console address, and a note for the
// banner when the default address was taken. An address given with
// --console-addr is used as is (a taken port fails the start); the default
// falls back to a free port when 7480 is taken, and a stack on another
// gRPC address (tests, several stacks on one machine) takes a free port at
// once, as for MCP. --no-console or an empty --console-addr: off.
func devConsoleAddr(flag string, set, off bool, grpcAddr string) (addr, note string) {
	switch {
	case off || flag == "":
		return "", ""
	case set:
		return flag, ""
	case grpcAddr != defaultDevGRPCAddr:
		return "127.0.0.1:0", ""
	}
	l, err := net.Listen("tcp", flag)
	if err != nil {
		return "127.0.0.1:0", flag + " is taken: serving on a free port instead"
	}
	_ = l.Close()
	return flag, ""
}

// consoleBanner is the banner's console line: the console's URL with the
// dev CLI's token in the fragment (#token=…), one click to a signed-in
// page (the page keeps the token for its tab and removes it from the
// address bar; a fragment never reaches a server); without a readable
// token file, the plain URL and where the key is.
func consoleBanner(consoleURL, tokenFile, note string) string {
	if note != "" {
		note += "; "
	}
	b, err := os.ReadFile(tokenFile)
	tok := strings.TrimSpace(string(b))
	if err != nil || tok == "" {
		return fmt.Sprintf("  console     %s   (%ssign in with the API key in %s)\n", consoleURL, note, tokenFile)
	}
	return fmt.Sprintf("  console     %s#token=%s   (%sopens signed in as the dev CLI: keep this URL to yourself)\n", consoleURL, url.QueryEscape(tok), note)
}

// devMCPAddr is the dev stack's MCP address: the flag when set, else the
// default next to the default gRPC address; a stack on another gRPC
// address (tests, several stacks on one machine) takes a free port instead
// of contending for 7403.
func devMCPAddr(flag string, set bool, grpcAddr string) string {
	if set || grpcAddr == defaultDevGRPCAddr {
		return flag
	}
	return "127.0.0.1:0"
}
