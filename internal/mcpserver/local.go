package mcpserver

import (
	"context"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
)

// Local is a SupervisorService client that calls srv in the same process
// as id, enforcing authn.SupervisorPolicy the way the gRPC interceptor
// does: a method needs its role (viewer, runner, approver), and the
// handler sees id in its context for its own checks (another's run,
// self-approval). The supervisor's HTTP MCP endpoint uses it.
func Local(srv planexv1.SupervisorServiceServer, id authn.Identity) planexv1.SupervisorServiceClient {
	return &local{srv: srv, id: id}
}

type local struct {
	srv planexv1.SupervisorServiceServer
	id  authn.Identity
}

// authorize applies the policy; a method missing from it needs admin.
func (l *local) authorize(ctx context.Context, method string) (context.Context, error) {
	need, ok := authn.SupervisorPolicy[method]
	if !ok {
		need = authn.RoleAdmin
	}
	if !l.id.Has(need) {
		return nil, authn.Denied()
	}
	return authn.WithIdentity(ctx, l.id), nil
}

func (l *local) StartRun(ctx context.Context, in *planexv1.StartRunRequest, _ ...grpc.CallOption) (*planexv1.StartRunResponse, error) {
	ctx, err := l.authorize(ctx, planexv1.SupervisorService_StartRun_FullMethodName)
	if err != nil {
		return nil, err
	}
	return l.srv.StartRun(ctx, in)
}

func (l *local) GetRun(ctx context.Context, in *planexv1.GetRunRequest, _ ...grpc.CallOption) (*planexv1.GetRunResponse, error) {
	ctx, err := l.authorize(ctx, planexv1.SupervisorService_GetRun_FullMethodName)
	if err != nil {
		return nil, err
	}
	return l.srv.GetRun(ctx, in)
}

func (l *local) ListRuns(ctx context.Context, in *planexv1.ListRunsRequest, _ ...grpc.CallOption) (*planexv1.ListRunsResponse, error) {
	ctx, err := l.authorize(ctx, planexv1.SupervisorService_ListRuns_FullMethodName)
	if err != nil {
		return nil, err
	}
	return l.srv.ListRuns(ctx, in)
}

func (l *local) CancelRun(ctx context.Context, in *planexv1.CancelRunRequest, _ ...grpc.CallOption) (*planexv1.CancelRunResponse, error) {
	ctx, err := l.authorize(ctx, planexv1.SupervisorService_CancelRun_FullMethodName)
	if err != nil {
		return nil, err
	}
	return l.srv.CancelRun(ctx, in)
}

// ListGates lists open gates with the viewer role.
func (l *local) ListGates(ctx context.Context, in *planexv1.ListGatesRequest, _ ...grpc.CallOption) (*planexv1.ListGatesResponse, error) {
	ctx, err := l.authorize(ctx, planexv1.SupervisorService_ListGates_FullMethodName)
	if err != nil {
		return nil, err
	}
	return l.srv.ListGates(ctx, in)
}

func (l *local) Decide(ctx context.Context, in *planexv1.DecideRequest, _ ...grpc.CallOption) (*planexv1.DecideResponse, error) {
	ctx, err := l.authorize(ctx, planexv1.SupervisorService_Decide_FullMethodName)
	if err != nil {
		return nil, err
	}
	return l.srv.Decide(ctx, in)
}

func (l *local) ListTools(ctx context.Context, in *planexv1.ListToolsRequest, _ ...grpc.CallOption) (*planexv1.ListToolsResponse, error) {
	ctx, err := l.authorize(ctx, planexv1.SupervisorService_ListTools_FullMethodName)
	if err != nil {
		return nil, err
	}
	return l.srv.ListTools(ctx, in)
}

// WatchRun runs the server's stream in a goroutine and hands its messages
// over an unbuffered channel; cancelling ctx ends both sides.
func (l *local) WatchRun(ctx context.Context, in *planexv1.WatchRunRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[planexv1.WatchRunResponse], error) {
	actx, err := l.authorize(ctx, planexv1.SupervisorService_WatchRun_FullMethodName)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(actx)
	p := &pipe{ctx: sctx, ch: make(chan *planexv1.WatchRunResponse)}
	go func() {
		defer cancel()
		err := l.srv.WatchRun(in, &pipeServer{p: p})
		p.err = err
		close(p.ch)
	}()
	return &pipeClient{p: p}, nil
}

// pipe connects an in-process server stream to its client.
type pipe struct {
	ctx context.Context
	ch  chan *planexv1.WatchRunResponse
	err error // written before ch is closed
}

type pipeServer struct{ p *pipe }

func (s *pipeServer) Send(m *planexv1.WatchRunResponse) error {
	select {
	case s.p.ch <- m:
		return nil
	case <-s.p.ctx.Done():
		return status.FromContextError(s.p.ctx.Err()).Err()
	}
}
func (s *pipeServer) Context() context.Context     { return s.p.ctx }
func (s *pipeServer) SetHeader(metadata.MD) error  { return nil }
func (s *pipeServer) SendHeader(metadata.MD) error { return nil }
func (s *pipeServer) SetTrailer(metadata.MD)       {}
func (s *pipeServer) SendMsg(m any) error {
	r, ok := m.(*planexv1.WatchRunResponse)
	if !ok {
		return status.Errorf(codes.Internal, "send %T on a WatchRun stream", m)
	}
	return s.Send(r)
}
func (s *pipeServer) RecvMsg(any) error { return io.EOF }

type pipeClient struct{ p *pipe }

func (c *pipeClient) Recv() (*planexv1.WatchRunResponse, error) {
	m, ok := <-c.p.ch
	if !ok {
		if c.p.err != nil {
			return nil, c.p.err
		}
		return nil, io.EOF
	}
	return m, nil
}
func (c *pipeClient) Header() (metadata.MD, error) { return metadata.MD{}, nil }
func (c *pipeClient) Trailer() metadata.MD         { return metadata.MD{} }
func (c *pipeClient) CloseSend() error             { return nil }
func (c *pipeClient) Context() context.Context     { return c.p.ctx }
func (c *pipeClient) SendMsg(any) error            { return nil }
func (c *pipeClient) RecvMsg(m any) error {
	r, ok := m.(*planexv1.WatchRunResponse)
	if !ok {
		return status.Errorf(codes.Internal, "receive %T from a WatchRun stream", m)
	}
	got, err := c.Recv()
	if err != nil {
		return err
	}
	proto.Reset(r)
	proto.Merge(r, got)
	return nil
}
