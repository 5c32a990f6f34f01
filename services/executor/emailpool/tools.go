package emailpool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	gomail "github.com/wneessen/go-mail"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/executor/runner"
)

// Version is reported in the tool specs.
const Version = "1"

// newDraftTool is email.draft.
func newDraftTool(p *Pool, b *runner.SchemaBuilder) runner.Tool {
	addrs := map[string]any{"type": "array", "maxItems": p.cfg.MaxRecipients, "items": map[string]any{"type": "string", "minLength": 3, "maxLength": 254}}
	to := map[string]any{"type": "array", "minItems": 1, "maxItems": p.cfg.MaxRecipients, "items": map[string]any{"type": "string", "minLength": 3, "maxLength": 254}}
	return runner.NewTool(&planexv1.ToolSpec{
		Name: "email.draft",
		Pool: "email",
		Description: fmt.Sprintf("Stores a plain-text email for review and returns {draft_id, to, subject, size}; send it with email.send. "+
			"Recipients must be in the allowed domains (%s); at most %d recipients, %d bytes of subject and %d bytes of body.",
			strings.Join(p.allowed, ", "), p.cfg.MaxRecipients, p.cfg.MaxSubjectBytes, p.cfg.MaxBodyBytes),
		ArgsSchema: b.Of(map[string]any{
			"type": "object",
			"properties": map[string]any{
				"to":      to,
				"cc":      addrs,
				"subject": map[string]any{"type": "string", "minLength": 1, "maxLength": p.cfg.MaxSubjectBytes},
				"body":    map[string]any{"type": "string", "maxLength": p.cfg.MaxBodyBytes},
			},
			"required":             []any{"to", "subject", "body"},
			"additionalProperties": false,
		}),
		OutputSchema: b.Of(map[string]any{
			"type": "object",
			"properties": map[string]any{
				"draft_id": map[string]any{"type": "string"},
				"to":       map[string]any{"type": "array", "items": map[string]any{"type": "string"}},
				"subject":  map[string]any{"type": "string"},
				"size":     map[string]any{"type": "integer", "description": "size of the rendered message in bytes"},
			},
		}),
		SideEffect:      planexv1.SideEffect_SIDE_EFFECT_WRITE,
		DefaultTimeout:  durationpb.New(10 * time.Second),
		Idempotent:      true,
		SensitiveFields: []string{"to", "cc", "body"},
		Version:         Version,
	}, p.runDraft)
}

func (p *Pool) runDraft(ctx context.Context, c runner.Call) (any, error) {
	ctx, span := p.tracer.Start(ctx, "email draft")
	defer span.End()
	f := c.Args.GetFields()
	d := &Draft{
		ID:        "d-" + attemptHash(c.RunID, c.StepID, c.Attempt)[:24],
		Subject:   f["subject"].GetStringValue(),
		Body:      f["body"].GetStringValue(),
		CreatedAt: time.Now().UTC(),
		RunID:     c.RunID,
		StepID:    c.StepID,
		Attempt:   c.Attempt,
	}
	var terr *runner.Error
	if d.To, terr = p.recipients("args.to", f["to"], nil); terr != nil {
		return nil, terr
	}
	if d.Cc, terr = p.recipients("args.cc", f["cc"], d.To); terr != nil {
		return nil, terr
	}
	if terr := p.checkContent(d); terr != nil {
		return nil, terr
	}
	msg, err := p.render(d, "")
	if err != nil {
		return nil, runner.InvalidArgument("args", "%v", err)
	}
	size, err := renderedSize(msg)
	if err != nil {
		return nil, err
	}
	if err := p.drafts.create(ctx, d); err != nil {
		if !errors.Is(err, errDraftExists) {
			return nil, bucketDown(err)
		}
		// The attempt ran before (its answer was lost): the draft it wrote
		// is the answer, provided it holds the same message.
		prev, _, gerr := p.drafts.get(ctx, d.ID)
		if gerr != nil {
			return nil, bucketDown(gerr)
		}
		if !prev.sameContent(d) {
			return nil, runner.Failed(err, "draft %q of run %s, step %s, attempt %d already exists with another message; a repeated attempt must carry the same arguments",
				d.ID, c.RunID, c.StepID, c.Attempt)
		}
	}
	out := map[string]any{"draft_id": d.ID, "to": d.To, "subject": d.Subject, "size": size}
	if len(d.Cc) > 0 {
		out["cc"] = d.Cc
	}
	return out, nil
}

// recipients checks a list of addresses; seen are addresses already in
// the message (cc duplicates of to are dropped).
func (p *Pool) recipients(field string, v *structpb.Value, seen []string) ([]string, *runner.Error) {
	list := v.GetListValue().GetValues()
	out := make([]string, 0, len(list))
	for i, a := range list {
		addr, terr := p.checkRecipient(fmt.Sprintf("%s[%d]", field, i), a.GetStringValue())
		if terr != nil {
			return nil, terr
		}
		same := func(s string) bool { return strings.EqualFold(s, addr) }
		if !slices.ContainsFunc(seen, same) && !slices.ContainsFunc(out, same) {
			out = append(out, addr)
		}
	}
	if n := len(seen) + len(out); n > p.cfg.MaxRecipients {
		return nil, runner.InvalidArgument(field, "%d recipients in total exceed the limit of %d", n, p.cfg.MaxRecipients)
	}
	return out, nil
}

// checkContent enforces the size limits and header safety of a draft.
func (p *Pool) checkContent(d *Draft) *runner.Error {
	switch {
	case strings.TrimSpace(d.Subject) == "":
		return runner.InvalidArgument("args.subject", "must not be empty")
	case len(d.Subject) > p.cfg.MaxSubjectBytes:
		return runner.InvalidArgument("args.subject", "%d bytes exceed the limit of %d", len(d.Subject), p.cfg.MaxSubjectBytes)
	case strings.ContainsAny(d.Subject, "\r\n"):
		return runner.InvalidArgument("args.subject", "must be one line (no CR or LF)")
	case !utf8.ValidString(d.Subject) || !utf8.ValidString(d.Body):
		return runner.InvalidArgument("args", "subject and body must be valid UTF-8")
	case len(d.Body) > p.cfg.MaxBodyBytes:
		return runner.InvalidArgument("args.body", "%d bytes exceed the limit of %d", len(d.Body), p.cfg.MaxBodyBytes)
	}
	return nil
}

// newSendTool is email.send.
func newSendTool(p *Pool, b *runner.SchemaBuilder) runner.Tool {
	how := "through the SMTP relay"
	if p.cfg.OutboxDir != "" {
		how = "into the local dev outbox"
	}
	return runner.NewTool(&planexv1.ToolSpec{
		Name: "email.send",
		Pool: "email",
		Description: "Sends a draft stored by email.draft " + how + " and returns {message_id, accepted, sent_at}. " +
			"Cannot be undone; requires approval; a draft is sent at most once.",
		ArgsSchema: b.Of(map[string]any{
			"type":                 "object",
			"properties":           map[string]any{"draft_id": map[string]any{"type": "string", "pattern": draftIDRE.String()}},
			"required":             []any{"draft_id"},
			"additionalProperties": false,
		}),
		OutputSchema: b.Of(map[string]any{
			"type": "object",
			"properties": map[string]any{
				"message_id": map[string]any{"type": "string"},
				"accepted":   map[string]any{"type": "array", "items": map[string]any{"type": "string"}},
				"sent_at":    map[string]any{"type": "string", "format": "date-time"},
			},
		}),
		SideEffect:       planexv1.SideEffect_SIDE_EFFECT_EXTERNAL,
		DefaultTimeout:   durationpb.New(60 * time.Second),
		Retry:            SendRetry(),
		RequiresApproval: true,
		SensitiveFields:  []string{"accepted"},
		Version:          Version,
	}, p.runSend)
}

// SendRetry is email.send's retry policy: it retries UNAVAILABLE only, for
// about a minute and a half of outage (each attempt is itself delivered up
// to --max-deliver times by the executor). That is safe although the tool
// is EXTERNAL and not idempotent, because the pool reports UNAVAILABLE only
// when no mail can have left: the relay could not be reached, refused the
// session, the envelope or the DATA command with a temporary error, or
// refused the message content with a 4xx reply, or the drafts bucket was
// unreachable before the claim. A connection that breaks while the
// content is transferred is OUTCOME_UNKNOWN, which — like TIMEOUT — is
// never retried (internal/plan refuses those codes for such tools).
func SendRetry() *planexv1.RetryPolicy {
	return &planexv1.RetryPolicy{
		MaxAttempts:       6,
		InitialBackoff:    durationpb.New(2 * time.Second),
		MaxBackoff:        durationpb.New(10 * time.Second),
		BackoffMultiplier: 2,
		RetryableCodes:    []planexv1.ErrorCode{planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE},
	}
}

// bucketDown is a failure to use the drafts bucket before anything was
// sent; the step is retried.
func bucketDown(err error) *runner.Error {
	return runner.Unavailable(err, "the drafts bucket %s is unreachable", bus.BucketDrafts)
}

// maxClaimTries bounds how often email.send re-reads a draft that other
// replicas keep changing under it.
const maxClaimTries = 8

// draftWriteTimeout bounds the write that settles a draft after a send.
const draftWriteTimeout = 5 * time.Second

func (p *Pool) runSend(ctx context.Context, c runner.Call) (any, error) {
	id := c.Args.GetFields()["draft_id"].GetStringValue()
	msgID := p.messageID(c.RunID, c.StepID, c.Attempt)
	cl, err := p.claim(ctx, c, id, msgID)
	if err != nil {
		return nil, err
	}
	sentAt := time.Now().UTC()
	cl.msg.SetDateWithValue(sentAt)
	if p.cfg.OutboxDir != "" {
		err = p.writeOutbox(ctx, cl.msg, msgID, sentAt, len(cl.rcpts))
	} else {
		err = p.sendSMTP(ctx, cl.msg, len(cl.rcpts))
	}
	// The outcome is written into the draft even when the step's deadline
	// has passed, so that the other replicas see it.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), draftWriteTimeout)
	defer cancel()
	if err != nil {
		p.settleFailed(wctx, cl, err)
		return nil, err
	}
	cl.draft.SentAt, cl.draft.MessageID = &sentAt, msgID
	if _, err := p.drafts.update(wctx, cl.draft, cl.rev); err != nil {
		// The mail is out. The claim still in the draft stops other
		// attempts, the effect record this one.
		p.logger.ErrorContext(ctx, "mark draft sent", "draft_id", id, "err", err)
	}
	return map[string]any{"message_id": "<" + msgID + ">", "accepted": cl.rcpts, "sent_at": sentAt.Format(time.RFC3339Nano)}, nil
}

// claimed is a draft an email.send attempt has claimed.
type claimed struct {
	draft *Draft
	rev   uint64 // the revision holding the claim
	msg   *gomail.Msg
	rcpts []string
}

// claim reads draft id, checks that attempt c may send it under today's
// policy, renders it and records the attempt's claim in the draft with an
// update on the revision read. When another replica changed the draft in
// between, it reads the draft again.
func (p *Pool) claim(ctx context.Context, c runner.Call, id, msgID string) (*claimed, error) {
	for range maxClaimTries {
		d, rev, err := p.drafts.get(ctx, id)
		if errors.Is(err, errNoDraft) {
			return nil, runner.InvalidArgument("args.draft_id", "no draft %q; create one with email.draft", id)
		}
		if err != nil {
			return nil, bucketDown(err)
		}
		if terr := taken(d, c); terr != nil {
			return nil, terr
		}
		rcpts, terr := p.sendable(d)
		if terr != nil {
			return nil, terr
		}
		msg, err := p.render(d, msgID)
		if err != nil {
			return nil, runner.InvalidArgument("args.draft_id", "draft %q cannot be rendered: %v", id, err)
		}
		d.SendBy = &SendClaim{RunID: c.RunID, StepID: c.StepID, Attempt: c.Attempt, MessageID: msgID, Since: time.Now().UTC()}
		if p.beforeClaim != nil {
			p.beforeClaim(id)
		}
		rev, err = p.drafts.update(ctx, d, rev)
		if errors.Is(err, errDraftChanged) {
			continue
		}
		if err != nil {
			// Should the claim have been stored after all, a redelivery
			// of this attempt takes it over (see taken).
			return nil, bucketDown(err)
		}
		return &claimed{draft: d, rev: rev, msg: msg, rcpts: rcpts}, nil
	}
	return nil, runner.Unavailable(nil, "draft %q kept changing while it was being claimed", id)
}

// taken refuses a draft that was sent or that another attempt claimed.
func taken(d *Draft, c runner.Call) *runner.Error {
	cl := d.SendBy
	switch {
	case d.SentAt != nil:
		return runner.InvalidArgument("args.draft_id", "draft %q was already sent at %s as <%s>", d.ID, d.SentAt.Format(time.RFC3339), d.MessageID)
	case cl == nil:
		return nil
	case cl.OutcomeUnknown:
		return runner.InvalidArgument("args.draft_id", "draft %q was being sent by attempt %d of step %q of run %s, which broke off with an unknown outcome; it is not sent again",
			d.ID, cl.Attempt, cl.StepID, cl.RunID)
	case cl.owns(c.RunID, c.StepID, c.Attempt):
		// The runner's planex-effects record lets an attempt run again
		// only when its earlier run had no effect (a retryable failure
		// whose claim could not be released), so it takes the claim over.
		return nil
	default:
		return runner.InvalidArgument("args.draft_id", "draft %q is being sent by attempt %d of step %q of run %s since %s; a draft is sent at most once",
			d.ID, cl.Attempt, cl.StepID, cl.RunID, cl.Since.Format(time.RFC3339))
	}
}

// sendable checks every recipient, against today's allowlist, and the
// content of a draft before anything is sent, and returns the recipients.
func (p *Pool) sendable(d *Draft) ([]string, *runner.Error) {
	var rcpts []string
	for i, a := range d.To {
		if _, terr := p.checkRecipient(fmt.Sprintf("draft.to[%d]", i), a); terr != nil {
			return nil, terr
		}
		rcpts = append(rcpts, a)
	}
	for i, a := range d.Cc {
		if _, terr := p.checkRecipient(fmt.Sprintf("draft.cc[%d]", i), a); terr != nil {
			return nil, terr
		}
		rcpts = append(rcpts, a)
	}
	if terr := p.checkContent(d); terr != nil {
		return nil, terr
	}
	return rcpts, nil
}

// settleFailed records a failed send in the draft: a send that may have
// handed the message over keeps its claim, marked outcome unknown, so no
// attempt sends the draft again; any other failure releases the claim.
func (p *Pool) settleFailed(ctx context.Context, cl *claimed, sendErr error) {
	d := cl.draft
	what := "release draft"
	var terr *runner.Error
	if errors.As(sendErr, &terr) && terr.Code == planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN {
		what = "mark draft outcome unknown"
		d.SendBy.OutcomeUnknown = true
	} else {
		d.SendBy = nil
	}
	if _, err := p.drafts.update(ctx, d, cl.rev); err != nil {
		// A claim left behind blocks other attempts, which is safe.
		p.logger.WarnContext(ctx, what, "draft_id", d.ID, "err", err)
	}
}
