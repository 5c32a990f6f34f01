// Package tlsconfig builds the TLS configurations of planex's gRPC servers
// and clients from PEM files (certificate, key, CA bundle) and reloads them
// when the files change, so a rotated certificate (cert-manager, a mounted
// Kubernetes Secret) is used by the next handshake without a restart.
package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// ClientAuth says what a server asks of its clients' certificates.
type ClientAuth string

const (
	// ClientAuthNone does not ask for a client certificate.
	ClientAuthNone ClientAuth = "none"
	// ClientAuthVerifyIfGiven verifies a client certificate when one is
	// presented (callers without one authenticate with a bearer token).
	ClientAuthVerifyIfGiven ClientAuth = "verify-if-given"
	// ClientAuthRequire requires and verifies a client certificate (mTLS).
	ClientAuthRequire ClientAuth = "require"
)

// Files are the PEM files of one TLS identity and the CA bundle it trusts.
type Files struct {
	// CertFile is the certificate chain (leaf first).
	CertFile string
	// KeyFile is the private key of the leaf certificate.
	KeyFile string
	// CAFile is the CA bundle that verifies peers: client certificates on
	// a server, server certificates on a client. Empty on a client means
	// the system roots.
	CAFile string
}

// Reloader holds the certificate and CA pool loaded from Files and reloads
// them when a file is replaced (another file behind the path: a rename, or
// the ..data symlink swap of a mounted Kubernetes Secret) or its size or
// modification time changes. It is checked on every handshake (a stat per
// file), so rotation takes effect on the next connection; a rotation that
// leaves unreadable or mismatched files keeps the previous material and
// reports the error through Err.
type Reloader struct {
	files Files
	now   func() time.Time

	mu      sync.Mutex
	stamp   []fileState
	gen     uint64 // successful loads so far
	cert    *tls.Certificate
	pool    *x509.CertPool
	lastErr error
}

// NewReloader loads files once and fails when they are unusable.
func NewReloader(files Files) (*Reloader, error) {
	r := &Reloader{files: files, now: time.Now}
	if err := r.reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Err returns the error of the last failed reload, or nil.
func (r *Reloader) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastErr
}

// fileState is what a stat of one path found (fi nil: missing).
type fileState struct {
	path string
	fi   os.FileInfo
}

func fileStamp(paths ...string) []fileState {
	var s []fileState
	for _, p := range paths {
		if p == "" {
			continue
		}
		fi, _ := os.Stat(p)
		s = append(s, fileState{path: p, fi: fi})
	}
	return s
}

// sameStamp reports whether no file changed between a and b. A file is
// the same when it is the same file (device and inode: a replacement by
// rename or symlink swap is another file even with the same size and a
// modification time within the file system's timestamp granularity) with
// the same size and modification time.
func sameStamp(a, b []fileState) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i].fi, b[i].fi
		if a[i].path != b[i].path || (x == nil) != (y == nil) {
			return false
		}
		if x != nil && (!os.SameFile(x, y) || x.Size() != y.Size() || !x.ModTime().Equal(y.ModTime())) {
			return false
		}
	}
	return true
}

// reload re-reads the files when their stamp changed.
func (r *Reloader) reload() error {
	stamp := fileStamp(r.files.CertFile, r.files.KeyFile, r.files.CAFile)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gen > 0 && sameStamp(stamp, r.stamp) && (r.cert != nil || r.files.CertFile == "") {
		return nil
	}
	var cert *tls.Certificate
	if r.files.CertFile != "" || r.files.KeyFile != "" {
		if r.files.CertFile == "" || r.files.KeyFile == "" {
			return errors.New("TLS certificate and key files must be set together")
		}
		c, err := tls.LoadX509KeyPair(r.files.CertFile, r.files.KeyFile)
		if err != nil {
			r.lastErr = fmt.Errorf("load TLS key pair %s, %s: %w", r.files.CertFile, r.files.KeyFile, err)
			return r.lastErr
		}
		cert = &c
	}
	var pool *x509.CertPool
	if r.files.CAFile != "" {
		pem, err := os.ReadFile(r.files.CAFile)
		if err != nil {
			r.lastErr = fmt.Errorf("read TLS CA file: %w", err)
			return r.lastErr
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			r.lastErr = fmt.Errorf("TLS CA file %s: no PEM certificate", r.files.CAFile)
			return r.lastErr
		}
	}
	r.stamp, r.cert, r.pool, r.lastErr = stamp, cert, pool, nil
	r.gen++
	return nil
}

// trust reloads when needed and returns the CA pool in use and the number
// of loads so far (it grows when the files changed).
func (r *Reloader) trust() (*x509.CertPool, uint64) {
	_ = r.reload()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pool, r.gen
}

// current reloads when needed and returns the material in use.
func (r *Reloader) current() (*tls.Certificate, *x509.CertPool) {
	_ = r.reload() // a failed rotation keeps the previous material
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cert, r.pool
}

// ServerConfig is a server TLS configuration whose certificate and client
// CA pool follow the files. With ClientAuthVerifyIfGiven or
// ClientAuthRequire the CA file is required.
func ServerConfig(r *Reloader, auth ClientAuth) (*tls.Config, error) {
	if r.files.CertFile == "" {
		return nil, errors.New("TLS server: certificate file required")
	}
	switch auth {
	case ClientAuthNone, ClientAuthVerifyIfGiven, ClientAuthRequire:
	default:
		return nil, fmt.Errorf("client auth %q: want none, verify-if-given or require", auth)
	}
	if auth != ClientAuthNone && r.files.CAFile == "" {
		return nil, fmt.Errorf("client auth %s: a CA file to verify client certificates is required", auth)
	}
	base := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		cert, pool := r.current()
		c := base.Clone()
		c.GetConfigForClient = nil
		c.Certificates = []tls.Certificate{*cert}
		c.ClientCAs = pool
		switch auth {
		case ClientAuthVerifyIfGiven:
			c.ClientAuth = tls.VerifyClientCertIfGiven
		case ClientAuthRequire:
			c.ClientAuth = tls.RequireAndVerifyClientCert
		}
		return c, nil
	}
	return base, nil
}

// ClientConfig is a client TLS configuration: the certificate (when the
// files have one) is presented for mTLS, the server is verified against
// the CA file (or the system roots) for serverName (empty: the dialled
// host). Both follow the files.
func ClientConfig(r *Reloader, serverName string) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if r.files.CertFile != "" {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, _ := r.current()
			return cert, nil
		}
	}
	if r.files.CAFile != "" {
		// Verification is done here against the current pool, so that a
		// rotated CA bundle applies without redialling the process.
		c.InsecureSkipVerify = true
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			_, pool := r.current()
			if len(cs.PeerCertificates) == 0 {
				return errors.New("tls: server presented no certificate")
			}
			inter := x509.NewCertPool()
			for _, ic := range cs.PeerCertificates[1:] {
				inter.AddCert(ic)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
				DNSName: cs.ServerName, Roots: pool, Intermediates: inter,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			})
			return err
		}
	}
	return c
}

// Leaf returns the parsed leaf certificate in use.
func (r *Reloader) Leaf() (*x509.Certificate, error) {
	cert, _ := r.current()
	if cert == nil || len(cert.Certificate) == 0 {
		return nil, errors.New("no certificate")
	}
	return x509.ParseCertificate(cert.Certificate[0])
}
