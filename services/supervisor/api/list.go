package api

import (
	"context"
	"encoding/base64"
	"slices"
	"strings"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
)

const (
	defaultPageSize = 50
	maxPageSize     = 500
	pageTokenPrefix = "after:"
)

// ListRuns lists runs newest first, filtered by status and labels.
//
// It reads the run snapshots in planex-runs: run ids are ULIDs, so sorting
// the bucket's keys in reverse gives newest first, and the page token is the
// last id returned. Each call lists every key (O(runs retained), bounded by
// the events retention) and reads snapshots until the page is full, so it
// suits operators and dashboards, not high-rate polling. A snapshot may lag
// its log by a few events, but never by a status change made by a live
// supervisor; GetRun reads the log itself.
func (s *Server) ListRuns(ctx context.Context, req *planexv1.ListRunsRequest) (*planexv1.ListRunsResponse, error) {
	resp, err := s.listRuns(ctx, req)
	return resp, s.status(ctx, "ListRuns", err)
}

func (s *Server) listRuns(ctx context.Context, req *planexv1.ListRunsRequest) (*planexv1.ListRunsResponse, error) {
	size := int(req.GetPageSize())
	switch {
	case size < 0:
		return nil, invalid("page_size %d: must not be negative", size)
	case size == 0:
		size = defaultPageSize
	case size > maxPageSize:
		size = maxPageSize
	}
	after := ""
	if tok := req.GetPageToken(); tok != "" {
		raw, err := base64.RawURLEncoding.DecodeString(tok)
		id, ok := strings.CutPrefix(string(raw), pageTokenPrefix)
		if err != nil || !ok || !bus.ValidToken(id) {
			return nil, invalid("page_token %q: not a token from ListRuns", clip(tok))
		}
		after = id
	}
	statuses := map[planexv1.RunStatus]bool{}
	for _, st := range req.GetStatuses() {
		if _, ok := planexv1.RunStatus_name[int32(st)]; !ok || st == planexv1.RunStatus_RUN_STATUS_UNSPECIFIED {
			return nil, invalid("statuses: %d is not a run status", st)
		}
		statuses[st] = true
	}
	mask := s.mask(ctx)
	ids, err := s.log.RunIDs(ctx)
	if err != nil {
		return nil, err
	}
	slices.Sort(ids)
	slices.Reverse(ids)
	resp := &planexv1.ListRunsResponse{}
	for _, id := range ids {
		if after != "" && id >= after {
			continue
		}
		run, err := s.log.Current(ctx, id)
		if err != nil {
			s.logger.DebugContext(ctx, "ListRuns: skipping unreadable snapshot", "run_id", id, "err", err)
			continue
		}
		if !matches(run, statuses, req.GetLabels()) {
			continue
		}
		if len(resp.Runs) == size {
			// One more match exists: there is a next page.
			last := resp.Runs[len(resp.Runs)-1].GetId()
			resp.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(pageTokenPrefix + last))
			break
		}
		resp.Runs = append(resp.Runs, mask.run(run))
	}
	return resp, nil
}

func matches(run *planexv1.Run, statuses map[planexv1.RunStatus]bool, labels map[string]string) bool {
	if len(statuses) > 0 && !statuses[run.GetStatus()] {
		return false
	}
	for k, v := range labels {
		if got, ok := run.GetLabels()[k]; !ok || got != v {
			return false
		}
	}
	return true
}
