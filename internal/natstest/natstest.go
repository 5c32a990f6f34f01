// Package natstest runs a real NATS server with JetStream inside the test
// process (nats-server embedded, not a mock), on a random loopback port with
// its store in t.TempDir().
package natstest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/planex-dev/planex/internal/bus"
)

// Server is an embedded NATS server that can be restarted on the same store
// directory, to test crash and restart paths.
type Server struct {
	t        testing.TB
	storeDir string
	port     int
	srv      *server.Server
}

// Start starts an embedded JetStream server and stops it when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, storeDir: t.TempDir(), port: -1}
	s.start()
	t.Cleanup(s.Shutdown)
	return s
}

func (s *Server) start() {
	s.t.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      s.port,
		JetStream: true,
		StoreDir:  s.storeDir,
		NoLog:     true,
		NoSigs:    true,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		s.t.Fatalf("natstest: new server: %v", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		s.t.Fatalf("natstest: server not ready within 10s")
	}
	s.srv = srv
	// Keep the port across restarts so clients reconnect to it.
	if addr, ok := srv.Addr().(*net.TCPAddr); ok {
		s.port = addr.Port
	}
}

// URL is the client URL of the server.
func (s *Server) URL() string { return s.srv.ClientURL() }

// Shutdown stops the server (idempotent).
func (s *Server) Shutdown() {
	if s.srv != nil {
		s.srv.Shutdown()
		s.srv.WaitForShutdown()
	}
}

// Restart stops the server and starts it again on the same port and store,
// as after a crash of the NATS node.
func (s *Server) Restart() {
	s.t.Helper()
	s.Shutdown()
	s.start()
}

// Connect opens a client connection closed when the test ends.
func (s *Server) Connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("natstest: connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Setup connects and creates planex's streams and buckets (in file storage
// under the test's store dir), returning the connection and resources.
func (s *Server) Setup(t testing.TB) (*nats.Conn, *bus.Resources) {
	t.Helper()
	nc := s.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := bus.Setup(ctx, nc, bus.Options{})
	if err != nil {
		t.Fatalf("natstest: setup: %v", err)
	}
	return nc, res
}

// Logger returns a logger that discards output unless -v is set, for code
// under test that needs one.
func Logger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
