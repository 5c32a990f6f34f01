package emailpool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
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
	_, span := p.tracer.Start(ctx, "email draft")
	defer span.End()
	f := c.Args.GetFields()
	d := &Draft{
		ID:        "d-" + attemptHash(c.RunID, c.StepID, c.Attempt)[:24],
		Subject:   f["subject"].GetStringValue(),
		Body:      f["body"].GetStringValue(),
		CreatedAt: time.Now().UTC(),
		RunID:     c.RunID,
		StepID:    c.StepID,
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
	if err := p.drafts.put(d); err != nil {
		return nil, err
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
		RequiresApproval: true,
		SensitiveFields:  []string{"accepted"},
		Version:          Version,
	}, p.runSend)
}

func (p *Pool) runSend(ctx context.Context, c runner.Call) (any, error) {
	id := c.Args.GetFields()["draft_id"].GetStringValue()
	d, err := p.drafts.get(id)
	if errors.Is(err, errNoDraft) {
		return nil, runner.InvalidArgument("args.draft_id", "no draft %q; create one with email.draft", id)
	}
	if err != nil {
		return nil, err
	}
	if d.SentAt != nil {
		return nil, runner.InvalidArgument("args.draft_id", "draft %q was already sent at %s as <%s>", id, d.SentAt.Format(time.RFC3339), d.MessageID)
	}
	// Every recipient is checked, against today's allowlist, before
	// anything is sent.
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
	msgID := p.messageID(c.RunID, c.StepID, c.Attempt)
	msg, err := p.render(d, msgID)
	if err != nil {
		return nil, runner.InvalidArgument("args.draft_id", "draft %q cannot be rendered: %v", id, err)
	}
	sentAt := time.Now().UTC()
	msg.SetDateWithValue(sentAt)
	if p.cfg.OutboxDir != "" {
		err = p.writeOutbox(ctx, msg, msgID, sentAt, len(rcpts))
	} else {
		err = p.sendSMTP(ctx, msg, len(rcpts))
	}
	if err != nil {
		return nil, err
	}
	d.SentAt, d.MessageID = &sentAt, msgID
	if err := p.drafts.put(d); err != nil {
		// The mail is out; the effect record still stops a repeat.
		p.logger.ErrorContext(ctx, "mark draft sent", "draft_id", id, "err", err)
	}
	return map[string]any{"message_id": "<" + msgID + ">", "accepted": rcpts, "sent_at": sentAt.Format(time.RFC3339Nano)}, nil
}
