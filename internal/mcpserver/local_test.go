package mcpserver_test

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/mcpserver"
)

// runs is a SupervisorService answering GetRun and streaming n events of
// WatchRun (until the stream's context ends), recording who called.
type runs struct {
	planexv1.UnimplementedSupervisorServiceServer
	n      int
	caller chan authn.Identity
	ended  chan error
}

func (r *runs) GetRun(ctx context.Context, in *planexv1.GetRunRequest) (*planexv1.GetRunResponse, error) {
	id, _ := authn.FromContext(ctx)
	r.caller <- id
	return &planexv1.GetRunResponse{Run: &planexv1.Run{Id: in.GetRunId()}}, nil
}

func (r *runs) WatchRun(in *planexv1.WatchRunRequest, stream grpc.ServerStreamingServer[planexv1.WatchRunResponse]) error {
	for i := range r.n {
		if err := stream.Send(&planexv1.WatchRunResponse{Event: &planexv1.RunEvent{RunId: in.GetRunId(), Sequence: uint64(i + 1)}}); err != nil {
			r.ended <- err
			return err
		}
	}
	r.ended <- nil
	return nil
}

// TestLocalEnforcesThePolicy: the in-process client applies the API's
// roles and hands the identity to the handler.
func TestLocalEnforcesThePolicy(t *testing.T) {
	srv := &runs{n: 3, caller: make(chan authn.Identity, 1), ended: make(chan error, 1)}
	vic := authn.Identity{Subject: "api-key:vic", Roles: []authn.Role{authn.RoleViewer}}
	c := mcpserver.Local(srv, vic)
	ctx := t.Context()

	if _, err := c.GetRun(ctx, &planexv1.GetRunRequest{RunId: "r1"}); err != nil {
		t.Fatal(err)
	}
	if got := <-srv.caller; got.Subject != vic.Subject {
		t.Errorf("the handler saw %+v, want %s", got, vic.Subject)
	}
	for name, call := range map[string]func() error{
		"StartRun":  func() error { _, err := c.StartRun(ctx, &planexv1.StartRunRequest{Goal: "x"}); return err },
		"CancelRun": func() error { _, err := c.CancelRun(ctx, &planexv1.CancelRunRequest{RunId: "r1"}); return err },
		"Decide":    func() error { _, err := c.Decide(ctx, &planexv1.DecideRequest{RunId: "r1"}); return err },
	} {
		if err := call(); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s as viewer: %v, want PermissionDenied", name, err)
		}
	}
	if _, err := mcpserver.Local(srv, authn.Identity{}).GetRun(ctx, &planexv1.GetRunRequest{RunId: "r1"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("GetRun without roles: %v", err)
	}

	stream, err := c.WatchRun(ctx, &planexv1.WatchRunRequest{RunId: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	for want := uint64(1); ; want++ {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			if want != 4 {
				t.Fatalf("EOF after %d events, want 3", want-1)
			}
			break
		}
		if err != nil || resp.GetEvent().GetSequence() != want {
			t.Fatalf("event %d: %v %v", want, resp, err)
		}
	}
	if err := <-srv.ended; err != nil {
		t.Fatal(err)
	}

	// A reader that goes away ends the server's stream.
	srv.n = 1000
	wctx, cancel := context.WithCancel(ctx)
	stream, err = c.WatchRun(wctx, &planexv1.WatchRunRequest{RunId: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-srv.ended; status.Code(err) != codes.Canceled {
		t.Fatalf("server stream after the reader left: %v, want Canceled", err)
	}
}

// BenchmarkNew measures building the MCP server, which the stateless HTTP
// endpoint does once per request.
func BenchmarkNew(b *testing.B) {
	var s *mcp.Server
	for b.Loop() {
		s = mcpserver.New(nil, mcpserver.Options{})
	}
	_ = s
}
