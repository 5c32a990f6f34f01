package trigger_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/trigger"
)

func valid() *planexv1.Trigger {
	return &planexv1.Trigger{
		Name: "gh-issues", Subject: "planex.inbound.github.issues",
		Filter:         `event.action == "opened"`,
		Goal:           `"Triage issue #" + string(int(event.issue.number)) + ": " + event.issue.title`,
		Inputs:         `{"issue": event.issue, "repo": headers["X-Repo"]}`,
		Labels:         map[string]string{"source": `"github"`},
		IdempotencyKey: `headers["X-GitHub-Delivery"]`,
		Webhook:        &planexv1.TriggerWebhook{Enabled: true, Scheme: "github", SecretRef: "github-secret"},
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*planexv1.Trigger)
		field  string // "" : valid
	}{
		{"valid", func(*planexv1.Trigger) {}, ""},
		{"wildcard subject without webhook", func(tr *planexv1.Trigger) { tr.Subject = "planex.inbound.orders.>"; tr.Webhook = nil }, ""},
		{"bad name", func(tr *planexv1.Trigger) { tr.Name = "Bad_Name" }, "trigger.name"},
		{"subject outside the prefix", func(tr *planexv1.Trigger) { tr.Subject = "planex.events.x" }, "trigger.subject"},
		{"subject with an empty token", func(tr *planexv1.Trigger) { tr.Subject = "planex.inbound..x" }, "trigger.subject"},
		{"subject with > not last", func(tr *planexv1.Trigger) { tr.Subject = "planex.inbound.>.x" }, "trigger.subject"},
		{"webhook on a wildcard subject", func(tr *planexv1.Trigger) { tr.Subject = "planex.inbound.*" }, "trigger.webhook.enabled"},
		{"webhook scheme", func(tr *planexv1.Trigger) { tr.Webhook.Scheme = "gitlab" }, "trigger.webhook.scheme"},
		{"webhook secret path", func(tr *planexv1.Trigger) { tr.Webhook.SecretRef = "../etc/passwd" }, "trigger.webhook.secret_ref"},
		{"webhook tolerance", func(tr *planexv1.Trigger) { tr.Webhook.ToleranceSeconds = -1 }, "trigger.webhook.tolerance_seconds"},
		{"filter syntax", func(tr *planexv1.Trigger) { tr.Filter = `event.action ==` }, "trigger.filter"},
		{"filter type", func(tr *planexv1.Trigger) { tr.Filter = `"yes"` }, "trigger.filter"},
		{"goal required", func(tr *planexv1.Trigger) { tr.Goal = "" }, "trigger.goal"},
		{"goal type", func(tr *planexv1.Trigger) { tr.Goal = `1 + 2` }, "trigger.goal"},
		{"inputs type", func(tr *planexv1.Trigger) { tr.Inputs = `"x"` }, "trigger.inputs"},
		{"key required", func(tr *planexv1.Trigger) { tr.IdempotencyKey = "" }, "trigger.idempotency_key"},
		{"key type", func(tr *planexv1.Trigger) { tr.IdempotencyKey = `true` }, "trigger.idempotency_key"},
		{"label key", func(tr *planexv1.Trigger) { tr.Labels = map[string]string{"Bad Key": `"x"`} }, "trigger.labels"},
		{"reserved label", func(tr *planexv1.Trigger) { tr.Labels = map[string]string{trigger.LabelTrigger: `"x"`} }, "trigger.labels"},
		{"label expression", func(tr *planexv1.Trigger) { tr.Labels = map[string]string{"a": `nope(`} }, `trigger.labels["a"]`},
		{"unknown variable", func(tr *planexv1.Trigger) { tr.Goal = `payload.x` }, "trigger.goal"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := valid()
			tc.change(tr)
			err := trigger.Validate(tr)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("valid trigger refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %v, want one naming %s", err, tc.field)
			}
		})
	}
	if err := trigger.Validate(nil); err == nil {
		t.Fatal("nil trigger accepted")
	}
}

func TestEvaluate(t *testing.T) {
	prg, err := trigger.Compile(valid())
	if err != nil {
		t.Fatal(err)
	}
	hdr := map[string]string{"X-GitHub-Delivery": "d-1", "X-Repo": "planex"}
	tests := []struct {
		name    string
		headers map[string]string
		body    string
		goal    string // want a run with this goal
		reject  string // want a rejection containing this
		filter  bool   // want ErrFiltered
	}{
		{name: "started", headers: hdr, body: `{"action":"opened","issue":{"number":42,"title":"crash"}}`, goal: "Triage issue #42: crash"},
		{name: "filtered", headers: hdr, body: `{"action":"closed","issue":{"number":42,"title":"crash"}}`, filter: true},
		{name: "not JSON", headers: hdr, body: `{"action":`, reject: "not JSON"},
		{name: "missing field", headers: hdr, body: `{"action":"opened"}`, reject: "goal"},
		{name: "filter on missing field", headers: hdr, body: `{}`, reject: "filter"},
		{name: "empty key", headers: map[string]string{"X-GitHub-Delivery": ""}, body: `{"action":"opened","issue":{"number":1,"title":"t"}}`, reject: "idempotency_key: empty"},
		{name: "missing key header", headers: nil, body: `{"action":"opened","issue":{"number":1,"title":"t"}}`, reject: "idempotency_key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			run, err := prg.Evaluate("planex.inbound.github.issues", tc.headers, []byte(tc.body))
			var rej *trigger.Rejection
			switch {
			case tc.filter:
				if !errors.Is(err, trigger.ErrFiltered) {
					t.Fatalf("got %v, want filtered", err)
				}
			case tc.reject != "":
				if !errors.As(err, &rej) || !strings.Contains(rej.Reason, tc.reject) {
					t.Fatalf("got %v, want a rejection with %q", err, tc.reject)
				}
			default:
				if err != nil {
					t.Fatal(err)
				}
				if run.Goal != tc.goal || run.Key != "d-1" || run.Labels["source"] != "github" {
					t.Fatalf("run %+v", run)
				}
				if got := run.Inputs.GetFields()["repo"].GetStringValue(); got != "planex" {
					t.Fatalf("inputs.repo = %q", got)
				}
				if got := run.Inputs.GetFields()["issue"].GetStructValue().GetFields()["number"].GetNumberValue(); got != 42 {
					t.Fatalf("inputs.issue.number = %v", got)
				}
			}
		})
	}
}

func TestRunKey(t *testing.T) {
	if got := trigger.RunKey("t", "k1"); got != "trigger:t:k1" {
		t.Fatalf("RunKey = %q", got)
	}
	long := trigger.RunKey("t", strings.Repeat("x", 300))
	if len(long) > 128 || !strings.HasPrefix(long, "trigger:t:sha256:") {
		t.Fatalf("long key %q (%d bytes)", long, len(long))
	}
	if long == trigger.RunKey("t", strings.Repeat("x", 299)) {
		t.Fatal("distinct long keys hashed alike")
	}
}

func TestMatches(t *testing.T) {
	for _, tc := range []struct {
		pattern, subject string
		want             bool
	}{
		{"planex.inbound.a", "planex.inbound.a", true},
		{"planex.inbound.a", "planex.inbound.b", false},
		{"planex.inbound.*", "planex.inbound.a", true},
		{"planex.inbound.*", "planex.inbound.a.b", false},
		{"planex.inbound.>", "planex.inbound.a.b", true},
		{"planex.inbound.a.>", "planex.inbound.a", false},
	} {
		if got := trigger.Matches(tc.pattern, tc.subject); got != tc.want {
			t.Errorf("Matches(%q, %q) = %v", tc.pattern, tc.subject, got)
		}
	}
}

func TestVerify(t *testing.T) {
	secret := []byte("s3cret")
	body := []byte(`{"id":"evt_1"}`)
	now := time.Unix(1_800_000_000, 0)
	h := func(k, v string) http.Header {
		x := http.Header{}
		if k != "" {
			x.Set(k, v)
		}
		return x
	}
	tests := []struct {
		name   string
		scheme string
		header http.Header
		body   []byte
		want   error
	}{
		{"github good", "github", h(trigger.HeaderGitHub, trigger.SignGitHub(secret, body)), body, nil},
		{"github other body", "github", h(trigger.HeaderGitHub, trigger.SignGitHub(secret, body)), []byte(`{"id":"evt_2"}`), trigger.ErrSignatureInvalid},
		{"github other secret", "github", h(trigger.HeaderGitHub, trigger.SignGitHub([]byte("other"), body)), body, trigger.ErrSignatureInvalid},
		{"github no prefix", "github", h(trigger.HeaderGitHub, strings.TrimPrefix(trigger.SignGitHub(secret, body), "sha256=")), body, trigger.ErrSignatureInvalid},
		{"github missing", "github", h("", ""), body, trigger.ErrSignatureMissing},
		{"stripe good", "stripe", h(trigger.HeaderStripe, trigger.SignStripe(secret, body, now.Add(-time.Minute))), body, nil},
		{"stripe stale", "stripe", h(trigger.HeaderStripe, trigger.SignStripe(secret, body, now.Add(-10*time.Minute))), body, trigger.ErrSignatureStale},
		{"stripe future", "stripe", h(trigger.HeaderStripe, trigger.SignStripe(secret, body, now.Add(10*time.Minute))), body, trigger.ErrSignatureStale},
		{"stripe other body", "stripe", h(trigger.HeaderStripe, trigger.SignStripe(secret, body, now)), []byte("{}"), trigger.ErrSignatureInvalid},
		// The timestamp is signed: moving it forward to beat the
		// tolerance breaks the signature.
		{"stripe replayed with a new timestamp", "stripe", h(trigger.HeaderStripe, strings.Replace(trigger.SignStripe(secret, body, now.Add(-10*time.Minute)), "t=", "t=1", 1)), body, trigger.ErrSignatureInvalid},
		{"stripe missing", "stripe", h("", ""), body, trigger.ErrSignatureMissing},
		{"stripe no v1", "stripe", h(trigger.HeaderStripe, "t=1800000000"), body, trigger.ErrSignatureInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := trigger.Verify(tc.scheme, secret, tc.header, tc.body, now, 0)
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
	if err := trigger.Verify("github", nil, h(trigger.HeaderGitHub, trigger.SignGitHub(nil, body)), body, now, 0); err == nil {
		t.Fatal("empty secret accepted")
	}
	// A replayed delivery has the same replay id; another has another.
	a := h(trigger.HeaderStripe, trigger.SignStripe(secret, body, now))
	b := h(trigger.HeaderStripe, trigger.SignStripe(secret, body, now.Add(time.Second)))
	if trigger.ReplayID("stripe", a) != trigger.ReplayID("stripe", a.Clone()) || trigger.ReplayID("stripe", a) == trigger.ReplayID("stripe", b) {
		t.Fatal("replay ids")
	}
}
