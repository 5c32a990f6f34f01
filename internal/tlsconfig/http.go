package tlsconfig

import (
	"crypto/tls"
	"fmt"
)

// HTTPServerConfig is the TLS configuration of an HTTP listener that
// shares the gRPC server's settings (certificate, client CA and
// --tls-client-auth, all following the files), offering HTTP/2 and
// HTTP/1.1; nil with --plaintext.
func (f Flags) HTTPServerConfig() (*tls.Config, error) {
	if f.Plaintext {
		return nil, nil
	}
	c, _, err := f.serverTLS()
	if err != nil {
		return nil, err
	}
	c.NextProtos = []string{"h2", "http/1.1"}
	return c, nil
}

// serverTLS is the server configuration the flags describe; client
// certificates are verified when given if --tls-client-auth is unset and
// a CA file is.
func (f Flags) serverTLS() (*tls.Config, *Reloader, error) {
	r, err := NewReloader(f.Files)
	if err != nil {
		return nil, nil, fmt.Errorf("--tls-cert-file: %w", err)
	}
	ca := f.ClientAuth
	if ca == "" {
		ca = ClientAuthVerifyIfGiven
		if f.CAFile == "" {
			ca = ClientAuthNone
		}
	}
	c, err := ServerConfig(r, ca)
	if err != nil {
		return nil, nil, fmt.Errorf("--tls-client-auth: %w", err)
	}
	return c, r, nil
}
