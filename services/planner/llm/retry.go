package llm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/planex-dev/planex/internal/redact"
)

// Retry defaults for ProviderConfig fields left zero.
const (
	// DefaultMaxRetryAfter is the longest Retry-After honoured; a provider
	// asking for more fails the call at once with that reason.
	DefaultMaxRetryAfter = 30 * time.Second
	// initialBackoff and maxBackoff shape the exponential backoff between
	// attempts when the provider gives no Retry-After.
	initialBackoff = 500 * time.Millisecond
	maxBackoff     = 8 * time.Second
)

// ExhaustedError ends a call the provider kept failing: the retries, the
// retry budget or the caller's deadline ran out, or the provider asked to
// wait longer than allowed. It wraps the last *ProviderError, so
// errors.Is(err, ErrUnavailable) and errors.As(err, **ProviderError) hold.
type ExhaustedError struct {
	// Last is the last attempt's error.
	Last *ProviderError
	// Attempts made.
	Attempts int
	// Elapsed is the time from the first attempt to giving up.
	Elapsed time.Duration
	// Reason says why no further attempt was made.
	Reason string
}

// Error renders the last error and why the call gave up.
func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("%v (gave up after %d attempt%s in %s: %s)", e.Last, e.Attempts, plural(e.Attempts), e.Elapsed.Round(time.Millisecond), e.Reason)
}

// Public is the client-safe message: the provider's status and message
// (secrets redacted) and why the call gave up.
func (e *ExhaustedError) Public() string {
	return fmt.Sprintf("%s (gave up after %d attempt%s in %s: %s)", e.Last.Public(), e.Attempts, plural(e.Attempts), e.Elapsed.Round(time.Millisecond), e.Reason)
}

// Unwrap returns Last.
func (e *ExhaustedError) Unwrap() error { return e.Last }

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// Retry runs attempt until it succeeds, fails with an error that is not
// retryable (ErrRejected, the caller's own cancellation), or the policy of
// cfg ends it: at most 1 + MaxRetries attempts, each bounded by
// CallTimeout, all within RetryBudget and before the caller's deadline
// (less a margin, so that the caller gets this error rather than its own
// timeout). Between attempts it waits the provider's Retry-After (up to
// MaxRetryAfter; beyond it gives up at once, saying so) or an exponential
// backoff with jitter. Providers disable their SDK's own retries and call
// this.
func Retry(ctx context.Context, provider string, cfg ProviderConfig, attempt func(ctx context.Context) (Reply, error)) (Reply, error) {
	start := time.Now()
	deadline, bounded := time.Time{}, false
	if cfg.RetryBudget > 0 {
		deadline, bounded = start.Add(cfg.RetryBudget), true
	}
	if d, ok := ctx.Deadline(); ok {
		// Answer before the caller's deadline: keep a tenth of the time
		// left, at most 5s, for the answer to travel back.
		d = d.Add(-min(time.Until(d)/10, 5*time.Second))
		if !bounded || d.Before(deadline) {
			deadline, bounded = d, true
		}
	}
	maxRetryAfter := cfg.MaxRetryAfter
	if maxRetryAfter <= 0 {
		maxRetryAfter = DefaultMaxRetryAfter
	}
	giveUp := func(last *ProviderError, n int, reason string) error {
		return &ExhaustedError{Last: last, Attempts: n, Elapsed: time.Since(start), Reason: reason}
	}
	for n := 1; ; n++ {
		timeout := cfg.CallTimeout
		if bounded {
			left := time.Until(deadline)
			if timeout <= 0 || left < timeout {
				timeout = left
			}
		}
		actx, cancel := ctx, context.CancelFunc(func() {})
		if timeout > 0 {
			actx, cancel = context.WithTimeout(ctx, timeout)
		}
		reply, err := attempt(actx)
		timedOut := actx.Err() != nil
		cancel()
		if err == nil {
			return reply, nil
		}
		if ctx.Err() != nil {
			if !errors.Is(err, ctx.Err()) {
				err = fmt.Errorf("%w: %w", ctx.Err(), err)
			}
			return reply, err
		}
		var pe *ProviderError
		switch {
		case timedOut:
			pe = &ProviderError{Provider: provider, Kind: ErrTimeout, Detail: fmt.Sprintf("no answer within %s", timeout.Round(time.Millisecond))}
		case !errors.As(err, &pe):
			return reply, err
		}
		if pe.Kind == ErrRejected {
			return reply, pe
		}
		if n > cfg.MaxRetries {
			return reply, giveUp(pe, n, fmt.Sprintf("%d retries allowed", max(cfg.MaxRetries, 0)))
		}
		wait := backoff(n)
		if pe.RetryAfter > 0 {
			if pe.RetryAfter > maxRetryAfter {
				return reply, giveUp(pe, n, fmt.Sprintf("the provider asked to retry after %s, more than the %s allowed (--planner-max-retry-after)", pe.RetryAfter, maxRetryAfter))
			}
			wait = pe.RetryAfter
		}
		if bounded && time.Until(deadline) < wait+minAttempt {
			why := "the retry budget (--planner-retry-budget) is spent"
			if d, ok := ctx.Deadline(); ok && !d.After(deadline.Add(5*time.Second)) {
				why = "the caller's deadline is near"
			}
			return reply, giveUp(pe, n, why)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return reply, fmt.Errorf("%w: %w", ctx.Err(), pe)
		case <-t.C:
		}
	}
}

// minAttempt is the least time worth starting another attempt with.
const minAttempt = 100 * time.Millisecond

// backoff is the wait before retry n (1-based): exponential from
// initialBackoff up to maxBackoff, with ±25% jitter.
func backoff(n int) time.Duration {
	d := initialBackoff << min(n-1, 10)
	d = min(d, maxBackoff)
	return time.Duration(float64(d) * (0.75 + rand.Float64()/2))
}

// RetryAfter reads how long a provider asks to wait: retry-after-ms
// (OpenAI, Anthropic) or Retry-After in seconds or as an HTTP date; 0 when
// absent or unreadable.
func RetryAfter(h http.Header, now time.Time) time.Duration {
	if h == nil {
		return 0
	}
	if ms, err := strconv.ParseFloat(h.Get("Retry-After-Ms"), 64); err == nil && ms > 0 {
		return time.Duration(ms * float64(time.Millisecond))
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s > 0 {
		return time.Duration(s * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// secretPatterns clean provider messages.
var secretPatterns = redact.New(redact.SecretPatterns()...)

// maxDetail caps a provider message kept for clients and logs.
const maxDetail = 500

// CleanDetail prepares a provider's error message for logs and clients:
// the API key (and any 8+ character piece of it the provider echoes, as in
// "Incorrect API key provided: sk-abc1****wxyz") and anything else that
// looks like a credential masked, on one line, at most 500 bytes.
func CleanDetail(detail, apiKey string) string {
	detail = strings.Join(strings.Fields(detail), " ")
	if apiKey != "" {
		detail = strings.ReplaceAll(detail, apiKey, redact.Mask)
		for _, piece := range keyPieces(apiKey) {
			detail = strings.ReplaceAll(detail, piece, redact.Mask)
		}
	}
	detail = secretPatterns.String(detail)
	if len(detail) > maxDetail {
		cut := maxDetail
		for cut > 0 && detail[cut]&0xC0 == 0x80 {
			cut--
		}
		detail = detail[:cut] + "…"
	}
	return detail
}

// keyPieces are the key's 8-character prefix and suffix (when the key is
// long enough for them to identify it).
func keyPieces(key string) []string {
	if len(key) < 16 {
		return nil
	}
	return []string{key[:8], key[len(key)-8:]}
}
