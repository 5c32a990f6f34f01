package supervisor

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/trigger"
)

// triggerRouter is the supervisor's TriggerService: each call goes to the
// triggers of the caller's tenant's cell, like router.
type triggerRouter struct {
	planexv1.UnimplementedTriggerServiceServer
	cells *cells
}

func (r *triggerRouter) target(ctx context.Context) (*triggers, error) {
	name, err := r.cells.tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	c, err := r.cells.cell(name)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if c.parts.triggers == nil {
		return nil, status.Errorf(codes.Unavailable, "tenant %s serves no triggers", name)
	}
	return c.parts.triggers, nil
}

// CreateTrigger creates a trigger of the caller's tenant.
func (r *triggerRouter) CreateTrigger(ctx context.Context, req *planexv1.CreateTriggerRequest) (*planexv1.CreateTriggerResponse, error) {
	t, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return t.CreateTrigger(ctx, req)
}

// GetTrigger reads a trigger of the caller's tenant.
func (r *triggerRouter) GetTrigger(ctx context.Context, req *planexv1.GetTriggerRequest) (*planexv1.GetTriggerResponse, error) {
	t, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return t.GetTrigger(ctx, req)
}

// ListTriggers lists the caller's tenant's triggers.
func (r *triggerRouter) ListTriggers(ctx context.Context, req *planexv1.ListTriggersRequest) (*planexv1.ListTriggersResponse, error) {
	t, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return t.ListTriggers(ctx, req)
}

// UpdateTrigger updates a trigger of the caller's tenant.
func (r *triggerRouter) UpdateTrigger(ctx context.Context, req *planexv1.UpdateTriggerRequest) (*planexv1.UpdateTriggerResponse, error) {
	t, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return t.UpdateTrigger(ctx, req)
}

// DeleteTrigger deletes a trigger of the caller's tenant.
func (r *triggerRouter) DeleteTrigger(ctx context.Context, req *planexv1.DeleteTriggerRequest) (*planexv1.DeleteTriggerResponse, error) {
	t, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return t.DeleteTrigger(ctx, req)
}

// PauseTrigger pauses a trigger of the caller's tenant.
func (r *triggerRouter) PauseTrigger(ctx context.Context, req *planexv1.PauseTriggerRequest) (*planexv1.PauseTriggerResponse, error) {
	t, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return t.PauseTrigger(ctx, req)
}

// ResumeTrigger resumes a trigger of the caller's tenant.
func (r *triggerRouter) ResumeTrigger(ctx context.Context, req *planexv1.ResumeTriggerRequest) (*planexv1.ResumeTriggerResponse, error) {
	t, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return t.ResumeTrigger(ctx, req)
}

// ListTriggerRejections lists rejections of a trigger of the caller's tenant.
func (r *triggerRouter) ListTriggerRejections(ctx context.Context, req *planexv1.ListTriggerRejectionsRequest) (*planexv1.ListTriggerRejectionsResponse, error) {
	t, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return t.ListTriggerRejections(ctx, req)
}

// FireTrigger publishes a test event for a trigger of the caller's tenant.
func (r *triggerRouter) FireTrigger(ctx context.Context, req *planexv1.FireTriggerRequest) (*planexv1.FireTriggerResponse, error) {
	t, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return t.FireTrigger(ctx, req)
}

// errTriggerNotFound and errTriggerConflict are the store's refusals.
var (
	errTriggerNotFound = errors.New("trigger not found")
	errTriggerConflict = errors.New("trigger revision conflict")
)

// cacheWait bounds how long a write waits for the consumer's cache to see
// it (so that an event published after the call is evaluated with it).
const cacheWait = 5 * time.Second

// CreateTrigger stores a new trigger.
func (t *triggers) CreateTrigger(ctx context.Context, req *planexv1.CreateTriggerRequest) (*planexv1.CreateTriggerResponse, error) {
	spec := clean(req.GetTrigger())
	if err := trigger.Validate(spec); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	now := timestamppb.Now()
	spec.CreateTime, spec.UpdateTime = now, now
	b, err := protojson.Marshal(spec)
	if err != nil {
		return nil, t.status(ctx, "CreateTrigger", err)
	}
	rev, err := t.kv.Create(ctx, spec.GetName(), b)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return nil, status.Errorf(codes.AlreadyExists, "trigger %q already exists", spec.GetName())
	}
	if err != nil {
		return nil, t.status(ctx, "CreateTrigger", err)
	}
	spec.Revision = rev
	t.awaitCache(ctx, spec.GetName(), rev)
	t.logger.InfoContext(ctx, "trigger created", "trigger", spec.GetName(), "subject", spec.GetSubject(), "by", caller(ctx))
	spec.Counters = &planexv1.TriggerCounters{}
	return &planexv1.CreateTriggerResponse{Trigger: spec}, nil
}

// GetTrigger returns a trigger with its counters.
func (t *triggers) GetTrigger(ctx context.Context, req *planexv1.GetTriggerRequest) (*planexv1.GetTriggerResponse, error) {
	spec, err := t.get(ctx, req.GetName())
	if err != nil {
		return nil, t.status(ctx, "GetTrigger", err)
	}
	if spec.Counters, err = t.counters(ctx, spec.GetName()); err != nil {
		return nil, t.status(ctx, "GetTrigger", err)
	}
	return &planexv1.GetTriggerResponse{Trigger: spec}, nil
}

// ListTriggers lists the triggers by name, with their counters.
func (t *triggers) ListTriggers(ctx context.Context, _ *planexv1.ListTriggersRequest) (*planexv1.ListTriggersResponse, error) {
	lister, err := t.kv.ListKeys(ctx)
	if err != nil {
		return nil, t.status(ctx, "ListTriggers", err)
	}
	var names []string
	for k := range lister.Keys() {
		names = append(names, k)
	}
	sort.Strings(names)
	out := &planexv1.ListTriggersResponse{}
	for _, n := range names {
		spec, err := t.get(ctx, n)
		if errors.Is(err, errTriggerNotFound) {
			continue // deleted since the listing
		}
		if err != nil {
			return nil, t.status(ctx, "ListTriggers", err)
		}
		if spec.Counters, err = t.counters(ctx, n); err != nil {
			return nil, t.status(ctx, "ListTriggers", err)
		}
		out.Triggers = append(out.Triggers, spec)
	}
	return out, nil
}

// UpdateTrigger replaces a trigger's spec (compare-and-set on revision);
// paused and create_time are kept.
func (t *triggers) UpdateTrigger(ctx context.Context, req *planexv1.UpdateTriggerRequest) (*planexv1.UpdateTriggerResponse, error) {
	spec := clean(req.GetTrigger())
	if err := trigger.Validate(spec); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	want := req.GetTrigger().GetRevision()
	out, err := t.modify(ctx, spec.GetName(), want, func(old *planexv1.Trigger) *planexv1.Trigger {
		spec.Paused, spec.CreateTime = old.GetPaused(), old.GetCreateTime()
		return spec
	})
	if err != nil {
		return nil, t.status(ctx, "UpdateTrigger", err)
	}
	t.logger.InfoContext(ctx, "trigger updated", "trigger", out.GetName(), "by", caller(ctx))
	return &planexv1.UpdateTriggerResponse{Trigger: out}, nil
}

// DeleteTrigger removes a trigger and its outcome and rejection records.
func (t *triggers) DeleteTrigger(ctx context.Context, req *planexv1.DeleteTriggerRequest) (*planexv1.DeleteTriggerResponse, error) {
	if _, err := t.get(ctx, req.GetName()); err != nil {
		return nil, t.status(ctx, "DeleteTrigger", err)
	}
	if err := t.kv.Delete(ctx, req.GetName()); err != nil {
		return nil, t.status(ctx, "DeleteTrigger", err)
	}
	// A trigger created again under the name starts from zero.
	for _, p := range []struct {
		s    jetstream.Stream
		subj string
	}{{t.outcomes, trigger.OutcomesPrefix + req.GetName() + ".*"}, {t.rejected, rejectionsPrefix + req.GetName()}} {
		if err := p.s.Purge(ctx, jetstream.WithPurgeSubject(p.subj)); err != nil {
			t.logger.WarnContext(ctx, "purge a deleted trigger's records", "trigger", req.GetName(), "err", err)
		}
	}
	t.awaitGone(ctx, req.GetName())
	t.logger.InfoContext(ctx, "trigger deleted", "trigger", req.GetName(), "by", caller(ctx))
	return &planexv1.DeleteTriggerResponse{}, nil
}

// PauseTrigger pauses a trigger.
func (t *triggers) PauseTrigger(ctx context.Context, req *planexv1.PauseTriggerRequest) (*planexv1.PauseTriggerResponse, error) {
	out, err := t.setPaused(ctx, req.GetName(), true)
	if err != nil {
		return nil, t.status(ctx, "PauseTrigger", err)
	}
	return &planexv1.PauseTriggerResponse{Trigger: out}, nil
}

// ResumeTrigger resumes a trigger.
func (t *triggers) ResumeTrigger(ctx context.Context, req *planexv1.ResumeTriggerRequest) (*planexv1.ResumeTriggerResponse, error) {
	out, err := t.setPaused(ctx, req.GetName(), false)
	if err != nil {
		return nil, t.status(ctx, "ResumeTrigger", err)
	}
	return &planexv1.ResumeTriggerResponse{Trigger: out}, nil
}

func (t *triggers) setPaused(ctx context.Context, name string, paused bool) (*planexv1.Trigger, error) {
	out, err := t.modify(ctx, name, 0, func(old *planexv1.Trigger) *planexv1.Trigger {
		old.Paused = paused
		return old
	})
	if err == nil {
		t.logger.InfoContext(ctx, "trigger paused or resumed", "trigger", name, "paused", paused, "by", caller(ctx))
	}
	return out, err
}

// ListTriggerRejections lists a trigger's rejections, newest first.
func (t *triggers) ListTriggerRejections(ctx context.Context, req *planexv1.ListTriggerRejectionsRequest) (*planexv1.ListTriggerRejectionsResponse, error) {
	if err := trigger.ValidName(req.GetName()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "name: %v", err)
	}
	limit := int(req.GetLimit())
	switch {
	case limit < 0 || limit > 1000:
		return nil, status.Errorf(codes.InvalidArgument, "limit %d: want 0 (100) to 1000", limit)
	case limit == 0:
		limit = 100
	}
	rs, err := t.rejections(ctx, req.GetName(), limit)
	if err != nil {
		return nil, t.status(ctx, "ListTriggerRejections", err)
	}
	return &planexv1.ListTriggerRejectionsResponse{Rejections: rs}, nil
}

// FireTrigger publishes a test event into the trigger's subject.
func (t *triggers) FireTrigger(ctx context.Context, req *planexv1.FireTriggerRequest) (*planexv1.FireTriggerResponse, error) {
	spec, err := t.get(ctx, req.GetName())
	if err != nil {
		return nil, t.status(ctx, "FireTrigger", err)
	}
	if len(req.GetData()) > trigger.MaxPayload {
		return nil, status.Errorf(codes.InvalidArgument, "data: %d bytes, at most %d", len(req.GetData()), trigger.MaxPayload)
	}
	subject := req.GetSubject()
	switch {
	case subject == "" && trigger.Literal(spec.GetSubject()):
		subject = spec.GetSubject()
	case subject == "":
		return nil, status.Errorf(codes.InvalidArgument, "subject: required, the trigger's subject %q has wildcards", spec.GetSubject())
	case trigger.ValidSubject(subject) != nil || !trigger.Literal(subject) || !trigger.Matches(spec.GetSubject(), subject):
		return nil, status.Errorf(codes.InvalidArgument, "subject %q: want a subject without wildcards that matches %q", clipText(subject), spec.GetSubject())
	}
	ack, err := t.js.Publish(ctx, subject, req.GetData())
	if err != nil {
		return nil, t.status(ctx, "FireTrigger", fmt.Errorf("publish: %w", err))
	}
	t.logger.InfoContext(ctx, "trigger fired", "trigger", spec.GetName(), "subject", subject, "event_sequence", ack.Sequence, "by", caller(ctx))
	return &planexv1.FireTriggerResponse{EventSequence: ack.Sequence, Subject: subject}, nil
}

// get reads a stored trigger.
func (t *triggers) get(ctx context.Context, name string) (*planexv1.Trigger, error) {
	if err := trigger.ValidName(name); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "name: %v", err)
	}
	e, err := t.kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, fmt.Errorf("%w: %q", errTriggerNotFound, name)
	}
	if err != nil {
		return nil, fmt.Errorf("read trigger %q: %w", name, err)
	}
	return decodeTrigger(e)
}

// modify applies change to a stored trigger with compare-and-set (want:
// the revision the caller read, 0: whatever is stored, retried on races).
func (t *triggers) modify(ctx context.Context, name string, want uint64, change func(*planexv1.Trigger) *planexv1.Trigger) (*planexv1.Trigger, error) {
	for range 5 {
		old, err := t.get(ctx, name)
		if err != nil {
			return nil, err
		}
		if want != 0 && want != old.GetRevision() {
			return nil, fmt.Errorf("%w: trigger %q is at revision %d, not %d; read it again", errTriggerConflict, name, old.GetRevision(), want)
		}
		rev := old.GetRevision()
		spec := change(proto.CloneOf(old))
		spec.Revision, spec.Counters, spec.UpdateTime = 0, nil, timestamppb.Now()
		b, err := protojson.Marshal(spec)
		if err != nil {
			return nil, err
		}
		nrev, err := t.kv.Update(ctx, name, b, rev)
		if errors.Is(err, jetstream.ErrKeyExists) {
			if want != 0 {
				return nil, fmt.Errorf("%w: trigger %q changed meanwhile; read it again", errTriggerConflict, name)
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("write trigger %q: %w", name, err)
		}
		spec.Revision = nrev
		t.awaitCache(ctx, name, nrev)
		if spec.Counters, err = t.counters(ctx, name); err != nil {
			return nil, err
		}
		return spec, nil
	}
	return nil, fmt.Errorf("%w: trigger %q keeps changing", errTriggerConflict, name)
}

// awaitCache waits (bounded) until this replica's cache holds revision
// rev of a trigger.
func (t *triggers) awaitCache(ctx context.Context, name string, rev uint64) {
	deadline := time.Now().Add(cacheWait)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		t.mu.RLock()
		c := t.specs[name]
		t.mu.RUnlock()
		if c != nil && c.spec.GetRevision() >= rev {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// awaitGone waits (bounded) until this replica's cache dropped a trigger.
func (t *triggers) awaitGone(ctx context.Context, name string) {
	deadline := time.Now().Add(cacheWait)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		t.mu.RLock()
		_, ok := t.specs[name]
		t.mu.RUnlock()
		if !ok {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// clean is a spec without its output-only fields.
func clean(in *planexv1.Trigger) *planexv1.Trigger {
	if in == nil {
		return nil
	}
	s := proto.CloneOf(in)
	s.Paused, s.Counters, s.Revision, s.CreateTime, s.UpdateTime = false, nil, 0, nil, nil
	return s
}

// status translates a store error for the client, logging what it hides.
func (t *triggers) status(ctx context.Context, method string, err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, errTriggerNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, errTriggerConflict):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	t.logger.ErrorContext(ctx, "trigger service", "method", method, "err", err)
	return status.Errorf(codes.Internal, "%s: the trigger store failed; see the supervisor's log", method)
}

// clipText shortens a client's value for an error message.
func clipText(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
