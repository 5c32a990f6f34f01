package emailpool_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/plan"
	"github.com/planex-dev/planex/services/executor/emailpool"
	"github.com/planex-dev/planex/services/executor/runner"
	"github.com/planex-dev/planex/services/executor/runner/runnertest"
)

// draftsBucket starts an embedded JetStream server and returns its
// planex-drafts bucket.
func draftsBucket(t testing.TB) jetstream.KeyValue {
	t.Helper()
	_, res := natstest.Start(t).Setup(t)
	return res.Drafts
}

// newPool makes a pool; without cfg.Drafts it gets a bucket of its own on
// a fresh server.
func newPool(t testing.TB, cfg emailpool.Config) *emailpool.Pool {
	t.Helper()
	if cfg.Drafts == nil {
		cfg.Drafts = draftsBucket(t)
	}
	if cfg.From == "" {
		cfg.From = "planex@example.com"
	}
	if cfg.AllowedDomains == nil {
		cfg.AllowedDomains = []string{"example.com"}
	}
	p, err := emailpool.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// call runs a tool the way the runner does, the arguments checked
// against its schema first.
func call(t testing.TB, p *emailpool.Pool, tool string, c runner.Call, args map[string]any) (map[string]any, *runner.Error) {
	t.Helper()
	out, terr := runnertest.Call(t, p.Tools(), tool, c, args)
	if terr != nil {
		return nil, terr
	}
	return out.(map[string]any), nil
}

func mustArgs(t testing.TB, m map[string]any) *structpb.Struct {
	t.Helper()
	a, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestDraftPolicy(t *testing.T) {
	p := newPool(t, emailpool.Config{OutboxDir: t.TempDir(), MaxRecipients: 3, MaxSubjectBytes: 40, MaxBodyBytes: 100})
	tests := []struct {
		name  string
		args  map[string]any
		code  planexv1.ErrorCode
		field string
		msg   string
	}{
		{name: "domain not allowed", args: map[string]any{"to": []any{"a@example.com", "b@evil.test"}, "subject": "s", "body": "b"},
			code: planexv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED, field: "args.to[1]", msg: `"evil.test"`},
		{name: "cc domain not allowed", args: map[string]any{"to": []any{"a@example.com"}, "cc": []any{"c@EXAMPLE.org"}, "subject": "s", "body": "b"},
			code: planexv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED, field: "args.cc[0]", msg: "example.org"},
		{name: "subdomain is another domain", args: map[string]any{"to": []any{"a@mail.example.com"}, "subject": "s", "body": "b"},
			code: planexv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED, field: "args.to[0]"},
		{name: "not an address", args: map[string]any{"to": []any{"not an address"}, "subject": "s", "body": "b"},
			code: planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, field: "args.to[0]", msg: "not an email address"},
		{name: "too many recipients", args: map[string]any{"to": []any{"a@example.com", "b@example.com"}, "cc": []any{"c@example.com", "d@example.com"}, "subject": "s", "body": "b"},
			code: planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, field: "args.cc", msg: "limit of 3"},
		{name: "subject too long", args: map[string]any{"to": []any{"a@example.com"}, "subject": strings.Repeat("é", 25), "body": "b"},
			code: planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, field: "args.subject", msg: "limit of 40"},
		{name: "header injection", args: map[string]any{"to": []any{"a@example.com"}, "subject": "hi\r\nBcc: x@evil.test", "body": "b"},
			code: planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, field: "args.subject"},
		{name: "body too large", args: map[string]any{"to": []any{"a@example.com"}, "subject": "s", "body": strings.Repeat("x", 101)},
			code: planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, field: "args.body", msg: "at most 100"},
		{name: "body too many bytes", args: map[string]any{"to": []any{"a@example.com"}, "subject": "s", "body": strings.Repeat("é", 51)},
			code: planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, field: "args.body", msg: "limit of 100"},
		{name: "blank subject", args: map[string]any{"to": []any{"a@example.com"}, "subject": "  ", "body": "b"},
			code: planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, field: "args.subject"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, terr := call(t, p, "email.draft", runner.Call{}, tt.args)
			if terr == nil || terr.Code != tt.code || terr.Field != tt.field || !strings.Contains(terr.Message, tt.msg) {
				t.Fatalf("error %+v, want %v on %s containing %q", terr, tt.code, tt.field, tt.msg)
			}
		})
	}

	deny := newPool(t, emailpool.Config{OutboxDir: t.TempDir(), AllowedDomains: []string{}})
	_, terr := call(t, deny, "email.draft", runner.Call{}, map[string]any{"to": []any{"a@example.com"}, "subject": "s", "body": "b"})
	if terr == nil || terr.Code != planexv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED || !strings.Contains(terr.Message, "none are allowed") {
		t.Fatalf("empty allowlist: %+v, want every domain denied", terr)
	}
}

func TestSendOverSTARTTLS(t *testing.T) {
	srv := startSMTP(t, true)
	p := newPool(t, emailpool.Config{SMTPAddr: srv.addr, SMTPUser: smtpUser, SMTPPassword: smtpPassword, TLSConfig: srv.clientTLS})
	draft, terr := call(t, p, "email.draft", runner.Call{RunID: "run1", StepID: "draft", Attempt: 1},
		map[string]any{"to": []any{"Ann <ann@example.com>", "bob@example.com"}, "cc": []any{"ann@example.com", "cat@example.com"}, "subject": "Überfällige Rechnungen", "body": "Hello,\nthree invoices are overdue.\n"})
	if terr != nil {
		t.Fatal(terr)
	}
	if got := draft["to"].([]string); len(got) != 2 || got[0] != "ann@example.com" {
		t.Fatalf("draft to %v", got)
	}
	out, terr := call(t, p, "email.send", runner.Call{RunID: "run1", StepID: "send", Attempt: 1}, map[string]any{"draft_id": draft["draft_id"]})
	if terr != nil {
		t.Fatal(terr)
	}
	mails := srv.received()
	if len(mails) != 1 {
		t.Fatalf("server received %d mails, want 1", len(mails))
	}
	m := mails[0]
	if !m.tls || m.user != smtpUser || m.from != "planex@example.com" || strings.Join(m.rcpts, ",") != "ann@example.com,bob@example.com,cat@example.com" {
		t.Fatalf("mail tls=%v user=%q from=%q rcpts=%v", m.tls, m.user, m.from, m.rcpts)
	}
	msgID := out["message_id"].(string)
	if !strings.Contains(m.data, "Message-ID: "+msgID) || !strings.HasSuffix(msgID, "@example.com>") {
		t.Fatalf("message id %s not in the mail:\n%s", msgID, m.data)
	}
	if !strings.Contains(m.data, "three invoices are overdue") {
		t.Fatalf("body missing from the mail:\n%s", m.data)
	}
	if acc := out["accepted"].([]string); len(acc) != 3 {
		t.Fatalf("accepted %v", acc)
	}

	// The Message-ID is a function of run, step and attempt.
	again := newPool(t, emailpool.Config{OutboxDir: t.TempDir()})
	d2, _ := call(t, again, "email.draft", runner.Call{}, map[string]any{"to": []any{"a@example.com"}, "subject": "s", "body": "b"})
	o2, terr := call(t, again, "email.send", runner.Call{RunID: "run1", StepID: "send", Attempt: 1}, map[string]any{"draft_id": d2["draft_id"]})
	if terr != nil || o2["message_id"] != msgID {
		t.Fatalf("message id %v (%v), want the deterministic %s", o2["message_id"], terr, msgID)
	}

	// A sent draft is never sent again.
	_, terr = call(t, p, "email.send", runner.Call{RunID: "run1", StepID: "send", Attempt: 2}, map[string]any{"draft_id": draft["draft_id"]})
	if terr == nil || terr.Field != "args.draft_id" || !strings.Contains(terr.Message, "already sent") {
		t.Fatalf("second send: %+v, want refusal", terr)
	}
	if n := len(srv.received()); n != 1 {
		t.Fatalf("server received %d mails after a refused resend", n)
	}
}

func TestSendFailures(t *testing.T) {
	tlsSrv := startSMTP(t, true)
	plainSrv := startSMTP(t, false)
	closed := closedAddr(t)
	tests := []struct {
		name      string
		cfg       emailpool.Config
		to        []any
		srv       *smtpServer
		code      planexv1.ErrorCode
		retryable bool
	}{
		{name: "relay down", cfg: emailpool.Config{SMTPAddr: closed}, to: []any{"a@example.com"},
			code: planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE, retryable: true},
		{name: "mandatory TLS against a plain server", cfg: emailpool.Config{SMTPAddr: plainSrv.addr}, srv: plainSrv, to: []any{"a@example.com"},
			code: planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE, retryable: true},
		{name: "wrong password", cfg: emailpool.Config{SMTPAddr: tlsSrv.addr, SMTPUser: smtpUser, SMTPPassword: "wrong", TLSConfig: tlsSrv.clientTLS}, srv: tlsSrv, to: []any{"a@example.com"},
			code: planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE, retryable: true},
		{name: "one recipient refused sends to nobody", cfg: emailpool.Config{SMTPAddr: tlsSrv.addr, TLSConfig: tlsSrv.clientTLS}, srv: tlsSrv,
			to: []any{"a@example.com", "refuse@example.com"}, code: planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPool(t, tt.cfg)
			d, terr := call(t, p, "email.draft", runner.Call{}, map[string]any{"to": tt.to, "subject": "s", "body": "b"})
			if terr != nil {
				t.Fatal(terr)
			}
			_, terr = call(t, p, "email.send", runner.Call{}, map[string]any{"draft_id": d["draft_id"]})
			if terr == nil || terr.Code != tt.code || terr.Retryable != tt.retryable {
				t.Fatalf("error %+v, want %v retryable=%v", terr, tt.code, tt.retryable)
			}
			if strings.Contains(terr.Error(), "wrong") {
				t.Fatalf("error leaks the password: %v", terr)
			}
			if tt.srv != nil && len(tt.srv.received()) != 0 {
				t.Fatalf("server received %d mails", len(tt.srv.received()))
			}
		})
	}
}

func TestAllowlistCheckedAgainAtSend(t *testing.T) {
	drafts := draftsBucket(t)
	outbox := t.TempDir()
	before := newPool(t, emailpool.Config{Drafts: drafts, OutboxDir: outbox, AllowedDomains: []string{"example.com", "example.net"}})
	d, terr := call(t, before, "email.draft", runner.Call{}, map[string]any{"to": []any{"a@example.com", "b@example.net"}, "subject": "s", "body": "b"})
	if terr != nil {
		t.Fatal(terr)
	}
	// The allowlist shrank since (a restart with other flags).
	after := newPool(t, emailpool.Config{Drafts: drafts, OutboxDir: outbox, AllowedDomains: []string{"example.com"}})
	_, terr = call(t, after, "email.send", runner.Call{}, map[string]any{"draft_id": d["draft_id"]})
	if terr == nil || terr.Code != planexv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED || terr.Field != "draft.to[1]" {
		t.Fatalf("error %+v, want PERMISSION_DENIED on draft.to[1]", terr)
	}
	if msgs, _ := emailpool.ListOutbox(outbox); len(msgs) != 0 {
		t.Fatalf("%d messages written although a recipient was refused", len(msgs))
	}
	// The refusal left no claim: the draft is still sendable.
	if got := readDraft(t, drafts, d["draft_id"].(string)); got.SendBy != nil || got.SentAt != nil {
		t.Fatalf("refused send changed the draft: %+v", got)
	}
}

// TestOutboxAndDraftsSurviveRestart restarts the pool and the NATS server
// (file storage) between email.draft and email.send.
func TestOutboxAndDraftsSurviveRestart(t *testing.T) {
	ns := natstest.Start(t)
	_, res := ns.Setup(t)
	outbox := filepath.Join(t.TempDir(), "outbox")
	first := newPool(t, emailpool.Config{Drafts: res.Drafts, OutboxDir: outbox})
	d, terr := call(t, first, "email.draft", runner.Call{}, map[string]any{"to": []any{"ops@example.com"}, "cc": []any{"lead@example.com"}, "subject": "Queue backlog", "body": "Backlog is at 10k."})
	if terr != nil {
		t.Fatal(terr)
	}
	if d["size"].(int64) <= int64(len("Backlog is at 10k.")) {
		t.Fatalf("size %v", d["size"])
	}
	ns.Restart()
	_, res = ns.Setup(t)
	second := newPool(t, emailpool.Config{Drafts: res.Drafts, OutboxDir: outbox}) // a restarted replica
	out, terr := call(t, second, "email.send", runner.Call{RunID: "r", StepID: "send", Attempt: 1}, map[string]any{"draft_id": d["draft_id"]})
	if terr != nil {
		t.Fatal(terr)
	}
	msgs, err := emailpool.ListOutbox(outbox)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 {
		t.Fatalf("outbox holds %d messages, want 1", len(msgs))
	}
	m := msgs[0]
	if m.Subject != "Queue backlog" || m.MessageID != out["message_id"] || strings.Join(m.To, ",") != "ops@example.com" ||
		strings.Join(m.Cc, ",") != "lead@example.com" || m.Date.IsZero() || m.Size == 0 {
		t.Fatalf("outbox message %+v", m)
	}
	if empty, err := emailpool.ListOutbox(filepath.Join(t.TempDir(), "none")); err != nil || len(empty) != 0 {
		t.Fatalf("missing outbox: %v %v", empty, err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  emailpool.Config
		want string
	}{
		{name: "no relay", cfg: emailpool.Config{From: "a@example.com"}, want: "--smtp-addr"},
		{name: "bad policy", cfg: emailpool.Config{OutboxDir: "o", From: "a@example.com", StartTLS: "sometimes"}, want: `--smtp-starttls "sometimes"`},
		{name: "bad from", cfg: emailpool.Config{OutboxDir: "o", From: "nobody"}, want: `--email-from "nobody"`},
		{name: "bad domain", cfg: emailpool.Config{OutboxDir: "o", From: "a@example.com", AllowedDomains: []string{"exa mple.com"}}, want: "exa mple.com"},
		{name: "password in clear", cfg: emailpool.Config{SMTPAddr: "h:25", From: "a@example.com", SMTPUser: "u", StartTLS: "none"}, want: "clear text"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if _, err := emailpool.New(emailpool.Config{OutboxDir: t.TempDir(), From: "a@example.com"}); !errors.Is(err, emailpool.ErrNoDraftsBucket) {
		t.Fatalf("New without a drafts bucket: %v, want ErrNoDraftsBucket", err)
	}
}

// email.send's retry policy retries UNAVAILABLE — which the pool reports
// only when no mail can have left (see TestSendFailures: the relay received
// nothing) — across an outage of more than 20s, and never an outcome that
// may hide a sent mail.
func TestSendRetryPolicy(t *testing.T) {
	p := newPool(t, emailpool.Config{SMTPAddr: closedAddr(t)})
	var spec *planexv1.ToolSpec
	for _, tool := range p.Tools() {
		if tool.Spec().GetName() == "email.send" {
			spec = tool.Spec()
		}
	}
	if spec == nil {
		t.Fatal("no email.send tool")
	}
	if errs := plan.CheckToolRetry(spec); len(errs) != 0 {
		t.Fatalf("catalog refuses email.send's retry policy: %v", errs)
	}
	pol := plan.RetryOf(&planexv1.Step{Id: "send", Tool: "email.send"}, spec)
	if !pol.Retries(planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE, 0) {
		t.Fatal("UNAVAILABLE is not retried")
	}
	for _, c := range []planexv1.ErrorCode{planexv1.ErrorCode_ERROR_CODE_TIMEOUT, planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN,
		planexv1.ErrorCode_ERROR_CODE_MAX_DELIVERIES, planexv1.ErrorCode_ERROR_CODE_INTERNAL, planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED} {
		if pol.Retries(c, 0) {
			t.Fatalf("%s is retried for a tool that sends mail", c)
		}
	}
	var window time.Duration
	for n := 1; pol.Retries(planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE, n-1); n++ {
		window += pol.Backoff(n)
	}
	if window < 20*time.Second {
		t.Fatalf("retries wait %v in all, want an outage of 20s covered", window)
	}
}
