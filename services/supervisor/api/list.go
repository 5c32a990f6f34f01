package api

import (
	"context"
	"encoding/base64"
	"errors"
	"slices"
	"strings"
	"sync"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

const (
	defaultPageSize = 50
	maxPageSize     = 500
	pageTokenPrefix = "after:"
)

// ListRuns lists runs newest first, filtered by status, labels and
// req.filter (every condition must hold), each whole (RUN_VIEW_FULL, the
// default) or as the index holds it (RUN_VIEW_BASIC: no run is read, so a
// page costs a scan of memory however cold the runs' storage is).
//
// Runs are selected in memory: the run log keeps a compact summary of
// every run's snapshot in planex-runs (runlog.SearchRuns, fed by a watch
// of the bucket), so a filter that matches few of many runs costs a scan
// of memory, not a read per run; only the page's runs are read, and
// checked against the filter again (a running run is read from its log,
// which may be a few events ahead of its snapshot). Run ids are ULIDs, so
// ids in reverse give newest first, and the page token is the last id
// returned with a short hash of the filter: a token is refused with
// another filter. Until the index is loaded (right after a start), runs
// are read a page at a time newest first and filtered as read. A run
// whose log is corrupt is listed as its last snapshot, with a
// stop_message that names the corruption and keeps the status it had
// (runlog.CorruptListing); GetRun answers DataLoss for it.
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
	basic := false
	switch v := req.GetView(); v {
	case planexv1.RunView_RUN_VIEW_UNSPECIFIED, planexv1.RunView_RUN_VIEW_FULL:
	case planexv1.RunView_RUN_VIEW_BASIC:
		basic = true
	default:
		return nil, invalid("view %d: not a RunView (RUN_VIEW_FULL or RUN_VIEW_BASIC)", v)
	}
	q, err := listQuery(req)
	if err != nil {
		return nil, err
	}
	hash := filterHash(req)
	after := ""
	if tok := req.GetPageToken(); tok != "" {
		if after, err = parsePageToken(tok, hash, req.GetFilter() == nil); err != nil {
			return nil, err
		}
	}
	mask := s.mask(ctx)
	resp := &planexv1.ListRunsResponse{}
	add := func(run *planexv1.Run) bool {
		if len(resp.Runs) == size {
			// One more match exists: there is a next page.
			last := resp.Runs[len(resp.Runs)-1].GetId()
			resp.NextPageToken = encodeToken(last, hash)
			return false
		}
		resp.Runs = append(resp.Runs, mask.run(run))
		return true
	}
	if basic {
		err = s.eachBasic(ctx, q, after, size+1, add)
	} else {
		err = s.eachMatch(ctx, q, after, size+1, add)
	}
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// encodeToken is the page token continuing after run id last with the
// filter of hash ("": a token of servers before filters, for tests).
func encodeToken(last, hash string) string {
	if hash != "" {
		last += ":" + hash
	}
	return base64.RawURLEncoding.EncodeToString([]byte(pageTokenPrefix + last))
}

// parsePageToken returns the run id a page token continues after. A token
// carries the hash of the filter it was made with and is refused with
// another; a token without one (from a server before filters) is taken
// only by a request without filter, as it was then.
func parsePageToken(tok, hash string, legacyOK bool) (string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	rest, ok := strings.CutPrefix(string(raw), pageTokenPrefix)
	if err != nil || !ok {
		return "", invalid("page_token %q: not a token from ListRuns", clip(tok))
	}
	id, got, hashed := strings.Cut(rest, ":")
	switch {
	case !bus.ValidToken(id):
		return "", invalid("page_token %q: not a token from ListRuns", clip(tok))
	case hashed && got != hash, !hashed && !legacyOK:
		return "", invalid("page_token: made for another filter; a token is valid only with the filter of the request that returned it (start again without page_token)")
	}
	return id, nil
}

// eachMatch calls fn with the runs matching q, newest first, among those
// whose id sorts before after ("": all), until fn returns false. It reads
// runs chunk at a time: ids from the index, or every id while the index
// is not loaded.
func (s *Server) eachMatch(ctx context.Context, q *runlog.Query, after string, chunk int, fn func(*planexv1.Run) bool) error {
	for {
		ids, err := s.log.SearchRuns(q, after, chunk)
		if errors.Is(err, runlog.ErrIndexNotReady) {
			return s.scanMatches(ctx, q, after, chunk, fn)
		}
		if err != nil {
			return err
		}
		for _, run := range s.readRuns(ctx, ids) {
			// The index holds snapshots; the run read may be newer.
			if run == nil || !q.MatchRun(run) {
				continue
			}
			if !fn(run) {
				return nil
			}
		}
		if len(ids) < chunk {
			return nil
		}
		after = ids[len(ids)-1]
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// eachBasic is eachMatch for RUN_VIEW_BASIC: the runs' basic views, from
// the index without reading a run, or, while the index is not loaded,
// read and projected (runlog.BasicRun).
func (s *Server) eachBasic(ctx context.Context, q *runlog.Query, after string, chunk int, fn func(*planexv1.Run) bool) error {
	runs, err := s.log.SearchBasic(q, after, chunk)
	if errors.Is(err, runlog.ErrIndexNotReady) {
		return s.scanMatches(ctx, q, after, chunk, func(run *planexv1.Run) bool { return fn(runlog.BasicRun(run)) })
	}
	if err != nil {
		return err
	}
	for _, run := range runs {
		if !fn(run) {
			return nil
		}
	}
	return nil
}

// scanMatches is eachMatch without the index: every run, newest first,
// read chunk at a time and filtered as read.
func (s *Server) scanMatches(ctx context.Context, q *runlog.Query, after string, chunk int, fn func(*planexv1.Run) bool) error {
	ids, err := s.log.RunIDs(ctx)
	if err != nil {
		return err
	}
	end := len(ids)
	if after != "" {
		end, _ = slices.BinarySearch(ids, after)
	}
	// Runs are read a chunk at a time, concurrently: a page of running
	// runs costs one round of reads, not one per run.
	for end > 0 {
		batch := slices.Clone(ids[max(0, end-chunk):end])
		slices.Reverse(batch)
		end -= len(batch)
		for _, run := range s.readRuns(ctx, batch) {
			if run == nil || !q.MatchRun(run) {
				continue
			}
			if !fn(run) {
				return nil
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
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
