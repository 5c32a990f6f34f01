package llm_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/planex-dev/planex/services/planner/llm"
)

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name string
		h    http.Header
		want time.Duration
	}{
		{"seconds", http.Header{"Retry-After": {"180"}}, 180 * time.Second},
		{"fraction", http.Header{"Retry-After": {"1.5"}}, 1500 * time.Millisecond},
		{"milliseconds win", http.Header{"Retry-After": {"180"}, "Retry-After-Ms": {"250"}}, 250 * time.Millisecond},
		{"http date", http.Header{"Retry-After": {now.Add(90 * time.Second).Format(http.TimeFormat)}}, 90 * time.Second},
		{"past date", http.Header{"Retry-After": {now.Add(-time.Minute).Format(http.TimeFormat)}}, 0},
		{"garbage", http.Header{"Retry-After": {"soon"}}, 0},
		{"none", nil, 0},
	}
	for _, tt := range tests {
		if got := llm.RetryAfter(tt.h, now); got != tt.want {
			t.Errorf("%s: RetryAfter = %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestCleanDetail(t *testing.T) {
	key := "sk-proj-" + "abcdefghijklmnopqrstuvwxyz0123456789"
	got := llm.CleanDetail("Incorrect API key provided: "+key[:8]+"*****"+key[len(key)-8:]+".\n  Also "+key+" and Bearer abcDEF1234567890xyz", key)
	for _, leak := range []string{key, key[len(key)-8:], "abcDEF1234567890xyz", "\n"} {
		if strings.Contains(got, leak) {
			t.Errorf("CleanDetail kept %q: %q", leak, got)
		}
	}
	if !strings.HasPrefix(got, "Incorrect API key provided: [REDACTED]") {
		t.Errorf("CleanDetail = %q", got)
	}
	if long := llm.CleanDetail(strings.Repeat("é", 600), ""); len(long) > 510 || !strings.HasSuffix(long, "…") {
		t.Errorf("long detail not capped: %d bytes", len(long))
	}
}
