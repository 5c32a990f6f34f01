package supervisor

import (
	"context"
	"fmt"
	"time"

	"github.com/planex-dev/planex/internal/schedule"
)

// Schedules (internal/schedule, docs/schedules.md): every cell runs a
// scheduler over its tenant's planex-schedules bucket, starting runs
// through the cell's own API, so a schedule's runs are its tenant's and
// go through the same validation, quotas and idempotency as a client's.
// Every replica runs one; there is no leader.

// ScheduleConfig tunes the schedules of a replica's cells.
type ScheduleConfig struct {
	// Disabled runs no scheduler (the API still serves schedules).
	Disabled bool
	// Now is the schedulers' clock (time.Now when nil); tests move it.
	Now func() time.Time
	// Recheck is how often schedules waiting on a running run look again
	// (default 1s).
	Recheck time.Duration
	// MaxCatchUp bounds catch_up_window: the idempotency keys' retention
	// (--events-max-age; 0: no bound).
	MaxCatchUp time.Duration
	// AfterStart is a test seam (schedule.Config.AfterStart).
	AfterStart func(id string, nominal time.Time) error
}

// scheduleCell is a cell's schedules: the operations the API calls and
// the scheduler firing them.
type scheduleCell struct {
	ops   *schedule.Ops
	sched *schedule.Scheduler
	stop  func()
}

// startSchedules opens the cell's planex-schedules bucket and starts its
// scheduler, which starts runs through runs (the cell's API).
func startSchedules(ctx context.Context, c Components, runs schedule.Runs) (*scheduleCell, error) {
	kv, err := c.Bus.SchedulesBucket(ctx)
	if err != nil {
		return nil, fmt.Errorf("schedules: %w", err)
	}
	store := schedule.NewStore(kv)
	cfg := c.Schedules
	sc := &scheduleCell{ops: &schedule.Ops{Store: store, Now: cfg.Now, MaxCatchUp: cfg.MaxCatchUp}, stop: func() {}}
	if cfg.Disabled {
		return sc, nil
	}
	sched, err := schedule.New(schedule.Config{Store: store, KV: kv, Runs: runs, Logger: c.Logger, Tenant: c.API.Tenant,
		Now: cfg.Now, Recheck: cfg.Recheck, AfterStart: cfg.AfterStart})
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = sched.Run(sctx)
	}()
	sc.sched = sched
	sc.stop = func() { cancel(); <-done }
	return sc, nil
}

// wake tells the cell's scheduler that a schedule changed here.
func (sc *scheduleCell) wake() {
	if sc.sched != nil {
		sc.sched.Wake()
	}
}
