package grpcserver_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/authn/authntest"
	"github.com/planex-dev/planex/internal/grpcserver"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/tlsconfig"
)

// panicky panics in GetRun to exercise the recovery interceptor.
type panicky struct {
	planexv1.UnimplementedSupervisorServiceServer
}

func (panicky) GetRun(context.Context, *planexv1.GetRunRequest) (*planexv1.GetRunResponse, error) {
	panic("boom")
}

func TestHealthRecoveryAndShutdown(t *testing.T) {
	auth, err := authn.New(t.Context(), authn.Config{Disabled: true}, natstest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := grpcserver.New(natstest.Logger(t), grpcserver.Security{Creds: insecure.NewCredentials(), Auth: auth, Policy: authn.ServicePolicy(true, false)})
	if err != nil {
		t.Fatal(err)
	}
	planexv1.RegisterSupervisorServiceServer(srv.GRPC, panicky{})
	lis := bufconn.Listen(1 << 20)
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis, 2*time.Second) }()

	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	check := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		resp, err := health.Check(t.Context(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("health check %q: %v", svc, err)
		}
		return resp.GetStatus()
	}
	if got := check(""); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("initial health = %v, want NOT_SERVING", got)
	}
	srv.SetServing(true)
	for _, svc := range []string{"", "planex.v1.SupervisorService"} {
		if got := check(svc); got != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q after SetServing(true) = %v", svc, got)
		}
	}

	_, err = planexv1.NewSupervisorServiceClient(conn).GetRun(t.Context(), &planexv1.GetRunRequest{RunId: "x"})
	if status.Code(err) != codes.Internal || status.Convert(err).Message() != "internal error" {
		t.Fatalf("panicking handler: %v, want Internal with a safe message", err)
	}
	if got := check(""); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("server unhealthy after a recovered panic: %v", got)
	}

	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve after shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return within 5s of cancellation")
	}
}

func TestListenNamesTheFlag(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = grpcserver.Listen(l.Addr().String())
	if err == nil || !strings.Contains(err.Error(), "--grpc-addr "+l.Addr().String()) {
		t.Fatalf("Listen on a busy port: %v", err)
	}
}

// TestServeHealthPlaintext: a TLS, authenticated server also answers
// health checks in plaintext on the probe listener, with its status.
func TestServeHealthPlaintext(t *testing.T) {
	f := authntest.New(t)
	auth, err := authn.New(t.Context(), authn.Config{APIKeysFile: f.APIKeysFile}, natstest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	creds, err := tlsconfig.Flags{Files: f.Server}.ServerCredentials()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := grpcserver.New(natstest.Logger(t), grpcserver.Security{Creds: creds, Auth: auth, Policy: authn.ServicePolicy(true, false)})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- srv.ServeHealth(ctx, lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	srv.SetServing(true)
	resp, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("plaintext health: %v %v", resp, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("ServeHealth: %v", err)
	}
}
