package emailpool_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/executor/emailpool"
	"github.com/planex-dev/planex/services/executor/runner"
	"github.com/planex-dev/planex/services/executor/runner/runnertest"
)

// TestSendExactlyOnceAcrossCrash is the acceptance test of email.send: the
// executor is killed after the SMTP server accepted the mail and before the
// step was acknowledged, a new executor gets the redelivered step, and the
// mail is delivered exactly once. Killed before the result was recorded,
// the step comes back OUTCOME_UNKNOWN; killed after, the recorded result is
// replayed.
func TestSendExactlyOnceAcrossCrash(t *testing.T) {
	tests := []struct {
		name     string
		crash    func(h *runner.Hooks, kill func())
		want     planexv1.StepResultStatus
		replayed bool
	}{
		{
			name:  "killed before the result was recorded",
			crash: func(h *runner.Hooks, kill func()) { h.AfterRun = func(*planexv1.StepRequest) { kill() } },
			want:  planexv1.StepResultStatus_STEP_RESULT_STATUS_OUTCOME_UNKNOWN,
		},
		{
			name:     "killed after the result was recorded",
			crash:    func(h *runner.Hooks, kill func()) { h.BeforePublish = func(*planexv1.StepRequest) { kill() } },
			want:     planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED,
			replayed: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := natstest.Start(t)
			mailSrv := startSMTP(t, true)
			_, res := ns.Setup(t)
			cfg := emailpool.Config{
				From: "planex@example.com", AllowedDomains: []string{"example.com"},
				SMTPAddr: mailSrv.addr, SMTPUser: smtpUser, SMTPPassword: smtpPassword, TLSConfig: mailSrv.clientTLS,
			}
			drafter := cfg
			drafter.Drafts = res.Drafts
			draft, terr := call(t, newPool(t, drafter), "email.draft", runner.Call{RunID: "run1", StepID: "draft", Attempt: 1},
				map[string]any{"to": []any{"finance@example.com"}, "subject": "Overdue invoices", "body": "Three invoices are overdue."})
			if terr != nil {
				t.Fatal(terr)
			}
			ctx := runnertest.Context(t)

			// Replica A: killed at the crash point (its NATS connection
			// closed without an ack, as if the process died).
			ncA, resA := ns.Setup(t)
			killed := make(chan struct{})
			var once sync.Once
			var hooks runner.Hooks
			tt.crash(&hooks, func() { once.Do(func() { ncA.Close(); close(killed) }) })
			startReplica(t, ctx, resA, cfg, hooks)

			results := runnertest.Results(t, ctx, res, "run1")
			runnertest.PublishStep(t, ctx, res, &planexv1.StepRequest{RunId: "run1", StepId: "send", Attempt: 1, PlanRevision: 1, Tool: "email.send",
				Args: mustArgs(t, map[string]any{"draft_id": draft["draft_id"]})})
			select {
			case <-killed:
			case <-ctx.Done():
				t.Fatal("replica A never reached the crash point")
			}
			if n := len(mailSrv.received()); n != 1 {
				t.Fatalf("SMTP server has %d mails at the crash, want 1", n)
			}

			// Replica B: a fresh executor on the same NATS; it gets the step
			// once AckWait expired.
			_, resB := ns.Setup(t)
			b := startReplica(t, ctx, resB, cfg, runner.Hooks{})
			got := runnertest.NextResult(t, ctx, results)
			if got.GetStatus() != tt.want || got.GetReplayed() != tt.replayed {
				t.Fatalf("result %v, want %v replayed=%v", got, tt.want, tt.replayed)
			}
			mails := mailSrv.received()
			if len(mails) != 1 {
				t.Fatalf("SMTP server received %d mails, want exactly 1", len(mails))
			}
			switch tt.want {
			case planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED:
				id := got.GetOutput().GetStructValue().GetFields()["message_id"].GetStringValue()
				if id == "" || !strings.Contains(mails[0].data, "Message-ID: "+id) {
					t.Fatalf("replayed message id %q is not the delivered mail's", id)
				}
				if got.GetExecutorId() == b.ID() {
					t.Fatal("replayed result claims replica B ran the step")
				}
			default:
				if got.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN || got.GetExecutorId() != b.ID() {
					t.Fatalf("result %v, want OUTCOME_UNKNOWN reported by replica B", got)
				}
			}
			// Nothing is left to redeliver.
			cons, err := res.JS.Consumer(ctx, bus.StreamSteps, bus.PoolConsumer("email"))
			if err != nil {
				t.Fatal(err)
			}
			for {
				info, err := cons.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if info.NumAckPending == 0 && info.NumPending == 0 {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("step still pending: %+v", info)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if n := len(mailSrv.received()); n != 1 {
				t.Fatalf("SMTP server received %d mails in the end", n)
			}
			// The draft records the send, for every replica to see.
			if d := readDraft(t, res.Drafts, draft["draft_id"].(string)); d.SentAt == nil || d.SendBy == nil || d.SendBy.StepID != "send" {
				t.Fatalf("draft after the send: %+v", d)
			}
		})
	}
}

// startReplica starts an email pool replica on res (its own NATS
// connection), the pool's drafts in res.Drafts.
func startReplica(t *testing.T, ctx context.Context, res *bus.Resources, cfg emailpool.Config, hooks runner.Hooks) *runner.Runner {
	t.Helper()
	cfg.Drafts = res.Drafts
	r, err := runner.New(res, runner.Options{
		Pool: "email", Tools: newPool(t, cfg).Tools(), AckWait: time.Second, MaxDeliver: 5,
		Logger: natstest.Logger(t), Hooks: hooks,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = r.Stop(sctx)
	})
	return r
}

// readDraft reads a draft straight from the planex-drafts bucket.
func readDraft(t testing.TB, kv jetstream.KeyValue, id string) emailpool.Draft {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e, err := kv.Get(ctx, id)
	if err != nil {
		t.Fatalf("read draft %s: %v", id, err)
	}
	var d emailpool.Draft
	if err := json.Unmarshal(e.Value(), &d); err != nil {
		t.Fatalf("decode draft %s: %v", id, err)
	}
	return d
}

// replicas returns n pools configured alike, each on a NATS connection of
// its own to ns, as n replicas of the email pool are.
func replicas(t testing.TB, ns *natstest.Server, n int, cfg emailpool.Config) []*emailpool.Pool {
	t.Helper()
	pools := make([]*emailpool.Pool, n)
	for i := range pools {
		_, res := ns.Setup(t)
		c := cfg
		c.Drafts = res.Drafts
		pools[i] = newPool(t, c)
	}
	return pools
}

// toolOf returns the tool name of p.
func toolOf(t testing.TB, p *emailpool.Pool, name string) runner.Tool {
	t.Helper()
	for _, tool := range p.Tools() {
		if tool.Spec().GetName() == name {
			return tool
		}
	}
	t.Fatalf("no tool %s", name)
	return nil
}

func TestDraftIsIdempotentPerAttempt(t *testing.T) {
	ns := natstest.Start(t)
	_, res := ns.Setup(t)
	pools := replicas(t, ns, 2, emailpool.Config{OutboxDir: t.TempDir()})
	ctx := runnertest.Context(t)
	args := map[string]any{"to": []any{"a@example.com"}, "subject": "Weekly report", "body": "Attached."}
	c := runner.Call{RunID: "run1", StepID: "draft", Attempt: 1}

	first, terr := call(t, pools[0], "email.draft", c, args)
	if terr != nil {
		t.Fatal(terr)
	}
	id := first["draft_id"].(string)
	e1, err := res.Drafts.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}

	// The attempt comes again, on the other replica: it gets the same
	// draft, which is not written again.
	again, terr := call(t, pools[1], "email.draft", c, args)
	if terr != nil {
		t.Fatal(terr)
	}
	if again["draft_id"] != id || again["size"] != first["size"] {
		t.Fatalf("repeated attempt returned %v, want %v", again, first)
	}
	if e2, err := res.Drafts.Get(ctx, id); err != nil || e2.Revision() != e1.Revision() {
		t.Fatalf("draft rewritten by the repeated attempt: revision %v (%v), was %d", e2, err, e1.Revision())
	}

	// The same attempt with another message neither returns nor
	// overwrites the first one.
	_, terr = call(t, pools[1], "email.draft", c, map[string]any{"to": []any{"a@example.com"}, "subject": "Something else", "body": "Attached."})
	if terr == nil || terr.Code != planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED || !strings.Contains(terr.Message, "another message") {
		t.Fatalf("same attempt, other message: %+v, want TOOL_FAILED", terr)
	}
	if d := readDraft(t, res.Drafts, id); d.Subject != "Weekly report" || d.RunID != "run1" || d.StepID != "draft" || d.Attempt != 1 {
		t.Fatalf("stored draft %+v", d)
	}

	// The next attempt writes a draft of its own.
	c.Attempt = 2
	next, terr := call(t, pools[1], "email.draft", c, args)
	if terr != nil {
		t.Fatal(terr)
	}
	if next["draft_id"] == id {
		t.Fatalf("attempt 2 reused the draft of attempt 1")
	}
	keys, err := res.Drafts.Keys(ctx)
	if err != nil || len(keys) != 2 {
		t.Fatalf("bucket keys %v (%v), want the two drafts", keys, err)
	}
}

// TestDraftOnOneReplicaSentOnAnother runs email.draft and email.send as
// steps from JetStream on two executor replicas: the draft written by one
// is sent by the other, and a second step sending it is refused.
func TestDraftOnOneReplicaSentOnAnother(t *testing.T) {
	ns := natstest.Start(t)
	mailSrv := startSMTP(t, true)
	cfg := emailpool.Config{
		From: "planex@example.com", AllowedDomains: []string{"example.com"},
		SMTPAddr: mailSrv.addr, SMTPUser: smtpUser, SMTPPassword: smtpPassword, TLSConfig: mailSrv.clientTLS,
	}
	ctx := runnertest.Context(t)
	_, res := ns.Setup(t)
	results := runnertest.Results(t, ctx, res, "run1")
	publish := func(step, tool string, args map[string]any) {
		t.Helper()
		runnertest.PublishStep(t, ctx, res, &planexv1.StepRequest{RunId: "run1", StepId: step, Attempt: 1, PlanRevision: 1, Tool: tool, Args: mustArgs(t, args)})
	}

	_, resA := ns.Setup(t)
	a := startReplica(t, ctx, resA, cfg, runner.Hooks{})
	publish("draft", "email.draft", map[string]any{"to": []any{"finance@example.com"}, "subject": "Overdue invoices", "body": "Three invoices are overdue."})
	drafted := runnertest.NextResult(t, ctx, results)
	if drafted.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED || drafted.GetExecutorId() != a.ID() {
		t.Fatalf("draft result %v, want SUCCEEDED on replica A", drafted)
	}
	id := drafted.GetOutput().GetStructValue().GetFields()["draft_id"].GetStringValue()
	// Replica A goes away; B has never seen the draft.
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	_, resB := ns.Setup(t)
	b := startReplica(t, ctx, resB, cfg, runner.Hooks{})

	publish("send", "email.send", map[string]any{"draft_id": id})
	sent := runnertest.NextResult(t, ctx, results)
	if sent.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED || sent.GetExecutorId() != b.ID() {
		t.Fatalf("send result %v, want SUCCEEDED on replica B", sent)
	}
	mails := mailSrv.received()
	msgID := sent.GetOutput().GetStructValue().GetFields()["message_id"].GetStringValue()
	if len(mails) != 1 || !strings.Contains(mails[0].data, "Message-ID: "+msgID) || !strings.Contains(mails[0].data, "Three invoices are overdue.") {
		t.Fatalf("SMTP server received %d mails, want the draft once as %s", len(mails), msgID)
	}

	// Another step naming the same draft (not a redelivery: planex-effects
	// does not know it) is refused.
	publish("resend", "email.send", map[string]any{"draft_id": id})
	again := runnertest.NextResult(t, ctx, results)
	if again.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_FAILED || again.GetError().GetField() != "args.draft_id" ||
		!strings.Contains(again.GetError().GetMessage(), "already sent") {
		t.Fatalf("second send %v, want a refusal", again)
	}
	if n := len(mailSrv.received()); n != 1 {
		t.Fatalf("SMTP server received %d mails, want 1", n)
	}
}

// TestSendRaceAcrossReplicas lets replicas send one draft at the same
// time for different steps, which planex-effects cannot tell apart: one
// send succeeds, the others are refused, and exactly one mail reaches the
// SMTP server.
func TestSendRaceAcrossReplicas(t *testing.T) {
	tests := []struct {
		name     string
		replicas int
		lineUp   bool // every replica reads the draft before any claims it
	}{
		{name: "two replicas read the draft before either claims it", replicas: 2, lineUp: true},
		{name: "eight replicas at once", replicas: 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := natstest.Start(t)
			_, res := ns.Setup(t)
			mailSrv := startSMTP(t, true)
			ctx := runnertest.Context(t)
			pools := replicas(t, ns, tt.replicas, emailpool.Config{SMTPAddr: mailSrv.addr, SMTPUser: smtpUser, SMTPPassword: smtpPassword, TLSConfig: mailSrv.clientTLS})
			draft, terr := call(t, pools[0], "email.draft", runner.Call{RunID: "run1", StepID: "draft", Attempt: 1},
				map[string]any{"to": []any{"ops@example.com"}, "subject": "Disk full", "body": "db-1 is at 99%."})
			if terr != nil {
				t.Fatal(terr)
			}
			id := draft["draft_id"].(string)
			if tt.lineUp {
				// Both hold the same revision when they claim, so one
				// update must fail on it.
				var read sync.WaitGroup
				read.Add(len(pools))
				allRead := make(chan struct{})
				go func() { read.Wait(); close(allRead) }()
				for _, p := range pools {
					arrive := sync.OnceFunc(read.Done)
					emailpool.SetBeforeClaim(p, func(string) {
						arrive()
						select {
						case <-allRead:
						case <-ctx.Done():
						}
					})
				}
			}

			type outcome struct {
				step string
				out  any
				err  error
			}
			outcomes := make([]outcome, len(pools))
			args := mustArgs(t, map[string]any{"draft_id": id})
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i, p := range pools {
				send := toolOf(t, p, "email.send")
				step := fmt.Sprintf("send-%d", i)
				wg.Go(func() {
					<-start
					out, err := send.Run(ctx, runner.Call{RunID: "run1", StepID: step, Attempt: 1, Args: args})
					outcomes[i] = outcome{step: step, out: out, err: err}
				})
			}
			close(start)
			wg.Wait()

			var winners []outcome
			for _, o := range outcomes {
				if o.err == nil {
					winners = append(winners, o)
					continue
				}
				var terr *runner.Error
				if !errors.As(o.err, &terr) || terr.Code != planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || terr.Field != "args.draft_id" ||
					!(strings.Contains(terr.Message, "is being sent") || strings.Contains(terr.Message, "already sent")) {
					t.Fatalf("%s: %v, want a refusal on args.draft_id", o.step, o.err)
				}
			}
			if len(winners) != 1 {
				t.Fatalf("%d sends succeeded, want exactly 1", len(winners))
			}
			mails := mailSrv.received()
			if len(mails) != 1 {
				t.Fatalf("SMTP server received %d mails, want exactly 1", len(mails))
			}
			msgID := winners[0].out.(map[string]any)["message_id"].(string)
			if !strings.Contains(mails[0].data, "Message-ID: "+msgID) {
				t.Fatalf("the mail is not the winner's %s", msgID)
			}
			d := readDraft(t, res.Drafts, id)
			if d.SentAt == nil || d.SendBy == nil || d.SendBy.StepID != winners[0].step || "<"+d.MessageID+">" != msgID {
				t.Fatalf("draft after the race: %+v, want sent by %s", d, winners[0].step)
			}
		})
	}
}

// TestSendLeavesTheDraftForOtherReplicas checks what a send leaves in the
// draft for the next step that names it, on another replica: a failure
// before the hand-over releases it, a broken hand-over keeps it, a send
// makes it final, and a claim of the attempt itself is taken over.
func TestSendLeavesTheDraftForOtherReplicas(t *testing.T) {
	type send struct {
		step      string
		relayDown bool
		code      planexv1.ErrorCode // UNSPECIFIED: the send succeeds
		msg       string
	}
	tests := []struct {
		name   string
		before func(t *testing.T, srv *smtpServer, drafts jetstream.KeyValue, id string)
		sends  []send
	}{
		{
			name: "a relay that is down releases the draft",
			sends: []send{
				{step: "send-a", relayDown: true, code: planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE},
				{step: "send-b"},
			},
		},
		{
			name:   "a broken hand-over keeps the draft",
			before: func(_ *testing.T, srv *smtpServer, _ jetstream.KeyValue, _ string) { srv.breakNext() },
			sends: []send{
				{step: "send-a", code: planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN},
				{step: "send-b", code: planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, msg: "unknown outcome"},
			},
		},
		{
			name: "a sent draft is final",
			sends: []send{
				{step: "send-a"},
				{step: "send-b", code: planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, msg: "already sent"},
				{step: "send-a", code: planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, msg: "already sent"},
			},
		},
		{
			name: "a claim left by the attempt itself is taken over",
			before: func(t *testing.T, _ *smtpServer, drafts jetstream.KeyValue, id string) {
				// As after a retryable failure whose release was lost.
				ctx := runnertest.Context(t)
				e, err := drafts.Get(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				var d emailpool.Draft
				if err := json.Unmarshal(e.Value(), &d); err != nil {
					t.Fatal(err)
				}
				d.SendBy = &emailpool.SendClaim{RunID: "run1", StepID: "send-a", Attempt: 1, Since: time.Now().UTC()}
				data, _ := json.Marshal(d)
				if _, err := drafts.Update(ctx, id, data, e.Revision()); err != nil {
					t.Fatal(err)
				}
			},
			sends: []send{
				{step: "send-b", code: planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, msg: "is being sent by attempt 1 of step \"send-a\""},
				{step: "send-a"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := natstest.Start(t)
			_, res := ns.Setup(t)
			srv := startSMTP(t, true)
			cfg := emailpool.Config{SMTPAddr: srv.addr, TLSConfig: srv.clientTLS}
			up := replicas(t, ns, 2, cfg)
			cfg.SMTPAddr = closedAddr(t)
			down := replicas(t, ns, 1, cfg)[0]
			draft, terr := call(t, up[0], "email.draft", runner.Call{RunID: "run1", StepID: "draft", Attempt: 1},
				map[string]any{"to": []any{"ops@example.com"}, "subject": "Disk full", "body": "db-1 is at 99%."})
			if terr != nil {
				t.Fatal(terr)
			}
			id := draft["draft_id"].(string)
			if tt.before != nil {
				tt.before(t, srv, res.Drafts, id)
			}
			for i, s := range tt.sends {
				p := up[i%2]
				if s.relayDown {
					p = down
				}
				_, terr := call(t, p, "email.send", runner.Call{RunID: "run1", StepID: s.step, Attempt: 1}, map[string]any{"draft_id": id})
				switch {
				case s.code == planexv1.ErrorCode_ERROR_CODE_UNSPECIFIED && terr != nil:
					t.Fatalf("send %d (%s): %+v, want success", i, s.step, terr)
				case s.code != planexv1.ErrorCode_ERROR_CODE_UNSPECIFIED && (terr == nil || terr.Code != s.code || !strings.Contains(terr.Message, s.msg)):
					t.Fatalf("send %d (%s): %+v, want %v containing %q", i, s.step, terr, s.code, s.msg)
				}
			}
			// Every case hands the message over exactly once.
			if n := len(srv.received()); n != 1 {
				t.Fatalf("SMTP server received %d mails, want 1", n)
			}
		})
	}
}
