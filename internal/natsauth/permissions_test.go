package natsauth_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natsauth"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/stepsign"
)

// startServer runs an embedded JetStream server with one user per planex
// service (password = user name), each with its ForService permissions.
func startServer(t *testing.T) string {
	t.Helper()
	var users []*server.User
	for _, svc := range natsauth.Services("sql", "email", "search", "mcp") {
		p, err := natsauth.ForService(svc)
		if err != nil {
			t.Fatal(err)
		}
		users = append(users, &server.User{Username: svc, Password: svc + "-pw", Permissions: p.Server()})
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true, Users: users})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	return s.ClientURL()
}

// connect connects as a service user; async errors go to errs.
func connect(t *testing.T, url, svc string, errs chan<- error) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserInfo(svc, svc+"-pw"), nats.Name("planex-"+svc), nats.CustomInboxPrefix(bus.InboxPrefix(svc)), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestExecutorCannotForgeStepsNorReadRunLogs: an executor identity can set
// up and use its own pool's consumer and publish results, but cannot
// publish step requests, subscribe to run logs, or read them through the
// JetStream API.
func TestExecutorCannotForgeStepsNorReadRunLogs(t *testing.T) {
	url := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	logger := natstest.Logger(t)

	sup := connect(t, url, "supervisor", make(chan error, 8))
	supRes, err := bus.Setup(ctx, sup, bus.Options{Update: true})
	if err != nil {
		t.Fatalf("supervisor sets up JetStream: %v", err)
	}
	// The supervisor writes a run log the executor must not read.
	if _, err := supRes.JS.Publish(ctx, bus.EventSubject("run1"), []byte("secret run log"), jetstream.WithMsgID("e1")); err != nil {
		t.Fatal(err)
	}
	// It registers its replica (the engine's MaxAckPending follows them).
	reg, err := supRes.SupervisorsBucket(ctx)
	if err != nil {
		t.Fatalf("supervisor opens %s: %v", bus.BucketSupervisors, err)
	}
	if _, err := reg.Put(ctx, "replica-1", []byte("512")); err != nil {
		t.Fatalf("supervisor registers in %s: %v", bus.BucketSupervisors, err)
	}

	errs := make(chan error, 8)
	ex := connect(t, url, "executor-sql", errs)
	res, err := bus.Setup(ctx, ex, bus.Options{})
	if err != nil {
		t.Fatalf("executor sets up (binds) JetStream: %v", err)
	}
	_ = logger
	// Its own pool: consumer, a step the supervisor published, ack, result.
	workOwnPool(ctx, t, supRes, res, "sql", "planex.steps.sql.query")
	// And its consumer on the run logs: the decisions that dispatch its
	// steps, and its requests published apart.
	workOwnDispatches(ctx, t, supRes, res, "sql")
	if _, err := res.Tools.Put(ctx, "sql.query.x", []byte("{}")); err != nil {
		t.Fatalf("executor registers a tool: %v", err)
	}
	// It lists its pool's registrations (runner: MaxAckPending scales with
	// the pool's replicas), and only its pool's.
	lister, err := res.Tools.ListKeysFiltered(ctx, "sql.*.*")
	if err != nil {
		t.Fatalf("executor lists its pool's registrations: %v", err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	if len(keys) != 1 || keys[0] != "sql.query.x" {
		t.Fatalf("executor-sql lists %v, want [sql.query.x]", keys)
	}
	lctx, lcancel := context.WithTimeout(ctx, time.Second)
	if l, err := res.Tools.ListKeysFiltered(lctx, "email.*.*"); err == nil {
		for range l.Keys() {
		}
		if lctx.Err() == nil {
			t.Fatal("executor-sql listed the email pool's registrations")
		}
	}
	lcancel()

	// The replicas' shared replay cache: the pool's own keys only.
	if _, err := stepsign.OpenSharedReplays(ctx, res.JS, "sql", 1); err != nil {
		t.Fatalf("executor opens the step replay bucket: %v", err)
	}
	replay, err := res.JS.KeyValue(ctx, stepsign.ReplayBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := replay.Create(ctx, "sql.0011", []byte("1")); err != nil {
		t.Fatalf("executor records a signature of its pool: %v", err)
	}
	if _, err := replay.Create(ctx, "sql.0011", []byte("2")); !errors.Is(err, jetstream.ErrKeyExists) {
		t.Fatalf("second Create of the same signature: %v, want ErrKeyExists", err)
	}
	if _, err := replay.Get(ctx, "sql.0011"); err != nil {
		t.Fatalf("executor reads its pool's signature: %v", err)
	}
	octx, ocancel := context.WithTimeout(ctx, time.Second)
	if _, err := replay.Create(octx, "email.0011", []byte("1")); err == nil {
		t.Fatal("executor-sql wrote the email pool's replay key")
	}
	ocancel()

	// The supervisor reads the catalog the way catalog.Load does.
	w, err := supRes.Tools.WatchAll(ctx)
	if err != nil {
		t.Fatalf("supervisor watches the tool catalog: %v", err)
	}
	select {
	case e := <-w.Updates():
		if e == nil || e.Key() != "sql.query.x" {
			t.Fatalf("catalog watch: first entry %v, want sql.query.x", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("supervisor's catalog watch saw nothing")
	}
	_ = w.Stop()

	// Replicas of one pool ask each other whether an attempt still runs
	// (runner.AttemptsSubject): allowed within the pool only.
	peer := connect(t, url, "executor-sql", make(chan error, 8))
	ans, err := peer.Subscribe("planex.executor.sql.replica2.attempts", func(m *nats.Msg) { _ = m.Respond([]byte("idle")) })
	if err != nil {
		t.Fatal(err)
	}
	defer ans.Unsubscribe()
	if err := peer.Flush(); err != nil {
		t.Fatal(err)
	}
	if reply, err := ex.Request("planex.executor.sql.replica2.attempts", []byte("key"), 5*time.Second); err != nil || string(reply.Data) != "idle" {
		t.Fatalf("attempt query within the pool: %v %v", reply, err)
	}
	if _, err := ex.SubscribeSync("planex.executor.email.*.attempts"); err != nil {
		t.Fatal(err)
	}
	waitViolation(t, errs, "planex.executor.email.*.attempts")

	// Forbidden: publishing a step request.
	pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = res.JS.Publish(pctx, "planex.steps.sql.exec", []byte("CREATE TABLE x"), jetstream.WithMsgID("forged"))
	pcancel()
	if err == nil {
		t.Fatal("executor published a step request")
	}
	waitViolation(t, errs, "planex.steps.sql.exec")
	st, err := supRes.JS.Stream(ctx, bus.StreamSteps)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Fatalf("steps stream holds %d messages (%v), want the forged one refused", info.State.Msgs, err)
	}

	// Forbidden: subscribing to run logs.
	sub, err := ex.SubscribeSync(bus.SubjectEventsPrefix + ">")
	if err != nil {
		t.Fatal(err)
	}
	waitViolation(t, errs, bus.SubjectEventsPrefix)
	if _, err := supRes.JS.Publish(ctx, bus.EventSubject("run2"), []byte("secret"), jetstream.WithMsgID("e2")); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.NextMsg(500 * time.Millisecond); err == nil {
		t.Fatalf("executor received a run log message: %q", m.Data)
	}

	// Forbidden: reading run logs through the JetStream API.
	for name, read := range map[string]func(context.Context) error{
		"consumer on PLANEX_EVENTS": func(ctx context.Context) error {
			_, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamEvents, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy})
			return err
		},
		"direct get from PLANEX_EVENTS": func(ctx context.Context) error {
			s, err := res.JS.Stream(ctx, bus.StreamEvents)
			if err != nil {
				return err
			}
			_, err = s.GetLastMsgForSubject(ctx, bus.EventSubject("run1"))
			return err
		},
		"another pool's consumer": func(ctx context.Context) error {
			_, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamSteps, bus.PoolConsumerConfig("email", 1, time.Second, 1))
			return err
		},
		"its PLANEX_EVENTS consumer with the whole log as filter": func(ctx context.Context) error {
			cfg := bus.DispatchConsumerConfig("sql", 1, time.Second, 1)
			cfg.FilterSubject = bus.SubjectEventsPrefix + ">"
			_, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamEvents, cfg)
			return err
		},
		"its PLANEX_EVENTS consumer with two filters": func(ctx context.Context) error {
			cfg := bus.DispatchConsumerConfig("sql", 1, time.Second, 1)
			cfg.FilterSubject, cfg.FilterSubjects = "", []string{bus.DispatchFilter("sql"), bus.RunLogFilter("run1")}
			_, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamEvents, cfg)
			return err
		},
		"another pool's PLANEX_EVENTS consumer": func(ctx context.Context) error {
			_, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamEvents, bus.DispatchConsumerConfig("email", 1, time.Second, 1))
			return err
		},
	} {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		err := read(rctx)
		rcancel()
		if err == nil {
			t.Errorf("executor could %s", name)
		}
	}
}

// waitViolation waits for the server's permissions violation on subject.
func waitViolation(t *testing.T, errs <-chan error, subject string) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case err := <-errs:
			if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				if strings.Contains(err.Error(), subject) {
					return
				}
			}
		case <-timeout:
			t.Fatalf("no permissions violation reported for %s", subject)
		}
	}
}

// TestExecutorCannotReadOtherInboxes: replies travel on per-service inbox
// prefixes; an executor identity may not subscribe to the supervisor's
// inboxes (where its JetStream API answers arrive) nor to _INBOX.>, and the
// supervisor's JetStream calls still work under its own prefix.
func TestExecutorCannotReadOtherInboxes(t *testing.T) {
	url := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sup := connect(t, url, "supervisor", make(chan error, 8))
	errs := make(chan error, 8)
	ex := connect(t, url, "executor-sql", errs)

	for _, subject := range []string{bus.InboxPrefix("supervisor") + ".>", "_INBOX.>", bus.InboxPrefix("planner") + ".>"} {
		sub, err := ex.SubscribeSync(subject)
		if err != nil {
			t.Fatal(err)
		}
		waitViolation(t, errs, subject)
		// The supervisor's JetStream API calls answer on its own inboxes.
		if _, err := bus.Setup(ctx, sup, bus.Options{}); err != nil {
			t.Fatalf("supervisor's JetStream calls under its inbox prefix: %v", err)
		}
		if m, err := sub.NextMsg(300 * time.Millisecond); err == nil {
			t.Fatalf("executor read a reply meant for another service on %s: %q", m.Subject, m.Data)
		}
		_ = sub.Unsubscribe()
	}
	// Its own inboxes work: JetStream set-up and KV reads as executor-sql.
	res, err := bus.Setup(ctx, ex, bus.Options{})
	if err != nil {
		t.Fatalf("executor's JetStream calls under its inbox prefix: %v", err)
	}
	if _, err := res.Tools.Put(ctx, "sql.query.y", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if _, err := res.Tools.Get(ctx, "sql.query.y"); err != nil {
		t.Fatalf("executor reads its KV entry: %v", err)
	}
	// A connection with the default inbox prefix gets no replies at all.
	plain, err := nats.Connect(url, nats.UserInfo("executor-sql", "executor-sql-pw"))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	js, err := jetstream.New(plain)
	if err != nil {
		t.Fatal(err)
	}
	ictx, icancel := context.WithTimeout(ctx, time.Second)
	defer icancel()
	if _, err := js.AccountInfo(ictx); err == nil {
		t.Fatal("a connection subscribing on _INBOX.> got a JetStream answer")
	}
}

// TestForServiceRejectsUnknown names the service at fault.
func TestForServiceRejectsUnknown(t *testing.T) {
	if _, err := natsauth.ForService("gateway"); err == nil || !strings.Contains(err.Error(), `"gateway"`) {
		t.Fatalf("unknown service: %v", err)
	}
	conf, err := natsauth.ServerConfig(map[string]string{"executor-sql": "UABC"})
	if err != nil || !strings.Contains(conf, `nkey: "UABC"`) || strings.Contains(conf, bus.SubjectStepsPrefix+">") {
		t.Fatalf("ServerConfig: %v\n%s", err, conf)
	}
}

// TestMCPPoolIdentity: the mcp pool (deploy/k8s/components/mcp-pool, NATS
// user executor-mcp from `planex auth k8s-secrets --pools ...,mcp`) gets
// an executor's permissions for its own pool only: its consumer, its
// steps, its tool registrations and replay keys; not another pool's
// consumer or replay keys, not the email pool's drafts, no step requests.
func TestMCPPoolIdentity(t *testing.T) {
	url := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sup := connect(t, url, "supervisor", make(chan error, 8))
	supRes, err := bus.Setup(ctx, sup, bus.Options{Update: true})
	if err != nil {
		t.Fatalf("supervisor sets up JetStream: %v", err)
	}
	errs := make(chan error, 8)
	ex := connect(t, url, "executor-mcp", errs)
	res, err := bus.Setup(ctx, ex, bus.Options{})
	if err != nil {
		t.Fatalf("executor-mcp sets up (binds) JetStream: %v", err)
	}
	workOwnPool(ctx, t, supRes, res, "mcp", "planex.steps.mcp.tickets_close_ticket")
	if _, err := res.Tools.Put(ctx, "mcp.tickets_close_ticket.r1", []byte("{}")); err != nil {
		t.Fatalf("executor-mcp registers an MCP tool: %v", err)
	}
	if _, err := stepsign.OpenSharedReplays(ctx, res.JS, "mcp", 1); err != nil {
		t.Fatalf("executor-mcp opens the step replay bucket: %v", err)
	}
	replay, err := res.JS.KeyValue(ctx, stepsign.ReplayBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := replay.Create(ctx, "mcp.0011", []byte("1")); err != nil {
		t.Fatalf("executor-mcp records a signature of its pool: %v", err)
	}
	for name, try := range map[string]func(context.Context) error{
		"create the sql pool's consumer": func(ctx context.Context) error {
			_, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamSteps, bus.PoolConsumerConfig("sql", 1, time.Second, 1))
			return err
		},
		"write the sql pool's replay key": func(ctx context.Context) error {
			_, err := replay.Create(ctx, "sql.0011", []byte("1"))
			return err
		},
		"publish a step request": func(ctx context.Context) error {
			_, err := res.JS.Publish(ctx, "planex.steps.mcp.tickets_close_ticket", []byte("forged"), jetstream.WithMsgID("forged"))
			return err
		},
		"open the drafts (email pool only)": func(ctx context.Context) error {
			_, err := res.JS.KeyValue(ctx, bus.BucketDrafts)
			return err
		},
		"write a draft (email pool only)": func(ctx context.Context) error {
			_, err := res.JS.Publish(ctx, "$KV."+bus.BucketDrafts+".d1", []byte("draft"))
			return err
		},
	} {
		tctx, tcancel := context.WithTimeout(ctx, time.Second)
		err := try(tctx)
		tcancel()
		if err == nil {
			t.Errorf("executor-mcp could %s", name)
		}
	}
	conf, err := natsauth.ServerConfig(map[string]string{"executor-mcp": "UMCP", "executor-sql": "USQL"})
	if err != nil {
		t.Fatal(err)
	}
	_, mcpBlock, _ := strings.Cut(conf, "# executor-mcp")
	mcpBlock, _, _ = strings.Cut(mcpBlock, "# executor-sql")
	if !strings.Contains(mcpBlock, `nkey: "UMCP"`) || !strings.Contains(mcpBlock, `"planex.executor.mcp.*.attempts"`) ||
		strings.Contains(mcpBlock, "sql") || strings.Contains(mcpBlock, bus.SubjectStepsPrefix+">") {
		t.Fatalf("authorization block of executor-mcp: want its own pool's subjects only:\n%s", mcpBlock)
	}
}

// workOwnPool has an executor of pool create its pool consumer, take and
// acknowledge a step the supervisor published on subject, and publish a
// result, as the executor runtime does.
// workOwnDispatches: executor-<pool> creates its consumer on PLANEX_EVENTS,
// receives a routed decision dispatching its step and a request published
// apart, and acks them.
func workOwnDispatches(ctx context.Context, t *testing.T, supRes, res *bus.Resources, pool string) {
	t.Helper()
	cons, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamEvents, bus.DispatchConsumerConfig(pool, 2, 5*time.Second, 3))
	if err != nil {
		t.Fatalf("executor-%s creates its consumer on %s: %v", pool, bus.StreamEvents, err)
	}
	for i, subject := range []string{bus.DispatchSubject("RUNP", pool), bus.RequestSubject(pool)} {
		if _, err := supRes.JS.Publish(ctx, subject, []byte("step"), jetstream.WithMsgID(fmt.Sprint("d", i))); err != nil {
			t.Fatal(err)
		}
	}
	fetchAndAck(ctx, t, cons, 2, fmt.Sprintf("executor-%s on %s", pool, bus.StreamEvents))
}

// fetchAndAck fetches want messages from cons and acks each (as who).
func fetchAndAck(ctx context.Context, t *testing.T, cons jetstream.Consumer, want int, who string) {
	t.Helper()
	batch, err := cons.Fetch(want, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for m := range batch.Messages() {
		got++
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatalf("%s acks its step: %v", who, err)
		}
	}
	if got != want {
		t.Fatalf("%s fetched %d steps, want %d", who, got, want)
	}
}

func workOwnPool(ctx context.Context, t *testing.T, supRes, res *bus.Resources, pool, subject string) {
	t.Helper()
	cons, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamSteps, bus.PoolConsumerConfig(pool, 1, 5*time.Second, 3))
	if err != nil {
		t.Fatalf("executor-%s creates its pool consumer: %v", pool, err)
	}
	if _, err := supRes.JS.Publish(ctx, subject, []byte("step"), jetstream.WithMsgID("s1")); err != nil {
		t.Fatal(err)
	}
	fetchAndAck(ctx, t, cons, 1, "executor-"+pool)
	if _, err := res.JS.Publish(ctx, bus.EngineSubject("run1", bus.KindResult), []byte("result"), jetstream.WithMsgID("r1")); err != nil {
		t.Fatalf("executor-%s publishes a result: %v", pool, err)
	}
}
