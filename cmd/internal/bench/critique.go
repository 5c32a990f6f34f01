package bench

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// Critique is not used: the benchmark's supervisor runs without a model
// critic.
func (scriptedPlanner) Critique(context.Context, *planexv1.CritiqueRequest, ...grpc.CallOption) (*planexv1.CritiqueResponse, error) {
	return nil, status.Error(codes.Unimplemented, "bench planner: no model critic")
}
