package tlsconfig_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/planex-dev/planex/internal/tlsconfig"
)

// TestReplacedFileWithSameSizeAndTime: a certificate replaced by another
// file of the same size and modification time (a timestamp within the
// file system's granularity, or a copy that keeps times) is still seen as
// changed, because it is another file (inode).
func TestReplacedFileWithSameSizeAndTime(t *testing.T) {
	dir := t.TempDir()
	ca, err := tlsconfig.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	leaf := tlsconfig.Leaf{CommonName: "server", Hosts: []string{"127.0.0.1"}, Server: true}
	files, err := ca.IssueFiles(dir, "server", caFile, leaf)
	if err != nil {
		t.Fatal(err)
	}
	scfg, err := tlsconfig.ServerConfig(mustReloader(t, files), tlsconfig.ClientAuthNone)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, scfg)
	ccfg := tlsconfig.ClientConfig(mustReloader(t, tlsconfig.Files{CAFile: caFile}), "127.0.0.1")
	first := serialOf(t, files.CertFile)
	if got, err := handshake(t, addr, ccfg); err != nil || got.Cmp(first) != 0 {
		t.Fatalf("before: serial %v, err %v; want %v", got, err, first)
	}
	oldCert, _ := os.Stat(files.CertFile)
	oldKey, _ := os.Stat(files.KeyFile)

	// ECDSA signatures vary in length: issue until the new certificate and
	// key have the sizes of the old ones.
	var cert, key []byte
	for range 100 {
		c, k, err := ca.Issue(leaf)
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(c)) == oldCert.Size() && int64(len(k)) == oldKey.Size() {
			cert, key = c, k
			break
		}
	}
	if cert == nil {
		t.Fatal("no certificate of the same size in 100 tries")
	}
	for _, f := range []struct {
		path string
		data []byte
		fi   os.FileInfo
	}{{files.KeyFile, key, oldKey}, {files.CertFile, cert, oldCert}} {
		if err := tlsconfig.WriteFileAtomic(f.path, f.data, f.fi.Mode()); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(f.path, f.fi.ModTime(), f.fi.ModTime()); err != nil {
			t.Fatal(err)
		}
	}
	now, _ := os.Stat(files.CertFile)
	if now.Size() != oldCert.Size() || !now.ModTime().Equal(oldCert.ModTime()) {
		t.Fatal("the replacement differs in size or time: the test would not test anything")
	}
	second := serialOf(t, files.CertFile)
	if got, err := handshake(t, addr, ccfg); err != nil || got.Cmp(second) != 0 {
		t.Fatalf("after the replacement: served serial %v, err %v; want the new %v", got, err, second)
	}
}

// pki is two CAs and files to point Flags at.
type pki struct {
	t        *testing.T
	dir      string
	ca1, ca2 *tlsconfig.CA
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{t: t, dir: t.TempDir()}
	var err error
	if p.ca1, err = tlsconfig.NewCA("CA 1", time.Hour); err != nil {
		t.Fatal(err)
	}
	if p.ca2, err = tlsconfig.NewCA("CA 2", time.Hour); err != nil {
		t.Fatal(err)
	}
	return p
}

// files issues a leaf of ca into name.pem and trusts bundle (written to
// name-ca.pem, replaced by setBundle).
func (p *pki) files(name string, ca *tlsconfig.CA, bundle ...*tlsconfig.CA) tlsconfig.Files {
	p.t.Helper()
	caFile := filepath.Join(p.dir, name+"-ca.pem")
	p.setBundle(caFile, bundle...)
	f, err := ca.IssueFiles(p.dir, name, caFile, tlsconfig.Leaf{CommonName: name, Hosts: []string{"127.0.0.1"}, Server: true, Client: true})
	if err != nil {
		p.t.Fatal(err)
	}
	return f
}

func (p *pki) setBundle(caFile string, cas ...*tlsconfig.CA) {
	p.t.Helper()
	var b []byte
	for _, ca := range cas {
		b = append(b, ca.CertPEM...)
	}
	if err := tlsconfig.WriteFileAtomic(caFile, b, 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// grpcHealth serves the gRPC health service with creds and returns its
// address.
func grpcHealth(t *testing.T, creds grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(creds)
	healthpb.RegisterHealthServer(s, health.NewServer())
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

// watch opens a health Watch stream on a new connection made with flags
// and returns a channel that receives the error that ends it.
func watch(t *testing.T, addr string, flags tlsconfig.Flags, recheck time.Duration) (ended <-chan error, cancel func()) {
	t.Helper()
	creds, err := flags.ClientCredentials("")
	if err != nil {
		t.Fatal(err)
	}
	if recheck > 0 {
		tlsconfig.SetRecheckInterval(creds, recheck)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancelCtx := context.WithCancel(context.Background())
	t.Cleanup(cancelCtx)
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatalf("health watch: %v", err)
	}
	ch := make(chan error, 1)
	go func() {
		for {
			if _, err := w.Recv(); err != nil {
				ch <- err
				return
			}
		}
	}()
	return ch, cancelCtx
}

// endsWith waits for a stream to end with code, within 5s.
func endsWith(t *testing.T, ended <-chan error, code codes.Code, what string) {
	t.Helper()
	select {
	case err := <-ended:
		if status.Code(err) != code {
			t.Fatalf("%s: stream ended with %v, want %s", what, err, code)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: stream still open after 5s, want it ended with %s", what, code)
	}
}

// TestConnectionsFollowTheBundle: when a CA leaves the bundle, the
// connections it had authenticated are closed — on the server, those of
// client certificates it signed; on the client, those to servers it
// signed — within the recheck interval and with no new handshake, while
// connections the new bundle still trusts carry on.
func TestConnectionsFollowTheBundle(t *testing.T) {
	t.Run("server", func(t *testing.T) {
		p := newPKI(t)
		srvFiles := p.files("server", p.ca2, p.ca1, p.ca2)
		creds, err := tlsconfig.Flags{Files: srvFiles, ClientAuth: tlsconfig.ClientAuthRequire}.ServerCredentials()
		if err != nil {
			t.Fatal(err)
		}
		tlsconfig.SetRecheckInterval(creds, 20*time.Millisecond)
		addr := grpcHealth(t, grpc.Creds(creds))
		retired, _ := watch(t, addr, tlsconfig.Flags{Files: p.files("client1", p.ca1, p.ca2)}, 0)
		kept, stopKept := watch(t, addr, tlsconfig.Flags{Files: p.files("client2", p.ca2, p.ca2)}, 0)

		p.setBundle(srvFiles.CAFile, p.ca2)
		endsWith(t, retired, codes.Unavailable, "the connection of a CA1 client certificate")
		select {
		case err := <-kept:
			t.Fatalf("the connection of a CA2 client certificate ended: %v", err)
		default:
		}
		stopKept()
		endsWith(t, kept, codes.Canceled, "the connection of a CA2 client certificate")
	})
	t.Run("client", func(t *testing.T) {
		p := newPKI(t)
		srvFiles := p.files("server", p.ca1, p.ca1, p.ca2)
		creds, err := tlsconfig.Flags{Files: srvFiles, ClientAuth: tlsconfig.ClientAuthRequire}.ServerCredentials()
		if err != nil {
			t.Fatal(err)
		}
		addr := grpcHealth(t, grpc.Creds(creds))
		cli := p.files("client", p.ca2, p.ca1, p.ca2)
		ended, _ := watch(t, addr, tlsconfig.Flags{Files: cli}, 20*time.Millisecond)
		p.setBundle(cli.CAFile, p.ca2)
		endsWith(t, ended, codes.Unavailable, "the connection to a CA1 server")
	})
	t.Run("broken bundle", func(t *testing.T) {
		// A bundle that cannot be read keeps the last good one: nothing
		// is closed.
		p := newPKI(t)
		srvFiles := p.files("server", p.ca1, p.ca1)
		creds, err := tlsconfig.Flags{Files: srvFiles, ClientAuth: tlsconfig.ClientAuthRequire}.ServerCredentials()
		if err != nil {
			t.Fatal(err)
		}
		addr := grpcHealth(t, grpc.Creds(creds))
		cli := p.files("client", p.ca1, p.ca1)
		ended, stop := watch(t, addr, tlsconfig.Flags{Files: cli}, 0)
		if err := tlsconfig.WriteFileAtomic(srvFiles.CAFile, []byte("not PEM"), 0o644); err != nil {
			t.Fatal(err)
		}
		// A new handshake re-reads the bundle (and checks the others).
		again, stopAgain := watch(t, addr, tlsconfig.Flags{Files: cli}, 0)
		stopAgain()
		endsWith(t, again, codes.Canceled, "a connection after the broken rotation")
		stop()
		endsWith(t, ended, codes.Canceled, "the connection before the broken rotation")
	})
}
