package service_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/service"
	"github.com/planex-dev/planex/internal/tlsconfig"
)

// TestHealthFollowsNATS checks the lifecycle promise: SERVING only while
// NATS is connected and the streams exist, NOT_SERVING while it is lost,
// SERVING again after it returns, and a clean return on shutdown with the
// stop function called.
func TestHealthFollowsNATS(t *testing.T) {
	srv := natstest.Start(t)
	ctx, cancel := context.WithCancel(t.Context())
	ready := make(chan net.Addr, 1)
	stopped := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- service.Serve(ctx, service.Params{
			Name:   "test",
			Logger: natstest.Logger(t),
			Common: service.Common{GRPCAddr: "127.0.0.1:0", NATSURL: srv.URL(), ShutdownGrace: 5 * time.Second, StreamReplicas: 1,
				TLS: tlsconfig.Flags{Plaintext: true}, Auth: authn.Config{Disabled: true}},
			Start: func(context.Context, service.Deps) (func(context.Context) error, error) {
				return func(context.Context) error { close(stopped); return nil }, nil
			},
			Ready: func(a net.Addr) { ready <- a },
		})
	}()
	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("Serve returned before ready: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("not ready within 20s")
	}
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	waitFor := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			resp, err := health.Check(t.Context(), &healthpb.HealthCheckRequest{})
			if err == nil && resp.GetStatus() == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("health never became %v (last %v, %v)", want, resp.GetStatus(), err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor(healthpb.HealthCheckResponse_SERVING)
	srv.Shutdown()
	waitFor(healthpb.HealthCheckResponse_NOT_SERVING)
	srv.Restart()
	waitFor(healthpb.HealthCheckResponse_SERVING)

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after cancel: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Serve did not return within 15s of cancellation")
	}
	select {
	case <-stopped:
	default:
		t.Fatal("the service's stop function was not called")
	}
}

func TestCommonValidateNamesFlags(t *testing.T) {
	ok := service.Common{GRPCAddr: "127.0.0.1:7400", NATSURL: "nats://127.0.0.1:4222", ShutdownGrace: time.Second, StreamReplicas: 1,
		TLS: tlsconfig.Flags{Plaintext: true}, Auth: authn.Config{Disabled: true}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	tests := []struct {
		name string
		edit func(*service.Common)
		want string
	}{
		{"grpc addr", func(c *service.Common) { c.GRPCAddr = "nope" }, `--grpc-addr "nope"`},
		{"metrics addr", func(c *service.Common) { c.MetricsAddr = "9090" }, `--metrics-addr "9090"`},
		{"nats url", func(c *service.Common) { c.NATSURL = "http://x" }, `--nats-url "http://x"`},
		{"grace", func(c *service.Common) { c.ShutdownGrace = 0 }, "--shutdown-grace 0s"},
		{"replicas", func(c *service.Common) { c.StreamReplicas = 7 }, "--stream-replicas 7"},
		{"redact pattern", func(c *service.Common) { c.RedactPatterns = []string{"ssn=("} }, `--redact-pattern: redact pattern "ssn"`},
		{"tls not chosen", func(c *service.Common) { c.TLS.Plaintext = false }, "--tls-cert-file and --tls-key-file: required (or --plaintext"},
		{"no way to authenticate", func(c *service.Common) { c.Auth.Disabled = false }, "--auth-*: no way to authenticate callers"},
		{"client auth without CA", func(c *service.Common) {
			c.TLS = tlsconfig.Flags{Files: tlsconfig.Files{CertFile: "c", KeyFile: "k"}, ClientAuth: tlsconfig.ClientAuthRequire}
		}, "--tls-client-auth require: needs --tls-ca-file"},
		{"credentials in NATS URL", func(c *service.Common) { c.NATSURL = "nats://planex:s3cret@127.0.0.1:4222" }, "--nats-url: must not carry credentials"},
		{"two NATS credentials", func(c *service.Common) { c.NATS.TokenFile, c.NATS.NKeySeedFile = "/dev/null", "/dev/null" }, "choose one of --nats-creds-file"},
		{"missing NATS creds file", func(c *service.Common) { c.NATS.CredsFile = "/nonexistent/planex.creds" }, "--nats-creds-file /nonexistent/planex.creds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.edit(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want an error naming %s", err, tt.want)
			}
		})
	}
}
