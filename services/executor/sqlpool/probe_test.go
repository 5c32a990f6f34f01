package sqlpool

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/planex-dev/planex/services/executor/runner/runnertest"
)

// Probe follows the SQLite database file: it fails while the file is gone
// (an unmounted volume) although open connections could still read it.
func TestProbeSQLite(t *testing.T) {
	f := sqliteFixture(t, Config{})
	ctx := runnertest.Context(t)
	if err := f.pool.Probe(ctx); err != nil {
		t.Fatalf("probe of a healthy database: %v", err)
	}
	path := f.pool.db.(*sqliteDB).path
	if err := os.Rename(path, path+".away"); err != nil {
		t.Fatal(err)
	}
	if err := f.pool.Probe(ctx); err == nil {
		t.Fatal("probe succeeded with the database file gone")
	}
	if err := os.Rename(path+".away", path); err != nil {
		t.Fatal(err)
	}
	if err := f.pool.Probe(ctx); err != nil {
		t.Fatalf("probe after the file came back: %v", err)
	}
}

// Probe follows PostgreSQL: through a TCP proxy the test cuts, it fails
// while the server cannot be reached and succeeds again once it can.
func TestProbePostgres(t *testing.T) {
	dsn := os.Getenv("PLANEX_TEST_POSTGRES_DSN")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	ctx := runnertest.Context(t)
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	c, err := pgx.Connect(cctx, dsn)
	cancel()
	if err != nil {
		t.Skipf("PostgreSQL not reachable at %s (set PLANEX_TEST_POSTGRES_DSN): %v", redactDSN(dsn), err)
	}
	_ = c.Close(ctx)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startProxy(t, u.Host)
	u.Host = proxy.addr
	p, err := Open(ctx, Config{DSN: u.String(), AllowPrivilegedRole: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	probe := func() error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return p.Probe(ctx)
	}
	if err := probe(); err != nil {
		t.Fatalf("probe of a reachable server: %v", err)
	}
	proxy.down()
	if err := probe(); err == nil {
		t.Fatal("probe succeeded while PostgreSQL was unreachable")
	}
	proxy.up(t)
	deadline := time.Now().Add(10 * time.Second)
	for err := probe(); err != nil; err = probe() {
		if time.Now().After(deadline) {
			t.Fatalf("probe still failing after PostgreSQL came back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// proxy forwards TCP connections from a loopback port to target; down
// closes the port and every connection, up opens the same port again.
type proxy struct {
	target, addr string
	mu           sync.Mutex
	lis          net.Listener
	conns        []net.Conn
}

func startProxy(t *testing.T, target string) *proxy {
	p := &proxy{target: target}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = lis.Addr().String()
	p.serve(lis)
	t.Cleanup(p.down)
	return p
}

func (p *proxy) up(t *testing.T) {
	lis, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	p.serve(lis)
}

func (p *proxy) serve(lis net.Listener) {
	p.mu.Lock()
	p.lis = lis
	p.mu.Unlock()
	go func() {
		for {
			in, err := lis.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
}

func (p *proxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lis != nil {
		if err := p.lis.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			return
		}
	}
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}
