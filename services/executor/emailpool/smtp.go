package emailpool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	gomail "github.com/wneessen/go-mail"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/planex-dev/planex/services/executor/runner"
)

// render builds the message of a draft; msgID is set when not empty.
func (p *Pool) render(d *Draft, msgID string) (*gomail.Msg, error) {
	m := gomail.NewMsg()
	if err := m.From(p.from.String()); err != nil {
		return nil, fmt.Errorf("from %q: %w", p.from, err)
	}
	if err := m.To(d.To...); err != nil {
		return nil, fmt.Errorf("to: %w", err)
	}
	if len(d.Cc) > 0 {
		if err := m.Cc(d.Cc...); err != nil {
			return nil, fmt.Errorf("cc: %w", err)
		}
	}
	m.Subject(d.Subject)
	m.SetBodyString(gomail.TypeTextPlain, d.Body)
	if msgID != "" {
		m.SetMessageIDWithValue(msgID)
	}
	m.SetUserAgent("planex")
	return m, nil
}

// countWriter counts bytes written.
type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

func renderedSize(m *gomail.Msg) (int64, error) {
	var c countWriter
	if _, err := m.WriteTo(&c); err != nil {
		return 0, fmt.Errorf("render message: %w", err)
	}
	return c.n, nil
}

// sendSMTP hands the message to the relay. Failures before the message data
// was accepted are retryable (4xx, network) or failed (5xx); a failure
// while or after the data was transferred is OUTCOME_UNKNOWN.
func (p *Pool) sendSMTP(ctx context.Context, m *gomail.Msg, rcpts int) error {
	host, portStr, _ := net.SplitHostPort(p.cfg.SMTPAddr)
	port, _ := strconv.Atoi(portStr)
	ctx, span := p.tracer.Start(ctx, "smtp send", trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("server.address", host), attribute.Int("server.port", port),
		attribute.Int("planex.email.recipients", rcpts), attribute.String("planex.email.starttls", p.cfg.StartTLS)))
	defer span.End()

	client, err := p.newClient(ctx)
	if err != nil {
		return err
	}
	err = client.DialAndSendWithContext(ctx, m)
	if m.IsDelivered() {
		if err != nil { // closing the session failed after the relay took the mail
			p.logger.WarnContext(ctx, "SMTP session ended with an error after delivery", "err", err)
		}
		return nil
	}
	terr := p.classifySMTP(err)
	span.RecordError(err)
	span.SetStatus(codes.Error, terr.Error())
	return terr
}

// newClient configures an SMTP client for the relay, its timeout bounded
// by ctx's deadline.
func (p *Pool) newClient(ctx context.Context) (*gomail.Client, error) {
	host, portStr, _ := net.SplitHostPort(p.cfg.SMTPAddr)
	port, _ := strconv.Atoi(portStr)
	timeout := 30 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(min(timeout, time.Until(dl)), time.Millisecond)
	}
	policy := gomail.TLSMandatory
	switch p.cfg.StartTLS {
	case StartTLSOpportunistic:
		policy = gomail.TLSOpportunistic
	case StartTLSNone:
		policy = gomail.NoTLS
	}
	opts := []gomail.Option{gomail.WithPort(port), gomail.WithTLSPolicy(policy), gomail.WithTimeout(timeout), gomail.WithHELO("planex")}
	if p.cfg.TLSConfig != nil {
		opts = append(opts, gomail.WithTLSConfig(p.cfg.TLSConfig))
	}
	if p.cfg.SMTPUser != "" {
		opts = append(opts, gomail.WithSMTPAuth(gomail.SMTPAuthAutoDiscover),
			gomail.WithUsername(p.cfg.SMTPUser), gomail.WithPassword(p.cfg.SMTPPassword))
	}
	client, err := gomail.NewClient(host, opts...)
	if err != nil {
		return nil, fmt.Errorf("SMTP client for %s: %w", p.cfg.SMTPAddr, err)
	}
	return client, nil
}

// classifySMTP maps a failed send to a tool error.
func (p *Pool) classifySMTP(err error) *runner.Error {
	var se *gomail.SendError
	if !errors.As(err, &se) {
		// Dial, STARTTLS or AUTH failed: no message was handed over.
		return runner.Unavailable(err, "SMTP relay %s: %v", p.cfg.SMTPAddr, err)
	}
	code := se.ErrorCode()
	switch se.Reason {
	case gomail.ErrWriteContent, gomail.ErrSMTPDataClose:
		if code >= 400 { // the relay answered the data with a refusal
			break
		}
		return runner.OutcomeUnknown(err, "the connection to the SMTP relay broke while the message was being transferred; it may or may not have been delivered")
	case gomail.ErrSMTPReset, gomail.ErrAmbiguous:
		return runner.OutcomeUnknown(err, "SMTP relay %s: %v", p.cfg.SMTPAddr, err)
	}
	if se.IsTemp() || (code >= 400 && code < 500) || code == 0 {
		return runner.Unavailable(err, "SMTP relay %s refused the message for now: %v", p.cfg.SMTPAddr, err)
	}
	return runner.Failed(err, "SMTP relay %s refused the message: %v", p.cfg.SMTPAddr, err)
}

// writeOutbox stores the message as an .eml file in the dev outbox.
func (p *Pool) writeOutbox(ctx context.Context, m *gomail.Msg, msgID string, sentAt time.Time, rcpts int) error {
	_, span := p.tracer.Start(ctx, "outbox write", trace.WithAttributes(attribute.Int("planex.email.recipients", rcpts)))
	defer span.End()
	var buf bytes.Buffer
	if _, err := m.WriteTo(&buf); err != nil {
		return fmt.Errorf("render message: %w", err)
	}
	name := sentAt.Format("20060102T150405.000000000Z") + "-" + msgID[len("planex."):len("planex.")+12] + ".eml"
	if err := writeAtomic(p.outboxPath(name), buf.Bytes()); err != nil {
		span.SetStatus(codes.Error, err.Error())
		return runner.Unavailable(err, "could not write to the dev outbox")
	}
	return nil
}

// Probe checks that mail can be handed over: it opens a session with the
// SMTP relay (greeting, EHLO, STARTTLS and AUTH as configured) and closes
// it without sending, or, in dev mode, checks that the outbox directory
// exists. The executor runs it periodically for its backend health.
func (p *Pool) Probe(ctx context.Context) error {
	if p.cfg.OutboxDir != "" {
		st, err := os.Stat(p.cfg.OutboxDir)
		if err != nil {
			return fmt.Errorf("dev outbox: %w", err)
		}
		if !st.IsDir() {
			return fmt.Errorf("dev outbox %s is not a directory", p.cfg.OutboxDir)
		}
		return nil
	}
	client, err := p.newClient(ctx)
	if err != nil {
		return err
	}
	if err := client.DialWithContext(ctx); err != nil {
		return fmt.Errorf("SMTP relay %s: %w", p.cfg.SMTPAddr, err)
	}
	if err := client.Close(); err != nil {
		return fmt.Errorf("SMTP relay %s: quit: %w", p.cfg.SMTPAddr, err)
	}
	return nil
}
