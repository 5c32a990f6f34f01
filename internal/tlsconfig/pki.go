package tlsconfig

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a small certificate authority for `planex dev` and tests: it
// issues ECDSA P-256 server and client certificates.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// CertPEM is the CA certificate, to write as a CA bundle.
	CertPEM []byte
}

// NewCA creates a self-signed CA valid for validity.
func NewCA(commonName string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// LoadCA reads a CA written by WriteFiles (certificate and key PEM).
func LoadCA(certFile, keyFile string) (*CA, error) {
	cpem, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("read CA certificate: %w", err)
	}
	kpem, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("read CA key: %w", err)
	}
	cb, _ := pem.Decode(cpem)
	kb, _ := pem.Decode(kpem)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("CA %s, %s: not PEM", certFile, keyFile)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate %s: %w", certFile, err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse CA key %s: %w", keyFile, err)
	}
	return &CA{cert: cert, key: key, CertPEM: cpem}, nil
}

// KeyPEM is the CA's private key in PEM.
func (ca *CA) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(ca.key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// Leaf describes a certificate to issue.
type Leaf struct {
	// CommonName is the subject CN (the identity of a client).
	CommonName string
	// OrganizationalUnits carry planex roles for client certificates.
	OrganizationalUnits []string
	// Hosts are DNS names and IP addresses for server certificates.
	Hosts []string
	// URIs are URI SANs (for example a SPIFFE id).
	URIs []string
	// Server and Client select the extended key usages.
	Server, Client bool
	// Validity of the certificate.
	Validity time.Duration
}

// Issue signs a new certificate and returns its certificate and key PEM.
func (ca *CA) Issue(l Leaf) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}
	if l.Validity == 0 {
		l.Validity = 365 * 24 * time.Hour
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: l.CommonName, OrganizationalUnit: l.OrganizationalUnits},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(l.Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	for _, h := range l.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	for _, u := range l.URIs {
		pu, err := parseURI(u)
		if err != nil {
			return nil, nil, err
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	if l.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if l.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("issue certificate for %s: %w", l.CommonName, err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// IssueFiles issues l and writes <dir>/<name>.pem and <dir>/<name>-key.pem
// (the key 0600), returning their Files with the CA bundle at caFile.
func (ca *CA) IssueFiles(dir, name, caFile string, l Leaf) (Files, error) {
	c, k, err := ca.Issue(l)
	if err != nil {
		return Files{}, err
	}
	f := Files{CertFile: filepath.Join(dir, name+".pem"), KeyFile: filepath.Join(dir, name+"-key.pem"), CAFile: caFile}
	if err := WriteFileAtomic(f.KeyFile, k, 0o600); err != nil {
		return Files{}, err
	}
	if err := WriteFileAtomic(f.CertFile, c, 0o644); err != nil {
		return Files{}, err
	}
	return f, nil
}

// WriteFileAtomic writes data to path through a temporary file and a
// rename, so readers (a Reloader) never see half a file.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}
