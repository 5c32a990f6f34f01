package emailpool_test

import (
	"context"
	"path/filepath"
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
			dir := t.TempDir()
			cfg := emailpool.Config{
				DraftsDir: filepath.Join(dir, "drafts"), From: "planex@example.com", AllowedDomains: []string{"example.com"},
				SMTPAddr: mailSrv.addr, SMTPUser: smtpUser, SMTPPassword: smtpPassword, TLSConfig: mailSrv.clientTLS,
			}
			draft, terr := call(t, newPool(t, cfg), "email.draft", runner.Call{RunID: "run1", StepID: "draft", Attempt: 1},
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

			_, res := ns.Setup(t)
			results := resultConsumer(t, ctx, res)
			req := &planexv1.StepRequest{RunId: "run1", StepId: "send", Attempt: 1, PlanRevision: 1, Tool: "email.send", Args: mustArgs(t, map[string]any{"draft_id": draft["draft_id"]})}
			subj, _ := bus.StepSubject(req.GetTool())
			if _, err := bus.Publish(ctx, res.JS, bus.Publication{Subject: subj, Msg: req, MsgID: "run1:send:1"}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-killed:
			case <-ctx.Done():
				t.Fatal("replica A never reached the crash point")
			}
			if n := len(mailSrv.received()); n != 1 {
				t.Fatalf("SMTP server has %d mails at the crash, want 1", n)
			}

			// Replica B: a fresh executor on the same drafts; it gets the step
			// once AckWait expired.
			_, resB := ns.Setup(t)
			b := startReplica(t, ctx, resB, cfg, runner.Hooks{})
			got := nextResult(t, ctx, results)
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
		})
	}
}

func startReplica(t *testing.T, ctx context.Context, res *bus.Resources, cfg emailpool.Config, hooks runner.Hooks) *runner.Runner {
	t.Helper()
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

func resultConsumer(t *testing.T, ctx context.Context, res *bus.Resources) jetstream.Consumer {
	t.Helper()
	cons, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamEngine, jetstream.ConsumerConfig{
		Durable: "crash-test", FilterSubject: bus.EngineSubject("run1", bus.KindResult), AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	return cons
}

func nextResult(t *testing.T, ctx context.Context, cons jetstream.Consumer) *planexv1.StepResult {
	t.Helper()
	msgs, err := cons.Fetch(1, jetstream.FetchContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	for m := range msgs.Messages() {
		var res planexv1.StepResult
		if err := bus.Decode(bus.NatsMsg(m), &res); err != nil {
			t.Fatal(err)
		}
		_ = m.Ack()
		return &res
	}
	t.Fatalf("no step result: %v", msgs.Error())
	return nil
}
