package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/planex-dev/planex/cmd/internal/devstack"
	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// devStore lets the commands that read run logs on NATS themselves (runs
// export, audit verify, replay) find a running `planex dev` the way the
// gRPC commands do: by its supervisor address, through the client context
// the dev stack wrote on this machine, which names its NATS server and the
// supervisor's nkey seed.
type devStore struct {
	addr string
	fs   *pflag.FlagSet
}

// defaultDevAddr is the supervisor address of `planex dev` and the
// default --addr of every client command.
const defaultDevAddr = "127.0.0.1:7400"

func (d *devStore) register(fs *pflag.FlagSet) {
	d.fs = fs
	fs.StringVar(&d.addr, "addr", defaultDevAddr, "supervisor address of the planex dev on this machine whose NATS server and credentials to use when --nats-url and NATS credentials are not given")
}

// given reports whether the command line or the environment set flag.
func (d *devStore) given(flag string) bool {
	if d.fs == nil {
		return false
	}
	f := d.fs.Lookup(flag)
	return f != nil && f.Changed
}

// apply points sf at the NATS server of the planex dev serving --addr when
// the caller gave neither --nats-url nor a NATS credential, and returns a
// hint to append to a connection error: which stack was used, or how to
// point the command at one.
func (d *devStore) apply(sf *storeFlags) string {
	a := sf.auth
	if d.given("nats-url") || a.CredsFile != "" || a.NKeySeedFile != "" || a.TokenFile != "" || a.User != "" || a.PasswordFile != "" ||
		a.TLS.CAFile != "" || a.TLS.CertFile != "" || a.TLS.KeyFile != "" {
		return ""
	}
	addr := d.addr
	if addr == "" {
		addr = defaultDevAddr
	}
	cc, ok := devstack.LookupClientContext(addr)
	if !ok || cc.NATSURL == "" || cc.NATSSeedFile == "" {
		return fmt.Sprintf(" (no planex dev serves --addr %s on this machine: start one, give the --addr of the one running, or give --nats-url and NATS credentials such as --nats-nkey-file <data-dir>/credentials/nats/supervisor.nk)", addr)
	}
	sf.url, sf.auth.NKeySeedFile, sf.identity = cc.NATSURL, cc.NATSSeedFile, "supervisor"
	return fmt.Sprintf(" (the NATS server of the planex dev serving %s: is it still running?)", addr)
}

// devCredentialsCmd prints where a running planex dev keeps what clients
// need: shell assignments of file paths and addresses, never a secret's
// value.
func devCredentialsCmd() *cobra.Command {
	var (
		addr    string
		dataDir string
	)
	cmd := &cobra.Command{
		Use:   "credentials",
		Short: "Print the paths of a planex dev's CA, CLI token and NATS nkey, and its addresses, as shell assignments",
		Long: `Print, as shell assignments, what a client on this machine needs to reach a
planex dev: its supervisor address, CA bundle, the CLI's API key file, its
NATS server URL and the supervisor's NATS nkey seed file. Only paths and
addresses are printed, never a key itself:

  eval "$(planex dev credentials)"
  grpcurl -cacert "$PLANEX_DEV_CA_FILE" -H "authorization: Bearer $(cat "$PLANEX_DEV_TOKEN_FILE")" "$PLANEX_DEV_ADDR" list

The planex CLI itself needs none of this: its commands find the planex dev
serving --addr on their own. With --data-dir, the files of that data
directory are printed even when no planex dev runs on it (without the
addresses, which only a running stack has).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var (
				vars    [][2]string
				credDir string
			)
			if dataDir != "" {
				credDir = filepath.Join(dataDir, "credentials")
				if _, err := os.Stat(filepath.Join(credDir, "ca.pem")); err != nil {
					return &exitError{code: exitUsage, msg: fmt.Sprintf("--data-dir %s: no planex dev credentials there (%v); planex dev --data-dir %s creates them", dataDir, err, dataDir)}
				}
			} else {
				cc, ok := devstack.LookupClientContext(addr)
				if !ok {
					return &exitError{code: exitUsage, msg: fmt.Sprintf("no planex dev serves --addr %s on this machine: start planex dev, give the --addr it printed, or --data-dir", addr)}
				}
				credDir = filepath.Dir(cc.CAFile)
				vars = append(vars, [2]string{"PLANEX_DEV_ADDR", cc.Addr})
				if cc.NATSURL != "" {
					vars = append(vars, [2]string{"PLANEX_DEV_NATS_URL", cc.NATSURL})
				}
			}
			vars = append(vars,
				[2]string{"PLANEX_DEV_CREDENTIALS_DIR", credDir},
				[2]string{"PLANEX_DEV_CA_FILE", filepath.Join(credDir, "ca.pem")},
				[2]string{"PLANEX_DEV_TOKEN_FILE", filepath.Join(credDir, "cli.token")},
				[2]string{"PLANEX_DEV_NATS_NKEY_FILE", filepath.Join(credDir, "nats", "supervisor.nk")})
			for _, v := range vars {
				fmt.Fprintf(cmd.OutOrStdout(), "%s=%s\n", v[0], shellQuote(v[1]))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "addr", defaultDevAddr, "supervisor address of the planex dev (what planex dev printed)")
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "print the credential files of this data directory instead, running or not")
	return cmd
}

// shellQuote quotes s for a POSIX shell when it holds anything but plain
// path characters.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-:+@,=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// devStoppedOutcome rewrites the outcome of a `planex run --dev` whose run
// waits for a decision: the stack that ran it stopped with the command, so
// `planex runs get` would reach nothing. It says how to decide the run
// instead; other errors pass unchanged.
func devStoppedOutcome(err error, dataDir string) error {
	var ee *exitError
	if !errors.As(err, &ee) || ee.run.GetStatus() != planexv1.RunStatus_RUN_STATUS_WAITING {
		return err
	}
	id := ee.run.GetId()
	for _, g := range ee.run.GetGates() {
		if g.GetKind() == planexv1.GateKind_GATE_KIND_INPUT && g.GetDecision() == planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED {
			return &exitError{code: ee.code, run: ee.run, msg: fmt.Sprintf("run %s is waiting for an answer (%q) and this command's dev stack has stopped; "+
				"to answer it, start `planex dev --data-dir %s` (the run resumes there), then `planex runs answer %s --value JSON`",
				id, g.GetInput().GetQuestion(), shellQuote(dataDir), id)}
		}
	}
	return &exitError{code: ee.code, run: ee.run, msg: fmt.Sprintf("run %s is waiting for a decision and this command's dev stack has stopped; "+
		"to decide it, start `planex dev --data-dir %s` (the run resumes there), then `planex runs approve %s` or `planex runs reject %s --comment WHY`",
		id, shellQuote(dataDir), id, id)}
}
