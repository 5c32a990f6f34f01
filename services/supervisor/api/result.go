package api

import (
	"context"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// maxAnswerResultBytes bounds a stored result GetRun inlines; a larger one
// is answered by reference only (result_ref), below gRPC's default 4 MiB
// receive limit of clients.
const maxAnswerResultBytes = 3 << 20

// withResult returns run with result read from result_ref (from the
// bucket it names, bus.CheckOutputBucket) when the engine stored it in the
// object store (too large for the run log) and it fits
// an answer; otherwise run unchanged.
func (s *Server) withResult(ctx context.Context, run *planexv1.Run) *planexv1.Run {
	ref := run.GetResultRef()
	if ref == nil || run.GetResult() != nil || ref.GetSize() > maxAnswerResultBytes {
		return run
	}
	data, err := s.res.ReadOutput(ctx, ref)
	if err != nil {
		s.logger.WarnContext(ctx, "read stored run result", "run_id", run.GetId(), "object", ref.GetName(), "err", err)
		return run
	}
	v := &structpb.Value{}
	if err := protojson.Unmarshal(data, v); err != nil {
		s.logger.WarnContext(ctx, "decode stored run result", "run_id", run.GetId(), "object", ref.GetName(), "err", err)
		return run
	}
	out := proto.CloneOf(run)
	out.Result = v
	return out
}
