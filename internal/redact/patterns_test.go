package redact_test

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/redact"
)

// Fake credentials of the formats issue 26 found missing, assembled so
// that no scanner mistakes this file for a leak.
var (
	stripeLive   = "sk_" + "live_" + "4eC39HqLyjWDarjtT1zdp7dc"
	stripeTest   = "sk_" + "test_" + "4eC39HqLyjWDarjtT1zdp7dc"
	stripeRK     = "rk_" + "live_" + "51H8xYzAbCdEfGhIjKlMnOp"
	googleKey    = "AIza" + "SyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY"
	basicHeader  = "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("admin:s3cr3t-pw"))
	openAIZWSP   = "sk-" + "\u200b" + "proj-ABCDEFGHIJKLMNOPQRST"
	natsJWTBody  = "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ." + "eyJqdGkiOiJBQkMiLCJpYXQiOjE3MDAwMDAwMDAsImlzcyI6IkFBQSIsInN1YiI6IlVBQSJ9." + strings.Repeat("Qx9_", 21) + "AB"
	spaceyHeader = base64.RawURLEncoding.EncodeToString([]byte(`{ "alg": "HS256", "typ": "JWT" }`)) + "." +
		base64.RawURLEncoding.EncodeToString([]byte(`{ "sub": "1234567890" }`)) + "." + "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
)

// seeds returns a fresh nkey seed of every type.
func seeds(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, create := range map[string]func() (nkeys.KeyPair, error){
		"user": nkeys.CreateUser, "account": nkeys.CreateAccount, "operator": nkeys.CreateOperator,
		"server": nkeys.CreateServer, "cluster": nkeys.CreateCluster, "curve": nkeys.CreateCurveKeys,
	} {
		kp, err := create()
		if err != nil {
			t.Fatal(err)
		}
		seed, err := kp.Seed()
		if err != nil {
			t.Fatal(err)
		}
		out[name] = string(seed)
	}
	return out
}

func TestNewSecretPatterns(t *testing.T) {
	secrets := redact.New(redact.SecretPatterns()...)
	apiKey, _, err := authn.GenerateAPIKey("ci", authn.RoleRunner)
	if err != nil {
		t.Fatal(err)
	}
	type tc struct{ name, in, pattern, secret string }
	found := []tc{
		{name: "planex api key", in: "use " + apiKey + " for the CLI", pattern: "planex_api_key", secret: apiKey},
		{name: "planex api key in env", in: "PLANEX_TOKEN=" + apiKey, pattern: "planex_api_key", secret: apiKey},
		{name: "stripe live", in: "charge with " + stripeLive, pattern: "stripe_key", secret: stripeLive},
		{name: "stripe test", in: "key " + stripeTest, pattern: "stripe_key", secret: stripeTest},
		{name: "stripe restricted", in: stripeRK, pattern: "stripe_key", secret: stripeRK},
		{name: "google", in: "maps key=" + googleKey, pattern: "google_api_key", secret: googleKey},
		{name: "google in url", in: "https://maps.googleapis.com/api?key=" + googleKey + "&x=1", pattern: "google_api_key", secret: googleKey},
		{name: "basic header", in: basicHeader, pattern: "basic_auth", secret: base64.StdEncoding.EncodeToString([]byte("admin:s3cr3t-pw"))},
		{name: "basic lower case", in: "authorization: basic " + base64.StdEncoding.EncodeToString([]byte("u:pw")), pattern: "basic_auth", secret: base64.StdEncoding.EncodeToString([]byte("u:pw"))},
		{name: "url password", in: "connect to postgres://planex:Tr0ub4dor3@db.internal:5432/app", pattern: "url_password", secret: "Tr0ub4dor3"},
		{name: "url password words", in: "amqp://guest:correcthorsebattery@rabbit/", pattern: "url_password", secret: "correcthorsebattery"},
		{name: "nats jwt", in: "jwt: " + natsJWTBody, pattern: "jwt", secret: natsJWTBody},
		{name: "jwt with spaced header", in: "token " + spaceyHeader, pattern: "jwt", secret: spaceyHeader},
		{name: "openai split by zero-width space", in: "key " + openAIZWSP + " ok", pattern: "openai_key", secret: "proj-ABCDEFGHIJKLMNOPQRST"},
		{name: "aws split by soft hyphen", in: "AKIA\u00adIOSFODNN7EXAMPLE", pattern: "aws_access_key", secret: "IOSFODNN7EXAMPLE"},
		{name: "card split by bidi override", in: "4111\u202e1111\u202c11111111", pattern: "card", secret: "11111111"},
		{name: "planex key split by word joiner", in: apiKey[:10] + "\u2060" + apiKey[10:], pattern: "planex_api_key", secret: apiKey[10:]},
		{name: "github fine-grained alone", in: "github_pat_" + "11ABCDEFG0123456789_ABCDEFIJKLMNOPQRSTUVWXYZ", pattern: "github_token", secret: "11ABCDEFG0123456789"},
		{name: "access token", in: "access_token=ya29a0AfH6SMBx3", pattern: "credential", secret: "ya29a0AfH6SMBx3"},
		{name: "nkey seed block", in: "-----BEGIN USER NKEY SEED-----\nSUAXYZ\n------END USER NKEY SEED------", pattern: "nkey_seed", secret: "SUAXYZ"},
	}
	for typ, seed := range seeds(t) {
		found = append(found, tc{name: "nkey seed " + typ, in: "seed: " + seed, pattern: "nkey_seed", secret: seed})
	}
	for _, tt := range found {
		t.Run(tt.name, func(t *testing.T) {
			name, ok := secrets.Match(tt.in)
			if !ok || name != tt.pattern {
				t.Fatalf("Match(%q) = %q, %v; want %q", tt.in, name, ok, tt.pattern)
			}
			out := secrets.String(tt.in)
			if strings.Contains(out, tt.secret) {
				t.Fatalf("String(%q) = %q still holds %q", tt.in, out, tt.secret)
			}
			if !strings.Contains(out, redact.Mask) && !strings.Contains(out, "[CARD]") {
				t.Fatalf("String(%q) = %q, want a mask", tt.in, out)
			}
		})
	}

	legit := []string{
		"List the skills of the support team",
		"Ask about sk_ prefixed keys in the runbook",
		"The AIza prefix marks Google API keys",
		"Basic authentication is disabled on the gateway",
		"Explain basic accounting for the finance team",
		"Basic Auth: see the runbook",
		"Connect with postgres://user:password@localhost:5432/db as in the docs",
		"Use postgres://planex:${PGPASSWORD}@db:5432/app",
		"The URL is amqp://guest:***@rabbit/",
		"Open https://github.com/planex-dev/planex/issues/26 and https://example.com:8443/path@v2",
		"ssh git@github.com:org/repo.git",
		"Read com.example.application.MainActivity and org.apache.commons.configuration",
		"Decode aGVsbG8gd29ybGQgYW5kIG1vcmU.dGhlIHNlY29uZCBwYXJ0.c2lnbmF0dXJl as base64",
		"The package is planex.v1.SupervisorService.StartRun",
		"SUMMARY OF THE QUARTERLY REVENUE REPORT FOR THE SALES TEAM", // upper case prose
		"pxk_ is the prefix of planex API keys",
		"Compare revenue for 2022 2023 2024 2025",
		"Send 👨\u200d👩\u200d👧 to the family channel",
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

func TestInvisibleCharactersOutsideMatchesAreKept(t *testing.T) {
	secrets := redact.New(redact.SecretPatterns()...)
	in := "family 👨\u200d👩\u200d👧, key " + openAIZWSP + ", \u200fmark"
	want := "family 👨\u200d👩\u200d👧, key " + redact.Mask + ", \u200fmark"
	if got := secrets.String(in); got != want {
		t.Fatalf("String = %q, want %q", got, want)
	}
	// A replacement that keeps part of the match ($1) reads it from the
	// normalised text.
	if got := secrets.String("pass\u200bword: hunter22"); got != "password: "+redact.Mask {
		t.Fatalf("String = %q", got)
	}
	// Invalid UTF-8 next to an invisible character keeps its bytes.
	if got := secrets.String("\xff\u200b" + stripeLive + "\xfe"); got != "\xff\u200b"+redact.Mask+"\xfe" {
		t.Fatalf("String = %q", got)
	}
	if got := redact.StripInvisible("a\u200bb\ufeffc\u00add\u2066e"); got != "abcde" {
		t.Fatalf("StripInvisible = %q", got)
	}
	for _, c := range []rune{0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF, 0x202A, 0x202E, 0x2066, 0x2069, 0x00AD, 0x200E, 0x200F} {
		if !redact.IsInvisible(c) {
			t.Errorf("IsInvisible(%U) = false", c)
		}
	}
	for _, c := range []rune{'a', ' ', 0x00A0, 0x2000, 0x202F, 0x3000, 0x1F468} {
		if redact.IsInvisible(c) {
			t.Errorf("IsInvisible(%U) = true", c)
		}
	}
}

func TestLeaves(t *testing.T) {
	secrets := redact.New(redact.SecretPatterns()...)
	var in any
	if err := json.Unmarshal([]byte(`{
		"rows": [
			{"k": "`+awsKey+`", "n": 1},
			{"password": "hunter22", "note": "fine"},
			{"card_number": 4111111111111111, "order": 4111111111111111},
			{"mail": "ops@example.com", "url": "postgres://u:Tr0ub4dor3@db/x"}
		],
		"`+stripeLive+`": "key as a key",
		"count": 4
	}`), &in); err != nil {
		t.Fatal(err)
	}
	before, _ := json.Marshal(in)
	out, changed := secrets.Leaves(in)
	if !changed {
		t.Fatal("Leaves reported no change")
	}
	got, _ := json.Marshal(out)
	for _, leak := range []string{awsKey, "hunter22", "Tr0ub4dor3", stripeLive} {
		if strings.Contains(string(got), leak) {
			t.Errorf("masked output holds %q: %s", leak, got)
		}
	}
	rows := out.(map[string]any)["rows"].([]any)
	if c := rows[2].(map[string]any); c["card_number"] != "[CARD]" || c["order"] != 4111111111111111.0 {
		t.Errorf("card row = %v, want the card masked and the order number kept", c)
	}
	if m := rows[3].(map[string]any); m["mail"] != "ops@example.com" || m["url"] != "postgres://u:"+redact.Mask+"@db/x" {
		t.Errorf("row = %v, want the address kept and the URL's password masked", m)
	}
	if p := rows[1].(map[string]any); p["password"] != redact.Mask || p["note"] != "fine" {
		t.Errorf("row = %v", p)
	}
	if after, _ := json.Marshal(in); string(after) != string(before) {
		t.Fatal("Leaves modified its input")
	}
	clean := map[string]any{"a": []any{"x", 1.0, true, nil}, "b": map[string]any{"c": "d"}}
	if _, changed := secrets.Leaves(clean); changed {
		t.Fatal("clean value reported changed")
	}
	var none *redact.Redactor
	if _, changed := none.Leaves(in); changed {
		t.Fatal("nil redactor changed something")
	}

	// The protobuf form masks the same and shares what it does not change.
	pv, err := structpb.NewValue(in)
	if err != nil {
		t.Fatal(err)
	}
	orig := proto.Clone(pv)
	red, changed := secrets.LeavesValue(pv)
	if !changed {
		t.Fatal("LeavesValue reported no change")
	}
	want, _ := structpb.NewValue(out)
	if !proto.Equal(red, want) {
		t.Fatalf("LeavesValue = %v, want %v", red, want)
	}
	if !proto.Equal(pv, orig) {
		t.Fatal("LeavesValue modified its input")
	}
	cv, _ := structpb.NewValue(clean)
	if same, changed := secrets.LeavesValue(cv); changed || same != cv {
		t.Fatal("clean Value not returned as is")
	}
}

// TestLeavesReadsTablesByColumn: an sql.query-shaped output is read cell by
// cell next to its column's name.
func TestLeavesReadsTablesByColumn(t *testing.T) {
	secrets := redact.New(redact.SecretPatterns()...)
	var in any
	if err := json.Unmarshal([]byte(`{
		"columns": [{"name": "password", "type": "TEXT"}, {"name": "order", "type": "INTEGER"}, {"name": "k", "type": "TEXT"}],
		"rows": [["hunter22", 4111111111111111, "`+awsKey+`"], ["short", 1, "x"]],
		"row_count": 2
	}`), &in); err != nil {
		t.Fatal(err)
	}
	want := `{"columns":[{"name":"password","type":"TEXT"},{"name":"order","type":"INTEGER"},{"name":"k","type":"TEXT"}],` +
		`"row_count":2,"rows":[["[REDACTED]",4111111111111111,"[REDACTED]"],["short",1,"x"]]}`
	out, changed := secrets.Leaves(in)
	got, _ := json.Marshal(out)
	if !changed || string(got) != want {
		t.Fatalf("Leaves = %s, want %s", got, want)
	}
	pv, _ := structpb.NewValue(in)
	red, changed := secrets.LeavesValue(pv)
	wantPV, _ := structpb.NewValue(out)
	if !changed || !proto.Equal(red, wantPV) {
		t.Fatalf("LeavesValue = %v, want %v", red, wantPV)
	}
	// Plain-string column names work too.
	in2 := map[string]any{"columns": []any{"secret"}, "rows": []any{[]any{"Zq9xZq9x12"}}}
	if out, _ := secrets.Leaves(in2); out.(map[string]any)["rows"].([]any)[0].([]any)[0] != redact.Mask {
		t.Fatalf("Leaves = %v", out)
	}
}

// TestLeavesValueHoldingAWholeCredential: a value that is itself a
// "key: secret" pair under a key of the same name is masked too.
func TestLeavesValueHoldingAWholeCredential(t *testing.T) {
	secrets := redact.New(redact.SecretPatterns()...)
	out, changed := secrets.Leaves(map[string]any{"password": "password: hunter22"})
	if !changed || strings.Contains(out.(map[string]any)["password"].(string), "hunter22") {
		t.Fatalf("Leaves = %v", out)
	}
}
