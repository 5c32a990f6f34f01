package emailpool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Draft is a stored message awaiting email.send: the JSON value of its key
// in the planex-drafts bucket.
type Draft struct {
	// ID is the draft id ("d-" and 24 hex digits) and the draft's key.
	ID string `json:"id"`
	// To and Cc are the recipients' bare addresses.
	To []string `json:"to"`
	Cc []string `json:"cc,omitempty"`
	// Subject and Body (text/plain) of the message.
	Subject string `json:"subject"`
	Body    string `json:"body"`
	// CreatedAt is when email.draft wrote it.
	CreatedAt time.Time `json:"created_at"`
	// RunID, StepID and Attempt name the attempt that wrote it.
	RunID   string `json:"run_id"`
	StepID  string `json:"step_id"`
	Attempt int32  `json:"attempt"`
	// SendBy is the email.send attempt that claimed the draft. It is set
	// before the message is handed over and never cleared once the hand-over
	// may have happened, so no other attempt, on any replica, sends the
	// draft again.
	SendBy *SendClaim `json:"send_by,omitempty"`
	// SentAt and MessageID are set once the draft was sent.
	SentAt    *time.Time `json:"sent_at,omitempty"`
	MessageID string     `json:"message_id,omitempty"`
}

// SendClaim records which email.send attempt owns a draft.
type SendClaim struct {
	// RunID, StepID and Attempt name the attempt.
	RunID   string `json:"run_id"`
	StepID  string `json:"step_id"`
	Attempt int32  `json:"attempt"`
	// MessageID (without angle brackets) of the mail the attempt sends.
	MessageID string `json:"message_id"`
	// Since is when the attempt claimed the draft.
	Since time.Time `json:"since"`
	// OutcomeUnknown is set when the attempt broke off while the relay
	// may have taken the message.
	OutcomeUnknown bool `json:"outcome_unknown,omitempty"`
}

// owns reports whether the claim belongs to the attempt run/step/attempt.
func (c *SendClaim) owns(run, step string, attempt int32) bool {
	return c.RunID == run && c.StepID == step && c.Attempt == attempt
}

// sameContent reports whether two drafts hold the same message.
func (d *Draft) sameContent(o *Draft) bool {
	return d.Subject == o.Subject && d.Body == o.Body && slices.Equal(d.To, o.To) && slices.Equal(d.Cc, o.Cc)
}

var draftIDRE = regexp.MustCompile(`^d-[0-9a-f]{24}$`)

var (
	// errNoDraft is returned for an unknown (or expired) draft id.
	errNoDraft = errors.New("no such draft")
	// errDraftExists is returned by create when the id is taken.
	errDraftExists = errors.New("draft exists")
	// errDraftChanged is returned by update when another writer changed
	// the draft since it was read.
	errDraftChanged = errors.New("draft changed since it was read")
)

// draftStore keeps drafts in the planex-drafts bucket, one key per draft,
// so that every replica of the pool sees every draft. Writes are
// conditional (Create, Update with the revision read), which makes
// replicas that race on one draft serialise.
type draftStore struct{ kv jetstream.KeyValue }

// draftCallTimeout bounds one call to the bucket, far below a step's
// timeout: during a NATS leader change a call fails fast and the step is
// retried (UNAVAILABLE) instead of hanging until its deadline.
const draftCallTimeout = 2 * time.Second

// get reads a draft and its revision; the id must be well formed.
func (s draftStore) get(ctx context.Context, id string) (*Draft, uint64, error) {
	if !draftIDRE.MatchString(id) {
		return nil, 0, errNoDraft
	}
	ctx, cancel := context.WithTimeout(ctx, draftCallTimeout)
	defer cancel()
	e, err := s.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, 0, errNoDraft
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read draft %s: %w", id, err)
	}
	var d Draft
	if err := json.Unmarshal(e.Value(), &d); err != nil {
		return nil, 0, fmt.Errorf("decode draft %s: %w", id, err)
	}
	return &d, e.Revision(), nil
}

// create stores a new draft; errDraftExists when its id is taken.
func (s draftStore) create(ctx context.Context, d *Draft) error {
	data, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("encode draft %s: %w", d.ID, err)
	}
	ctx, cancel := context.WithTimeout(ctx, draftCallTimeout)
	defer cancel()
	_, err = s.kv.Create(ctx, d.ID, data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("create draft %s: %w", d.ID, errDraftExists)
	}
	if err != nil {
		return fmt.Errorf("create draft %s: %w", d.ID, err)
	}
	return nil
}

// update replaces the draft if rev is still its latest revision and
// returns the new revision; errDraftChanged when it is not.
func (s draftStore) update(ctx context.Context, d *Draft, rev uint64) (uint64, error) {
	data, err := json.Marshal(d)
	if err != nil {
		return 0, fmt.Errorf("encode draft %s: %w", d.ID, err)
	}
	ctx, cancel := context.WithTimeout(ctx, draftCallTimeout)
	defer cancel()
	next, err := s.kv.Update(ctx, d.ID, data, rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("update draft %s: %w", d.ID, errDraftChanged)
	}
	if err != nil {
		return 0, fmt.Errorf("update draft %s: %w", d.ID, err)
	}
	return next, nil
}
