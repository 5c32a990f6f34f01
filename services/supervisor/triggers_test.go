package supervisor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/trigger"
	"github.com/planex-dev/planex/services/supervisor"
	"github.com/planex-dev/planex/services/supervisor/engine"
)

// trigReplica is a supervisor replica with its TriggerService client and
// a count of the trigger events it started runs for.
type trigReplica struct {
	runs     planexv1.SupervisorServiceClient
	triggers planexv1.TriggerServiceClient
	nc       *nats.Conn
	gs       *grpc.Server
	stop     func(context.Context) error
	started  atomic.Int64
	once     sync.Once
}

// kill stops the replica as kill -9 would: its NATS connection closes
// without draining, so the events it holds go to another replica after
// the ack wait.
func (r *trigReplica) kill() {
	r.once.Do(func() {
		r.nc.Close()
		r.gs.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = r.stop(ctx)
	})
}

func startTrigReplica(t *testing.T, h *harness, hook func(n int64, seq uint64, runID string)) *trigReplica {
	t.Helper()
	nc, err := nats.Connect(h.srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	res, err := bus.Setup(testCtx(t, 10*time.Second), nc, bus.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := &trigReplica{nc: nc, gs: grpc.NewServer()}
	hooks := supervisor.TriggerHooks{AckWait: 2 * time.Second, AfterStart: func(_ context.Context, _ string, seq uint64, runID string) {
		n := r.started.Add(1)
		if hook != nil {
			hook(n, seq, runID)
		}
	}}
	r.stop, err = supervisor.Start(context.Background(), supervisor.Components{
		Bus: res, Logger: natstest.Logger(t), Planner: h.planner.client, GRPC: r.gs,
		Engine:   engine.Config{Workers: 16, AckWait: h.ackWait, MaxAckPending: 2048},
		Triggers: hooks,
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r.runs, r.triggers = planexv1.NewSupervisorServiceClient(conn), planexv1.NewTriggerServiceClient(conn)
	t.Cleanup(func() {
		_ = conn.Close()
		r.once.Do(func() {
			r.gs.Stop()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := r.stop(ctx); err != nil {
				t.Errorf("stop replica: %v", err)
			}
			nc.Close()
		})
	})
	return r
}

// orderTrigger starts a run per order event, keyed by the order's id.
func orderTrigger(name string) *planexv1.Trigger {
	return &planexv1.Trigger{
		Name: name, Subject: "planex.inbound.orders.>",
		Filter:         `!has(event.skip)`,
		Goal:           `"Handle order " + event.id`,
		Inputs:         `{"n": event.n}`,
		Labels:         map[string]string{"source": `subject.split(".")[2]`},
		IdempotencyKey: `event.id`,
	}
}

// TestTriggerAcceptance is issue 32's acceptance test: 1,000 well-formed
// events of which 100 repeat an earlier idempotency key, plus 10
// malformed ones, consumed by two replicas → exactly 900 runs, 10 counted
// rejections listed, 0 duplicate runs. The "kill" variant kills a replica
// while it holds an event whose run it has just started (before its
// outcome is recorded and the event acknowledged): the other replica gets
// the event again and counts it once, as started.
func TestTriggerAcceptance(t *testing.T) {
	t.Parallel()
	for _, kill := range []bool{false, true} {
		t.Run(map[bool]string{false: "two-replicas", true: "replica-killed"}[kill], func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.planner.on("Handle order *", always(step("a", "test.approve", map[string]any{"value": 1})))

			type heldEvent struct {
				seq   uint64
				runID string
			}
			held := make(chan heldEvent, 1)
			release := make(chan struct{})
			var releaseOnce sync.Once
			var holding atomic.Bool
			var hook func(int64, uint64, string)
			if kill {
				// The first event from the 50th on that replica a started
				// (or found) a run for: it stops there until killed.
				hook = func(n int64, seq uint64, runID string) {
					if n < 50 || runID == "" {
						return
					}
					if holding.CompareAndSwap(false, true) {
						held <- heldEvent{seq, runID}
						<-release
					}
				}
			}
			a := startTrigReplica(t, h, hook)
			b := startTrigReplica(t, h, nil)
			// Before the replicas' cleanups (they run first): a held event
			// is let go whatever happens.
			t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
			ctx := testCtx(t, 3*time.Minute)
			if _, err := a.triggers.CreateTrigger(ctx, &planexv1.CreateTriggerRequest{Trigger: orderTrigger("orders")}); err != nil {
				t.Fatal(err)
			}
			// b's cache sees the trigger too before any event is published.
			waitFor(t, 5*time.Second, "trigger on b", func() bool {
				_, err := b.triggers.GetTrigger(ctx, &planexv1.GetTriggerRequest{Name: "orders"})
				return err == nil
			})

			js, err := jetstream.New(h.nc)
			if err != nil {
				t.Fatal(err)
			}
			var futures []jetstream.PubAckFuture
			pub := func(subject string, body []byte) {
				f, err := js.PublishAsync(subject, body)
				if err != nil {
					t.Fatal(err)
				}
				futures = append(futures, f)
			}
			for i := range 900 {
				pub("planex.inbound.orders.web", fmt.Appendf(nil, `{"id":"o-%d","n":%d}`, i, i))
				if i%9 == 0 && i/9 < 100 {
					// A repeat of an earlier key, with another body.
					pub("planex.inbound.orders.api", fmt.Appendf(nil, `{"id":"o-%d","n":%d}`, i/9, 10_000+i))
				}
				if i%90 == 0 {
					if i%180 == 0 {
						pub("planex.inbound.orders.web", []byte(`{"id": "o-`)) // not JSON
					} else {
						pub("planex.inbound.orders.web", []byte(`{"n": 1}`)) // no key
					}
				}
			}
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				t.Fatal("publish did not complete")
			}
			for _, f := range futures {
				select {
				case err := <-f.Err():
					t.Fatalf("publish: %v", err)
				default:
				}
			}
			if len(futures) != 1010 {
				t.Fatalf("published %d events, want 1010", len(futures))
			}

			if kill {
				var ev heldEvent
				select {
				case ev = <-held:
				case <-ctx.Done():
					t.Fatal("replica a never reached its 50th event")
				}
				// The crash lands where claimed: the event's run exists,
				// and the event is neither recorded nor acknowledged.
				if _, err := b.runs.GetRun(ctx, &planexv1.GetRunRequest{RunId: ev.runID}); err != nil {
					t.Fatalf("held event %d: run %s: %v", ev.seq, ev.runID, err)
				}
				ci, err := js.Consumer(ctx, trigger.StreamEvents, trigger.ConsumerEvents)
				if err != nil {
					t.Fatal(err)
				}
				if info, err := ci.Info(ctx); err != nil || info.AckFloor.Stream >= ev.seq {
					t.Fatalf("held event %d already acknowledged (ack floor %v, %v)", ev.seq, info, err)
				}
				a.kill()
				releaseOnce.Do(func() { close(release) })
				t.Logf("killed replica a holding event %d (run %s) after it started %d runs", ev.seq, ev.runID, a.started.Load())
			}

			var c *planexv1.TriggerCounters
			waitFor(t, 2*time.Minute, "every event evaluated", func() bool {
				resp, err := b.triggers.GetTrigger(ctx, &planexv1.GetTriggerRequest{Name: "orders"})
				if err != nil {
					t.Fatal(err)
				}
				c = resp.GetTrigger().GetCounters()
				return c.GetReceived() >= 1010
			})
			want := &planexv1.TriggerCounters{Received: 1010, Started: 900, Duplicates: 100, Rejected: 10}
			if c.String() != want.String() {
				t.Fatalf("counters %v, want %v", c, want)
			}
			if a.started.Load() == 0 || b.started.Load() == 0 {
				t.Fatalf("both replicas must consume: a started %d, b %d", a.started.Load(), b.started.Load())
			}

			runs := listTriggerRuns(t, ctx, b.runs, map[string]string{trigger.LabelTrigger: "orders"})
			goals := map[string]int{}
			for _, r := range runs {
				goals[r.GetGoal()]++
				if r.GetStartedBy() != "trigger:orders" {
					t.Fatalf("run %s started by %q", r.GetId(), r.GetStartedBy())
				}
			}
			if len(runs) != 900 || len(goals) != 900 {
				t.Fatalf("%d runs for %d distinct orders, want 900 and 900", len(runs), len(goals))
			}

			rej, err := b.triggers.ListTriggerRejections(ctx, &planexv1.ListTriggerRejectionsRequest{Name: "orders"})
			if err != nil {
				t.Fatal(err)
			}
			reasons := map[string]int{}
			for _, r := range rej.GetRejections() {
				reasons[strings.SplitN(r.GetReason(), ":", 2)[0]]++
				if len(r.GetPayloadSha256()) != 64 || r.GetSubject() != "planex.inbound.orders.web" || r.GetTime() == nil {
					t.Fatalf("rejection %v", r)
				}
			}
			if len(rej.GetRejections()) != 10 || reasons["not JSON"] != 5 || reasons["idempotency_key"] != 5 {
				t.Fatalf("rejections by reason %v (%d), want 5 not JSON and 5 idempotency_key", reasons, len(rej.GetRejections()))
			}
		})
	}
}

func listTriggerRuns(t *testing.T, ctx context.Context, c planexv1.SupervisorServiceClient, labels map[string]string) []*planexv1.Run {
	t.Helper()
	var out []*planexv1.Run
	token := ""
	for {
		resp, err := c.ListRuns(ctx, &planexv1.ListRunsRequest{Labels: labels, PageSize: 500, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, resp.GetRuns()...)
		if token = resp.GetNextPageToken(); token == "" {
			return out
		}
	}
}

// TestTriggerService: CRUD, compare-and-set, pause and fire through one
// replica; refusals name the field.
func TestTriggerService(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.planner.on("Handle order *", always(step("a", "test.approve", map[string]any{"value": 1})))
	r := startTrigReplica(t, h, nil)
	ctx := testCtx(t, time.Minute)
	bad := orderTrigger("bad")
	bad.Subject = "planex.events.x"
	if _, err := r.triggers.CreateTrigger(ctx, &planexv1.CreateTriggerRequest{Trigger: bad}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "trigger.subject") {
		t.Fatalf("bad subject: %v", err)
	}
	created, err := r.triggers.CreateTrigger(ctx, &planexv1.CreateTriggerRequest{Trigger: orderTrigger("orders")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.triggers.CreateTrigger(ctx, &planexv1.CreateTriggerRequest{Trigger: orderTrigger("orders")}); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("second create: %v", err)
	}
	upd := orderTrigger("orders")
	upd.Description = "v2"
	upd.Revision = created.GetTrigger().GetRevision()
	if _, err := r.triggers.UpdateTrigger(ctx, &planexv1.UpdateTriggerRequest{Trigger: upd}); err != nil {
		t.Fatal(err)
	}
	// The same revision again is stale.
	if _, err := r.triggers.UpdateTrigger(ctx, &planexv1.UpdateTriggerRequest{Trigger: upd}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("stale update: %v", err)
	}
	if _, err := r.triggers.PauseTrigger(ctx, &planexv1.PauseTriggerRequest{Name: "orders"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.triggers.FireTrigger(ctx, &planexv1.FireTriggerRequest{Name: "orders", Data: []byte(`{"id":"p"}`)}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "subject") {
		t.Fatalf("fire without a subject on a wildcard trigger: %v", err)
	}
	fire := func(id string) {
		t.Helper()
		if _, err := r.triggers.FireTrigger(ctx, &planexv1.FireTriggerRequest{Name: "orders", Subject: "planex.inbound.orders.cli", Data: fmt.Appendf(nil, `{"id":%q,"n":1}`, id)}); err != nil {
			t.Fatal(err)
		}
	}
	fire("paused")
	counters := func() *planexv1.TriggerCounters {
		resp, err := r.triggers.GetTrigger(ctx, &planexv1.GetTriggerRequest{Name: "orders"})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetTrigger().GetCounters()
	}
	waitFor(t, 10*time.Second, "paused event filtered", func() bool { return counters().GetFiltered() == 1 })
	if _, err := r.triggers.ResumeTrigger(ctx, &planexv1.ResumeTriggerRequest{Name: "orders"}); err != nil {
		t.Fatal(err)
	}
	fire("resumed")
	waitFor(t, 10*time.Second, "resumed event started", func() bool { return counters().GetStarted() == 1 })
	// The service's consumer deleted under it (`nats consumer rm`) is made
	// again, and the events published meanwhile are evaluated.
	if err := h.res.JS.DeleteConsumer(ctx, trigger.StreamEvents, trigger.ConsumerEvents); err != nil {
		t.Fatal(err)
	}
	fire("after the consumer's deletion")
	waitFor(t, 15*time.Second, "the event after the consumer's deletion started", func() bool { return counters().GetStarted() == 2 })
	list, err := r.triggers.ListTriggers(ctx, &planexv1.ListTriggersRequest{})
	if err != nil || len(list.GetTriggers()) != 1 || list.GetTriggers()[0].GetDescription() != "v2" || list.GetTriggers()[0].GetPaused() {
		t.Fatalf("list %v, %v", list, err)
	}
	if _, err := r.triggers.DeleteTrigger(ctx, &planexv1.DeleteTriggerRequest{Name: "orders"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.triggers.GetTrigger(ctx, &planexv1.GetTriggerRequest{Name: "orders"}); status.Code(err) != codes.NotFound {
		t.Fatalf("get after delete: %v", err)
	}
}

// TestTriggerWebhook runs the supervisor with --webhook-addr and checks
// both signature schemes end to end: good (202, a run), bad and stale
// (401 without detail, nothing published), replayed (deduplicated: one
// event), unknown trigger (404), too large (413).
func TestTriggerWebhook(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	planner := startPlanner(t)
	planner.on("Handle order *", always(step("a", "test.approve", map[string]any{"value": 1})))
	plis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pgs := grpc.NewServer()
	planexv1.RegisterPlannerServiceServer(pgs, planner)
	go func() { _ = pgs.Serve(plis) }()
	t.Cleanup(pgs.Stop)
	secrets := t.TempDir()
	if err := os.WriteFile(filepath.Join(secrets, "gh"), []byte("gh-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secrets, "stripe"), []byte("whsec_stripe"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := parse(t, "--grpc-addr", "127.0.0.1:0", "--nats-url", srv.URL(), "--planner-addr", plis.Addr().String(),
		"--shutdown-grace", "5s", "--plaintext", "--auth-disabled", "--health-addr", "127.0.0.1:0",
		"--webhook-addr", "127.0.0.1:0", "--webhook-secrets-dir", secrets)
	ready := make(chan net.Addr, 1)
	hooks := make(chan string, 1)
	cfg.OnReady = func(a net.Addr) { ready <- a }
	cfg.OnWebhookReady = func(u string) { hooks <- u }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- supervisor.Run(ctx, cfg, natstest.Logger(t), nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("supervisor: %v", err)
		}
	})
	var addr net.Addr
	var base string
	for addr == nil || base == "" {
		select {
		case addr = <-ready:
		case base = <-hooks:
		case err := <-done:
			t.Fatalf("supervisor ended: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("supervisor not ready")
		}
	}
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	tc := planexv1.NewTriggerServiceClient(conn)
	tctx := testCtx(t, time.Minute)
	for _, tr := range []*planexv1.Trigger{
		{Name: "gh", Subject: "planex.inbound.github", Goal: `"Handle order " + event.id`, IdempotencyKey: `headers["X-Github-Delivery"]`,
			Webhook: &planexv1.TriggerWebhook{Enabled: true, Scheme: "github", SecretRef: "gh"}},
		{Name: "stripe", Subject: "planex.inbound.stripe", Goal: `"Handle order " + event.id`, IdempotencyKey: `event.id`,
			Webhook: &planexv1.TriggerWebhook{Enabled: true, Scheme: "stripe", SecretRef: "stripe", ToleranceSeconds: 60}},
	} {
		if _, err := tc.CreateTrigger(tctx, &planexv1.CreateTriggerRequest{Trigger: tr}); err != nil {
			t.Fatal(err)
		}
	}
	post := func(path string, body []byte, hdr map[string]string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(tctx, http.MethodPost, base+path, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	ghBody := []byte(`{"id":"gh-1"}`)
	stBody := []byte(`{"id":"evt_1"}`)
	now := time.Now()
	tests := []struct {
		name string
		path string
		body []byte
		hdr  map[string]string
		code int
	}{
		{"github good", "gh", ghBody, map[string]string{trigger.HeaderGitHub: trigger.SignGitHub([]byte("gh-secret"), ghBody), "X-GitHub-Delivery": "d1"}, 202},
		{"github replayed", "gh", ghBody, map[string]string{trigger.HeaderGitHub: trigger.SignGitHub([]byte("gh-secret"), ghBody), "X-GitHub-Delivery": "d1"}, 202},
		{"github bad", "gh", ghBody, map[string]string{trigger.HeaderGitHub: trigger.SignGitHub([]byte("wrong"), ghBody), "X-GitHub-Delivery": "d2"}, 401},
		{"github unsigned", "gh", ghBody, map[string]string{"X-GitHub-Delivery": "d3"}, 401},
		{"stripe good", "stripe", stBody, map[string]string{trigger.HeaderStripe: trigger.SignStripe([]byte("whsec_stripe"), stBody, now)}, 202},
		{"stripe replayed", "stripe", stBody, map[string]string{trigger.HeaderStripe: trigger.SignStripe([]byte("whsec_stripe"), stBody, now)}, 202},
		{"stripe stale", "stripe", stBody, map[string]string{trigger.HeaderStripe: trigger.SignStripe([]byte("whsec_stripe"), stBody, now.Add(-2*time.Minute))}, 401},
		{"stripe bad", "stripe", stBody, map[string]string{trigger.HeaderStripe: trigger.SignStripe([]byte("other"), stBody, now)}, 401},
		{"unknown trigger", "nope", stBody, nil, 404},
		{"too large", "gh", bytes.Repeat([]byte("x"), trigger.MaxPayload+1), nil, 413},
	}
	for _, tc := range tests {
		code, body := post(supervisor.WebhookPath+"default/"+tc.path, tc.body, tc.hdr)
		if code != tc.code {
			t.Fatalf("%s: %d %s, want %d", tc.name, code, body, tc.code)
		}
		if code == 401 && strings.TrimSpace(body) != "unauthorized" {
			t.Fatalf("%s: 401 body %q leaks detail", tc.name, body)
		}
		if strings.Contains(tc.name, "replayed") {
			var ack struct{ Duplicate bool }
			if err := json.Unmarshal([]byte(body), &ack); err != nil || !ack.Duplicate {
				t.Fatalf("%s: %s, want a duplicate", tc.name, body)
			}
		}
	}
	// Exactly one event per good delivery, each starting one run.
	for _, name := range []string{"gh", "stripe"} {
		waitFor(t, 20*time.Second, name+" run started", func() bool {
			resp, err := tc.GetTrigger(tctx, &planexv1.GetTriggerRequest{Name: name})
			if err != nil {
				t.Fatal(err)
			}
			return resp.GetTrigger().GetCounters().GetStarted() == 1
		})
		resp, _ := tc.GetTrigger(tctx, &planexv1.GetTriggerRequest{Name: name})
		if c := resp.GetTrigger().GetCounters(); c.GetReceived() != 1 {
			t.Fatalf("%s counters %v, want one event", name, c)
		}
		if resp.GetTrigger().GetWebhook().GetSecretRef() != name || strings.Contains(resp.String(), "secret\n") || strings.Contains(resp.String(), "whsec_") {
			t.Fatalf("%s: the API shows the secret: %v", name, resp)
		}
	}
}
