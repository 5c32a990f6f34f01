package redact_test

import (
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/planex-dev/planex/internal/redact"
)

// fake credentials, assembled so that no scanner mistakes this file for a
// leak.
var (
	awsKey    = "AKIA" + "IOSFODNN7EXAMPLE"
	awsSecret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "EXAMPLEKEY"
	ghp       = "ghp_" + strings.Repeat("a1B2", 9)
	pat       = "github_pat_" + "11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz"
	slack     = "xoxb-" + "123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
	jwt       = "eyJhbGciOiJIUzI1NiJ9." + "eyJzdWIiOiIxMjM0NTY3ODkwIn0." + "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
	pem       = "-----BEGIN RSA " + "PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----"
	pemOpen   = "-----BEGIN OPENSSH " + "PRIVATE KEY-----"
)

func TestSecretPatterns(t *testing.T) {
	secrets := redact.New(redact.SecretPatterns()...)
	found := []struct{ name, in, pattern string }{
		{name: "aws access key", in: "use " + awsKey + " for s3", pattern: "aws_access_key"},
		{name: "aws secret", in: "aws_secret_access_key=" + awsSecret, pattern: "aws_secret_key"},
		{name: "github classic", in: "token " + ghp, pattern: "github_token"},
		{name: "github fine-grained", in: pat, pattern: "github_token"},
		{name: "slack", in: "post with " + slack, pattern: "slack_token"},
		{name: "jwt", in: "Authorization: " + jwt, pattern: "jwt"},
		{name: "pem", in: "key:\n" + pem, pattern: "private_key"},
		{name: "pem header only", in: pemOpen, pattern: "private_key"},
		{name: "openai", in: "sk-proj-ABCDEFGHIJKLMNOPQRST", pattern: "openai_key"},
		{name: "bearer", in: "Bearer abcDEF123456789xyz", pattern: "bearer"},
		{name: "password", in: "password: hunter22", pattern: "credential"},
		{name: "card plain", in: "charge 4111111111111111 now", pattern: "card"},
		{name: "card spaces", in: "4111 1111 1111 1111", pattern: "card"},
		{name: "card dots", in: "card 4111.1111.1111.1111", pattern: "card"},
		{name: "card dashes", in: "5500-0000-0000-0004", pattern: "card"},
		{name: "amex", in: "3782 822463 10005", pattern: "card"},
	}
	for _, tt := range found {
		t.Run(tt.name, func(t *testing.T) {
			name, ok := secrets.Match(tt.in)
			if !ok || name != tt.pattern {
				t.Fatalf("Match(%q) = %q, %v; want %q", tt.in, name, ok, tt.pattern)
			}
			if out := secrets.String(tt.in); out == tt.in {
				t.Fatalf("String(%q) left it unchanged", tt.in)
			}
		})
	}
	// Issue 11's false positives, and their neighbours.
	legit := []string{
		"Find the runbook on bearer authentication for the API gateway",
		"Compare revenue for 2022 2023 2024 2025",
		"Compare revenue for 2021 2022 2023 2024 2025 by region",
		"Look up order 1234567890123456",
		"Look up order 4111111111111111 in the shop database", // Luhn-valid, but an order number
		"Why did the login fail with token: expired?",
		"password: required",
		"Explain JWT validation and the access key rotation runbook",
		"Count rows where id between 1000000000000 and 2000000000000",
		"Phone +1 415 555 0100 is the support line",
		"The SKU list has 978-3-16-148410-0 on it",
	}
	for _, in := range legit {
		t.Run("legit/"+in, func(t *testing.T) {
			if name, ok := secrets.Match(in); ok {
				t.Fatalf("Match(%q) = %s, want no secret", in, name)
			}
			if out := secrets.String(in); out != in {
				t.Fatalf("String(%q) = %q, want unchanged", in, out)
			}
		})
	}
}

func TestLuhn(t *testing.T) {
	for in, want := range map[string]bool{"4111111111111111": true, "1234567890123456": false, "378282246310005": true, "2022202320242025": false} {
		if got := redact.Luhn(in); got != want {
			t.Errorf("Luhn(%s) = %v", in, got)
		}
	}
}

func TestCanonicalNeverFails(t *testing.T) {
	in := &structpb.Struct{Fields: map[string]*structpb.Value{
		"x":     structpb.NewNumberValue(math.NaN()),
		"y":     structpb.NewNumberValue(math.Inf(1)),
		"z":     structpb.NewNumberValue(math.Inf(-1)),
		"key":   structpb.NewStringValue("sk-" + strings.Repeat("A1b2", 6)),
		"card":  structpb.NewNumberValue(4111111111111111),
		"list":  structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("a"), structpb.NewBoolValue(true), structpb.NewNullValue()}}),
		"inner": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"password": structpb.NewStringValue("hunter22")}}),
	}}
	got := redact.CanonicalStruct(in)
	for _, want := range []string{"x: NaN\n", "y: +Inf\n", "z: -Inf\n", "card: 4111111111111111\n", "inner.password: hunter22\n", "list: a\n", "list: true\n", "list: null\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("Canonical lacks %q:\n%s", want, got)
		}
	}
	secrets := redact.New(redact.SecretPatterns()...)
	for key, want := range map[string]string{"key": "openai_key", "card": "card", "inner": "credential"} {
		one := &structpb.Struct{Fields: map[string]*structpb.Value{key: in.Fields[key], "x": in.Fields["x"]}}
		if name, ok := secrets.Match(redact.CanonicalStruct(one)); !ok || name != want {
			t.Errorf("secret in %s not found (got %q)", key, name)
		}
	}
	if redact.CanonicalStruct(nil) != "" {
		t.Fatal("nil struct")
	}
}
