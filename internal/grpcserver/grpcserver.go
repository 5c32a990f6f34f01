// Package grpcserver builds the gRPC server every planex service runs: TLS
// (or explicit plaintext) transport credentials, authentication and
// per-method roles (internal/authn), the standard health service (starting
// NOT_SERVING), server reflection when enabled, OpenTelemetry stats
// handlers, panic recovery and request logging, and a graceful shutdown
// that flips health first, then drains, then stops.
package grpcserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/planex-dev/planex/internal/authn"
)

// Server is a gRPC server with health and reflection.
type Server struct {
	// GRPC is where services register their implementations.
	GRPC   *grpc.Server
	health *health.Server
	logger *slog.Logger

	// known holds the full names of the registered methods, read once at
	// the first call (registration ends before Serve).
	knownOnce sync.Once
	known     map[string]bool
}

// Security is how a server protects itself. The zero value is refused by
// New: plaintext and unauthenticated serving must be chosen explicitly.
type Security struct {
	// Creds are the transport credentials (TLS, or insecure when
	// plaintext was chosen).
	Creds credentials.TransportCredentials
	// Auth authenticates callers; Policy says which role each method
	// needs.
	Auth *authn.Authenticator
	// Policy maps methods to roles; methods not in it need admin.
	Policy authn.Policy
	// Reflection registers server reflection.
	Reflection bool
}

// New returns a server whose health status is NOT_SERVING until SetServing
// is called.
func New(logger *slog.Logger, sec Security, opts ...grpc.ServerOption) (*Server, error) {
	if sec.Creds == nil || sec.Auth == nil {
		return nil, errors.New("grpc server: transport credentials and an authenticator are required")
	}
	s := &Server{logger: logger, health: health.NewServer()}
	base := []grpc.ServerOption{
		grpc.Creds(sec.Creds),
		grpc.StatsHandler(otelgrpc.NewServerHandler()),
		// Recovery first, then authentication: nothing runs for a caller
		// that is not allowed the method. Invalid UTF-8 in a request is
		// InvalidArgument, not Internal.
		grpc.ChainUnaryInterceptor(s.unaryRecover, s.unaryLog, sec.Auth.UnaryInterceptor(sec.Policy), unaryUTF8),
		grpc.ChainStreamInterceptor(s.streamRecover, s.streamAuth(sec), streamUTF8),
		grpc.ForceServerCodecV2(newLenientCodec()),
		// grpc-go answers a method no service registered Unimplemented
		// before any interceptor runs, which let anonymous callers
		// enumerate methods. With this handler such calls take the stream
		// path, whose interceptors authenticate them first (streamAuth).
		grpc.UnknownServiceHandler(unknownMethod),
	}
	s.GRPC = grpc.NewServer(append(base, opts...)...)
	healthpb.RegisterHealthServer(s.GRPC, s.health)
	if sec.Reflection {
		reflection.Register(s.GRPC)
	}
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	return s, nil
}

// SetServing flips the overall status and the status of every registered
// service.
func (s *Server) SetServing(serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	for name := range s.GRPC.GetServiceInfo() {
		s.health.SetServingStatus(name, st)
	}
}

// SetStatus sets the health status of a named component that is not a
// gRPC service (an executor's backend, an MCP server "planex.mcp.<server>"):
// SetServing leaves it alone, so the overall status, which probes restart
// and route on, does not follow it.
func (s *Server) SetStatus(name string, serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus(name, st)
}

// Listen binds addr, with an error naming the flag value on failure.
func Listen(addr string) (net.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on --grpc-addr %s: %w", addr, err)
	}
	return lis, nil
}

// Serve serves on lis until ctx ends, then marks the server NOT_SERVING,
// stops accepting, waits up to grace for in-flight RPCs, and force-stops
// what remains.
func (s *Server) Serve(ctx context.Context, lis net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- s.GRPC.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("grpc serve on %s: %w", lis.Addr(), err)
	case <-ctx.Done():
	}
	s.Shutdown(grace)
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("grpc serve on %s: %w", lis.Addr(), err)
	}
	return nil
}

// Shutdown flips health to NOT_SERVING and stops the server gracefully
// within grace.
func (s *Server) Shutdown(grace time.Duration) {
	s.health.Shutdown() // NOT_SERVING for every service, and stays so.
	done := make(chan struct{})
	go func() {
		s.GRPC.GracefulStop()
		close(done)
	}()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.logger.Warn("grace period over, closing remaining RPCs", "grace", grace)
		s.GRPC.Stop()
		<-done
	}
}

func (s *Server) unaryRecover(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			s.logger.ErrorContext(ctx, "panic in RPC", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
			err = status.Error(codes.Internal, "internal error")
		}
	}()
	return handler(ctx, req)
}

func (s *Server) streamRecover(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s.logger.ErrorContext(ss.Context(), "panic in stream", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
			err = status.Error(codes.Internal, "internal error")
		}
	}()
	return handler(srv, ss)
}

// streamAuth enforces sec.Policy on the streams of registered methods. A
// method no service registered only needs an authenticated caller, who
// then gets Unimplemented: anonymous callers get Unauthenticated whatever
// they call, so they cannot tell which methods exist.
func (s *Server) streamAuth(sec Security) grpc.StreamServerInterceptor {
	enforce := sec.Auth.StreamInterceptor(sec.Policy)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if s.registered(info.FullMethod) {
			return enforce(srv, ss, info, handler)
		}
		if _, err := sec.Auth.AuthenticateCall(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// registered reports whether a service registered method
// ("/pkg.Service/Method").
func (s *Server) registered(method string) bool {
	s.knownOnce.Do(func() {
		s.known = map[string]bool{}
		for svc, info := range s.GRPC.GetServiceInfo() {
			for _, m := range info.Methods {
				s.known["/"+svc+"/"+m.Name] = true
			}
		}
	})
	return s.known[method]
}

// unknownMethod answers a method no service registered, once the caller
// is authenticated.
func unknownMethod(_ any, ss grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(ss)
	return status.Errorf(codes.Unimplemented, "unknown method %s", method)
}

func (s *Server) unaryLog(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	code := status.Code(err)
	level := slog.LevelDebug
	if code != codes.OK && code != codes.NotFound && code != codes.InvalidArgument && code != codes.AlreadyExists && code != codes.Canceled {
		level = slog.LevelWarn
	}
	s.logger.Log(ctx, level, "rpc", "method", info.FullMethod, "code", code.String(), "duration", time.Since(start))
	return resp, err
}

// ServeHealth serves only the health service, in plaintext and without
// authentication, on lis until ctx ends: for probes that cannot present
// TLS (Kubernetes gRPC probes). It reports the same status as the main
// server.
func (s *Server) ServeHealth(ctx context.Context, lis net.Listener) error {
	hs := grpc.NewServer()
	healthpb.RegisterHealthServer(hs, s.health)
	stop := context.AfterFunc(ctx, hs.Stop)
	defer stop()
	if err := hs.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("health serve on %s: %w", lis.Addr(), err)
	}
	return nil
}
