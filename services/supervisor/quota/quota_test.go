package quota

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/natstest"
)

// clock is a settable test clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newCell is a cell of tenant "acme" with quotas q on its own embedded
// NATS (nil srv: a new one).
func newCell(t *testing.T, srv *natstest.Server, clk *clock, q *planexv1.TenantQuotas, prices Prices) *Cell {
	t.Helper()
	if srv == nil {
		srv = natstest.Start(t)
	}
	_, res := srv.Setup(t)
	c, err := NewCell(testCtx(t), Deps{
		Tenant: "acme", Bus: res, Prices: prices, Now: clk.Now, Logger: natstest.Logger(t),
		Spec: func() *planexv1.Tenant { return &planexv1.Tenant{Name: "acme", Quotas: q} },
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// refusal checks err is the quota's RESOURCE_EXHAUSTED, naming it, with
// a QuotaFailure and (retry > 0) a RetryInfo of about retry.
func refusal(t *testing.T, err error, quota string, retry time.Duration) string {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		t.Fatalf("err %v, want RESOURCE_EXHAUSTED", err)
	}
	if !strings.Contains(st.Message(), "tenant acme") || !strings.Contains(st.Message(), quota) || !strings.Contains(st.Message(), "ask a platform admin") {
		t.Fatalf("message %q: want the tenant, the quota %s and what to do", st.Message(), quota)
	}
	var gotRetry *errdetails.RetryInfo
	var gotQuota *errdetails.QuotaFailure
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			gotRetry = d
		case *errdetails.QuotaFailure:
			gotQuota = d
		}
	}
	if gotQuota == nil || len(gotQuota.GetViolations()) != 1 || gotQuota.GetViolations()[0].GetSubject() != "tenant:acme" {
		t.Fatalf("QuotaFailure %v, want one violation of tenant:acme", gotQuota)
	}
	switch {
	case retry == 0 && gotRetry != nil:
		t.Fatalf("RetryInfo %v, want none", gotRetry)
	case retry > 0 && gotRetry == nil:
		t.Fatalf("no RetryInfo, want about %s", retry)
	case retry > 0:
		if d := gotRetry.GetRetryDelay().AsDuration(); d < retry*9/10 || d > retry*11/10 {
			t.Fatalf("RetryInfo %s, want about %s", d, retry)
		}
	}
	return st.Message()
}

func TestAdmitStartRate(t *testing.T) {
	t.Parallel()
	clk := &clock{now: time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)}
	c := newCell(t, nil, clk, &planexv1.TenantQuotas{StartsPerSecond: 2, StartBurst: 3}, nil)
	ctx := testCtx(t)
	for i := range 3 {
		if err := c.AdmitStart(ctx, &planexv1.StartRunRequest{}); err != nil {
			t.Fatalf("start %d of the burst: %v", i+1, err)
		}
	}
	msg := refusal(t, c.AdmitStart(ctx, &planexv1.StartRunRequest{}), "starts_per_second", 500*time.Millisecond)
	if !strings.Contains(msg, "burst 3") {
		t.Fatalf("message %q: want the burst", msg)
	}
	clk.add(500 * time.Millisecond)
	if err := c.AdmitStart(ctx, &planexv1.StartRunRequest{}); err != nil {
		t.Fatalf("start after the token came back: %v", err)
	}
	refusal(t, c.AdmitStart(ctx, &planexv1.StartRunRequest{}), "starts_per_second", 500*time.Millisecond)
}

// TestStartRateRefusalsAreSpread: callers refused together are told to
// come back at successive tokens, not all at the next one; a new caller
// is told to come after them, and advice nobody followed expires.
func TestStartRateRefusalsAreSpread(t *testing.T) {
	t.Parallel()
	clk := &clock{now: time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)}
	c := newCell(t, nil, clk, &planexv1.TenantQuotas{StartsPerSecond: 10, StartBurst: 1}, nil)
	ctx := testCtx(t)
	if err := c.AdmitStart(ctx, &planexv1.StartRunRequest{}); err != nil {
		t.Fatalf("first start: %v", err)
	}
	// Four callers refused at the same instant: 100, 200, 300, 400 ms.
	for k := 1; k <= 4; k++ {
		refusal(t, c.AdmitStart(ctx, &planexv1.StartRunRequest{}), "starts_per_second", time.Duration(k)*100*time.Millisecond)
	}
	// The first comes back at its token and is admitted; a new caller
	// is told to come after the last one told (400 ms + 100 ms).
	clk.add(100 * time.Millisecond)
	if err := c.AdmitStart(ctx, &planexv1.StartRunRequest{}); err != nil {
		t.Fatalf("start at the first promised token: %v", err)
	}
	refusal(t, c.AdmitStart(ctx, &planexv1.StartRunRequest{}), "starts_per_second", 400*time.Millisecond)
	// Nobody else comes back: once the times told have passed, a refusal
	// is told the next token again.
	clk.add(time.Second)
	if err := c.AdmitStart(ctx, &planexv1.StartRunRequest{}); err != nil {
		t.Fatalf("start after a second: %v", err)
	}
	refusal(t, c.AdmitStart(ctx, &planexv1.StartRunRequest{}), "starts_per_second", 100*time.Millisecond)

	// A rate of one start every two minutes keeps its exact advice; the
	// spread past it is bounded to a minute.
	slow := newCell(t, nil, clk, &planexv1.TenantQuotas{StartsPerSecond: 1.0 / 120, StartBurst: 1}, nil)
	if err := slow.AdmitStart(ctx, &planexv1.StartRunRequest{}); err != nil {
		t.Fatalf("first slow start: %v", err)
	}
	refusal(t, slow.AdmitStart(ctx, &planexv1.StartRunRequest{}), "starts_per_second", 2*time.Minute)
	refusal(t, slow.AdmitStart(ctx, &planexv1.StartRunRequest{}), "starts_per_second", 3*time.Minute)
}

func planEvent(seq uint64, at time.Time, model string, in, out int64) *planexv1.RunEvent {
	return &planexv1.RunEvent{RunId: "r1", Sequence: seq, Time: timestamppb.New(at), Payload: &planexv1.RunEvent_PlanRevised{
		PlanRevised: &planexv1.PlanRevised{Model: model, Usage: &planexv1.TokenUsage{InputTokens: in, OutputTokens: out}},
	}}
}

func stepEvent(seq uint64, at time.Time, step string) *planexv1.RunEvent {
	return &planexv1.RunEvent{RunId: "r1", Sequence: seq, Time: timestamppb.New(at), Payload: &planexv1.RunEvent_StepSucceeded{
		StepSucceeded: &planexv1.StepSucceeded{StepId: step, Attempt: 1},
	}}
}

func TestAdmitStartTokensPerDay(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 10, 18, 0, 0, 0, time.UTC)
	clk := &clock{now: now}
	c := newCell(t, nil, clk, &planexv1.TenantQuotas{TokensPerDay: 1000}, nil)
	ctx := testCtx(t)
	run := &planexv1.Run{Id: "r1", CreatedAt: timestamppb.New(now), Status: planexv1.RunStatus_RUN_STATUS_RUNNING}
	c.OnEvents(ctx, run, []*planexv1.RunEvent{planEvent(2, now, "m", 400, 100)})
	if err := c.AdmitStart(ctx, &planexv1.StartRunRequest{}); err != nil {
		t.Fatalf("start at 500 of 1000 tokens: %v", err)
	}
	// Yesterday's tokens do not count today.
	c.OnEvents(ctx, run, []*planexv1.RunEvent{planEvent(3, now.Add(-24*time.Hour), "m", 5000, 0)})
	if err := c.AdmitStart(ctx, &planexv1.StartRunRequest{}); err != nil {
		t.Fatalf("start with yesterday's tokens over the quota: %v", err)
	}
	c.OnEvents(ctx, run, []*planexv1.RunEvent{planEvent(4, now, "m", 400, 100)})
	msg := refusal(t, c.AdmitStart(ctx, &planexv1.StartRunRequest{}), "tokens_per_day", 6*time.Hour)
	if !strings.Contains(msg, "1000 model tokens today") {
		t.Fatalf("message %q: want the tokens used", msg)
	}
	// Flushed, the refusal stands (planex-usage now holds the tokens).
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	refusal(t, c.AdmitStart(ctx, &planexv1.StartRunRequest{}), "tokens_per_day", 6*time.Hour)
	clk.add(6 * time.Hour)
	if err := c.AdmitStart(ctx, &planexv1.StartRunRequest{}); err != nil {
		t.Fatalf("start the next UTC day: %v", err)
	}
}

func TestAdmitStartMoneyPerMonth(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 31, 22, 0, 0, 0, time.UTC)
	clk := &clock{now: now}
	prices := Prices{"big": {InputPerMillion: 10_000_000, OutputPerMillion: 30_000_000}} // $10 and $30 per million
	c := newCell(t, nil, clk, &planexv1.TenantQuotas{MoneyPerMonthMicros: 1_000_000}, prices)
	ctx := testCtx(t)
	run := &planexv1.Run{Id: "r1", CreatedAt: timestamppb.New(now), Status: planexv1.RunStatus_RUN_STATUS_RUNNING}
	// Earlier this month: 50,000 input tokens = $0.50.
	c.OnEvents(ctx, run, []*planexv1.RunEvent{planEvent(2, now.AddDate(0, 0, -20), "big", 50_000, 0)})
	if err := c.AdmitStart(ctx, &planexv1.StartRunRequest{}); err != nil {
		t.Fatalf("start at $0.50 of $1: %v", err)
	}
	// Today: 20,000 output tokens = $0.60: $1.10 this month.
	c.OnEvents(ctx, run, []*planexv1.RunEvent{planEvent(3, now, "big", 0, 20_000)})
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	msg := refusal(t, c.AdmitStart(ctx, &planexv1.StartRunRequest{}), "money_per_month_micros", 2*time.Hour)
	if !strings.Contains(msg, "$1.100000") || !strings.Contains(msg, "2026-04-01") {
		t.Fatalf("message %q: want the money spent and when it resets", msg)
	}
	u, err := c.Usage(ctx, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if u.GetMoneyThisMonthMicros() != 1_100_000 || u.GetTotal().GetCostMicros() != 1_100_000 || len(u.GetDays()) != 2 {
		t.Fatalf("usage %v: want $1.10 this month over 2 days", u)
	}
	clk.add(2 * time.Hour)
	if err := c.AdmitStart(ctx, &planexv1.StartRunRequest{}); err != nil {
		t.Fatalf("start the next month: %v", err)
	}
}

// TestUsageCountedOnce: two replicas' cells count the events each appended
// of one run, one of them sees a batch again (a redelivered message's
// OnEvents), and both flush concurrently: planex-usage holds every event
// once.
func TestUsageCountedOnce(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	clk := &clock{now: now}
	srv := natstest.Start(t)
	prices := Prices{"*": {InputPerMillion: 1_000_000, OutputPerMillion: 2_000_000}}
	a := newCell(t, srv, clk, nil, prices)
	b := newCell(t, srv, clk, nil, prices)
	ctx := testCtx(t)
	run := &planexv1.Run{Id: "r1", CreatedAt: timestamppb.New(now), Status: planexv1.RunStatus_RUN_STATUS_RUNNING}
	batch1 := []*planexv1.RunEvent{planEvent(2, now, "m", 1000, 500)}
	batch2 := []*planexv1.RunEvent{stepEvent(3, now, "s1"), stepEvent(4, now, "s2")}
	a.OnEvents(ctx, run, batch1)
	b.OnEvents(ctx, run, batch2)
	b.OnEvents(ctx, run, batch2) // again: skipped
	b.OnEvents(ctx, run, batch1) // an older sequence: skipped
	done := &planexv1.Run{Id: "r1", CreatedAt: timestamppb.New(now), Status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED}
	a.OnEvents(ctx, done, []*planexv1.RunEvent{{RunId: "r1", Sequence: 5, Time: timestamppb.New(now), Payload: &planexv1.RunEvent_Finished{Finished: &planexv1.RunFinished{}}}})
	var wg sync.WaitGroup
	for _, c := range []*Cell{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Flush(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for _, c := range []*Cell{a, b} {
		if err := c.Flush(ctx); err != nil { // nothing left: no change
			t.Fatal(err)
		}
		u, err := c.Usage(ctx, "2026-03-10", "2026-03-10")
		if err != nil {
			t.Fatal(err)
		}
		want := &planexv1.UsageDay{Day: "2026-03-10", RunsStarted: 1, RunsFinished: 1, Steps: 2, InputTokens: 1000, OutputTokens: 500, CostMicros: 2000}
		if len(u.GetDays()) != 1 || u.GetDays()[0].String() != want.String() {
			t.Fatalf("usage days %v, want [%v]", u.GetDays(), want)
		}
		if u.GetTokensToday() != 1500 {
			t.Fatalf("tokens today %d, want 1500", u.GetTokensToday())
		}
	}
}

func TestUsageBadDays(t *testing.T) {
	t.Parallel()
	c, err := NewCell(testCtx(t), Deps{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ from, to, field string }{
		{"2026-13-01", "", "from_day"},
		{"", "yesterday", "to_day"},
		{"2026-03-10", "2026-03-01", "from_day"},
		{"2024-01-01", "2026-01-01", "from_day"},
	} {
		_, err := c.Usage(testCtx(t), tc.from, tc.to)
		bad, ok := err.(*BadRequestError)
		if !ok || bad.Field != tc.field || !strings.Contains(bad.Msg, tc.field) {
			t.Errorf("Usage(%q, %q): %v, want a bad %s", tc.from, tc.to, err, tc.field)
		}
	}
}

func TestLoadPrices(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	p, err := LoadPrices(write("ok.json", `{"claude-x": {"input_per_million_micros": 3000000, "output_per_million_micros": 15000000}, "*": {"input_per_million_micros": 1, "output_per_million_micros": 2}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := p.Cost("claude-x", 1_000_000, 100_000); !ok || c != 4_500_000 {
		t.Fatalf("cost %d %v, want 4500000", c, ok)
	}
	if c, ok := p.Cost("other", 1_000_000, 1_000_000); !ok || c != 3 {
		t.Fatalf("cost of an unnamed model %d %v, want 3 (the \"*\" price)", c, ok)
	}
	if empty, err := LoadPrices(""); err != nil || len(empty) != 0 {
		t.Fatalf("LoadPrices(\"\") = %v, %v; want an empty table", empty, err)
	}
	for name, tc := range map[string]struct{ body, want string }{
		"negative": {`{"m1": {"input_per_million_micros": -1, "output_per_million_micros": 2}}`, `model "m1": input_per_million_micros`},
		"fraction": {`{"m1": {"input_per_million_micros": 1.5, "output_per_million_micros": 2}}`, `model "m1": input_per_million_micros`},
		"missing":  {`{"m2": {"input_per_million_micros": 1}}`, `model "m2": output_per_million_micros is required`},
		"unknown":  {`{"m3": {"input_per_million_micros": 1, "output_per_million_micros": 2, "cached": 1}}`, `model "m3": unknown field "cached"`},
		"not json": {`[1, 2]`, `want a JSON object`},
	} {
		_, err := LoadPrices(write(name+".json", tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "--model-prices") {
			t.Errorf("%s: %v, want an error with %q", name, err, tc.want)
		}
	}
	if _, err := LoadPrices(filepath.Join(dir, "absent.json")); err == nil || !strings.Contains(err.Error(), "--model-prices") {
		t.Errorf("absent file: %v, want an error naming --model-prices", err)
	}
}
