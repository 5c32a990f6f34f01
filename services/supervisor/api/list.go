package api

import (
	"context"
	"encoding/base64"
	"slices"
	"strings"
	"sync"

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
// It reads the run snapshots in planex-runs: run ids are ULIDs, so the
// sorted ids in reverse give newest first, and the page token is the last
// id returned. The ids come from an index the run log keeps in memory from
// a watch of the bucket (runlog.Log.RunIDs); snapshots are read a page at
// a time, concurrently, until the page is full — so a first page costs the
// same with a hundred runs or a hundred thousand, but a filter that
// matches few runs reads many. A snapshot may lag
// its log by a few events, but never by a status change made by a live
// supervisor; GetRun reads the log itself. A run whose log is corrupt is
// listed as its last snapshot, with a stop_message that names the
// corruption and keeps the status it had (runlog.CorruptListing); GetRun
// answers DataLoss for it.
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
	// Newest first, after the page token.
	end := len(ids)
	if after != "" {
		end, _ = slices.BinarySearch(ids, after)
	}
	resp := &planexv1.ListRunsResponse{}
	// Runs are read a page (plus one) at a time, concurrently: a page of
	// running runs costs one round of reads, not one per run.
	for end > 0 {
		batch := slices.Clone(ids[max(0, end-(size+1)):end])
		slices.Reverse(batch)
		end -= len(batch)
		runs := s.readRuns(ctx, batch)
		for _, run := range runs {
			if run == nil || !matches(run, statuses, req.GetLabels()) {
				continue
			}
			if len(resp.Runs) == size {
				// One more match exists: there is a next page.
				last := resp.Runs[len(resp.Runs)-1].GetId()
				resp.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(pageTokenPrefix + last))
				return resp, nil
			}
			resp.Runs = append(resp.Runs, mask.run(run))
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// listReaders bounds the concurrent reads of one ListRuns call.
const listReaders = 16

// readRuns reads the runs of ids (snapshot, or log for a running run)
// concurrently; an unreadable one is nil.
func (s *Server) readRuns(ctx context.Context, ids []string) []*planexv1.Run {
	runs := make([]*planexv1.Run, len(ids))
	sem := make(chan struct{}, listReaders)
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			run, err := s.log.Current(ctx, id)
			if err != nil {
				s.logger.DebugContext(ctx, "ListRuns: skipping unreadable snapshot", "run_id", id, "err", err)
				return
			}
			runs[i] = run
		}()
	}
	wg.Wait()
	return runs
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
