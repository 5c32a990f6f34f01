package chaos

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// Critique is not used: the liveness supervisor runs without a model
// critic.
func (p *oneStepPlanner) Critique(context.Context, *planexv1.CritiqueRequest, ...grpc.CallOption) (*planexv1.CritiqueResponse, error) {
	return nil, status.Error(codes.Unimplemented, "liveness planner: no model critic")
}
