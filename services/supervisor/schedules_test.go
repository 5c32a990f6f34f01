package supervisor_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/authn/authntest"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/mcpserver"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/schedule"
	"github.com/planex-dev/planex/internal/tlsconfig"
	"github.com/planex-dev/planex/services/supervisor"
	"github.com/planex-dev/planex/services/supervisor/api"
	"github.com/planex-dev/planex/services/supervisor/engine"
)

// schedReplica is a supervisor replica with its ScheduleService client.
type schedReplica struct {
	*replica
	schedules planexv1.ScheduleServiceClient
}

// startScheduleReplica is startReplica with the replica's schedule
// settings (the harness's replicas take the defaults).
func (h *harness) startScheduleReplica(sc supervisor.ScheduleConfig) *schedReplica {
	t := h.t
	t.Helper()
	nc, err := nats.Connect(h.srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	res, err := bus.Setup(testCtx(t, 10*time.Second), nc, bus.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := engine.Config{Workers: 16, AckWait: h.ackWait, MaxAckPending: 2048}
	gs := grpc.NewServer()
	stop, err := supervisor.Start(context.Background(), supervisor.Components{
		Bus: res, Logger: natstest.Logger(t), Planner: h.planner.client, GRPC: gs, Engine: cfg,
		API: api.Config{Limits: cfg.Limits}, Schedules: sc,
	})
	if err != nil {
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
	r := &replica{client: planexv1.NewSupervisorServiceClient(conn), nc: nc, gs: gs, stop: stop}
	t.Cleanup(func() {
		_ = conn.Close()
		r.once.Do(func() {
			gs.Stop()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := stop(ctx); err != nil {
				t.Errorf("stop replica: %v", err)
			}
			nc.Close()
		})
	})
	return &schedReplica{replica: r, schedules: planexv1.NewScheduleServiceClient(conn)}
}

// scheduleRuns lists the runs a schedule started, by nominal time label.
func scheduleRuns(t *testing.T, c planexv1.SupervisorServiceClient, id string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	token := ""
	for {
		resp, err := c.ListRuns(testCtx(t, 10*time.Second), &planexv1.ListRunsRequest{
			Labels: map[string]string{schedule.LabelSchedule: id}, PageSize: 500, PageToken: token})
		if err != nil {
			t.Fatalf("ListRuns: %v", err)
		}
		for _, r := range resp.GetRuns() {
			n := r.GetLabels()[schedule.LabelNominal]
			out[n] = append(out[n], r.GetId())
			if want := schedule.IdempotencyKey(id, mustTime(t, n)); r.GetIdempotencyKey() != want {
				t.Errorf("run %s: idempotency key %q, want %q", r.GetId(), r.GetIdempotencyKey(), want)
			}
		}
		if token = resp.GetNextPageToken(); token == "" {
			return out
		}
	}
}

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("nominal label %q: %v", s, err)
	}
	return tm
}

// TestScheduleFiresExactlyOnceAcrossReplicaKills is the acceptance test
// of issue 32's schedules: a one-per-second schedule over two minutes,
// two replicas, one of them killed twice right after it started a
// firing's run and before it could record it (the kill lands where a
// doubled or lost firing would come from); every nominal time of the two
// minutes starts exactly one run.
func TestScheduleFiresExactlyOnceAcrossReplicaKills(t *testing.T) {
	if testing.Short() {
		t.Skip("two minutes of schedule time")
	}
	t.Parallel()
	h := newHarness(t)
	h.planner.on("tick*", sequence(withAnswer(planOf(), "tock")))

	// The victim's hook: once armed, the first firing it starts makes
	// the replica "die" there — it reports the nominal time and never
	// records anything again — until the test kills it for real.
	type victim struct {
		armed atomic.Bool
		dead  atomic.Bool
		hit   chan time.Time
	}
	newVictim := func() *victim { return &victim{hit: make(chan time.Time, 1)} }
	hook := func(v *victim) func(string, time.Time) error {
		return func(_ string, nominal time.Time) error {
			if v.dead.Load() {
				return errors.New("replica is dead")
			}
			if v.armed.Load() {
				v.dead.Store(true)
				v.hit <- nominal
				return errors.New("killed after StartRun, before the firing was recorded")
			}
			return nil
		}
	}
	survivor := h.startScheduleReplica(supervisor.ScheduleConfig{Recheck: 200 * time.Millisecond})
	v1 := newVictim()
	r1 := h.startScheduleReplica(supervisor.ScheduleConfig{Recheck: 200 * time.Millisecond, AfterStart: hook(v1)})

	ctx := testCtx(t, 4*time.Minute)
	resp, err := survivor.schedules.CreateSchedule(ctx, &planexv1.CreateScheduleRequest{Schedule: &planexv1.Schedule{
		Id:            "tick",
		Spec:          &planexv1.ScheduleSpec{Interval: durationpb.New(time.Second)},
		Action:        &planexv1.ScheduleAction{Goal: "tick"},
		OverlapPolicy: planexv1.ScheduleOverlapPolicy_SCHEDULE_OVERLAP_POLICY_ALLOW_ALL,
		CatchUpWindow: durationpb.New(30 * time.Second),
	}})
	if err != nil {
		t.Fatalf("CreateSchedule: %v", err)
	}
	t0 := resp.GetSchedule().GetCreateTime().AsTime()
	first := t0.Truncate(time.Second).Add(time.Second)
	last := first.Add(119 * time.Second) // 120 nominal times
	var killed []time.Time

	kill := func(v *victim, r *schedReplica) {
		v.armed.Store(true)
		select {
		case n := <-v.hit:
			killed = append(killed, n)
			r.kill()
			t.Logf("replica killed after starting the run of %s", n.Format(time.RFC3339))
		case <-time.After(30 * time.Second):
			t.Fatal("the victim replica started no firing in 30s")
		}
	}
	time.Sleep(time.Until(first.Add(30 * time.Second)))
	kill(v1, r1)
	time.Sleep(5 * time.Second) // one replica only for a while
	v2 := newVictim()
	r2 := h.startScheduleReplica(supervisor.ScheduleConfig{Recheck: 200 * time.Millisecond, AfterStart: hook(v2)})
	time.Sleep(time.Until(first.Add(70 * time.Second)))
	kill(v2, r2)
	h.startScheduleReplica(supervisor.ScheduleConfig{Recheck: 200 * time.Millisecond})

	time.Sleep(time.Until(last.Add(2 * time.Second)))
	if _, err := survivor.schedules.PauseSchedule(ctx, &planexv1.PauseScheduleRequest{Id: "tick", Note: "test over"}); err != nil {
		t.Fatalf("PauseSchedule: %v", err)
	}
	// Let a firing decided before the pause finish.
	waitFor(t, 10*time.Second, "no pending firing", func() bool {
		g, err := survivor.schedules.GetSchedule(ctx, &planexv1.GetScheduleRequest{Id: "tick"})
		return err == nil && len(g.GetSchedule().GetRecentFirings()) > 0
	})
	time.Sleep(time.Second)

	runs := scheduleRuns(t, survivor.client, "tick")
	inWindow := 0
	for n, ids := range runs {
		if len(ids) != 1 {
			t.Errorf("nominal time %s started %d runs: %v", n, len(ids), ids)
		}
		if tm := mustTime(t, n); !tm.Before(first) && !tm.After(last) {
			inWindow++
		}
	}
	for i := range 120 {
		n := first.Add(time.Duration(i) * time.Second).UTC().Format(time.RFC3339Nano)
		if len(runs[n]) == 0 {
			t.Errorf("nominal time %s started no run", n)
		}
	}
	if inWindow != 120 {
		t.Errorf("%d nominal times of the two minutes fired, want 120", inWindow)
	}
	for _, n := range killed {
		if ids := runs[n.UTC().Format(time.RFC3339Nano)]; len(ids) != 1 {
			t.Errorf("the firing the kill interrupted (%s) has runs %v, want exactly one", n, ids)
		}
	}
	if len(killed) != 2 {
		t.Errorf("%d kills landed, want 2", len(killed))
	}
	t.Logf("%d runs in all, %d in the two minutes, kills at %v", len(runs), inWindow, killed)
}

// clock is a test clock the schedulers read.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// grpcRuns adapts a SupervisorService client to schedule.Runs.
type grpcRuns struct {
	c planexv1.SupervisorServiceClient
}

func (g grpcRuns) StartRun(ctx context.Context, r *planexv1.StartRunRequest) (*planexv1.StartRunResponse, error) {
	return g.c.StartRun(ctx, r)
}
func (g grpcRuns) GetRun(ctx context.Context, r *planexv1.GetRunRequest) (*planexv1.GetRunResponse, error) {
	return g.c.GetRun(ctx, r)
}
func (g grpcRuns) CancelRun(ctx context.Context, r *planexv1.CancelRunRequest) (*planexv1.CancelRunResponse, error) {
	return g.c.CancelRun(ctx, r)
}

// clocked is a replica whose scheduler is off, and a scheduler on a test
// clock the test advances by hand (Advance), over the replica's API.
type clocked struct {
	r     *schedReplica
	clock *clock
	sched *schedule.Scheduler
	ops   *schedule.Ops
}

func newClocked(t *testing.T, h *harness, start time.Time) *clocked {
	t.Helper()
	c := &clock{now: start}
	r := h.startScheduleReplica(supervisor.ScheduleConfig{Disabled: true, Now: c.Now})
	kv, err := h.res.SchedulesBucket(testCtx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	store := schedule.NewStore(kv)
	s, err := schedule.New(schedule.Config{Store: store, KV: kv, Runs: grpcRuns{r.client}, Now: c.Now, Logger: natstest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return &clocked{r: r, clock: c, sched: s, ops: &schedule.Ops{Store: store, Now: c.Now}}
}

// at moves the clock to t and lets the scheduler handle what is due.
func (c *clocked) at(t *testing.T, tm time.Time, id string) *planexv1.Schedule {
	t.Helper()
	c.clock.set(tm)
	if _, err := c.sched.Advance(testCtx(t, 20*time.Second), id); err != nil {
		t.Fatalf("Advance at %s: %v", tm, err)
	}
	sc, err := c.ops.Get(testCtx(t, 5*time.Second), id)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func outcomes(sc *planexv1.Schedule) []string {
	var out []string
	for i := len(sc.GetRecentFirings()) - 1; i >= 0; i-- {
		f := sc.GetRecentFirings()[i]
		out = append(out, fmt.Sprintf("%s %s", f.GetNominalTime().AsTime().UTC().Format("15:04:05"), f.GetOutcome().String()[len("SCHEDULE_FIRING_OUTCOME_"):]))
	}
	return out
}

func TestScheduleOverlapCatchUpAndPause(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	// "hold" runs wait in test.gate until the pool's gate opens; "quick"
	// runs answer at once.
	h.planner.on("hold*", sequence(planOf(step("g", "test.gate", map[string]any{}))))
	h.planner.on("quick*", sequence(withAnswer(planOf(), "ok")))
	start := time.Now().Truncate(time.Minute).Add(time.Minute)
	c := newClocked(t, h, start)
	ctx := testCtx(t, 2*time.Minute)
	create := func(id, goal string, p planexv1.ScheduleOverlapPolicy) {
		t.Helper()
		c.clock.set(start)
		if _, err := c.ops.Create(ctx, &planexv1.Schedule{Id: id, Spec: &planexv1.ScheduleSpec{Interval: durationpb.New(10 * time.Second)},
			Action: &planexv1.ScheduleAction{Goal: goal}, OverlapPolicy: p, CatchUpWindow: durationpb.New(30 * time.Second)}, "test"); err != nil {
			t.Fatal(err)
		}
	}
	sec := func(n int) time.Time { return start.Add(time.Duration(n) * time.Second) }
	running := func(sc *planexv1.Schedule) string { return sc.GetRunningRunIds()[0] }

	t.Run("skip", func(t *testing.T) {
		create("skip", "hold skip", planexv1.ScheduleOverlapPolicy_SCHEDULE_OVERLAP_POLICY_SKIP)
		c.at(t, sec(5), "skip")
		c.at(t, sec(10), "skip")
		sc := c.at(t, sec(20), "skip")
		got := outcomes(sc)
		if len(got) != 2 || got[1][9:] != "SKIPPED" || got[0][9:] != "STARTED" {
			t.Fatalf("firings %v, want STARTED then SKIPPED", got)
		}
	})
	t.Run("buffer one", func(t *testing.T) {
		create("buffer", "hold buffer", planexv1.ScheduleOverlapPolicy_SCHEDULE_OVERLAP_POLICY_BUFFER_ONE)
		sc := c.at(t, sec(10), "buffer")
		first := running(sc)
		sc = c.at(t, sec(20), "buffer")
		sc = c.at(t, sec(30), "buffer")
		if got := outcomes(sc); len(got) != 3 || got[1][9:] != "BUFFERED" || got[2][9:] != "SKIPPED" {
			t.Fatalf("firings %v, want STARTED, BUFFERED, SKIPPED", got)
		}
		if _, err := c.r.client.CancelRun(ctx, &planexv1.CancelRunRequest{RunId: first, Reason: "test"}); err != nil {
			t.Fatal(err)
		}
		waitTerminal(t, c.r.client, first, 10*time.Second)
		sc = c.at(t, sec(31), "buffer")
		got := outcomes(sc)
		if len(got) != 4 || got[3] != sec(20).UTC().Format("15:04:05")+" STARTED" {
			t.Fatalf("firings %v, want the buffered 20s firing started once the first run ended", got)
		}
	})
	t.Run("cancel other", func(t *testing.T) {
		create("cancel", "hold cancel", planexv1.ScheduleOverlapPolicy_SCHEDULE_OVERLAP_POLICY_CANCEL_OTHER)
		first := running(c.at(t, sec(10), "cancel"))
		sc := c.at(t, sec(20), "cancel")
		if got := outcomes(sc); len(got) != 2 || got[1][9:] != "STARTED" {
			t.Fatalf("firings %v, want two STARTED", got)
		}
		run := waitTerminal(t, c.r.client, first, 10*time.Second)
		if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_CANCELLED {
			t.Fatalf("the earlier run is %s, want CANCELLED", run.GetStatus())
		}
	})
	t.Run("catch up", func(t *testing.T) {
		create("catchup", "quick catchup", planexv1.ScheduleOverlapPolicy_SCHEDULE_OVERLAP_POLICY_ALLOW_ALL)
		// Down from 0s to 95s: 10s..60s are older than the 30s window,
		// 70s, 80s and 90s fire, each once.
		sc := c.at(t, sec(95), "catchup")
		got := outcomes(sc)
		if len(got) != 4 || got[0][9:] != "SKIPPED" || got[1][9:] != "STARTED" || got[3] != sec(90).UTC().Format("15:04:05")+" STARTED" {
			t.Fatalf("firings %v, want one SKIPPED record (10s-60s) then 70s, 80s, 90s STARTED", got)
		}
		if r := sc.GetRecentFirings()[3].GetReason(); !contains(r, "6 firing(s)") {
			t.Errorf("skip reason %q, want it to count 6 firings", r)
		}
		runs := scheduleRuns(t, c.r.client, "catchup")
		if len(runs) != 3 {
			t.Errorf("runs by nominal time %v, want 3", runs)
		}
	})
	t.Run("paused fires nothing", func(t *testing.T) {
		create("paused", "quick paused", planexv1.ScheduleOverlapPolicy_SCHEDULE_OVERLAP_POLICY_ALLOW_ALL)
		if _, err := c.ops.Pause(ctx, "paused", "maintenance", "test"); err != nil {
			t.Fatal(err)
		}
		sc := c.at(t, sec(25), "paused")
		if len(sc.GetRecentFirings()) != 0 || len(sc.GetNextFirings()) != 0 {
			t.Fatalf("paused schedule: firings %v, next %v; want none", outcomes(sc), sc.GetNextFirings())
		}
		if _, err := c.ops.Resume(ctx, "paused", "done", "test"); err != nil {
			t.Fatal(err)
		}
		sc = c.at(t, sec(41), "paused")
		if got := outcomes(sc); len(got) != 2 || got[0] != sec(30).UTC().Format("15:04:05")+" STARTED" {
			t.Fatalf("after resume at 25s: firings %v, want only 30s and 40s (10s and 20s passed while paused)", got)
		}
	})
	t.Run("backfill", func(t *testing.T) {
		create("backfill", "quick backfill", planexv1.ScheduleOverlapPolicy_SCHEDULE_OVERLAP_POLICY_ALLOW_ALL)
		_, n, err := c.ops.Backfill(ctx, "backfill", sec(-3600), sec(-3570), planexv1.ScheduleOverlapPolicy_SCHEDULE_OVERLAP_POLICY_UNSPECIFIED, "test")
		if err != nil || n != 3 {
			t.Fatalf("Backfill: %d, %v; want 3 nominal times", n, err)
		}
		sc := c.at(t, sec(1), "backfill")
		if got := outcomes(sc); len(got) != 3 || sc.GetBackfillRemaining() != 0 {
			t.Fatalf("firings %v (remaining %d), want the 3 backfilled", got, sc.GetBackfillRemaining())
		}
		// The same range again finds the runs by their idempotency keys.
		if _, _, err := c.ops.Backfill(ctx, "backfill", sec(-3600), sec(-3570), 0, "test"); err != nil {
			t.Fatal(err)
		}
		c.at(t, sec(2), "backfill")
		for n, ids := range scheduleRuns(t, c.r.client, "backfill") {
			if len(ids) != 1 {
				t.Errorf("nominal %s: runs %v, want one", n, ids)
			}
		}
	})
	h.pool.openGate()
}

func TestScheduleAPIRefusesBadInputNamingTheField(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.startScheduleReplica(supervisor.ScheduleConfig{Disabled: true})
	ctx := testCtx(t, 20*time.Second)
	good := func() *planexv1.Schedule {
		return &planexv1.Schedule{Id: "nightly", Spec: &planexv1.ScheduleSpec{Cron: "0 3 * * *", TimeZone: "Europe/Paris"},
			Action: &planexv1.ScheduleAction{Goal: "report"}}
	}
	for _, tc := range []struct {
		name  string
		edit  func(*planexv1.Schedule)
		field string
	}{
		{"bad id", func(s *planexv1.Schedule) { s.Id = "Bad Id" }, "id"},
		{"bad cron", func(s *planexv1.Schedule) { s.Spec.Cron = "61 * * * *" }, "spec.cron"},
		{"bad zone", func(s *planexv1.Schedule) { s.Spec.TimeZone = "Mars/Olympus" }, "spec.time_zone"},
		{"no goal", func(s *planexv1.Schedule) { s.Action.Goal = "" }, "action.goal"},
		{"reserved label", func(s *planexv1.Schedule) { s.Action.Labels = map[string]string{schedule.LabelSchedule: "x"} }, "action.labels"},
		{"jitter", func(s *planexv1.Schedule) { s.Spec.Jitter = durationpb.New(2 * time.Hour) }, "spec.jitter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := good()
			tc.edit(s)
			_, err := r.schedules.CreateSchedule(ctx, &planexv1.CreateScheduleRequest{Schedule: s})
			if status.Code(err) != codes.InvalidArgument || !contains(status.Convert(err).Message(), tc.field) {
				t.Fatalf("CreateSchedule: %v, want InvalidArgument naming %s", err, tc.field)
			}
		})
	}
	created, err := r.schedules.CreateSchedule(ctx, &planexv1.CreateScheduleRequest{Schedule: good()})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(created.GetSchedule().GetNextFirings()); n != 5 {
		t.Errorf("%d next firings, want 5", n)
	}
	if _, err := r.schedules.CreateSchedule(ctx, &planexv1.CreateScheduleRequest{Schedule: good()}); status.Code(err) != codes.AlreadyExists {
		t.Errorf("second create: %v, want AlreadyExists", err)
	}
	upd := good()
	upd.Description = "changed"
	if _, err := r.schedules.UpdateSchedule(ctx, &planexv1.UpdateScheduleRequest{Schedule: upd, Revision: created.GetSchedule().GetRevision() + 7}); status.Code(err) != codes.Aborted {
		t.Errorf("update at a stale revision: %v, want Aborted", err)
	}
	if _, err := r.schedules.UpdateSchedule(ctx, &planexv1.UpdateScheduleRequest{Schedule: upd, Revision: created.GetSchedule().GetRevision()}); err != nil {
		t.Errorf("update at the read revision: %v", err)
	}
	_, err = r.schedules.BackfillSchedule(ctx, &planexv1.BackfillScheduleRequest{Id: "nightly",
		StartTime: timestamppb.New(time.Now()), EndTime: timestamppb.New(time.Now().Add(-time.Hour))})
	if status.Code(err) != codes.InvalidArgument || !contains(status.Convert(err).Message(), "end_time") {
		t.Errorf("backfill of an empty range: %v, want InvalidArgument naming end_time", err)
	}
	if _, err := r.schedules.DeleteSchedule(ctx, &planexv1.DeleteScheduleRequest{Id: "nightly"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.schedules.GetSchedule(ctx, &planexv1.GetScheduleRequest{Id: "nightly"}); status.Code(err) != codes.NotFound {
		t.Errorf("get after delete: %v, want NotFound", err)
	}
}

// schedulesOver serves ScheduleService by calling a replica's (what the
// MCP tools use), so that mcpserver.LocalSchedules can check roles in
// front of a real supervisor.
type schedulesOver struct {
	planexv1.UnimplementedScheduleServiceServer
	c planexv1.ScheduleServiceClient
}

func (s schedulesOver) ListSchedules(ctx context.Context, r *planexv1.ListSchedulesRequest) (*planexv1.ListSchedulesResponse, error) {
	return s.c.ListSchedules(ctx, r)
}
func (s schedulesOver) CreateSchedule(ctx context.Context, r *planexv1.CreateScheduleRequest) (*planexv1.CreateScheduleResponse, error) {
	return s.c.CreateSchedule(ctx, r)
}
func (s schedulesOver) PauseSchedule(ctx context.Context, r *planexv1.PauseScheduleRequest) (*planexv1.PauseScheduleResponse, error) {
	return s.c.PauseSchedule(ctx, r)
}
func (s schedulesOver) ResumeSchedule(ctx context.Context, r *planexv1.ResumeScheduleRequest) (*planexv1.ResumeScheduleResponse, error) {
	return s.c.ResumeSchedule(ctx, r)
}

func TestScheduleMCPToolsAndRoles(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.startScheduleReplica(supervisor.ScheduleConfig{Disabled: true})
	ctx := testCtx(t, time.Minute)
	connectAs := func(role authn.Role) *mcp.ClientSession {
		id := authn.Identity{Subject: "apikey:" + role.String(), Roles: []authn.Role{role}}
		srv := mcpserver.New(r.client, mcpserver.Options{
			Schedules: mcpserver.LocalSchedules(schedulesOver{c: r.schedules}, id)})
		st, ct := mcp.NewInMemoryTransports()
		ss, err := srv.Connect(ctx, st, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ss.Close() })
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v1"}, nil).Connect(ctx, ct, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.Close() })
		return cs
	}
	call := func(cs *mcp.ClientSession, name string, args map[string]any) (bool, string) {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatal(err)
		}
		text := ""
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				text += tc.Text
			}
		}
		return res.IsError, text
	}
	viewer, runner := connectAs(authn.RoleViewer), connectAs(authn.RoleRunner)
	create := map[string]any{"id": "hourly", "goal": "summarise the hour", "cron": "0 * * * *", "overlap": "buffer-one"}
	if isErr, text := call(viewer, "create_schedule", create); !isErr || !contains(text, "permission denied") {
		t.Fatalf("viewer create_schedule: error %v %q, want permission denied", isErr, text)
	}
	if isErr, text := call(runner, "create_schedule", create); isErr || !contains(text, "SCHEDULE_OVERLAP_POLICY_BUFFER_ONE") {
		t.Fatalf("runner create_schedule: error %v %q", isErr, text)
	}
	if isErr, text := call(runner, "create_schedule", map[string]any{"id": "bad", "goal": "x", "every": "soon"}); !isErr || !contains(text, "every") {
		t.Fatalf("create_schedule with a bad interval: error %v %q, want one naming every", isErr, text)
	}
	if isErr, text := call(viewer, "list_schedules", nil); isErr || !contains(text, "hourly") || !contains(text, "next_firings") {
		t.Fatalf("viewer list_schedules: error %v %q", isErr, text)
	}
	if isErr, text := call(runner, "pause_schedule", map[string]any{"id": "hourly", "note": "holiday"}); isErr || !contains(text, `"paused":true`) {
		t.Fatalf("pause_schedule: error %v %q", isErr, text)
	}
}

// TestScheduleAuthorization: over API keys on a secured supervisor,
// reading schedules needs viewer and changing them runner; the creator's
// subject is recorded.
func TestScheduleAuthorization(t *testing.T) {
	f := authntest.New(t)
	addr := startSecured(t, f)
	ctx := testCtx(t, 30*time.Second)
	as := func(role string) planexv1.ScheduleServiceClient {
		return planexv1.NewScheduleServiceClient(f.Dial(addr, tlsconfig.Files{}, f.APIKeys[role]))
	}
	anonymous := planexv1.NewScheduleServiceClient(f.Dial(addr, tlsconfig.Files{}, ""))
	sc := &planexv1.Schedule{Id: "nightly", Spec: &planexv1.ScheduleSpec{Cron: "@daily"}, Action: &planexv1.ScheduleAction{Goal: "report"}}
	if _, err := anonymous.ListSchedules(ctx, &planexv1.ListSchedulesRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("anonymous ListSchedules: %v, want Unauthenticated", err)
	}
	if _, err := as("viewer").CreateSchedule(ctx, &planexv1.CreateScheduleRequest{Schedule: sc}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("viewer CreateSchedule: %v, want PermissionDenied", err)
	}
	created, err := as("runner").CreateSchedule(ctx, &planexv1.CreateScheduleRequest{Schedule: sc})
	if err != nil {
		t.Fatalf("runner CreateSchedule: %v", err)
	}
	if by := created.GetSchedule().GetCreatedBy(); !strings.HasPrefix(by, "apikey:") {
		t.Errorf("created_by %q, want the runner's apikey: subject", by)
	}
	if _, err := as("viewer").PauseSchedule(ctx, &planexv1.PauseScheduleRequest{Id: "nightly"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("viewer PauseSchedule: %v, want PermissionDenied", err)
	}
	got, err := as("viewer").ListSchedules(ctx, &planexv1.ListSchedulesRequest{})
	if err != nil || len(got.GetSchedules()) != 1 {
		t.Fatalf("viewer ListSchedules: %v %v", got, err)
	}
}
