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

// ResetRun re-opens a run with the operator role.
func (l *local) ResetRun(ctx context.Context, in *planexv1.ResetRunRequest, _ ...grpc.CallOption) (*planexv1.ResetRunResponse, error) {
	ctx, err := l.authorize(ctx, planexv1.SupervisorService_ResetRun_FullMethodName)
	if err != nil {
		return nil, err
	}
	return l.srv.ResetRun(ctx, in)
}

// ForkRun forks a run with the operator role.
func (l *local) ForkRun(ctx context.Context, in *planexv1.ForkRunRequest, _ ...grpc.CallOption) (*planexv1.ForkRunResponse, error) {
	ctx, err := l.authorize(ctx, planexv1.SupervisorService_ForkRun_FullMethodName)
	if err != nil {
		return nil, err
	}
	return l.srv.ForkRun(ctx, in)
}

// WatchRun runs the server's stream in a goroutine and hands its messages
// over an unbuffered channel; cancelling ctx ends both sides.
func (l *local) WatchRun(ctx context.Context, in *planexv1.WatchRunRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[planexv1.WatchRunResponse], error) {
	actx, err := l.authorize(ctx, planexv1.SupervisorService_WatchRun_FullMethodName)
	if err != nil {
		return nil, err
	}
	return stream(actx, func(s grpc.ServerStreamingServer[planexv1.WatchRunResponse]) error { return l.srv.WatchRun(in, s) }), nil
}

// RunBatch runs a batch with the operator role, streamed like WatchRun.
func (l *local) RunBatch(ctx context.Context, in *planexv1.RunBatchRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[planexv1.RunBatchResponse], error) {
	actx, err := l.authorize(ctx, planexv1.SupervisorService_RunBatch_FullMethodName)
	if err != nil {
		return nil, err
	}
	return stream(actx, func(s grpc.ServerStreamingServer[planexv1.RunBatchResponse]) error { return l.srv.RunBatch(in, s) }), nil
}

// stream runs a server-streaming handler in a goroutine and hands its
// messages to the returned client over an unbuffered channel; cancelling
// ctx ends both sides.
func stream[T any, M interface {
	*T
	proto.Message
}](ctx context.Context, serve func(grpc.ServerStreamingServer[T]) error) grpc.ServerStreamingClient[T] {
	sctx, cancel := context.WithCancel(ctx)
	p := &pipe[T]{ctx: sctx, ch: make(chan *T)}
	go func() {
		defer cancel()
		err := serve(&pipeServer[T, M]{p: p})
		p.err = err
		close(p.ch)
	}()
	return &pipeClient[T, M]{p: p}
}

// pipe connects an in-process server stream to its client.
type pipe[T any] struct {
	ctx context.Context
	ch  chan *T
	err error // written before ch is closed
}

type pipeServer[T any, M interface {
	*T
	proto.Message
}] struct{ p *pipe[T] }

func (s *pipeServer[T, M]) Send(m *T) error {
	select {
	case s.p.ch <- m:
		return nil
	case <-s.p.ctx.Done():
		return status.FromContextError(s.p.ctx.Err()).Err()
	}
}
func (s *pipeServer[T, M]) Context() context.Context     { return s.p.ctx }
func (s *pipeServer[T, M]) SetHeader(metadata.MD) error  { return nil }
func (s *pipeServer[T, M]) SendHeader(metadata.MD) error { return nil }
func (s *pipeServer[T, M]) SetTrailer(metadata.MD)       {}
func (s *pipeServer[T, M]) SendMsg(m any) error {
	r, ok := m.(*T)
	if !ok {
		return status.Errorf(codes.Internal, "send %T on a %T stream", m, r)
	}
	return s.Send(r)
}
func (s *pipeServer[T, M]) RecvMsg(any) error { return io.EOF }

type pipeClient[T any, M interface {
	*T
	proto.Message
}] struct{ p *pipe[T] }

func (c *pipeClient[T, M]) Recv() (*T, error) {
	m, ok := <-c.p.ch
	if !ok {
		if c.p.err != nil {
			return nil, c.p.err
		}
		return nil, io.EOF
	}
	return m, nil
}
func (c *pipeClient[T, M]) Header() (metadata.MD, error) { return metadata.MD{}, nil }
func (c *pipeClient[T, M]) Trailer() metadata.MD         { return metadata.MD{} }
func (c *pipeClient[T, M]) CloseSend() error             { return nil }
func (c *pipeClient[T, M]) Context() context.Context     { return c.p.ctx }
func (c *pipeClient[T, M]) SendMsg(any) error            { return nil }
func (c *pipeClient[T, M]) RecvMsg(m any) error {
	r, ok := m.(*T)
	if !ok {
		return status.Errorf(codes.Internal, "receive %T from a %T stream", m, r)
	}
	got, err := c.Recv()
	if err != nil {
		return err
	}
	proto.Reset(M(r))
	proto.Merge(M(r), M(got))
	return nil
}
