package grpcserver_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/authn/authntest"
	"github.com/planex-dev/planex/internal/grpcserver"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/tlsconfig"
)

// runGetter answers GetRun.
type runGetter struct {
	planexv1.UnimplementedSupervisorServiceServer
}

func (runGetter) GetRun(_ context.Context, in *planexv1.GetRunRequest) (*planexv1.GetRunResponse, error) {
	return &planexv1.GetRunResponse{Run: &planexv1.Run{Id: in.GetRunId()}}, nil
}

// TestUnknownMethodsAuthenticateFirst reproduces issue 26: an unknown
// gRPC method answered Unimplemented before authentication, so an
// anonymous caller could enumerate methods. Over TLS on loopback, with
// API keys, JWTs and client certificates on: anonymous callers get
// Unauthenticated for unknown methods (of known and unknown services,
// unary and streaming) exactly as for known ones; authenticated callers
// get Unimplemented; known methods keep their roles.
func TestUnknownMethodsAuthenticateFirst(t *testing.T) {
	f := authntest.New(t)
	auth, err := authn.New(t.Context(), authn.Config{APIKeysFile: f.APIKeysFile,
		JWT: authn.JWTConfig{JWKSFile: f.JWKSFile, Issuer: authntest.Issuer, Audience: authntest.Audience, RolesClaim: "roles"}}, natstest.Logger(t))
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
	planexv1.RegisterSupervisorServiceServer(srv.GRPC, runGetter{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis, 2*time.Second) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	addr := lis.Addr().String()
	conns := map[string]*grpc.ClientConn{
		"anonymous":          f.Dial(addr, tlsconfig.Files{}, ""),
		"viewer API key":     f.Dial(addr, tlsconfig.Files{}, f.APIKeys["viewer"]),
		"admin API key":      f.Dial(addr, tlsconfig.Files{}, f.APIKeys["admin"]),
		"JWT without a role": f.Dial(addr, tlsconfig.Files{}, f.Token("nobody", nil, nil)),
		"client certificate": f.Dial(addr, f.ClientCert("abe", "viewer"), ""),
		"invalid API key":    f.Dial(addr, tlsconfig.Files{}, "planex_not-a-key"),
	}
	unary := func(conn *grpc.ClientConn, method string) error {
		return conn.Invoke(t.Context(), method, &emptypb.Empty{}, &emptypb.Empty{})
	}
	stream := func(conn *grpc.ClientConn, method string) error {
		s, err := conn.NewStream(t.Context(), &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method)
		if err != nil {
			return err
		}
		if err := s.CloseSend(); err != nil {
			return err
		}
		return s.RecvMsg(&emptypb.Empty{})
	}
	unknown := []string{
		"/planex.v1.SupervisorService/DeleteEverything",             // unknown method of a known service
		"/planex.v1.AdminService/Shell",                             // unknown service
		"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", // reflection is off
	}
	for who, conn := range conns {
		want := codes.Unimplemented
		if who == "anonymous" || who == "invalid API key" {
			want = codes.Unauthenticated
		}
		for _, m := range unknown {
			for kind, call := range map[string]func(*grpc.ClientConn, string) error{"unary": unary, "stream": stream} {
				err := call(conn, m)
				if status.Code(err) != want {
					t.Errorf("%s, %s %s: %v, want %v", who, kind, m, err, want)
				}
				if want == codes.Unauthenticated && status.Convert(err).Message() != "authentication required" {
					t.Errorf("%s, %s %s: message %q, want the fixed one", who, kind, m, status.Convert(err).Message())
				}
			}
		}
	}

	// Known methods are unchanged.
	getRun := func(conn *grpc.ClientConn) error {
		_, err := planexv1.NewSupervisorServiceClient(conn).GetRun(t.Context(), &planexv1.GetRunRequest{RunId: "r1"})
		return err
	}
	startRun := func(conn *grpc.ClientConn) error {
		_, err := planexv1.NewSupervisorServiceClient(conn).StartRun(t.Context(), &planexv1.StartRunRequest{Goal: "g"})
		return err
	}
	for _, tc := range []struct {
		who  string
		call func(*grpc.ClientConn) error
		want codes.Code
	}{
		{"anonymous", getRun, codes.Unauthenticated},
		{"viewer API key", getRun, codes.OK},
		{"client certificate", getRun, codes.OK},
		{"JWT without a role", getRun, codes.PermissionDenied},
		{"viewer API key", startRun, codes.PermissionDenied},
		{"admin API key", startRun, codes.Unimplemented}, // runGetter does not implement it
	} {
		if err := tc.call(conns[tc.who]); status.Code(err) != tc.want {
			t.Errorf("%s: known method: %v, want %v", tc.who, err, tc.want)
		}
	}
}
