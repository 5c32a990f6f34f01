package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/planex-dev/planex/cmd/internal/devstack"
	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/tlsconfig"
)

// Exit codes of client commands; scripts rely on them.
const (
	exitOK        = 0
	exitUsage     = 1 // could not talk to the server, or bad usage
	exitFailed    = 3 // the run failed
	exitEscalated = 4 // escalated or waiting for a decision
	exitStopped   = 5 // cancelled, deadline or budget exceeded
)

// exitError carries an exit code; its message may be empty when the
// command already printed what the user needs.
type exitError struct {
	code int
	msg  string
	run  *planexv1.Run // the run the code is about, when there is one
}

func (e *exitError) Error() string { return e.msg }

// ExitCode implements exitCoder.
func (e *exitError) ExitCode() int { return e.code }

// clientFlags are shared by every client command.
type clientFlags struct {
	addr string
	json bool
}

func (f *clientFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.addr, "addr", "127.0.0.1:7400", "supervisor address (host:port)")
	fs.BoolVar(&f.json, "json", false, "print protojson on stdout instead of the human view")
	connection.register(fs)
}

// connFlags say how a client command connects and authenticates. The
// process runs one command, so they are process-wide: every command that
// dials registers them.
type connFlags struct {
	token, tokenFile                      string
	caFile, certFile, keyFile, serverName string
	plaintext                             bool
}

var connection connFlags

func (c *connFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&c.token, "token", "", "bearer token (API key or JWT) sent to the supervisor; prefer --token-file or PLANEX_TOKEN")
	fs.StringVar(&c.tokenFile, "token-file", "", "file holding the bearer token")
	fs.StringVar(&c.caFile, "tls-ca-file", "", "PEM CA bundle verifying the supervisor (default: the CA of the planex dev serving --addr on this machine, else the system roots)")
	fs.StringVar(&c.certFile, "tls-cert-file", "", "PEM client certificate (mTLS identity)")
	fs.StringVar(&c.keyFile, "tls-key-file", "", "PEM key of --tls-cert-file")
	fs.StringVar(&c.serverName, "tls-server-name", "", "name to verify in the supervisor's certificate (default: the --addr host)")
	fs.BoolVar(&c.plaintext, "plaintext", false, "connect without TLS (a supervisor started with --plaintext)")
}

// options are the dial options: TLS (or explicit plaintext) and the bearer
// token. A `planex dev` stack serving addr on this machine supplies its CA
// unless --tls-ca-file is given (a token or client certificate of the
// caller's own does not make the dev CA any less right), and the CLI's
// token unless the caller gives a credential.
func (c connFlags) options(addr string) ([]grpc.DialOption, error) {
	if c.caFile == "" && !c.plaintext {
		if cc, ok := devstack.LookupClientContext(addr); ok {
			c.caFile = cc.CAFile
			if c.token == "" && c.tokenFile == "" && c.certFile == "" {
				c.tokenFile = cc.TokenFile
			}
		}
	}
	token := c.token
	if c.tokenFile != "" {
		b, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		token = strings.TrimSpace(string(b))
		if token == "" {
			return nil, fmt.Errorf("--token-file %s: empty", c.tokenFile)
		}
	}
	if c.plaintext {
		if token != "" || c.certFile != "" {
			return nil, errors.New("--plaintext: a token or client certificate is never sent without TLS")
		}
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, nil
	}
	if (c.certFile == "") != (c.keyFile == "") {
		return nil, errors.New("--tls-cert-file and --tls-key-file: set both")
	}
	r, err := tlsconfig.NewReloader(tlsconfig.Files{CertFile: c.certFile, KeyFile: c.keyFile, CAFile: c.caFile})
	if err != nil {
		return nil, fmt.Errorf("--tls-*: %w", err)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsconfig.ClientConfig(r, c.serverName)))}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(authn.Bearer(token)))
	}
	return opts, nil
}

// dial connects to the supervisor. grpc.NewClient does not connect yet;
// the first RPC reports an unreachable server.
func dial(addr string) (planexv1.SupervisorServiceClient, func() error, error) {
	return dialService(addr, planexv1.NewSupervisorServiceClient)
}

// speaksTLS reports whether addr completes a TLS handshake: a plaintext
// client's "connection closed" from a TLS server then gets its real cause.
// The probe verifies nothing and sends nothing but the handshake.
func speaksTLS(addr string) bool {
	d := &net.Dialer{Timeout: 2 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // a probe: nothing is sent or trusted
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// rpcError turns a gRPC error into one clear line for the user.
func rpcError(addr string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.Unavailable:
		if connection.plaintext && speaksTLS(addr) {
			return fmt.Errorf("the supervisor at %s serves TLS: drop --plaintext (and PLANEX_PLAINTEXT); a planex dev on this machine needs no other flag", addr)
		}
		if strings.Contains(st.Message(), "handshake") || strings.Contains(st.Message(), "tls:") || strings.Contains(st.Message(), "x509") {
			return fmt.Errorf("TLS with the supervisor at %s failed (set --tls-ca-file to its CA, or --plaintext for a server started with --plaintext): %s", addr, st.Message())
		}
		return fmt.Errorf("cannot reach the supervisor at %s (is `planex dev` or `planex supervisor` running? set --addr or PLANEX_ADDR): %s", addr, st.Message())
	case codes.Unauthenticated:
		return fmt.Errorf("the supervisor at %s needs credentials: set --token-file, --token or PLANEX_TOKEN, or a client certificate (--tls-cert-file)", addr)
	case codes.PermissionDenied:
		if why, ok := strings.CutPrefix(st.Message(), "permission denied: "); ok && why != "" {
			// The supervisor said why (a gate's approvers).
			return fmt.Errorf("permission denied by the supervisor at %s: %s", addr, why)
		}
		return fmt.Errorf("permission denied by the supervisor at %s: your identity lacks the role this command needs (viewer, runner, approver, operator or admin), or the run is not yours", addr)
	case codes.DeadlineExceeded:
		return fmt.Errorf("supervisor at %s did not answer in time", addr)
	case codes.Canceled:
		return context.Canceled
	default:
		return errors.New(st.Message())
	}
}

var jsonOut = protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitUnpopulated: false}

// printJSON writes m as protojson (enum names as strings) to w.
func printJSON(w io.Writer, m proto.Message) error {
	b, err := jsonOut.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode %T: %w", m, err)
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

// runExitCode maps a terminal (or waiting) run to the process exit code.
func runExitCode(r *planexv1.Run) int {
	switch r.GetStatus() {
	case planexv1.RunStatus_RUN_STATUS_SUCCEEDED:
		return exitOK
	case planexv1.RunStatus_RUN_STATUS_ESCALATED, planexv1.RunStatus_RUN_STATUS_WAITING:
		return exitEscalated
	case planexv1.RunStatus_RUN_STATUS_CANCELLED:
		return exitStopped
	}
	switch r.GetStopReason() {
	case planexv1.StopReason_STOP_REASON_DEADLINE, planexv1.StopReason_STOP_REASON_BUDGET_EXCEEDED, planexv1.StopReason_STOP_REASON_CANCELLED:
		return exitStopped
	case planexv1.StopReason_STOP_REASON_ESCALATED:
		return exitEscalated
	}
	return exitFailed
}

// isTerminal reports whether a run reached a final status.
func isTerminal(s planexv1.RunStatus) bool {
	switch s {
	case planexv1.RunStatus_RUN_STATUS_SUCCEEDED, planexv1.RunStatus_RUN_STATUS_FAILED,
		planexv1.RunStatus_RUN_STATUS_ESCALATED, planexv1.RunStatus_RUN_STATUS_CANCELLED:
		return true
	}
	return false
}

// parseLabels parses k=v pairs from --label.
func parseLabels(pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--label %q: want key=value", p)
		}
		out[k] = v
	}
	return out, nil
}

// statusName strips the enum prefix for display.
func statusName(s fmt.Stringer, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), prefix))
}

// stdoutIsTerminal reports whether stdout is a character device (a
// terminal), to choose between the live view and plain lines.
func stdoutIsTerminal() bool {
	fi, err := os.Stdout.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// usageError marks a command-line mistake (exit code 1).
func usageError(cmd *cobra.Command, format string, args ...any) error {
	return &exitError{code: exitUsage, msg: fmt.Sprintf(format, args...) + " (see `" + cmd.CommandPath() + " --help`)"}
}

var jsonLine = protojson.MarshalOptions{}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }
