package runner

import (
	"context"
	"errors"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// Service implements planexv1.ExecutorServiceServer over a Runner.
type Service struct {
	planexv1.UnimplementedExecutorServiceServer
	r      *Runner
	logger *slog.Logger
}

// NewService returns the gRPC service of r.
func NewService(r *Runner, logger *slog.Logger) *Service {
	return &Service{r: r, logger: logger}
}

// Describe lists the pool's tools and the replica id.
func (s *Service) Describe(context.Context, *planexv1.DescribeRequest) (*planexv1.DescribeResponse, error) {
	return &planexv1.DescribeResponse{Pool: s.r.Pool(), Tools: s.r.Specs(), ExecutorId: s.r.ID()}, nil
}

// Execute runs one step directly. Tool failures are reported in the
// result; only a malformed request or an unreachable JetStream is a gRPC
// error.
func (s *Service) Execute(ctx context.Context, req *planexv1.ExecuteRequest) (*planexv1.ExecuteResponse, error) {
	if req.GetStep() == nil {
		return nil, status.Error(codes.InvalidArgument, "step: required")
	}
	res, err := s.r.Execute(ctx, req.GetStep())
	switch {
	case errors.Is(err, ErrBadRequest):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case err != nil:
		s.logger.ErrorContext(ctx, "execute step", "tool", req.GetStep().GetTool(), "err", err)
		return nil, status.Error(codes.Unavailable, "executor could not reach JetStream; retry later")
	}
	return &planexv1.ExecuteResponse{Result: res}, nil
}
