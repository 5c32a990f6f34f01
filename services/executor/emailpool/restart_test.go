package emailpool_test

import (
	"context"
	"errors"
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

// TestSendRecordedAcrossNATSRestart is the leader-change case of issue 12:
// the NATS server goes away right after the SMTP relay accepted the mail
// and before the executor recorded the result in planex-effects. The
// executor keeps trying the record (and then the result) with short
// per-call deadlines until the server is back: the step SUCCEEDS, with
// exactly one mail, and is not escalated as OUTCOME_UNKNOWN.
func TestSendRecordedAcrossNATSRestart(t *testing.T) {
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

	down := make(chan int, 1) // mails at the moment NATS went down
	recordFailed := make(chan error, 1)
	var once, failOnce sync.Once
	hooks := runner.Hooks{
		AfterRun: func(*planexv1.StepRequest) {
			once.Do(func() {
				ns.Shutdown()
				down <- len(mailSrv.received())
			})
		},
		OnRetry: func(op string, err error) {
			if strings.HasPrefix(op, "record result in ") {
				failOnce.Do(func() { recordFailed <- err })
			}
		},
	}
	_, resA := ns.Setup(t)
	a := startReplica(t, ctx, resA, cfg, hooks)

	results := runnertest.Results(t, ctx, res, "run1")
	runnertest.PublishStep(t, ctx, res, &planexv1.StepRequest{RunId: "run1", StepId: "send", Attempt: 1, PlanRevision: 1, Tool: "email.send",
		Args: mustArgs(t, map[string]any{"draft_id": draft["draft_id"]})})

	select {
	case n := <-down:
		if n != 1 {
			t.Fatalf("SMTP server had %d mails when NATS went down, want 1", n)
		}
	case <-ctx.Done():
		t.Fatal("the send never reached the point after the SMTP delivery")
	}
	// The crash landed where claimed: recording the result failed.
	select {
	case err := <-recordFailed:
		t.Logf("recording failed while NATS was down, as intended: %v", err)
	case <-ctx.Done():
		t.Fatal("recording the result never failed while NATS was down")
	}
	ns.Restart()

	// While NATS was down the step's heartbeats were lost, so JetStream
	// may redeliver it (to A, the only replica) once it is back; that
	// delivery finds the attempt running, waits for it and replays its
	// record. Either way the result is A's success.
	got := runnertest.NextResult(t, ctx, results)
	if got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED || got.GetExecutorId() != a.ID() {
		t.Fatalf("result %v, want SUCCEEDED by replica A", got)
	}
	if n := len(mailSrv.received()); n != 1 {
		t.Fatalf("SMTP server received %d mails, want exactly 1", n)
	}
	// The effect record holds the result, so any redelivery would replay it.
	e, err := res.Effects.Get(ctx, bus.PoolEffectKey("email", bus.EffectKey("run1", "send", 1)))
	if err != nil {
		t.Fatalf("effect record: %v", err)
	}
	if !strings.Contains(string(e.Value()), "message_id") {
		t.Fatalf("effect record does not hold the result: %q", e.Value())
	}
	// The step was acknowledged: nothing is redelivered, no second result.
	waitDrained(t, ctx, res, "email")
	extra, err := results.Fetch(1, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range extra.Messages() {
		t.Fatalf("a second result was published: %s", m.Subject())
	}
	if err := extra.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
		t.Fatal(err)
	}
}

// waitDrained waits until the pool's consumer has nothing pending or
// unacknowledged.
func waitDrained(t *testing.T, ctx context.Context, res *bus.Resources, pool string) {
	t.Helper()
	for {
		cons, err := res.JS.Consumer(ctx, bus.StreamSteps, bus.PoolConsumer(pool))
		if err != nil {
			t.Fatal(err)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 0 && info.NumPending == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("steps still pending: %+v", info)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
