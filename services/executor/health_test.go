package executor_test

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/executor"
)

// TestSMTPOutageReportedInHealth: with the SMTP relay down the email
// replica keeps running and SERVING overall (probes must not restart it),
// reports NOT_SERVING for executor.BackendHealthService, and turns SERVING
// again by itself once the relay is back.
func TestSMTPOutageReportedInHealth(t *testing.T) {
	ns := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	relay := l.Addr().String()
	l.Close() // nobody listens: the relay is down

	addr, stop := serve(t, ctx, defaults(t, "--pool", "email", "--smtp-addr", relay, "--smtp-starttls", "none",
		"--email-allowed-domains", "example.com", "--grpc-addr", "127.0.0.1:0", "--nats-url", ns.URL()))
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	status := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("health %q: %v", svc, err)
		}
		return resp.GetStatus()
	}
	waitFor := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for status(executor.BackendHealthService) != want {
			if got := status(""); got != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("overall health %v during a backend change, want SERVING", got)
			}
			select {
			case <-ctx.Done():
				t.Fatalf("backend health never became %v", want)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	waitFor(healthpb.HealthCheckResponse_NOT_SERVING)

	lis, err := net.Listen("tcp", relay)
	if err != nil {
		t.Fatalf("listen on the relay's address again: %v", err)
	}
	srv := smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) { return sink{}, nil }))
	srv.Domain = "localhost"
	go func() { _ = srv.Serve(lis) }()
	defer srv.Close()
	waitFor(healthpb.HealthCheckResponse_SERVING)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// sink is an SMTP session that accepts and discards everything.
type sink struct{}

func (sink) Mail(string, *smtp.MailOptions) error { return nil }
func (sink) Rcpt(string, *smtp.RcptOptions) error { return nil }
func (sink) Data(r io.Reader) error {
	_, err := io.Copy(io.Discard, r)
	return err
}
func (sink) Reset()        {}
func (sink) Logout() error { return nil }
