package tlsconfig

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"

	"github.com/spf13/pflag"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

func parseURI(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		return nil, fmt.Errorf("URI SAN %q: want scheme://...", s)
	}
	return u, nil
}

// Flags are a service's TLS settings: its own certificate (served, and
// presented as a client certificate when it calls other services), the CA
// bundle that verifies peers, and the explicit plaintext opt-out.
type Flags struct {
	Files
	// ClientAuth is what the server asks of client certificates.
	ClientAuth ClientAuth
	// Plaintext serves and dials without TLS; it must be chosen
	// explicitly.
	Plaintext bool
}

// RegisterFlags adds --tls-cert-file, --tls-key-file, --tls-ca-file,
// --tls-client-auth and --plaintext.
func (f *Flags) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.CertFile, "tls-cert-file", "", "PEM certificate chain this service serves (and presents to the services it calls); reloaded when the file changes")
	fs.StringVar(&f.KeyFile, "tls-key-file", "", "PEM private key of --tls-cert-file")
	fs.StringVar(&f.CAFile, "tls-ca-file", "", "PEM CA bundle that verifies peers: client certificates (mTLS) and the servers this service calls")
	fs.StringVar((*string)(&f.ClientAuth), "tls-client-auth", string(ClientAuthVerifyIfGiven), "client certificates: none, verify-if-given (mTLS or a bearer token) or require (mTLS only)")
	fs.BoolVar(&f.Plaintext, "plaintext", false, "serve and call gRPC without TLS (explicit opt-out; only on a trusted network)")
}

// Validate checks the flags: TLS needs a certificate and key unless
// --plaintext is set, and client authentication needs a CA bundle.
func (f Flags) Validate() error {
	var errs []error
	if f.Plaintext {
		if f.CertFile != "" || f.KeyFile != "" {
			errs = append(errs, errors.New("--plaintext: conflicts with --tls-cert-file/--tls-key-file"))
		}
		return errors.Join(errs...)
	}
	if f.CertFile == "" || f.KeyFile == "" {
		errs = append(errs, errors.New("--tls-cert-file and --tls-key-file: required (or --plaintext to run without TLS)"))
	}
	switch f.ClientAuth {
	case ClientAuthNone:
	case ClientAuthVerifyIfGiven, ClientAuthRequire:
		if f.CAFile == "" {
			errs = append(errs, fmt.Errorf("--tls-client-auth %s: needs --tls-ca-file", f.ClientAuth))
		}
	default:
		errs = append(errs, fmt.Errorf("--tls-client-auth %q: want none, verify-if-given or require", f.ClientAuth))
	}
	return errors.Join(errs...)
}

// ServerCredentials returns the gRPC transport credentials of a server:
// TLS following the files, or insecure with --plaintext. A connection
// authenticated by a client certificate is closed when the CA bundle
// changes and no longer trusts that certificate (checked on the next
// handshake, and every RecheckInterval while such connections are open).
func (f Flags) ServerCredentials() (credentials.TransportCredentials, error) {
	if f.Plaintext {
		return insecure.NewCredentials(), nil
	}
	c, r, err := f.serverTLS()
	if err != nil {
		return nil, err
	}
	return &revalidating{TransportCredentials: credentials.NewTLS(c), w: newTrustWatch(r, x509.ExtKeyUsageClientAuth)}, nil
}

// ClientCredentials returns the gRPC transport credentials this service
// uses to call another: TLS with its certificate as client certificate,
// verifying the server against --tls-ca-file; insecure with --plaintext.
// Like ServerCredentials, a connection to a server the changed CA bundle
// no longer trusts is closed (and dialled again).
func (f Flags) ClientCredentials(serverName string) (credentials.TransportCredentials, error) {
	if f.Plaintext {
		return insecure.NewCredentials(), nil
	}
	r, err := NewReloader(f.Files)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert-file: %w", err)
	}
	return &revalidating{TransportCredentials: credentials.NewTLS(ClientConfig(r, serverName)), w: newTrustWatch(r, x509.ExtKeyUsageServerAuth)}, nil
}
