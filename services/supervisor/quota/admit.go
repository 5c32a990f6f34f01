package quota

import (
	"context"
	"fmt"
	"math"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// Names of the start quotas, as in TenantQuotas, RESOURCE_EXHAUSTED
// messages and the planex.tenant.quota.refusals metric.
const (
	QuotaConcurrentRuns = "max_concurrent_runs"
	QuotaStartsPerSec   = "starts_per_second"
	QuotaTokensPerDay   = "tokens_per_day"
	QuotaMoneyPerMonth  = "money_per_month_micros"
)

// AdmitStart is api.Config.AdmitStart: it refuses a start over a quota
// with RESOURCE_EXHAUSTED, whose message names the tenant, the quota and
// what the caller can do, with an errdetails.QuotaFailure and, when
// waiting helps, an errdetails.RetryInfo (the next start token; the next
// UTC day; the next UTC month). An admitted start holds a place against
// max_concurrent_runs until ctx ends: the API ends it once the run is
// created (it is then in the run index) or failed. An admitted start then
// takes the tenant's turn for a slot of the shared Fair, held while the
// run is created, like an engine message.
func (c *Cell) AdmitStart(ctx context.Context, req *planexv1.StartRunRequest) error {
	if err := c.admitQuotas(ctx); err != nil {
		return err
	}
	return c.deps.Fair.AdmitStart(ctx, c.deps.Tenant)
}

// admitQuotas checks the start quotas and reserves a place against
// max_concurrent_runs until ctx ends.
func (c *Cell) admitQuotas(ctx context.Context) error {
	q := c.quotas()
	now := c.deps.Now().UTC()
	if lim := q.GetMoneyPerMonthMicros(); lim > 0 {
		if spent := c.moneyThisMonth(now); spent >= lim {
			next := time.Date(now.Year(), now.Month()+1, 1, 0, 0, 0, 0, time.UTC)
			return c.refuse(ctx, QuotaMoneyPerMonth, next.Sub(now), fmt.Sprintf(
				"tenant %s spent %s on models this month (UTC), its quota money_per_month_micros is %d (%s): new runs are refused until %s; ask a platform admin to raise it",
				c.deps.Tenant, dollars(spent), lim, dollars(lim), next.Format("2006-01-02 15:04 MST")))
		}
	}
	if lim := q.GetTokensPerDay(); lim > 0 {
		if used := c.tokensToday(now); used >= lim {
			next := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
			return c.refuse(ctx, QuotaTokensPerDay, next.Sub(now), fmt.Sprintf(
				"tenant %s used %d model tokens today (UTC), its quota tokens_per_day is %d: new runs are refused until 00:00 UTC (in %s); ask a platform admin to raise it",
				c.deps.Tenant, used, lim, next.Sub(now).Round(time.Minute)))
		}
	}
	lim := int(q.GetMaxConcurrentRuns())
	// The count and the reservation are one step under the cell's lock, so
	// that this replica's concurrent starts are counted exactly (the index
	// is in memory: the lock is held for microseconds, except while the
	// index loads the first time).
	c.mu.Lock()
	defer c.mu.Unlock()
	if lim > 0 && c.deps.Log != nil {
		n, err := c.runsInFlight(ctx, lim, true)
		if err != nil {
			return fmt.Errorf("tenant %s: count runs in flight: %w", c.deps.Tenant, err)
		}
		if n+c.reserved >= lim {
			return c.refuse(ctx, QuotaConcurrentRuns, 0, fmt.Sprintf(
				"tenant %s has %d runs not finished, its quota max_concurrent_runs: wait for one to finish or ask a platform admin to raise it",
				c.deps.Tenant, lim))
		}
	}
	if rate := q.GetStartsPerSecond(); rate > 0 {
		burst := max(int(math.Ceil(rate)), 1)
		if q.GetStartBurst() > 0 {
			burst = int(q.GetStartBurst())
		}
		if wait := c.bucket.take(now, rate, burst); wait > 0 {
			return c.refuse(ctx, QuotaStartsPerSec, wait, fmt.Sprintf(
				"tenant %s starts runs faster than its quota starts_per_second %g (burst %d): retry in %s or ask a platform admin to raise it",
				c.deps.Tenant, rate, burst, wait.Round(time.Millisecond)))
		}
	}
	if lim > 0 {
		c.reserved++
		context.AfterFunc(ctx, func() {
			c.mu.Lock()
			c.reserved--
			c.mu.Unlock()
		})
	}
	return nil
}

// refuse builds a quota's RESOURCE_EXHAUSTED (retry > 0 adds a RetryInfo)
// and counts it.
func (c *Cell) refuse(ctx context.Context, quota string, retry time.Duration, msg string) error {
	c.metrics.refused(ctx, quota)
	st := status.New(codes.ResourceExhausted, msg)
	qf := &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
		Subject: "tenant:" + c.deps.Tenant, Description: msg,
	}}}
	var err error
	if retry > 0 {
		st, err = st.WithDetails(qf, &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	} else {
		st, err = st.WithDetails(qf)
	}
	if err != nil {
		return status.Error(codes.ResourceExhausted, msg)
	}
	return st.Err()
}

// dollars formats micro-dollars as "$12.345678".
func dollars(micros int64) string {
	return fmt.Sprintf("$%d.%06d", micros/1_000_000, micros%1_000_000)
}

// tokenBucket is the starts_per_second bucket; its mutex is the cell's.
type tokenBucket struct {
	tokens float64
	last   time.Time
	rate   float64
	burst  int
	// told is the latest time a refused caller was told to come back: the
	// next refusal is told one token's time after it (or the next token,
	// if later). Clients refused together (a burst of 64 over a rate of
	// 100/s) then come back spread over the coming tokens, not all at the
	// next one, where one would win and the rest be refused again: a storm
	// of refusals that takes CPU from every tenant. Advice nobody follows
	// expires with the time it names.
	told time.Time
}

// maxRetrySpread bounds how far past the next token a refusal's advice
// is spread.
const maxRetrySpread = time.Minute

// take takes a token at now, or returns how long until this caller should
// come back for one.
func (b *tokenBucket) take(now time.Time, rate float64, burst int) time.Duration {
	if b.rate != rate || b.burst != burst || b.last.IsZero() {
		// A new or changed quota starts with a full bucket.
		b.rate, b.burst, b.tokens, b.last, b.told = rate, burst, float64(burst), now, time.Time{}
	}
	if now.After(b.last) {
		b.tokens = min(float64(b.burst), b.tokens+now.Sub(b.last).Seconds()*b.rate)
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return 0
	}
	per := time.Duration(float64(time.Second) / b.rate)
	next := now.Add(time.Duration((1 - b.tokens) * float64(per)))
	at := next
	if after := b.told.Add(per); after.After(at) {
		at = after
	}
	if limit := next.Add(maxRetrySpread); at.After(limit) {
		at = limit
	}
	b.told = at
	return at.Sub(now)
}
