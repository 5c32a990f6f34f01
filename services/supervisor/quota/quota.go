// Package quota keeps a tenant's quotas and usage for the supervisor: the
// start quotas StartRun asks (concurrent runs, starts per second, model
// tokens per day, money per month), the steps in flight per pool, the
// usage counters per UTC day (planex-usage in the tenant's NATS account)
// and the fair scheduler that the tenants' engines share.
//
// What is exact and what is bounded (docs/tenancy.md):
//
//   - max_concurrent_runs counts the tenant's runs not finished in the run
//     log's in-memory index, plus the starts this replica admitted and has
//     not finished creating. On one replica it is exact. Across replicas a
//     start becomes visible to the others when its RunCreated snapshot
//     reaches their index (one planex-runs watch delivery, milliseconds),
//     so R replicas can overshoot by at most the StartRun calls admitted on
//     the other R-1 replicas within that window.
//   - starts_per_second and start_burst are a token bucket per replica: R
//     replicas admit up to R times the rate (put them behind one replica
//     or divide the quota when that matters).
//   - tokens_per_day and money_per_month_micros compare the planex-usage
//     counters (every replica's flushed usage) plus this replica's usage
//     not flushed yet; another replica's unflushed usage (at most one
//     flush interval, 2s by default) is not seen yet.
//
// Usage is counted once: the engine calls OnEvents after a conditional
// append, which succeeds on exactly one replica for each run sequence; the
// cell also skips sequences it already counted, so a redelivered message
// (which appends new sequences, or none) never counts an event twice. A
// replica that dies between the append and its next flush loses that
// interval's counts (usage is never double-counted, possibly
// under-counted by one flush interval).
package quota

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

const instrumentation = "github.com/planex-dev/planex/services/supervisor/quota"

// Deps are what a tenant's Cell is built from.
type Deps struct {
	// Tenant is the tenant's name ("default" for the implicit tenant).
	Tenant string
	// Bus is the tenant's NATS account (bus.Setup done); nil keeps usage
	// in memory only (tests).
	Bus *bus.Resources
	// Log is the tenant's run log (its index counts runs in flight); nil
	// leaves max_concurrent_runs unchecked.
	Log *runlog.Log
	// Spec returns the tenant's current spec (its quotas); nil or a spec
	// without quotas: unlimited.
	Spec func() *planexv1.Tenant
	// Prices prices model tokens (--model-prices).
	Prices Prices
	// Fair is the scheduler the supervisor's tenants share (nil: none).
	Fair *Fair
	// Logger for the cell.
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// FlushInterval is how often usage is added to planex-usage (default
	// 2s).
	FlushInterval time.Duration
	// MeterProvider records the per-tenant metrics (default: the global
	// provider).
	MeterProvider metric.MeterProvider
}

// Cell is one tenant's quota and usage keeping.
type Cell struct {
	deps    Deps
	logger  *slog.Logger
	kv      jetstream.KeyValue // planex-usage (nil: in memory only)
	metrics *metrics

	mu       sync.Mutex
	reserved int // starts admitted by this replica and not yet created
	bucket   tokenBucket
	// Usage not yet in planex-usage: pending since the last flush, and
	// flushing while a flush writes it.
	pending, flushing map[string]*planexv1.UsageDay
	// stored caches planex-usage's days of this month (and today), with
	// their revisions.
	stored map[string]storedDay
	// seen is the last sequence counted per run; model the model of a
	// run's last plan (to price its rejected plans).
	seen         map[string]uint64
	model        map[string]string
	warnedModels map[string]bool

	flushMu sync.Mutex // one flush (or usage read) at a time
}

type storedDay struct {
	day *planexv1.UsageDay
	rev uint64
}

// NewCell builds a tenant's cell. With a Bus it opens the tenant's
// planex-usage bucket and reads this month's usage.
func NewCell(ctx context.Context, d Deps) (*Cell, error) {
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.FlushInterval <= 0 {
		d.FlushInterval = 2 * time.Second
	}
	if d.Prices == nil {
		d.Prices = Prices{}
	}
	mp := d.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m, err := newMetrics(mp.Meter(instrumentation), d.Tenant)
	if err != nil {
		return nil, fmt.Errorf("tenant %s: usage metrics: %w", d.Tenant, err)
	}
	c := &Cell{
		deps: d, logger: d.Logger.With("tenant", d.Tenant), metrics: m,
		pending: map[string]*planexv1.UsageDay{}, flushing: map[string]*planexv1.UsageDay{},
		stored: map[string]storedDay{}, seen: map[string]uint64{}, model: map[string]string{},
		warnedModels: map[string]bool{},
	}
	if d.Bus != nil {
		kv, err := d.Bus.UsageBucket(ctx)
		if err != nil {
			return nil, fmt.Errorf("tenant %s: open %s: %w", d.Tenant, bus.BucketUsage, err)
		}
		c.kv = kv
		if err := c.refresh(ctx); err != nil {
			return nil, fmt.Errorf("tenant %s: read usage: %w", d.Tenant, err)
		}
	}
	return c, nil
}

// quotas returns the tenant's current quotas (never nil).
func (c *Cell) quotas() *planexv1.TenantQuotas {
	if c.deps.Spec != nil {
		if q := c.deps.Spec().GetQuotas(); q != nil {
			return q
		}
	}
	return &planexv1.TenantQuotas{}
}

// PoolLimit is engine.Config.PoolLimit: the tenant's quota of steps of
// pool dispatched and not finished at once (0: no limit).
func (c *Cell) PoolLimit(pool string) int {
	return int(c.quotas().GetPoolStepsInFlight()[pool])
}

// Admit is engine.Config.Admit: the fair scheduler's slot for this tenant.
func (c *Cell) Admit(ctx context.Context) (release func(), err error) {
	return c.deps.Fair.Acquire(ctx, c.deps.Tenant)
}

// refreshEvery is how often the cached usage of this month is read again
// (other replicas' flushes).
const refreshEvery = 30 * time.Second

// Run keeps the cell's background work until ctx ends: it adds usage to
// planex-usage every flush interval and once more on stop (within 5s), and
// reads this month's usage again every 30s.
func (c *Cell) Run(ctx context.Context) error {
	t := time.NewTicker(c.deps.FlushInterval)
	defer t.Stop()
	lastRefresh := time.Now()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := c.Flush(fctx); err != nil {
				return fmt.Errorf("tenant %s: flush usage on stop: %w", c.deps.Tenant, err)
			}
			return nil
		case <-t.C:
			if err := c.Flush(ctx); err != nil && ctx.Err() == nil {
				c.logger.WarnContext(ctx, "flush tenant usage, will retry", "err", err)
			}
			if time.Since(lastRefresh) >= refreshEvery {
				lastRefresh = time.Now()
				if err := c.refresh(ctx); err != nil && ctx.Err() == nil {
					c.logger.WarnContext(ctx, "read tenant usage", "err", err)
				}
			}
		}
	}
}

// errNoIndex is returned when runs in flight cannot be counted.
var errNoIndex = errors.New("no run log to count runs in flight")

// runsInFlight counts the tenant's runs not finished (up to limit; 0: all)
// in the run log's index, waiting for it to load the first time. A run this
// replica has already seen finish is not counted even while its snapshot,
// written concurrently with the run's last decision, has not reached the
// index: a client that waits for its run to finish and then starts the next
// one is never refused for the run it waited for.
//
// roots counts only runs that are no run's child: max_concurrent_runs
// counts run trees, as a child's budget is carved out of its parent's
// (docs/tenancy.md). Counting children there would let parents waiting
// for children hold every place, and refuse a top-level start for work
// its own runs were allowed to do.
func (c *Cell) runsInFlight(ctx context.Context, limit int, roots bool) (int, error) {
	if c.deps.Log == nil {
		return 0, errNoIndex
	}
	for range 2 {
		n, err := c.deps.Log.CountNotFinished(roots, limit)
		if err == nil {
			return n, nil
		}
		if !errors.Is(err, runlog.ErrIndexNotReady) {
			return 0, err
		}
		if _, err := c.deps.Log.WaitIndexed(ctx); err != nil {
			return 0, err
		}
	}
	return 0, runlog.ErrIndexNotReady
}
