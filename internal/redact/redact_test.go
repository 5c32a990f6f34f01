package redact_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/planex-dev/planex/internal/redact"
)

func TestString(t *testing.T) {
	r := redact.New()
	tests := []struct {
		name, in, want string
	}{
		{name: "email", in: "send to oncall@example.com now", want: "send to [EMAIL] now"},
		{name: "two emails", in: "a@b.io,c.d+e@f.example.org", want: "[EMAIL],[EMAIL]"},
		{name: "bearer", in: "Authorization: Bearer abcDEF123456789", want: "Authorization: Bearer [REDACTED]"},
		{name: "api key assignment", in: `api_key="s3cr3tvalue99"`, want: `api_key="[REDACTED]"`},
		{name: "openai key", in: "key sk-proj-ABCDEFGHIJKLMNOPQRST used", want: "key [REDACTED] used"},
		{name: "card spaced", in: "card 4111 1111 1111 1111 ok", want: "card [CARD] ok"},
		{name: "card plain", in: "4111111111111111", want: "[CARD]"},
		{name: "short number kept", in: "order 12345 total 99", want: "order 12345 total 99"},
		{name: "plain text kept", in: "How many open tickets?", want: "How many open tickets?"},
		{name: "prose about passwords kept", in: "Find the runbook for password resets and token rotation", want: "Find the runbook for password resets and token rotation"},
		{name: "password assignment", in: "password: hunter22", want: "password: [REDACTED]"},
		{name: "empty", in: "", want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := r.String(tt.in); got != tt.want {
				t.Fatalf("String(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestValueAndStructMaskSensitiveFields(t *testing.T) {
	r := redact.New()
	in, err := structpb.NewStruct(map[string]any{
		"to":      []any{"a@example.com"},
		"subject": "Report for bob@example.com",
		"body":    "secret body",
		"nested":  map[string]any{"body": "inner", "n": 3.0},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := r.Struct(in, "body").AsMap()
	if got["body"] != redact.Mask || got["nested"].(map[string]any)["body"] != redact.Mask {
		t.Fatalf("sensitive field not masked: %v", got)
	}
	if got["to"].([]any)[0] != "[EMAIL]" || got["subject"] != "Report for [EMAIL]" {
		t.Fatalf("patterns not applied inside values: %v", got)
	}
	if got["nested"].(map[string]any)["n"] != 3.0 {
		t.Fatalf("non-string value changed: %v", got)
	}
	if in.AsMap()["body"] != "secret body" {
		t.Fatal("input was modified")
	}
	if r.Struct(nil) != nil {
		t.Fatal("nil struct should stay nil")
	}
}

func TestCompile(t *testing.T) {
	ps, err := redact.Compile([]string{`ssn=\d{3}-\d{2}-\d{4}`})
	if err != nil {
		t.Fatal(err)
	}
	if got := redact.New(ps...).String("ssn 123-45-6789 and x@y.io"); got != "ssn [REDACTED] and [EMAIL]" {
		t.Fatalf("got %q", got)
	}
	for _, bad := range []string{"noequals", "=x", "bad=("} {
		if _, err := redact.Compile([]string{bad}); err == nil || !strings.Contains(err.Error(), "redact pattern") {
			t.Errorf("Compile(%q) error = %v", bad, err)
		}
	}
}

func TestReplaceAttrRedactsLogs(t *testing.T) {
	var buf bytes.Buffer
	r := redact.New()
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{ReplaceAttr: r.ReplaceAttr}))
	log.Info("sent mail to oncall@example.com", "to", "oncall@example.com", "err", errString("token=abcdef123456"))
	out := buf.String()
	if strings.Contains(out, "oncall@example.com") || strings.Contains(out, "abcdef123456") {
		t.Fatalf("log leaks sensitive values: %s", out)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

func TestNilRedactorMasksFieldsOnly(t *testing.T) {
	var r *redact.Redactor
	got := r.Value(map[string]any{"to": []any{"a@example.com"}, "subject": "for b@example.com"}, "to").(map[string]any)
	if got["to"] != redact.Mask || got["subject"] != "for b@example.com" {
		t.Fatalf("nil redactor: %v, want only the sensitive field masked", got)
	}
}
