// Package emailpool is the "email" executor pool: email.draft stores a
// message for review, email.send hands a stored draft to an SMTP relay
// (STARTTLS and AUTH through github.com/wneessen/go-mail) or, in dev mode,
// writes it as an .eml file into a local outbox that `planex outbox` lists.
//
// # Drafts
//
// Drafts live in the JetStream KV bucket planex-drafts (bus.BucketDrafts,
// Config.Drafts), one key per draft holding the draft as JSON, so every
// replica of the pool sees every draft: email.draft and email.send of one
// run may land on different replicas. A draft's id is derived from the
// run, step and attempt that created it and the key is written with KV
// Create, which makes email.draft idempotent: a repeated attempt gets the
// draft it already wrote. Drafts expire with the bucket's TTL (7 days by
// default).
//
// A draft is sent at most once, across replicas. email.send first claims
// the draft: it records its attempt in the draft with a KV Update on the
// revision it read, so of two replicas racing on one draft only one
// succeeds, and the other re-reads the draft and finds it taken. The claim
// is released when the send failed before the message was handed over,
// turned into "sent" when it succeeded, and kept, marked outcome unknown,
// when the hand-over broke off midway. planex-effects (below) keeps one
// attempt from acting twice; the claim keeps two attempts (a replanned step,
// another step naming the same draft) from sending one draft twice.
//
// # Exactly once or escalate
//
// email.send is SIDE_EFFECT_EXTERNAL: the runner records the attempt in
// planex-effects before the tool runs, so a redelivered send returns the
// recorded result or, when the executor died between handing the mail over
// and recording it, OUTCOME_UNKNOWN for a human to resolve. The tool itself
// reports failures that happened before the message was handed over (the
// relay is unreachable, a recipient was refused) as retryable or failed,
// and a break after the message data was sent as OUTCOME_UNKNOWN. Every
// message carries a Message-ID derived from run, step and attempt, so a
// duplicate, should one ever slip through, is recognisable downstream.
//
// # Policy
//
// Every recipient (to and cc) must belong to an allowed domain
// (Config.AllowedDomains; none allowed by default) and is checked when the
// draft is written and again, all of them, before anything is sent: there
// are no partial sends. Subjects, bodies and recipient counts are capped.
package emailpool

import (
	"cmp"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/mail"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/planex-dev/planex/services/executor/runner"
)

const instrumentation = "github.com/planex-dev/planex/services/executor/emailpool"

// STARTTLS policies.
const (
	StartTLSMandatory     = "mandatory"
	StartTLSOpportunistic = "opportunistic"
	StartTLSNone          = "none"
)

// Defaults of Config fields left zero.
const (
	DefaultMaxRecipients   = 20
	DefaultMaxSubjectBytes = 200
	DefaultMaxBodyBytes    = 64 << 10
)

// Config configures the pool.
type Config struct {
	// Drafts is the planex-drafts bucket (bus.Resources.Drafts), shared by
	// the pool's replicas (required by New; not a flag).
	Drafts jetstream.KeyValue
	// OutboxDir, when set, selects dev mode: email.send writes .eml files
	// there instead of using SMTP. Created if missing.
	OutboxDir string
	// AllowedDomains are the recipient domains mail may go to; empty
	// allows none.
	AllowedDomains []string
	// SMTPAddr is the relay's host:port (required unless OutboxDir is set).
	SMTPAddr string
	// SMTPUser enables SMTP AUTH when set.
	SMTPUser string
	// SMTPPassword is the AUTH password; never logged.
	SMTPPassword string
	// StartTLS is mandatory (default), opportunistic or none.
	StartTLS string
	// TLSConfig overrides the TLS client configuration (custom CAs).
	TLSConfig *tls.Config
	// From is the sender address (required).
	From string
	// MaxRecipients caps to + cc.
	MaxRecipients int
	// MaxSubjectBytes caps the subject.
	MaxSubjectBytes int
	// MaxBodyBytes caps the body.
	MaxBodyBytes int
	// Logger receives the pool's logs.
	Logger *slog.Logger
}

// Validate checks the configuration; errors name the flag and value.
func (c Config) Validate() error {
	var errs []error
	if c.OutboxDir == "" {
		if _, _, err := net.SplitHostPort(c.SMTPAddr); err != nil {
			errs = append(errs, fmt.Errorf("--smtp-addr %q: want host:port (or set --email-outbox for dev mode)", c.SMTPAddr))
		}
	}
	switch c.StartTLS {
	case "", StartTLSMandatory, StartTLSOpportunistic, StartTLSNone:
	default:
		errs = append(errs, fmt.Errorf("--smtp-starttls %q: want mandatory, opportunistic or none", c.StartTLS))
	}
	if _, err := mail.ParseAddress(c.From); err != nil {
		errs = append(errs, fmt.Errorf("--email-from %q: want an email address", c.From))
	}
	for _, d := range c.AllowedDomains {
		if !validDomain(d) {
			errs = append(errs, fmt.Errorf("--email-allowed-domains: %q is not a domain name", d))
		}
	}
	if c.SMTPUser != "" && c.StartTLS == StartTLSNone {
		errs = append(errs, errors.New("--smtp-user with --smtp-starttls none would send the password in clear text"))
	}
	return errors.Join(errs...)
}

func validDomain(d string) bool {
	if d == "" || len(d) > 253 || strings.HasPrefix(d, ".") || strings.HasSuffix(d, ".") {
		return false
	}
	for _, label := range strings.Split(d, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// Pool is the email pool.
type Pool struct {
	cfg     Config
	from    *mail.Address
	allowed []string
	drafts  draftStore
	tracer  trace.Tracer
	logger  *slog.Logger
	tools   []runner.Tool

	// beforeClaim, set by tests, runs between reading a draft and
	// claiming it.
	beforeClaim func(id string)
}

// ErrNoDraftsBucket is returned by New without Config.Drafts.
var ErrNoDraftsBucket = errors.New("email pool: no drafts bucket (Config.Drafts, the planex-drafts KV bucket)")

// New checks the configuration and prepares the outbox directory in dev
// mode.
func New(cfg Config) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Drafts == nil {
		return nil, ErrNoDraftsBucket
	}
	cfg.StartTLS = cmp.Or(cfg.StartTLS, StartTLSMandatory)
	cfg.MaxRecipients = cmp.Or(max(cfg.MaxRecipients, 0), DefaultMaxRecipients)
	cfg.MaxSubjectBytes = cmp.Or(max(cfg.MaxSubjectBytes, 0), DefaultMaxSubjectBytes)
	cfg.MaxBodyBytes = cmp.Or(max(cfg.MaxBodyBytes, 0), DefaultMaxBodyBytes)
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	from, err := mail.ParseAddress(cfg.From)
	if err != nil {
		return nil, fmt.Errorf("--email-from %q: %w", cfg.From, err)
	}
	if cfg.OutboxDir != "" {
		if err := os.MkdirAll(cfg.OutboxDir, 0o750); err != nil {
			return nil, fmt.Errorf("--email-outbox %s: %w", cfg.OutboxDir, err)
		}
	}
	p := &Pool{
		cfg:    cfg,
		from:   from,
		drafts: draftStore{kv: cfg.Drafts},
		tracer: otel.Tracer(instrumentation),
		logger: cfg.Logger,
	}
	for _, d := range cfg.AllowedDomains {
		p.allowed = append(p.allowed, strings.ToLower(d))
	}
	var b runner.SchemaBuilder
	p.tools = []runner.Tool{newDraftTool(p, &b), newSendTool(p, &b)}
	if b.Err != nil {
		return nil, b.Err
	}
	return p, nil
}

// Tools returns email.draft and email.send.
func (p *Pool) Tools() []runner.Tool { return p.tools }

// checkRecipient parses addr and checks its domain against the allowlist;
// field names it in errors.
func (p *Pool) checkRecipient(field, addr string) (string, *runner.Error) {
	a, err := mail.ParseAddress(addr)
	if err != nil {
		return "", runner.InvalidArgument(field, "%q is not an email address", addr)
	}
	at := strings.LastIndexByte(a.Address, '@')
	domain := strings.ToLower(a.Address[at+1:])
	if !slices.Contains(p.allowed, domain) {
		allowed := "none are allowed (--email-allowed-domains is empty)"
		if len(p.allowed) > 0 {
			allowed = "allowed: " + strings.Join(p.allowed, ", ")
		}
		return "", runner.PermissionDenied(field, "recipient domain %q is not allowed; %s", domain, allowed)
	}
	return a.Address, nil
}

// attemptHash identifies one attempt, for draft ids and Message-IDs.
func attemptHash(run, step string, attempt int32) string {
	sum := sha256.Sum256([]byte(run + "\x00" + step + "\x00" + strconv.Itoa(int(attempt))))
	return hex.EncodeToString(sum[:])
}

// messageID is the deterministic Message-ID (without angle brackets) of
// the mail an attempt sends.
func (p *Pool) messageID(run, step string, attempt int32) string {
	at := strings.LastIndexByte(p.from.Address, '@')
	return "planex." + attemptHash(run, step, attempt)[:32] + "@" + p.from.Address[at+1:]
}
