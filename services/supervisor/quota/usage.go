package quota

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// dayLayout is a UTC day as UsageDay.day and GetUsageRequest name it.
const dayLayout = "2006-01-02"

// usageKey is the planex-usage key of a day's counters.
func usageKey(day string) string { return "day." + day }

// OnEvents is engine.Config.OnEvents: it counts the usage the events
// record (runs started and finished, steps finished, model tokens and
// their cost) on the day of each event, in memory; Run adds it to
// planex-usage. It never blocks on I/O. Events of a run at or below a
// sequence already counted are skipped.
func (c *Cell) OnEvents(ctx context.Context, run *planexv1.Run, events []*planexv1.RunEvent) {
	if len(events) == 0 {
		return
	}
	runID := run.GetId()
	if runID == "" {
		runID = events[0].GetRunId()
	}
	var (
		started, finished, steps int64
		in, out, cost            int64
	)
	c.mu.Lock()
	defer c.mu.Unlock()
	last := c.seen[runID]
	var succeeded map[string]bool
	for _, ev := range events {
		if ev.GetSequence() <= last {
			continue
		}
		last = ev.GetSequence()
		d := c.pendingDay(ev.GetTime().AsTime())
		var (
			model string
			u     *planexv1.TokenUsage
		)
		switch p := ev.GetPayload().(type) {
		case *planexv1.RunEvent_Created:
			// Appended by StartRun, not the engine: counted with the
			// engine's first decision below.
		case *planexv1.RunEvent_PlanRevised:
			model = p.PlanRevised.GetModel()
			if model == "" {
				model = p.PlanRevised.GetBackend()
			}
			c.model[runID] = model
			u = p.PlanRevised.GetUsage()
		case *planexv1.RunEvent_PlanRejected:
			model, u = c.model[runID], p.PlanRejected.GetUsage()
		case *planexv1.RunEvent_CriticVerdict:
			model, u = strings.TrimPrefix(p.CriticVerdict.GetVerifier(), "model:"), p.CriticVerdict.GetUsage()
		case *planexv1.RunEvent_StepSucceeded:
			d.Steps++
			steps++
			if succeeded == nil {
				succeeded = map[string]bool{}
			}
			succeeded[fmt.Sprint(p.StepSucceeded.GetStepId(), "/", p.StepSucceeded.GetAttempt())] = true
		case *planexv1.RunEvent_StepFailed:
			d.Steps++
			steps++
		case *planexv1.RunEvent_ExpectationFailed:
			// Recorded instead of a StepSucceeded, unless it judges one of
			// the same decision.
			if !succeeded[fmt.Sprint(p.ExpectationFailed.GetStepId(), "/", p.ExpectationFailed.GetAttempt())] {
				d.Steps++
				steps++
			}
		case *planexv1.RunEvent_Finished:
			d.RunsFinished++
			finished++
		}
		if ev.GetSequence() == 2 {
			// The run's first decision after StartRun's RunCreated: it is
			// appended once, so the run is counted once, on its creation
			// day.
			sd := c.pendingDay(run.GetCreatedAt().AsTime())
			if run.GetCreatedAt() == nil {
				sd = d
			}
			sd.RunsStarted++
			started++
		}
		if u != nil && (u.GetInputTokens() > 0 || u.GetOutputTokens() > 0) {
			d.InputTokens += u.GetInputTokens()
			d.OutputTokens += u.GetOutputTokens()
			in += u.GetInputTokens()
			out += u.GetOutputTokens()
			price, ok := c.deps.Prices.Cost(model, u.GetInputTokens(), u.GetOutputTokens())
			if !ok && len(c.deps.Prices) > 0 && !c.warnedModels[model] {
				c.warnedModels[model] = true
				c.logger.WarnContext(ctx, "model not in --model-prices (and no \"*\" entry): its tokens cost 0", "model", model)
			}
			d.CostMicros += price
			cost += price
		}
	}
	if runlog.Terminal(run.GetStatus()) {
		delete(c.seen, runID)
		delete(c.model, runID)
	} else {
		c.seen[runID] = last
	}
	c.metrics.add(ctx, started, finished, steps, in, out, cost)
}

// pendingDay returns the pending counters of t's UTC day; c.mu is held.
func (c *Cell) pendingDay(t time.Time) *planexv1.UsageDay {
	day := t.UTC().Format(dayLayout)
	d := c.pending[day]
	if d == nil {
		d = &planexv1.UsageDay{Day: day}
		c.pending[day] = d
	}
	return d
}

func addDay(to, d *planexv1.UsageDay) {
	to.RunsStarted += d.GetRunsStarted()
	to.RunsFinished += d.GetRunsFinished()
	to.Steps += d.GetSteps()
	to.InputTokens += d.GetInputTokens()
	to.OutputTokens += d.GetOutputTokens()
	to.CostMicros += d.GetCostMicros()
}

// viewDay is a day's usage as this replica knows it: planex-usage (as
// last read) plus what it has not flushed; c.mu is held.
func (c *Cell) viewDay(day string) *planexv1.UsageDay {
	v := &planexv1.UsageDay{Day: day}
	if s, ok := c.stored[day]; ok {
		addDay(v, s.day)
	}
	if d := c.flushing[day]; d != nil {
		addDay(v, d)
	}
	if d := c.pending[day]; d != nil {
		addDay(v, d)
	}
	return v
}

// tokensToday is today's model tokens (input + output).
func (c *Cell) tokensToday(now time.Time) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.viewDay(now.UTC().Format(dayLayout))
	return d.GetInputTokens() + d.GetOutputTokens()
}

// moneyThisMonth is this UTC month's model cost.
func (c *Cell) moneyThisMonth(now time.Time) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var sum int64
	for _, day := range monthDays(now) {
		sum += c.viewDay(day).GetCostMicros()
	}
	return sum
}

// monthDays lists the days of now's UTC month up to now.
func monthDays(now time.Time) []string {
	now = now.UTC()
	out := make([]string, 0, now.Day())
	for d := 1; d <= now.Day(); d++ {
		out = append(out, time.Date(now.Year(), now.Month(), d, 0, 0, 0, 0, time.UTC).Format(dayLayout))
	}
	return out
}

// refresh reads this month's days from planex-usage into the cache.
func (c *Cell) refresh(ctx context.Context) error {
	if c.kv == nil {
		return nil
	}
	now := c.deps.Now()
	for _, day := range monthDays(now) {
		d, rev, err := c.readDay(ctx, day)
		if err != nil {
			return err
		}
		if d == nil {
			continue
		}
		c.mu.Lock()
		if s, ok := c.stored[day]; !ok || s.rev < rev {
			c.stored[day] = storedDay{day: d, rev: rev}
		}
		c.mu.Unlock()
	}
	// Forget cached days of past months.
	month := now.UTC().Format("2006-01")
	c.mu.Lock()
	for day := range c.stored {
		if !strings.HasPrefix(day, month) {
			delete(c.stored, day)
		}
	}
	c.mu.Unlock()
	return nil
}

// readDay reads a day's counters (nil when the day has none).
func (c *Cell) readDay(ctx context.Context, day string) (*planexv1.UsageDay, uint64, error) {
	e, err := c.kv.Get(ctx, usageKey(day))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read usage of %s: %w", day, err)
	}
	d := &planexv1.UsageDay{}
	if err := protojson.Unmarshal(e.Value(), d); err != nil {
		return nil, 0, fmt.Errorf("decode usage of %s (revision %d): %w", day, e.Revision(), err)
	}
	d.Day = day
	return d, e.Revision(), nil
}

// Flush adds the usage counted since the last flush to planex-usage, one
// compare-and-set per day (replicas add concurrently); what could not be
// written stays pending for the next flush.
func (c *Cell) Flush(ctx context.Context) error {
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	c.mu.Lock()
	if len(c.pending) == 0 || c.kv == nil {
		c.mu.Unlock()
		return nil
	}
	c.flushing, c.pending = c.pending, map[string]*planexv1.UsageDay{}
	work := make(map[string]*planexv1.UsageDay, len(c.flushing))
	for day, d := range c.flushing {
		work[day] = proto.CloneOf(d)
	}
	c.mu.Unlock()

	var errs []error
	for day, delta := range work {
		total, rev, err := c.addStored(ctx, day, delta)
		c.mu.Lock()
		if err != nil {
			errs = append(errs, err)
			addDay(c.pendingDay(mustDay(day)), delta)
		} else if s, ok := c.stored[day]; !ok || s.rev < rev {
			c.stored[day] = storedDay{day: total, rev: rev}
		}
		delete(c.flushing, day)
		c.mu.Unlock()
	}
	return errors.Join(errs...)
}

func mustDay(day string) time.Time {
	t, _ := time.Parse(dayLayout, day)
	return t
}

// maxCAS bounds the compare-and-set retries of one day's flush.
const maxCAS = 20

// addStored adds delta to the day's counters in planex-usage.
func (c *Cell) addStored(ctx context.Context, day string, delta *planexv1.UsageDay) (*planexv1.UsageDay, uint64, error) {
	for range maxCAS {
		cur, rev, err := c.readDay(ctx, day)
		if err != nil {
			return nil, 0, err
		}
		total := &planexv1.UsageDay{Day: day}
		if cur != nil {
			addDay(total, cur)
		}
		addDay(total, delta)
		data, err := protojson.Marshal(total)
		if err != nil {
			return nil, 0, fmt.Errorf("encode usage of %s: %w", day, err)
		}
		var newRev uint64
		if cur == nil {
			newRev, err = c.kv.Create(ctx, usageKey(day), data)
		} else {
			newRev, err = c.kv.Update(ctx, usageKey(day), data, rev)
		}
		if err == nil {
			return total, newRev, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return nil, 0, fmt.Errorf("write usage of %s: %w", day, err)
		}
	}
	return nil, 0, fmt.Errorf("write usage of %s: gave up after %d concurrent updates", day, maxCAS)
}

// maxUsageDays bounds the days one GetUsage reports.
const maxUsageDays = 366

// Usage answers TenantService.GetUsage for this tenant (days "YYYY-MM-DD",
// empty for the defaults: the last 30 days to today). Bad days are
// INVALID_ARGUMENT-worthy errors naming the field (*BadRequestError).
func (c *Cell) Usage(ctx context.Context, fromDay, toDay string) (*planexv1.GetUsageResponse, error) {
	now := c.deps.Now().UTC()
	today := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	to, from := today, today.AddDate(0, 0, -30)
	var err error
	if toDay != "" {
		if to, err = time.Parse(dayLayout, toDay); err != nil {
			return nil, &BadRequestError{Field: "to_day", Msg: fmt.Sprintf("to_day %q: want a UTC day YYYY-MM-DD", toDay)}
		}
		if fromDay == "" {
			from = to.AddDate(0, 0, -30)
		}
	}
	if fromDay != "" {
		if from, err = time.Parse(dayLayout, fromDay); err != nil {
			return nil, &BadRequestError{Field: "from_day", Msg: fmt.Sprintf("from_day %q: want a UTC day YYYY-MM-DD", fromDay)}
		}
	}
	if from.After(to) {
		return nil, &BadRequestError{Field: "from_day", Msg: fmt.Sprintf("from_day %s is after to_day %s", from.Format(dayLayout), to.Format(dayLayout))}
	}
	if to.Sub(from) > maxUsageDays*24*time.Hour {
		return nil, &BadRequestError{Field: "from_day", Msg: fmt.Sprintf("from_day %s to to_day %s: at most %d days", from.Format(dayLayout), to.Format(dayLayout), maxUsageDays)}
	}
	// Serialized with flushes: a day read while a flush wrote it would
	// count the flushing delta twice.
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	resp := &planexv1.GetUsageResponse{Tenant: c.deps.Tenant, Quotas: proto.CloneOf(c.quotas()), Total: &planexv1.UsageDay{}}
	for d := from; !d.After(to); d = d.AddDate(0, 0, 1) {
		day := d.Format(dayLayout)
		stored := &planexv1.UsageDay{Day: day}
		if c.kv != nil {
			s, rev, err := c.readDay(ctx, day)
			if err != nil {
				return nil, fmt.Errorf("tenant %s: %w", c.deps.Tenant, err)
			}
			if s != nil {
				stored = s
				c.mu.Lock()
				if cur, ok := c.stored[day]; ok && cur.rev < rev {
					c.stored[day] = storedDay{day: s, rev: rev}
				}
				c.mu.Unlock()
			}
		}
		c.mu.Lock()
		if p := c.pending[day]; p != nil {
			addDay(stored, p)
		}
		c.mu.Unlock()
		if proto.Equal(stored, &planexv1.UsageDay{Day: day}) {
			continue
		}
		resp.Days = append(resp.Days, stored)
		addDay(resp.Total, stored)
	}
	resp.TokensToday = c.tokensToday(now)
	resp.MoneyThisMonthMicros = c.moneyThisMonth(now)
	if c.deps.Log != nil {
		n, err := c.runsInFlight(ctx, 0, false)
		if err != nil {
			return nil, fmt.Errorf("tenant %s: count runs in flight: %w", c.deps.Tenant, err)
		}
		resp.RunsInFlight = int32(n)
		if n, err = c.runsInFlight(ctx, 0, true); err != nil {
			return nil, fmt.Errorf("tenant %s: count run trees in flight: %w", c.deps.Tenant, err)
		}
		resp.RunTreesInFlight = int32(n)
	}
	return resp, nil
}

// BadRequestError is a GetUsage request with a bad field; the API answers
// it INVALID_ARGUMENT with Msg.
type BadRequestError struct {
	// Field is the request field at fault; Msg says what is wrong.
	Field, Msg string
}

func (e *BadRequestError) Error() string { return e.Msg }
