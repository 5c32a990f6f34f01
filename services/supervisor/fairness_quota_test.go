package supervisor_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/supervisor/api"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/engine"
	"github.com/planex-dev/planex/services/supervisor/quota"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// tenantSpec is a tenant's spec the test changes while replicas run.
type tenantSpec struct {
	mu sync.Mutex
	q  *planexv1.TenantQuotas
}

func (s *tenantSpec) get() *planexv1.Tenant {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &planexv1.Tenant{Name: "acme", Quotas: proto.CloneOf(s.q)}
}

func (s *tenantSpec) set(fn func(q *planexv1.TenantQuotas)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn(s.q)
}

// startCell starts a supervisor replica of tenant "acme" as the
// supervisor's tenant cells are built: one run log shared by the engine,
// the API and the quota cell, whose hooks are wired (AdmitStart,
// Admit, PoolLimit, OnEvents). The cell has a NATS connection of its own,
// so that it can still flush after the replica's connection is closed.
func (h *harness) startCell(t *testing.T, spec *tenantSpec, prices quota.Prices, fair *quota.Fair, opts ...func(*engine.Config)) (*replica, *quota.Cell) {
	t.Helper()
	nc, err := nats.Connect(h.srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 10*time.Second)
	res, err := bus.Setup(ctx, nc, bus.Options{})
	if err != nil {
		t.Fatal(err)
	}
	logger := natstest.Logger(t)
	log, err := runlog.New(ctx, res, logger, runlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	log.IndexRuns()
	_, cellRes := h.srv.Setup(t)
	cell, err := quota.NewCell(ctx, quota.Deps{Tenant: "acme", Bus: cellRes, Log: log, Spec: spec.get, Prices: prices, Fair: fair, Logger: logger, FlushInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cellCtx, stopCell := context.WithCancel(context.Background())
	cellDone := make(chan error, 1)
	go func() { cellDone <- cell.Run(cellCtx) }()
	floors, err := res.ToolFloorsBucket(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tools := catalog.NewCache(res.Tools, logger, time.Second, catalog.Trust{Floors: floors})
	cfg := engine.Config{Workers: 16, AckWait: h.ackWait, MaxAckPending: 2048, Tenant: "acme",
		Admit: cell.Admit, PoolLimit: cell.PoolLimit, OnEvents: cell.OnEvents}
	for _, o := range opts {
		o(&cfg)
	}
	eng, err := engine.New(ctx, cfg, res, log, tools, h.planner.client, logger)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Config{Limits: cfg.Limits, Tools: tools, Tenant: "acme", AdmitStart: cell.AdmitStart}, res, log, logger)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	srv.Register(gs)
	if err := eng.Start(ctx); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{client: planexv1.NewSupervisorServiceClient(conn), nc: nc, gs: gs, stop: eng.Stop}
	t.Cleanup(func() {
		_ = conn.Close()
		r.once.Do(func() {
			gs.Stop()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := eng.Stop(sctx); err != nil {
				t.Errorf("stop replica: %v", err)
			}
			nc.Close()
		})
		stopCell()
		if err := <-cellDone; err != nil {
			t.Errorf("cell: %v", err)
		}
	})
	return r, cell
}

// keyClaimed reports whether an idempotency key was claimed.
func (h *harness) keyClaimed(t *testing.T, key string) bool {
	t.Helper()
	sum := sha256.Sum256([]byte(key))
	_, err := h.res.Idempotency.Get(testCtx(t, 5*time.Second), hex.EncodeToString(sum[:]))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

func listCount(t *testing.T, c planexv1.SupervisorServiceClient) int {
	t.Helper()
	resp, err := c.ListRuns(testCtx(t, 5*time.Second), &planexv1.ListRunsRequest{PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.GetRuns())
}

// refusedStart starts a run with key and checks it is refused by quota
// with nothing created: its message names the quota and what to do, a
// RetryInfo is there when waiting helps (retry), no run was added and the
// key was not claimed.
func (h *harness) refusedStart(t *testing.T, r *replica, goal, key, quotaName string, retry bool) string {
	t.Helper()
	before := listCount(t, r.client)
	_, err := r.client.StartRun(testCtx(t, 10*time.Second), &planexv1.StartRunRequest{Goal: goal, IdempotencyKey: key})
	st, _ := status.FromError(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("StartRun over %s: %v, want RESOURCE_EXHAUSTED", quotaName, err)
	}
	if !strings.HasPrefix(st.Message(), "tenant acme ") || !strings.Contains(st.Message(), quotaName) || !strings.Contains(st.Message(), "ask a platform admin") {
		t.Fatalf("message %q: want the tenant, the quota %s and what to do", st.Message(), quotaName)
	}
	var hasRetry, hasQuota bool
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			hasRetry = d.GetRetryDelay().AsDuration() > 0
		case *errdetails.QuotaFailure:
			hasQuota = len(d.GetViolations()) == 1
		}
	}
	if hasRetry != retry || !hasQuota {
		t.Fatalf("details %v: want RetryInfo %v and a QuotaFailure", st.Details(), retry)
	}
	if n := listCount(t, r.client); n != before {
		t.Fatalf("%d runs after the refusal, %d before: a refused start created a run", n, before)
	}
	if h.keyClaimed(t, key) {
		t.Fatalf("idempotency key %q claimed by a refused start", key)
	}
	return st.Message()
}

// TestQuotaConcurrentRuns: with max_concurrent_runs 3, the 4th start is
// refused with nothing created, retries of started runs are not, and the
// refused key starts its run once one finished. 12 concurrent starts on
// one replica never overshoot.
func TestQuotaConcurrentRuns(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	spec := &tenantSpec{q: &planexv1.TenantQuotas{MaxConcurrentRuns: 3}}
	r, cell := h.startCell(t, spec, nil, nil)
	h.planner.on("quota wait*", always(step("wait", "test.gate", map[string]any{})))
	var ids []string
	for i := range 3 {
		ids = append(ids, start(t, r.client, &planexv1.StartRunRequest{Goal: fmt.Sprint("quota wait ", i), IdempotencyKey: fmt.Sprint("k", i)}))
	}
	msg := h.refusedStart(t, r, "quota wait 3", "k3", "max_concurrent_runs", false)
	if want := "tenant acme has 3 runs not finished, its quota max_concurrent_runs: wait for one to finish or ask a platform admin to raise it"; msg != want {
		t.Fatalf("message %q, want %q", msg, want)
	}
	// A retry of a started run is never refused.
	resp, err := r.client.StartRun(testCtx(t, 5*time.Second), &planexv1.StartRunRequest{Goal: "quota wait 0", IdempotencyKey: "k0"})
	if err != nil || !resp.GetExisting() || resp.GetRun().GetId() != ids[0] {
		t.Fatalf("retry of a started run at the quota: %v %v, want the existing run", resp, err)
	}
	u, err := cell.Usage(testCtx(t, 5*time.Second), "", "")
	if err != nil || u.GetRunsInFlight() != 3 || u.GetRunTreesInFlight() != 3 {
		t.Fatalf("usage %v %v: want 3 runs (3 trees) in flight", u, err)
	}
	h.pool.openGate()
	for _, id := range ids {
		succeeded(t, r, id)
	}
	resp, err = r.client.StartRun(testCtx(t, 5*time.Second), &planexv1.StartRunRequest{Goal: "quota wait 3", IdempotencyKey: "k3"})
	if err != nil || resp.GetExisting() {
		t.Fatalf("start with the refused key once runs finished: %v %v, want a new run", resp, err)
	}
	succeeded(t, r, resp.GetRun().GetId())

	// A client that waits for each run to finish before it starts the next
	// is never refused at max_concurrent_runs 1, though the finished run's
	// snapshot is written concurrently with its last decision.
	spec.set(func(q *planexv1.TenantQuotas) { q.MaxConcurrentRuns = 1 })
	h.planner.on("quota seq*", always(step("a", "test.echo", map[string]any{"value": 1})))
	for i := range 20 {
		succeeded(t, r, start(t, r.client, &planexv1.StartRunRequest{Goal: fmt.Sprint("quota seq ", i)}))
	}

	// Concurrent starts: exactly the quota's worth get in.
	spec.set(func(q *planexv1.TenantQuotas) { q.MaxConcurrentRuns = 5 })
	h.planner.on("quota hold*", always(step("wait", "test.sleep", map[string]any{"ms": 3000})))
	var ok, refused atomic.Int32
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := r.client.StartRun(testCtx(t, 10*time.Second), &planexv1.StartRunRequest{Goal: fmt.Sprint("quota hold ", i)})
			switch status.Code(err) {
			case codes.OK:
				ok.Add(1)
			case codes.ResourceExhausted:
				refused.Add(1)
			default:
				t.Errorf("concurrent StartRun: %v", err)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 5 || refused.Load() != 7 {
		t.Fatalf("12 concurrent starts with max_concurrent_runs 5: %d started, %d refused; want 5 and 7", ok.Load(), refused.Load())
	}
}

// TestQuotaRateTokensMoney: starts_per_second, tokens_per_day and
// money_per_month_micros each refuse with their message and a RetryInfo,
// nothing created; raising the quota lets the same key start its run.
func TestQuotaRateTokensMoney(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	spec := &tenantSpec{q: &planexv1.TenantQuotas{}}
	// Every plan of the harness planner uses 10 input and 5 output tokens;
	// at $100 per million each, a plan costs 1,500 micro-dollars.
	prices := quota.Prices{"*": {InputPerMillion: 100_000_000, OutputPerMillion: 100_000_000}}
	r, cell := h.startCell(t, spec, prices, nil)
	echo := always(step("a", "test.echo", map[string]any{"value": 1}))

	t.Run("starts_per_second", func(t *testing.T) {
		spec.set(func(q *planexv1.TenantQuotas) { q.StartsPerSecond, q.StartBurst = 0.5, 1 })
		defer spec.set(func(q *planexv1.TenantQuotas) { q.StartsPerSecond, q.StartBurst = 0, 0 })
		h.planner.on("rate 1", echo)
		succeeded(t, r, start(t, r.client, &planexv1.StartRunRequest{Goal: "rate 1", IdempotencyKey: "rate-1"}))
		h.refusedStart(t, r, "rate 2", "rate-2", "starts_per_second", true)
		spec.set(func(q *planexv1.TenantQuotas) { q.StartsPerSecond = 0 })
		h.planner.on("rate 2", echo)
		succeeded(t, r, start(t, r.client, &planexv1.StartRunRequest{Goal: "rate 2", IdempotencyKey: "rate-2"}))
	})
	t.Run("tokens_per_day", func(t *testing.T) {
		u, err := cell.Usage(testCtx(t, 5*time.Second), "", "")
		if err != nil {
			t.Fatal(err)
		}
		spec.set(func(q *planexv1.TenantQuotas) { q.TokensPerDay = u.GetTokensToday() + 20 })
		h.planner.on("tokens*", echo)
		succeeded(t, r, start(t, r.client, &planexv1.StartRunRequest{Goal: "tokens 1", IdempotencyKey: "tokens-1"}))
		succeeded(t, r, start(t, r.client, &planexv1.StartRunRequest{Goal: "tokens 2", IdempotencyKey: "tokens-2"}))
		h.refusedStart(t, r, "tokens 3", "tokens-3", "tokens_per_day", true)
		spec.set(func(q *planexv1.TenantQuotas) { q.TokensPerDay = 0 })
		succeeded(t, r, start(t, r.client, &planexv1.StartRunRequest{Goal: "tokens 3", IdempotencyKey: "tokens-3"}))
	})
	t.Run("money_per_month_micros", func(t *testing.T) {
		u, err := cell.Usage(testCtx(t, 5*time.Second), "", "")
		if err != nil {
			t.Fatal(err)
		}
		if u.GetMoneyThisMonthMicros() != 1500*u.GetTotal().GetRunsStarted() {
			t.Fatalf("usage %v: want 1500 micro-dollars per run", u)
		}
		spec.set(func(q *planexv1.TenantQuotas) { q.MoneyPerMonthMicros = u.GetMoneyThisMonthMicros() + 1000 })
		h.planner.on("money*", echo)
		succeeded(t, r, start(t, r.client, &planexv1.StartRunRequest{Goal: "money 1", IdempotencyKey: "money-1"}))
		msg := h.refusedStart(t, r, "money 2", "money-2", "money_per_month_micros", true)
		if !strings.Contains(msg, "until "+time.Now().UTC().AddDate(0, 1, 1-time.Now().UTC().Day()).Format("2006-01-02")) {
			t.Fatalf("message %q: want the first day of next month", msg)
		}
		spec.set(func(q *planexv1.TenantQuotas) { q.MoneyPerMonthMicros = 0 })
		succeeded(t, r, start(t, r.client, &planexv1.StartRunRequest{Goal: "money 2", IdempotencyKey: "money-2"}))
	})
}

// TestPoolLimit: with 2 steps of pool "test" in flight at most, a run of
// 6 independent steps (parallelism 6) never has more than 2 dispatched
// and not finished, dispatches them in plan order, and succeeds; a second
// replica's run shares the same 2 places.
func TestPoolLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	spec := &tenantSpec{q: &planexv1.TenantQuotas{PoolStepsInFlight: map[string]int32{"test": 2}}}
	a, _ := h.startCell(t, spec, nil, nil)
	b, _ := h.startCell(t, spec, nil, nil)
	var steps []*planexv1.Step
	for i := 1; i <= 6; i++ {
		steps = append(steps, step(fmt.Sprint("s", i), "test.sleep", map[string]any{"ms": 150}))
	}
	h.planner.on("pool limit*", always(steps...))
	budget := &planexv1.Budget{MaxParallelism: 6}
	id1 := start(t, a.client, &planexv1.StartRunRequest{Goal: "pool limit 1", Budget: budget})
	id2 := start(t, b.client, &planexv1.StartRunRequest{Goal: "pool limit 2", Budget: budget})
	succeeded(t, a, id1)
	succeeded(t, b, id2)

	type span struct{ from, to time.Time }
	var spans []span
	for _, id := range []string{id1, id2} {
		evs := watchAll(t, a.client, id, 1)
		var order []string
		open := map[string]time.Time{}
		for _, ev := range evs {
			switch {
			case ev.GetStepDispatched() != nil:
				order = append(order, ev.GetStepDispatched().GetStepId())
				open[ev.GetStepDispatched().GetStepId()] = ev.GetTime().AsTime()
			case ev.GetStepSucceeded() != nil:
				s := ev.GetStepSucceeded().GetStepId()
				spans = append(spans, span{open[s], ev.GetTime().AsTime()})
			}
		}
		if want := []string{"s1", "s2", "s3", "s4", "s5", "s6"}; !slices.Equal(order, want) {
			t.Fatalf("run %s dispatched %v, want %v (in order)", id, order, want)
		}
	}
	if len(spans) != 12 {
		t.Fatalf("%d steps finished, want 12", len(spans))
	}
	peak := 0
	for _, s := range spans {
		n := 0
		for _, o := range spans {
			if !o.from.After(s.from) && o.to.After(s.from) {
				n++
			}
		}
		peak = max(peak, n)
	}
	if peak > 2 {
		t.Fatalf("%d steps of pool test dispatched and not finished at once, want at most 2", peak)
	}
	if peak < 2 {
		t.Fatalf("at most %d step in flight: the limit of 2 was not used", peak)
	}
}

// TestUsageCountedOnceAcrossRedelivery: the replica that appended a step's
// result dies before acking it; the result is redelivered to another
// replica. Every token and step of the run is counted once.
func TestUsageCountedOnceAcrossRedelivery(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	spec := &tenantSpec{q: &planexv1.TenantQuotas{}}
	var (
		victim  *replica
		once    sync.Once
		crashed = make(chan struct{})
	)
	a, cellA := h.startCell(t, spec, nil, nil, func(c *engine.Config) {
		c.Hooks.AfterAppend = func(_ string, evs []*planexv1.RunEvent) {
			for _, ev := range evs {
				if ev.GetStepSucceeded().GetStepId() == "one" {
					once.Do(func() {
						victim.nc.Close() // kill -9 after the append: no ack
						close(crashed)
					})
				}
			}
		}
	})
	victim = a
	h.planner.on("usage once", sequence(
		planOf(step("one", "test.echo", map[string]any{"value": 1}), step("two", "test.fail", map[string]any{"message": "no"}, "one")),
		planOf(step("one", "test.echo", map[string]any{"value": 1}), step("three", "test.echo", map[string]any{"value": 3}, "one")),
	))
	id := start(t, a.client, &planexv1.StartRunRequest{Goal: "usage once", Budget: &planexv1.Budget{MaxReplans: 1}})
	select {
	case <-crashed:
	case <-time.After(15 * time.Second):
		t.Fatal("the replica never appended the step's result")
	}
	a.kill()
	b, cellB := h.startCell(t, spec, nil, nil)
	run := succeeded(t, b, id)

	var want planexv1.UsageDay
	want.RunsStarted, want.RunsFinished = 1, 1
	for _, ev := range watchAll(t, b.client, id, 1) {
		switch {
		case ev.GetPlanRevised() != nil:
			want.InputTokens += ev.GetPlanRevised().GetUsage().GetInputTokens()
			want.OutputTokens += ev.GetPlanRevised().GetUsage().GetOutputTokens()
		case ev.GetPlanRejected() != nil:
			want.InputTokens += ev.GetPlanRejected().GetUsage().GetInputTokens()
			want.OutputTokens += ev.GetPlanRejected().GetUsage().GetOutputTokens()
		case ev.GetStepSucceeded() != nil, ev.GetStepFailed() != nil:
			want.Steps++
		}
	}
	if want.Steps < 3 || want.InputTokens != 20 {
		t.Fatalf("run %s: %d steps and %d input tokens recorded, want a failed step, a replan and 2 plans", id, want.Steps, want.InputTokens)
	}
	ctx := testCtx(t, 10*time.Second)
	day := run.GetCreatedAt().AsTime().UTC().Format("2006-01-02")
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, c := range []*quota.Cell{cellA, cellB} {
			if err := c.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
		u, err := cellB.Usage(ctx, day, day)
		if err != nil {
			t.Fatal(err)
		}
		var got planexv1.UsageDay
		if len(u.GetDays()) == 1 {
			got = *proto.CloneOf(u.GetDays()[0])
			got.Day = ""
		}
		if proto.Equal(&got, &want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("usage %v, want %v (every event counted once)", &got, &want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestQuotaConcurrentRunsCountsTreesForksAndResets: max_concurrent_runs
// counts run trees — a parent and the child it waits for take one place,
// so a parent can always start its children and another run can start
// beside them — while a fork and the reset of a finished run are new runs
// in flight: at the quota each is refused like StartRun, with nothing
// created or appended, and allowed once a place is free.
func TestQuotaConcurrentRunsCountsTreesForksAndResets(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	spec := &tenantSpec{q: &planexv1.TenantQuotas{MaxConcurrentRuns: 2}}
	r, cell := h.startCell(t, spec, nil, nil)
	h.planner.on("tree done", always(step("a", "test.echo", map[string]any{"value": 1})))
	h.planner.on("tree parent", always(childStep("c", "tree child", nil)))
	h.planner.on("tree child", always(step("g", "test.gate", map[string]any{})))
	h.planner.on("tree hold", always(step("g", "test.gate", map[string]any{})))
	ctx := testCtx(t, time.Minute)

	done := start(t, r.client, &planexv1.StartRunRequest{Goal: "tree done"})
	succeeded(t, r, done)
	parent := start(t, r.client, &planexv1.StartRunRequest{Goal: "tree parent", Budget: &planexv1.Budget{MaxSteps: 10, MaxTokens: 1000}})
	var child string
	waitFor(t, 20*time.Second, "the parent's child run to be running", func() bool {
		resp, err := r.client.ListRuns(ctx, &planexv1.ListRunsRequest{Filter: &planexv1.RunFilter{ParentRunId: parent}})
		if err != nil || len(resp.GetRuns()) != 1 || resp.GetRuns()[0].GetStatus() != planexv1.RunStatus_RUN_STATUS_RUNNING {
			return false
		}
		child = resp.GetRuns()[0].GetId()
		return true
	})
	if u, err := cell.Usage(ctx, "", ""); err != nil || u.GetRunsInFlight() != 2 || u.GetRunTreesInFlight() != 1 {
		t.Fatalf("usage %v %v: want the parent and its child in flight, one tree", u, err)
	}
	// Two runs in flight, one tree: a second tree starts.
	hold := start(t, r.client, &planexv1.StartRunRequest{Goal: "tree hold"})
	h.refusedStart(t, r, "tree hold 2", "k-tree", "max_concurrent_runs", false)

	// At the quota, a fork is refused before anything of it exists.
	before := listCount(t, r.client)
	_, err := r.client.ForkRun(ctx, &planexv1.ForkRunRequest{RunId: done, FromStep: "a", Reason: "again", RequestId: "fork-1"})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "max_concurrent_runs") {
		t.Fatalf("ForkRun at the quota: %v, want RESOURCE_EXHAUSTED naming max_concurrent_runs", err)
	}
	if n := listCount(t, r.client); n != before {
		t.Fatalf("%d runs after the refused fork, %d before", n, before)
	}
	if h.keyClaimed(t, "fork "+done+" fork-1") {
		t.Fatal("the refused fork claimed its request id")
	}
	// And so is the reset of a finished run: nothing appended.
	prev, err := r.client.GetRun(ctx, &planexv1.GetRunRequest{RunId: done})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.client.ResetRun(ctx, &planexv1.ResetRunRequest{RunId: done, FromStep: "a", Reason: "again", RequestId: "reset-1"})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "max_concurrent_runs") {
		t.Fatalf("ResetRun at the quota: %v, want RESOURCE_EXHAUSTED naming max_concurrent_runs", err)
	}
	after, err := r.client.GetRun(ctx, &planexv1.GetRunRequest{RunId: done})
	if err != nil || after.GetRun().GetLastSequence() != prev.GetRun().GetLastSequence() || after.GetRun().GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("run after the refused reset: %v %v, want it unchanged (SUCCEEDED at sequence %d)", after.GetRun(), err, prev.GetRun().GetLastSequence())
	}

	h.pool.openGate()
	for _, id := range []string{child, parent, hold} {
		succeeded(t, r, id)
	}
	fork, err := r.client.ForkRun(ctx, &planexv1.ForkRunRequest{RunId: done, FromStep: "a", Reason: "again", RequestId: "fork-1"})
	if err != nil || fork.GetExisting() {
		t.Fatalf("ForkRun with the refused request id once places are free: %v %v, want a new fork", fork, err)
	}
	succeeded(t, r, fork.GetRun().GetId())
	if _, err := r.client.ResetRun(ctx, &planexv1.ResetRunRequest{RunId: done, FromStep: "a", Reason: "again", RequestId: "reset-1"}); err != nil {
		t.Fatalf("ResetRun once places are free: %v", err)
	}
	succeeded(t, r, done)
}
