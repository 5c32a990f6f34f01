package llm_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/planex-dev/planex/services/planner/llm"
)

func TestCallError(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	transport := errors.New("dial tcp 127.0.0.1:1: connection refused")
	cases := []struct {
		name   string
		ctx    context.Context
		err    error
		status int
		want   error
		public string
	}{
		{"429", context.Background(), transport, http.StatusTooManyRequests, llm.ErrUnavailable, "p: HTTP 429 Too Many Requests: model provider unavailable"},
		{"408", context.Background(), transport, http.StatusRequestTimeout, llm.ErrUnavailable, "p: HTTP 408"},
		{"529 overloaded", context.Background(), transport, 529, llm.ErrUnavailable, "p: HTTP 529 : model provider unavailable"},
		{"401", context.Background(), transport, http.StatusUnauthorized, llm.ErrRejected, "p: HTTP 401 Unauthorized: model provider rejected the request"},
		{"404 unknown model", context.Background(), transport, http.StatusNotFound, llm.ErrRejected, "p: HTTP 404 Not Found"},
		{"attempt timeout", context.Background(), fmt.Errorf("post: %w", context.DeadlineExceeded), 0, llm.ErrTimeout, "p: model call timed out"},
		{"transport", context.Background(), transport, 0, llm.ErrUnavailable, "p: model provider unavailable"},
		{"caller cancelled", cancelled, transport, http.StatusInternalServerError, context.Canceled, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := "sk-" + "configuredKey0123456789"
			err := llm.CallError(tc.ctx, "p", tc.err, tc.status, "detail with "+key+" and sk-"+"otherKeyAbcdefghij012", nil, key, time.Second)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			var pe *llm.ProviderError
			if tc.public == "" {
				if errors.As(err, &pe) {
					t.Errorf("a cancellation became a provider error: %v", err)
				}
				return
			}
			if !errors.As(err, &pe) || !strings.HasPrefix(pe.Public(), tc.public) || strings.Contains(pe.Public(), "configuredKey") || strings.Contains(pe.Public(), "otherKey") {
				t.Errorf("public = %q, want prefix %q and no key", pe.Public(), tc.public)
			}
			if tc.status > 0 && !strings.Contains(pe.Public(), "detail with [REDACTED] and [REDACTED]") {
				t.Errorf("public %q lost the provider's message", pe.Public())
			}
		})
	}
}

func TestNewRequiresValidator(t *testing.T) {
	if _, err := llm.New(nil, llm.Options{Name: "x"}); err == nil {
		t.Error("New accepted a backend without provider and validator")
	}
}

func TestTruncatedError(t *testing.T) {
	cases := []struct {
		name     string
		err      *llm.TruncatedError
		budget   bool
		contains string
	}{
		{"the configured cap", &llm.TruncatedError{Backend: "openai", Cap: 4096, Configured: 4096}, false, "raise --planner-max-output-tokens (now 4096)"},
		{"the remaining budget", &llm.TruncatedError{Backend: "anthropic", Cap: 900, Configured: 4096}, true, "(900 tokens, all that the remaining token budget allows; --planner-max-output-tokens is 4096) twice"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !errors.Is(tc.err, llm.ErrTruncated) || errors.Is(tc.err, llm.ErrBudget) != tc.budget || errors.Is(tc.err, llm.ErrInvalidAnswer) {
				t.Errorf("Is(ErrTruncated) %v, Is(ErrBudget) %v (want %v), Is(ErrInvalidAnswer) %v",
					errors.Is(tc.err, llm.ErrTruncated), errors.Is(tc.err, llm.ErrBudget), tc.budget, errors.Is(tc.err, llm.ErrInvalidAnswer))
			}
			if !strings.Contains(tc.err.Error(), tc.contains) || !strings.HasPrefix(tc.err.Error(), tc.err.Backend+": ") {
				t.Errorf("Error() = %q, want it to contain %q", tc.err.Error(), tc.contains)
			}
		})
	}
}
