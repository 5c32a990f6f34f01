// Package natsauth is how planex services authenticate to NATS and what
// each may do there: connection options from credential files (a .creds
// file, an nkey seed, a token or a user with a password file) and TLS, and
// the per-service publish/subscribe allow lists (Permissions) that the dev
// stack's embedded NATS enforces and deploy/k8s's nats.conf mirrors.
// Secrets are read from files only — never from URLs or flags — and never
// logged.
package natsauth

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"

	"github.com/planex-dev/planex/internal/tlsconfig"
)

// Options are a service's NATS credentials and TLS settings.
type Options struct {
	// CredsFile is a NATS .creds file (user JWT and nkey seed).
	CredsFile string
	// NKeySeedFile holds a user nkey seed ("SU...").
	NKeySeedFile string
	// TokenFile holds an authentication token.
	TokenFile string
	// User is the user name for PasswordFile.
	User string
	// PasswordFile holds the password of User.
	PasswordFile string
	// TLS are the CA bundle verifying the server and an optional client
	// certificate; TLS is used when any is set or the URL is tls://.
	TLS tlsconfig.Files
}

// RegisterFlags adds --nats-creds-file, --nats-nkey-file,
// --nats-token-file, --nats-user, --nats-password-file,
// --nats-tls-ca-file, --nats-tls-cert-file and --nats-tls-key-file.
func (o *Options) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.CredsFile, "nats-creds-file", "", "NATS .creds file (user JWT and nkey seed)")
	fs.StringVar(&o.NKeySeedFile, "nats-nkey-file", "", "file holding this service's NATS user nkey seed")
	fs.StringVar(&o.TokenFile, "nats-token-file", "", "file holding a NATS authentication token")
	fs.StringVar(&o.User, "nats-user", "", "NATS user name (password from --nats-password-file)")
	fs.StringVar(&o.PasswordFile, "nats-password-file", "", "file holding the password of --nats-user")
	fs.StringVar(&o.TLS.CAFile, "nats-tls-ca-file", "", "PEM CA bundle verifying the NATS server (enables TLS)")
	fs.StringVar(&o.TLS.CertFile, "nats-tls-cert-file", "", "PEM client certificate for NATS (TLS client auth)")
	fs.StringVar(&o.TLS.KeyFile, "nats-tls-key-file", "", "PEM key of --nats-tls-cert-file")
}

// Validate checks that at most one way to authenticate is chosen, that
// its files exist, and that the URL carries no credentials.
func (o Options) Validate(natsURL string) error {
	var errs []error
	if u, err := url.Parse(natsURL); err == nil && u.User != nil {
		errs = append(errs, errors.New("--nats-url: must not carry credentials (use --nats-creds-file, --nats-nkey-file, --nats-token-file or --nats-user with --nats-password-file)"))
	}
	n := 0
	for _, f := range []struct{ flag, path string }{
		{"--nats-creds-file", o.CredsFile}, {"--nats-nkey-file", o.NKeySeedFile},
		{"--nats-token-file", o.TokenFile}, {"--nats-password-file", o.PasswordFile},
		{"--nats-tls-ca-file", o.TLS.CAFile}, {"--nats-tls-cert-file", o.TLS.CertFile}, {"--nats-tls-key-file", o.TLS.KeyFile},
	} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", f.flag, f.path, errors.Unwrap(err)))
		}
		if f.flag != "--nats-password-file" && !strings.HasPrefix(f.flag, "--nats-tls") {
			n++
		}
	}
	if o.User != "" || o.PasswordFile != "" {
		n++
		if o.User == "" || o.PasswordFile == "" {
			errs = append(errs, errors.New("--nats-user and --nats-password-file: set both"))
		}
	}
	if n > 1 {
		errs = append(errs, errors.New("NATS credentials: choose one of --nats-creds-file, --nats-nkey-file, --nats-token-file, --nats-user"))
	}
	if (o.TLS.CertFile == "") != (o.TLS.KeyFile == "") {
		errs = append(errs, errors.New("--nats-tls-cert-file and --nats-tls-key-file: set both"))
	}
	return errors.Join(errs...)
}

// NATSOptions are the nats.Options for these settings. Tokens and
// passwords are read from their files on every (re)connect, so rotated
// secrets are picked up.
func (o Options) NATSOptions() ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case o.CredsFile != "":
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	case o.NKeySeedFile != "":
		opt, err := nats.NkeyOptionFromSeed(o.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("--nats-nkey-file: %w", err)
		}
		opts = append(opts, opt)
	case o.TokenFile != "":
		file := o.TokenFile
		opts = append(opts, nats.TokenHandler(func() string { return readSecret(file) }))
	case o.User != "":
		user, file := o.User, o.PasswordFile
		opts = append(opts, nats.UserInfoHandler(func() (string, string) { return user, readSecret(file) }))
	}
	if o.TLS != (tlsconfig.Files{}) {
		r, err := tlsconfig.NewReloader(o.TLS)
		if err != nil {
			return nil, fmt.Errorf("--nats-tls-*: %w", err)
		}
		opts = append(opts, nats.Secure(tlsconfig.ClientConfig(r, "")))
	}
	return opts, nil
}

// readSecret reads a one-line secret file; an unreadable file gives an
// empty secret, which the server refuses (and the error handler logs).
func readSecret(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
