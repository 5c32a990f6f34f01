package api

import (
	"context"
	"slices"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// ListGates lists open gates, oldest first: of one run, or of every run
// waiting at a gate (read from the planex-runs snapshots like ListRuns,
// O(runs retained)).
func (s *Server) ListGates(ctx context.Context, req *planexv1.ListGatesRequest) (*planexv1.ListGatesResponse, error) {
	resp, err := s.listGates(ctx, req)
	return resp, s.status(ctx, "ListGates", err)
}

func (s *Server) listGates(ctx context.Context, req *planexv1.ListGatesRequest) (*planexv1.ListGatesResponse, error) {
	var runs []*planexv1.Run
	if id := req.GetRunId(); id != "" {
		if err := validRunID(id); err != nil {
			return nil, err
		}
		st, err := s.load(ctx, id)
		if err != nil {
			return nil, err
		}
		runs = append(runs, st.Run)
	} else {
		ids, err := s.log.RunIDs(ctx)
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			run, err := s.log.Current(ctx, id)
			if err != nil {
				s.logger.DebugContext(ctx, "ListGates: skipping unreadable snapshot", "run_id", id, "err", err)
				continue
			}
			if run.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING && !runlog.CorruptListing(run) {
				runs = append(runs, run)
			}
		}
	}
	mask := s.mask(ctx)
	resp := &planexv1.ListGatesResponse{}
	for _, run := range runs {
		for _, g := range run.GetGates() {
			if !runlog.GateOpen(run, g) {
				continue
			}
			og := &planexv1.OpenGate{RunId: run.GetId(), Goal: mask.run(run).GetGoal(), Gate: g, StartedBy: run.GetStartedBy()}
			if g.GetKind() != planexv1.GateKind_GATE_KIND_PLAN {
				og.Tool = runlog.PlanStep(run, g.GetStepId()).GetTool()
			}
			resp.Gates = append(resp.Gates, og)
		}
	}
	slices.SortStableFunc(resp.Gates, func(a, b *planexv1.OpenGate) int {
		return a.GetGate().GetOpenedAt().AsTime().Compare(b.GetGate().GetOpenedAt().AsTime())
	})
	return resp, nil
}
