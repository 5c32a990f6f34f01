package redact

import (
	"encoding/base64"
	"strings"
	"testing"
)

// TestHintsNeverRefuseAMatch: a hint only saves work; for every sample
// (and its upper- and lower-case forms) that a pattern's expression
// matches, the hint lets it through.
func TestHintsNeverRefuseAMatch(t *testing.T) {
	samples := []string{
		"password: hunter22", "PASSWORD=Hunter22x", "Api-Key: 'ab12cd34ef'", "session_token=abc123def456",
		"Bearer abcDEF123456789xyz", "authorization: basic " + base64.StdEncoding.EncodeToString([]byte("u:p")),
		"redis://default:s3cr3tpw@cache:6379/0", "-----BEGIN EC PRIVATE KEY-----\nabc\n-----END EC PRIVATE KEY-----",
		"-----BEGIN USER NKEY SEED-----\nSUAX\n------END USER NKEY SEED------", "S" + "UA" + strings.Repeat("ABCDEFGH234567", 4),
		"pxk_" + strings.Repeat("aB3-_", 9), "eyJhbGciOiJIUzI1NiJ9." + "eyJzdWIiOiIxMjM0NTY3ODkwIn0." + strings.Repeat("x", 20),
		base64.RawURLEncoding.EncodeToString([]byte(`{"typ":"JWT","alg":"none"}`)) + "." + base64.RawURLEncoding.EncodeToString([]byte(`{"a":1}`)) + ".",
		"AKIA" + "IOSFODNN7EXAMPLE", "aws_secret_access_key = " + strings.Repeat("aB3/", 10), "ghp_" + strings.Repeat("a1B2", 9),
		"github_pat_" + strings.Repeat("A1_", 10), "xoxp-1234567890-abc", "sk-" + strings.Repeat("Ab1", 6), "sk_" + "test_" + strings.Repeat("Ab1", 6),
		"AIza" + strings.Repeat("x", 35), "4111 1111 1111 1111", "4111-1111-1111-1111", "4111.1111.1111.1111", "378282246310005",
		"a@b.io", "mail ops@example.com now",
	}
	for _, p := range DefaultPatterns() {
		if p.hint == nil {
			continue
		}
		for _, s := range samples {
			for _, v := range []string{s, strings.ToUpper(s), strings.ToLower(s), "x " + s + " y"} {
				if p.RE.MatchString(v) && !p.hint(&probe{s: v}) {
					t.Errorf("pattern %s matches %q but its hint refuses it", p.Name, v)
				}
			}
		}
	}
}
