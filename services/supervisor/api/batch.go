package api

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/engine"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// Batch limits and pacing.
const (
	maxBatchSample   = 20
	batchWorkers     = 8
	batchEvery       = 100                    // items per progress message at most
	batchTick        = 250 * time.Millisecond // a progress message at least this often
	maxBatchIDLength = 64
)

var batchIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Batch item outcomes (BatchItem.outcome).
const (
	outcomeDone    = "done"
	outcomeSkipped = "skipped"
	outcomeFailed  = "failed"
)

// RunBatch cancels, decides or resets every run a filter selects (see
// RunBatchRequest). A dry run answers the count and a sample; the real
// batch must be confirmed with that count (expected_count) and streams
// its progress: a message at least every 100 runs or 250 ms, then a last
// one with finished set. Each run's outcome is an item: done, skipped
// (nothing to do) or failed with why — a run the caller may not act on
// (self-approval, a gate's approvers) is a failed item, not a failed
// batch.
//
// Each operation is idempotent, so a batch run again with the same
// batch_id skips what it already did:
//   - cancel: a finished run is skipped, and the cancel kick's message id
//     is the run's (as CancelRun's), deduplicated by the engine inbox;
//   - decide: only open gates are decided, and a decision's message id is
//     "<run>:decide:<gate>", so a gate decided by the first pass is closed
//     (the run is skipped) or its decision deduplicated;
//   - reset: only finished runs are reset, with request id
//     "batch-<batch_id>", which ResetRun deduplicates.
//
// The cancel reason, decision comment and reset are recorded in each
// run's log with the batch id ("batch <id>: <reason>", via "batch <id>").
func (s *Server) RunBatch(req *planexv1.RunBatchRequest, stream grpc.ServerStreamingServer[planexv1.RunBatchResponse]) error {
	ctx := stream.Context()
	return s.status(ctx, "RunBatch", s.runBatch(ctx, req, stream.Send))
}

// batchOp is a validated batch operation on one run.
type batchOp func(ctx context.Context, runID string) (*planexv1.BatchItem, error)

func (s *Server) runBatch(ctx context.Context, req *planexv1.RunBatchRequest, send func(*planexv1.RunBatchResponse) error) error {
	if emptyFilter(req.GetFilter()) {
		return invalid("filter: empty: a batch needs at least one condition; to mean every run, set created_before")
	}
	q, err := compileFilter(req.GetFilter(), "filter.")
	if err != nil {
		return err
	}
	batchID := req.GetBatchId()
	switch {
	case batchID == "":
		batchID = ulid.Make().String()
	case len(batchID) > maxBatchIDLength || !batchIDRE.MatchString(batchID):
		return invalid("batch_id %q: want 1 to %d of [A-Za-z0-9_-]", clip(batchID), maxBatchIDLength)
	}
	if err := checkText("actor", req.GetActor(), maxActorBytes); err != nil {
		return err
	}
	if !req.GetDryRun() && req.GetReason() == "" {
		return invalid("reason: required: say why (it is recorded in each run's log)")
	}
	if err := checkText("reason", req.GetReason(), maxReasonBytes); err != nil {
		return err
	}
	note := "batch " + batchID + ": " + req.GetReason()
	var (
		op      batchOp
		cancels = &cancelled{}
		opName  string
	)
	switch o := req.GetOperation().(type) {
	case *planexv1.RunBatchRequest_Cancel:
		opName = "cancel"
		op = func(ctx context.Context, id string) (*planexv1.BatchItem, error) {
			return s.batchCancel(ctx, id, note, cancels)
		}
	case *planexv1.RunBatchRequest_Decide:
		opName = "decide"
		d := o.Decide
		switch d.GetDecision() {
		case planexv1.DecisionKind_DECISION_KIND_APPROVE, planexv1.DecisionKind_DECISION_KIND_REJECT:
		default:
			return invalid("decide.decision %s: want DECISION_KIND_APPROVE or DECISION_KIND_REJECT (an edit needs each gate's arguments: use Decide)", d.GetDecision())
		}
		if d.GetStopRun() && d.GetDecision() != planexv1.DecisionKind_DECISION_KIND_REJECT {
			return invalid("decide.stop_run: only allowed with DECISION_KIND_REJECT")
		}
		op = func(ctx context.Context, id string) (*planexv1.BatchItem, error) {
			return s.batchDecide(ctx, id, d, note, req.GetActor(), batchID)
		}
	case *planexv1.RunBatchRequest_Reset_:
		opName = "reset"
		r := o.Reset_
		op = func(ctx context.Context, id string) (*planexv1.BatchItem, error) {
			return s.batchReset(ctx, id, r, req, batchID)
		}
	default:
		return invalid("operation: required: cancel, decide or reset")
	}
	ids, err := s.matchIDs(ctx, q)
	if err != nil {
		return err
	}
	resp := &planexv1.RunBatchResponse{BatchId: batchID, Matched: int64(len(ids))}
	if req.GetDryRun() {
		resp.DryRun, resp.Finished = true, true
		resp.SampleRunIds = ids[:min(len(ids), maxBatchSample)]
		return send(resp)
	}
	switch want := req.GetExpectedCount(); {
	case want < 0:
		return invalid("expected_count %d: must not be negative", want)
	case want == 0 && len(ids) > 0:
		return invalid("expected_count: required: the filter selects %d runs; run the dry run first and confirm its count", len(ids))
	case want != int64(len(ids)):
		return &preconditionError{msg: fmt.Sprintf("the filter now selects %d runs, not %d: run the dry run again", len(ids), want)}
	}
	s.logger.InfoContext(ctx, "run batch", "batch_id", batchID, "operation", opName, "runs", len(ids), "caller", startedBy(ctx))
	return s.applyBatch(ctx, ids, op, resp, send, cancels)
}

// matchIDs returns the ids of every run q selects, newest first.
func (s *Server) matchIDs(ctx context.Context, q *runlog.Query) ([]string, error) {
	ids, err := s.log.SearchRuns(q, "", 0)
	if !errors.Is(err, runlog.ErrIndexNotReady) {
		return ids, err
	}
	ids = nil
	err = s.scanMatches(ctx, q, "", listReaders*4, func(run *planexv1.Run) bool {
		ids = append(ids, run.GetId())
		return true
	})
	return ids, err
}

// applyBatch runs op on every id (batchWorkers at a time), sending
// progress, then waits (bounded) for the runs it asked to cancel.
func (s *Server) applyBatch(ctx context.Context, ids []string, op batchOp, resp *planexv1.RunBatchResponse,
	send func(*planexv1.RunBatchResponse) error, cancels *cancelled) error {
	work := make(chan string)
	items := make(chan *planexv1.BatchItem)
	var wg sync.WaitGroup
	for range min(batchWorkers, len(ids)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				item, err := op(ctx, id)
				if err != nil {
					item = &planexv1.BatchItem{RunId: id, Outcome: outcomeFailed, Message: s.itemMessage(ctx, id, err)}
				}
				items <- item
			}
		}()
	}
	go func() {
		defer close(work)
		for _, id := range ids {
			select {
			case work <- id:
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() {
		wg.Wait()
		close(items)
	}()
	tick := time.NewTicker(batchTick)
	defer tick.Stop()
	flush := func() error {
		err := send(resp)
		resp.Items = nil
		return err
	}
	var sendErr error
	for open := true; open; {
		select {
		case item, ok := <-items:
			if !ok {
				open = false
				break
			}
			resp.Done++
			if item.GetOutcome() == outcomeFailed {
				resp.Failed++
			}
			resp.Items = append(resp.Items, item)
			if len(resp.Items) >= batchEvery && sendErr == nil {
				sendErr = flush()
			}
		case <-tick.C:
			if sendErr == nil {
				sendErr = flush()
			}
		}
	}
	if sendErr != nil {
		return fmt.Errorf("%w: %w", errClientGone, sendErr)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.awaitCancels(ctx, cancels.ids())
	resp.Finished = true
	return send(resp)
}

// itemMessage is what a batch item says of a run's error: the client-safe
// message status would send, and for a refusal why (the caller is an
// operator and the rule is the run's: self-approval, a gate's approvers).
func (s *Server) itemMessage(ctx context.Context, runID string, err error) string {
	var den *deniedError
	if errors.As(err, &den) {
		if den.public != "" {
			return "permission denied: " + den.public
		}
		return "permission denied: " + den.msg
	}
	st := s.status(ctx, "RunBatch", fmt.Errorf("run %s: %w", runID, err))
	if m := grpcMessage(st); m != "" {
		return m
	}
	return err.Error()
}

// grpcMessage is the message of a gRPC status error.
func grpcMessage(err error) string { return status.Convert(err).Message() }

// cancelled collects the runs a batch asked to cancel.
type cancelled struct {
	mu   sync.Mutex
	runs []string
}

func (c *cancelled) add(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runs = append(c.runs, id)
}

func (c *cancelled) ids() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs
}

// batchCancel asks the engine to cancel a run, as CancelRun does, without
// waiting for it (applyBatch waits for the whole batch at the end).
func (s *Server) batchCancel(ctx context.Context, id, note string, c *cancelled) (*planexv1.BatchItem, error) {
	st, err := s.load(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := checkCancel(ctx, st.Run); err != nil {
		return nil, err
	}
	if runlog.Terminal(st.Run.GetStatus()) {
		return &planexv1.BatchItem{RunId: id, Outcome: outcomeSkipped, Message: "already finished (" + st.Run.GetStatus().String() + ")"}, nil
	}
	_, err = bus.Publish(engine.RunContext(ctx, st.TraceContext), s.res.JS, bus.Publication{
		Subject: bus.EngineSubject(id, bus.KindKick),
		Msg:     &planexv1.EngineKick{RunId: id, Reason: "cancel", Cancel: true, CancelReason: note},
		MsgID:   bus.MsgID(id, "cancel"),
		Attrs:   []attribute.KeyValue{attribute.String("planex.run_id", id)},
	})
	if err != nil {
		return nil, fmt.Errorf("publish cancel of run %s: %w", id, err)
	}
	c.add(id)
	return &planexv1.BatchItem{RunId: id, Outcome: outcomeDone, Message: "cancel requested"}, nil
}

// awaitCancels waits, bounded by the API's wait (Config.Wait) for the
// whole batch, until the runs are finished.
func (s *Server) awaitCancels(ctx context.Context, ids []string) {
	deadline := time.Now().Add(s.cfg.Wait)
	delay := 10 * time.Millisecond
	for len(ids) > 0 && time.Now().Before(deadline) {
		var left []string
		for _, id := range ids {
			st, err := s.log.Load(ctx, id)
			if err == nil && !runlog.Terminal(st.Run.GetStatus()) {
				left = append(left, id)
			}
		}
		ids = left
		if len(ids) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
	if len(ids) > 0 {
		s.logger.WarnContext(ctx, "run batch: runs not cancelled yet when the wait ended", "runs", len(ids), "wait", s.cfg.Wait)
	}
}

// batchDecide decides every open gate of a run through decideVia, with
// the caller's authorization (self-approval, the gates' approvers).
func (s *Server) batchDecide(ctx context.Context, id string, d *planexv1.BatchDecide, note, actor, batchID string) (*planexv1.BatchItem, error) {
	st, err := s.load(ctx, id)
	if err != nil {
		return nil, err
	}
	var decisions []*planexv1.GateDecision
	for _, g := range st.Run.GetGates() {
		if runlog.GateOpen(st.Run, g) {
			decisions = append(decisions, &planexv1.GateDecision{GateId: g.GetId(), Decision: d.GetDecision(), Comment: note, StopRun: d.GetStopRun()})
		}
	}
	if len(decisions) == 0 {
		return &planexv1.BatchItem{RunId: id, Outcome: outcomeSkipped, Message: "no open gate"}, nil
	}
	_, err = s.decideVia(ctx, &planexv1.DecideRequest{RunId: id, Decisions: decisions, Actor: actor, Via: "batch " + batchID})
	if err != nil {
		return nil, err
	}
	return &planexv1.BatchItem{RunId: id, Outcome: outcomeDone, Message: fmt.Sprintf("%d gate(s) decided", len(decisions))}, nil
}

// batchReset resets a finished run (resetRun); a live run is skipped.
func (s *Server) batchReset(ctx context.Context, id string, r *planexv1.BatchReset, req *planexv1.RunBatchRequest, batchID string) (*planexv1.BatchItem, error) {
	st, err := s.load(ctx, id)
	if err != nil {
		return nil, err
	}
	if !runlog.Terminal(st.Run.GetStatus()) {
		return &planexv1.BatchItem{RunId: id, Outcome: outcomeSkipped, Message: "not finished (" + st.Run.GetStatus().String() + ")"}, nil
	}
	if _, err := s.resetRun(ctx, &planexv1.ResetRunRequest{
		RunId: id, Reason: req.GetReason(), Replan: r.GetReplan(), RequestId: "batch-" + batchID, Actor: req.GetActor(),
	}, batchID); err != nil {
		return nil, err
	}
	return &planexv1.BatchItem{RunId: id, Outcome: outcomeDone, Message: "reset"}, nil
}
