// Package trigger is what planex's event triggers share between the
// supervisor and the CLI: validation of a trigger's spec naming the field
// at fault, compilation of its CEL expressions, the evaluation of one
// event into a run to start (or a rejection reason), and the webhook
// signature schemes (GitHub's and Stripe's). It holds no state; the
// supervisor stores triggers and consumes their events
// (services/supervisor/triggers.go). See docs/triggers.md.
package trigger

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// Stream, bucket and subject names: part of the operational contract.
const (
	// SubjectPrefix prefixes every trigger subject. It is apart from
	// planex's own subjects (planex.events., planex.steps., ...), so an
	// event publisher can never write into a run log.
	SubjectPrefix = "planex.inbound."
	// StreamEvents holds the events of a tenant's trigger subjects until
	// a supervisor has evaluated them (a work queue).
	StreamEvents = "PLANEX_TRIGGER_EVENTS"
	// ConsumerEvents is the durable consumer the supervisors share.
	ConsumerEvents = "triggers"
	// StreamOutcomes records each evaluated event's outcome (one message
	// per event and trigger; rejections carry their record), from which
	// the counters are read.
	StreamOutcomes = "PLANEX_TRIGGER_OUTCOMES"
	// OutcomesPrefix prefixes outcome subjects:
	// planex.trigger-outcomes.<trigger>.<outcome>.
	OutcomesPrefix = "planex.trigger-outcomes."
	// StreamRejections holds the rejection records (reason, subject,
	// time, payload digest), one subject per trigger, bounded per trigger.
	StreamRejections = "PLANEX_TRIGGER_REJECTIONS"
	// Bucket holds the triggers' specs, one key per trigger.
	Bucket = "planex-triggers"
)

// Outcomes of an event, the last token of its outcome subject and the
// "outcome" attribute of the planex.trigger.events metric.
const (
	OutcomeStarted   = "started"
	OutcomeDuplicate = "duplicate"
	OutcomeRejected  = "rejected"
	OutcomeFiltered  = "filtered"
)

// Labels every triggered run carries.
const (
	// LabelTrigger is the trigger's name.
	LabelTrigger = "planex.trigger"
	// LabelEvent is the event's sequence in StreamEvents: a redelivered
	// event recognises the run it started itself.
	LabelEvent = "planex.trigger.event"
)

// OutcomeSubject is the subject of an outcome record.
func OutcomeSubject(trigger, outcome string) string {
	return OutcomesPrefix + trigger + "." + outcome
}

// maxRunKey is StartRunRequest.idempotency_key's limit (the API's).
const maxRunKey = 128

// RunKey is the StartRun idempotency key of an event's key:
// "trigger:<name>:<key>", the key hashed when it would not fit.
func RunKey(name, key string) string {
	k := "trigger:" + name + ":" + key
	if len(k) <= maxRunKey {
		return k
	}
	sum := sha256.Sum256([]byte(key))
	return "trigger:" + name + ":sha256:" + hex.EncodeToString(sum[:16])
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)

// ValidName checks a trigger name: lower-case letters, digits and '-',
// starting with a letter, at most 63 characters.
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%q: want lower-case letters, digits and '-', starting with a letter, at most 63 characters", clip(name))
	}
	return nil
}

var tokenRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidSubject checks a trigger subject: under SubjectPrefix, tokens of
// letters, digits, '_' and '-', "*" for one token and ">" last.
func ValidSubject(s string) error {
	rest, ok := strings.CutPrefix(s, SubjectPrefix)
	if !ok || rest == "" {
		return fmt.Errorf("%q: want a NATS subject under %s (e.g. %sgithub.push)", clip(s), SubjectPrefix, SubjectPrefix)
	}
	if len(s) > 255 {
		return fmt.Errorf("%q: at most 255 characters", clip(s))
	}
	toks := strings.Split(rest, ".")
	for i, t := range toks {
		switch {
		case t == ">" && i == len(toks)-1:
		case t == "*":
		case tokenRE.MatchString(t):
		default:
			return fmt.Errorf("%q: token %q: want letters, digits, '_' or '-', \"*\", or \">\" last", clip(s), clip(t))
		}
	}
	return nil
}

// Literal reports whether a subject has no wildcards.
func Literal(s string) bool {
	for _, t := range strings.Split(s, ".") {
		if t == "*" || t == ">" {
			return false
		}
	}
	return true
}

// Matches reports whether a literal subject matches pattern (NATS rules).
func Matches(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, t := range p {
		if t == ">" {
			return len(s) > i
		}
		if i >= len(s) || (t != "*" && t != s[i]) {
			return false
		}
	}
	return len(p) == len(s)
}

// Signature schemes of TriggerWebhook.scheme.
const (
	SchemeGitHub = "github"
	SchemeStripe = "stripe"
)

var secretRefRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// Limits of a spec.
const (
	maxExpr        = 4096
	maxDescription = 1024
	maxLabels      = 30 // the API's 32 less the two added
	maxTolerance   = 3600
)

var labelKeyRE = regexp.MustCompile(`^[a-z0-9_./-]{1,63}$`)

// Validate checks a spec to be stored (output-only fields are ignored) and
// compiles its expressions, naming the field at fault.
func Validate(t *planexv1.Trigger) error {
	if t == nil {
		return errors.New("trigger: required")
	}
	var errs []error
	if err := ValidName(t.GetName()); err != nil {
		errs = append(errs, fmt.Errorf("trigger.name: %w", err))
	}
	if len(t.GetDescription()) > maxDescription {
		errs = append(errs, fmt.Errorf("trigger.description: at most %d bytes", maxDescription))
	}
	if err := ValidSubject(t.GetSubject()); err != nil {
		errs = append(errs, fmt.Errorf("trigger.subject: %w", err))
	}
	if w := t.GetWebhook(); w.GetEnabled() {
		if t.GetSubject() != "" && !Literal(t.GetSubject()) {
			errs = append(errs, fmt.Errorf("trigger.webhook.enabled: the subject %q has wildcards; a webhook publishes into one subject", clip(t.GetSubject())))
		}
		if w.GetScheme() != SchemeGitHub && w.GetScheme() != SchemeStripe {
			errs = append(errs, fmt.Errorf("trigger.webhook.scheme %q: want github or stripe", clip(w.GetScheme())))
		}
		if !secretRefRE.MatchString(w.GetSecretRef()) || strings.Contains(w.GetSecretRef(), "..") {
			errs = append(errs, fmt.Errorf("trigger.webhook.secret_ref %q: want a file name in --webhook-secrets-dir (letters, digits, '_', '.', '-')", clip(w.GetSecretRef())))
		}
		if n := w.GetToleranceSeconds(); n < 0 || n > maxTolerance {
			errs = append(errs, fmt.Errorf("trigger.webhook.tolerance_seconds %d: want 0 (300) to %d", n, maxTolerance))
		}
	}
	if len(t.GetLabels()) > maxLabels {
		errs = append(errs, fmt.Errorf("trigger.labels: at most %d", maxLabels))
	}
	for k := range t.GetLabels() {
		if !labelKeyRE.MatchString(k) {
			errs = append(errs, fmt.Errorf("trigger.labels[%q]: want a key of a-z, 0-9, '_', '.', '/', '-' (at most 63)", clip(k)))
		} else if k == LabelTrigger || k == LabelEvent {
			errs = append(errs, fmt.Errorf("trigger.labels[%q]: reserved (planex sets it)", k))
		}
	}
	if _, err := Compile(t); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// clip shortens a value echoed in an error.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
