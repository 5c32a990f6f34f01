package emailpool_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"github.com/planex-dev/planex/internal/freeport"
)

// received is one message the test SMTP server accepted.
type received struct {
	from  string
	rcpts []string
	data  string
	tls   bool
	user  string
}

// smtpServer is a real SMTP server (github.com/emersion/go-smtp) in the
// test process, with STARTTLS on a self-signed certificate and AUTH PLAIN.
type smtpServer struct {
	addr      string
	clientTLS *tls.Config // trusts the server's certificate

	mu     sync.Mutex
	mails  []received
	onData func(*smtp.Conn) // called after a message was accepted, before 250 is sent
}

const (
	smtpUser     = "planex"
	smtpPassword = "s3cret-pass"
)

// startSMTP starts the server; withTLS false serves plain SMTP only.
func startSMTP(t testing.TB, withTLS bool) *smtpServer {
	t.Helper()
	s := &smtpServer{}
	srv := smtp.NewServer(smtp.BackendFunc(func(c *smtp.Conn) (smtp.Session, error) {
		return &session{s: s, conn: c}, nil
	}))
	srv.Domain = "localhost"
	srv.ReadTimeout = 10 * time.Second
	srv.WriteTimeout = 10 * time.Second
	srv.MaxMessageBytes = 1 << 20
	srv.ErrorLog = discardLogger{}
	if withTLS {
		cert, pool := selfSigned(t)
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		s.clientTLS = &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	} else {
		srv.AllowInsecureAuth = true
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = lis.Addr().String()
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return s
}

// breakNext makes the server close the connection of the next message
// after it took the message and before it answers: the client cannot
// tell whether the message was delivered.
func (s *smtpServer) breakNext() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onData = func(c *smtp.Conn) {
		s.mu.Lock()
		s.onData = nil
		s.mu.Unlock()
		_ = c.Conn().Close()
	}
}

// closedAddr returns a loopback address nobody listens on (below the
// ephemeral range: no listener on port 0 takes it meanwhile).
func closedAddr(t testing.TB) string {
	t.Helper()
	return freeport.Addr(t)
}

func (s *smtpServer) received() []received {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]received(nil), s.mails...)
}

type discardLogger struct{}

func (discardLogger) Printf(string, ...any) {}
func (discardLogger) Println(...any)        {}

type session struct {
	s     *smtpServer
	conn  *smtp.Conn
	user  string
	from  string
	rcpts []string
}

func (x *session) AuthMechanisms() []string { return []string{sasl.Plain} }

func (x *session) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, user, pass string) error {
		if user != smtpUser || pass != smtpPassword {
			return smtp.ErrAuthFailed
		}
		x.user = user
		return nil
	}), nil
}

func (x *session) Mail(from string, _ *smtp.MailOptions) error {
	x.from = from
	return nil
}

func (x *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	if strings.HasPrefix(to, "refuse@") {
		return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such mailbox"}
	}
	x.rcpts = append(x.rcpts, to)
	return nil
}

func (x *session) Data(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	_, isTLS := x.conn.TLSConnectionState()
	x.s.mu.Lock()
	x.s.mails = append(x.s.mails, received{from: x.from, rcpts: x.rcpts, data: string(b), tls: isTLS, user: x.user})
	hook := x.s.onData
	x.s.mu.Unlock()
	if hook != nil {
		hook(x.conn)
	}
	return nil
}

func (x *session) Reset() { x.from, x.rcpts = "", nil }

func (x *session) Logout() error { return nil }

// selfSigned makes a certificate for 127.0.0.1 and a pool trusting it.
func selfSigned(t testing.TB) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "planex test SMTP"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:              []string{"localhost"},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}
