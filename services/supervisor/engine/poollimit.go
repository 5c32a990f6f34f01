package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// Steps in flight per pool (Config.PoolLimit): a tenant's quota of steps
// of a pool dispatched and not finished at once, across every supervisor
// replica of the tenant. Beyond it the run waits: its ready step stays
// pending and is dispatched, oldest waiter first, when one of the pool's
// steps finishes.
//
// The count is shared through one key per pool in the tenant's
// planex-usage bucket ("pool.<pool>"), written with compare-and-set: the
// attempts holding a place (run/step/attempt, with when they took it) and
// the steps waiting for one, in arrival order. A decision takes a place
// before it appends its StepDispatched (again, idempotently, when the
// append conflicts and the decision is made again) and gives it back after
// the append that ends the attempt (or the run). A place whose holder died
// between taking it and appending is reclaimed once it is older than
// poolReclaimAfter and the run's log shows no such attempt in flight.
// Why not the pool consumer's ack-pending or the run snapshots: the first
// counts every tenant's steps of a shared pool and only those an executor
// holds, the second is not written at every dispatch; neither can be
// taken atomically by two replicas.

// poolKeyPrefix prefixes the planex-usage key of a pool's places.
const poolKeyPrefix = "pool."

const (
	// poolReclaimAfter is how old a place must be before it is checked
	// against its run's log and reclaimed.
	poolReclaimAfter = 30 * time.Second
	// poolWakeGrace is how long a woken waiter keeps its turn before it
	// is dropped (its run no longer needs the place).
	poolWakeGrace = 10 * time.Second
	// poolCAS bounds the compare-and-set retries of one change.
	poolCAS = 50
)

// poolState is the value of a pool's key.
type poolState struct {
	// InFlight maps "<run>/<step>/<attempt>" to when it took its place
	// (Unix milliseconds).
	InFlight map[string]int64 `json:"in_flight,omitempty"`
	// Waiting are the steps waiting for a place, oldest first.
	Waiting []poolWaiter `json:"waiting,omitempty"`
}

// poolWaiter is a step waiting for a place.
type poolWaiter struct {
	Run   string `json:"run"`
	Step  string `json:"step"`
	Since int64  `json:"since"`           // Unix milliseconds
	Woken int64  `json:"woken,omitempty"` // when its run was kicked to take a place
}

// poolLimiter holds the places of the tenant's pools.
type poolLimiter struct {
	e *Engine

	mu sync.Mutex
	kv jetstream.KeyValue
}

func (p *poolLimiter) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.kv == nil {
		kv, err := p.e.res.UsageBucket(ctx)
		if err != nil {
			return nil, fmt.Errorf("open %s for pool limits: %w", bus.BucketUsage, err)
		}
		p.kv = kv
	}
	return p.kv, nil
}

func attemptKey(run, step string, attempt int32) string {
	return run + "/" + step + "/" + strconv.Itoa(int(attempt))
}

// change applies fn to a pool's state with compare-and-set; fn reports
// whether it changed anything (nothing is written otherwise).
func (p *poolLimiter) change(ctx context.Context, pool string, fn func(*poolState) (bool, error)) error {
	kv, err := p.bucket(ctx)
	if err != nil {
		return err
	}
	key := poolKeyPrefix + pool
	for range poolCAS {
		var (
			st  poolState
			rev uint64
		)
		e, err := kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return fmt.Errorf("read places of pool %s: %w", pool, err)
		default:
			rev = e.Revision()
			if err := json.Unmarshal(e.Value(), &st); err != nil {
				return fmt.Errorf("decode places of pool %s (revision %d): %w", pool, rev, err)
			}
		}
		if st.InFlight == nil {
			st.InFlight = map[string]int64{}
		}
		changed, err := fn(&st)
		if err != nil || !changed {
			return err
		}
		data, err := json.Marshal(&st)
		if err != nil {
			return fmt.Errorf("encode places of pool %s: %w", pool, err)
		}
		if rev == 0 {
			_, err = kv.Create(ctx, key, data)
		} else {
			_, err = kv.Update(ctx, key, data, rev)
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return fmt.Errorf("write places of pool %s: %w", pool, err)
		}
	}
	return fmt.Errorf("write places of pool %s: gave up after %d concurrent updates", pool, poolCAS)
}

// acquire takes a place of pool for a step's attempt, or records the step
// as waiting and reports false. Waiters ahead of the step take the free
// places first.
func (p *poolLimiter) acquire(ctx context.Context, pool string, limit int, run, step string, attempt int32) (bool, error) {
	now := p.e.cfg.Now()
	key := attemptKey(run, step, attempt)
	var (
		ok    bool
		wake  []string
		stale []string
	)
	err := p.change(ctx, pool, func(st *poolState) (bool, error) {
		ok, wake, stale = false, nil, nil
		if _, held := st.InFlight[key]; held {
			ok = true
			return false, nil
		}
		changed := dropStaleWaiters(st, now)
		pos := slices.IndexFunc(st.Waiting, func(w poolWaiter) bool { return w.Run == run && w.Step == step })
		if pos < 0 {
			pos = len(st.Waiting)
		}
		free := limit - len(st.InFlight)
		if pos < free {
			st.InFlight[key] = now.UnixMilli()
			if pos < len(st.Waiting) {
				st.Waiting = slices.Delete(st.Waiting, pos, pos+1)
			}
			ok = true
			return true, nil
		}
		if pos == len(st.Waiting) {
			st.Waiting = append(st.Waiting, poolWaiter{Run: run, Step: step, Since: now.UnixMilli()})
			changed = true
		}
		// Places are free but owed to waiters ahead: make sure they know.
		wake = wakeWaiters(st, free, now)
		changed = changed || len(wake) > 0
		if free <= 0 {
			stale = reclaimable(st, now)
		}
		return changed, nil
	})
	if err != nil {
		return false, err
	}
	p.kick(ctx, pool, wake)
	if len(stale) > 0 {
		p.reclaim(ctx, pool, limit, stale)
	}
	return ok, nil
}

// release gives back the places of attempts that left flight and wakes as
// many waiters as places are free.
func (p *poolLimiter) release(ctx context.Context, pool string, limit int, keys []string) error {
	now := p.e.cfg.Now()
	var wake []string
	err := p.change(ctx, pool, func(st *poolState) (bool, error) {
		wake = nil
		changed := dropStaleWaiters(st, now)
		for _, k := range keys {
			if _, held := st.InFlight[k]; held {
				delete(st.InFlight, k)
				changed = true
			}
		}
		if !changed {
			return false, nil
		}
		wake = wakeWaiters(st, limit-len(st.InFlight), now)
		return true, nil
	})
	if err != nil {
		return err
	}
	p.kick(ctx, pool, wake)
	return nil
}

// dropStaleWaiters drops waiters woken long ago that did not take their
// place (their run no longer needs it).
func dropStaleWaiters(st *poolState, now time.Time) bool {
	n := len(st.Waiting)
	st.Waiting = slices.DeleteFunc(st.Waiting, func(w poolWaiter) bool {
		return w.Woken > 0 && now.Sub(time.UnixMilli(w.Woken)) > poolWakeGrace
	})
	return len(st.Waiting) != n
}

// wakeWaiters marks the first free waiters woken (those not woken
// recently) and returns their runs.
func wakeWaiters(st *poolState, free int, now time.Time) []string {
	var runs []string
	for i := 0; i < len(st.Waiting) && i < free; i++ {
		w := &st.Waiting[i]
		if w.Woken > 0 && now.Sub(time.UnixMilli(w.Woken)) < poolWakeGrace/2 {
			continue
		}
		w.Woken = now.UnixMilli()
		if !slices.Contains(runs, w.Run) {
			runs = append(runs, w.Run)
		}
	}
	return runs
}

// reclaimable lists the places old enough to be checked against their
// runs' logs.
func reclaimable(st *poolState, now time.Time) []string {
	var out []string
	for k, at := range st.InFlight {
		if now.Sub(time.UnixMilli(at)) > poolReclaimAfter {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// reclaim gives back the places among keys whose attempt the run's log
// does not show in flight.
func (p *poolLimiter) reclaim(ctx context.Context, pool string, limit int, keys []string) {
	var gone []string
	for _, k := range keys {
		run, step, attempt, ok := splitAttemptKey(k)
		if !ok {
			gone = append(gone, k)
			continue
		}
		st, err := p.e.log.Load(ctx, run)
		if errors.Is(err, runlog.ErrRunNotFound) {
			gone = append(gone, k)
			continue
		}
		if err != nil {
			continue
		}
		s := st.Step(step)
		if runlog.Terminal(st.Run.GetStatus()) || s == nil || s.GetAttempt() != attempt || !runlog.InFlight(s.GetStatus()) {
			gone = append(gone, k)
		}
	}
	if len(gone) == 0 {
		return
	}
	p.e.logger.InfoContext(ctx, "reclaiming pool places whose holders left no attempt in flight", "pool", pool, "places", len(gone))
	if err := p.release(ctx, pool, limit, gone); err != nil {
		p.e.logger.WarnContext(ctx, "reclaim pool places", "pool", pool, "err", err)
	}
}

func splitAttemptKey(k string) (run, step string, attempt int32, ok bool) {
	i := len(k) - 1
	for i >= 0 && k[i] != '/' {
		i--
	}
	if i <= 0 {
		return "", "", 0, false
	}
	n, err := strconv.Atoi(k[i+1:])
	if err != nil {
		return "", "", 0, false
	}
	rest := k[:i]
	j := 0
	for j < len(rest) && rest[j] != '/' {
		j++
	}
	if j == len(rest) {
		return "", "", 0, false
	}
	return rest[:j], rest[j+1:], int32(n), true
}

// kick asks the engine to advance waiting runs (any replica takes it).
func (p *poolLimiter) kick(ctx context.Context, pool string, runs []string) {
	for _, run := range runs {
		_, err := bus.Publish(ctx, p.e.res.JS, bus.Publication{
			Subject: bus.EngineSubject(run, bus.KindKick),
			Msg:     &planexv1.EngineKick{RunId: run, Reason: "a place of pool " + pool + " is free"},
			MsgID:   bus.MsgID(run, "pool", pool, strconv.FormatInt(time.Now().UnixNano(), 10)),
			Attrs:   []attribute.KeyValue{attribute.String("planex.run_id", run)},
		})
		if err != nil && ctx.Err() == nil {
			// The waiter keeps its turn; the next release (or the
			// stranded-run sweeper) wakes it.
			p.e.logger.WarnContext(ctx, "kick a run waiting for its pool", "run_id", run, "pool", pool, "err", err)
		}
	}
}

// poolLimit is the tenant's limit of pool (0: none).
func (e *Engine) poolLimit(pool string) int {
	if e.cfg.PoolLimit == nil {
		return 0
	}
	return e.cfg.PoolLimit(pool)
}

// releasePlaces gives back the pool places of the attempts a committed
// decision took out of flight (finished, or their run finished).
func (e *Engine) releasePlaces(ctx context.Context, base, next *runlog.State, events []*planexv1.RunEvent) {
	if e.cfg.PoolLimit == nil || base == nil || base.Run == nil {
		return
	}
	byPool := map[string][]string{}
	left := func(s *planexv1.StepState) {
		if s == nil || !runlog.InFlight(s.GetStatus()) {
			return
		}
		if n := next.Step(s.GetStepId()); n != nil && n.GetAttempt() == s.GetAttempt() && runlog.InFlight(n.GetStatus()) && !runlog.Terminal(next.Run.GetStatus()) {
			return
		}
		pool := bus.PoolOf(s.GetTool())
		if e.poolLimit(pool) > 0 {
			byPool[pool] = append(byPool[pool], attemptKey(base.Run.GetId(), s.GetStepId(), s.GetAttempt()))
		}
	}
	for _, ev := range events {
		switch p := ev.GetPayload().(type) {
		case *planexv1.RunEvent_StepSucceeded:
			left(base.Step(p.StepSucceeded.GetStepId()))
		case *planexv1.RunEvent_StepFailed:
			left(base.Step(p.StepFailed.GetStepId()))
		case *planexv1.RunEvent_ExpectationFailed:
			left(base.Step(p.ExpectationFailed.GetStepId()))
		case *planexv1.RunEvent_CritiquePending:
			left(base.Step(p.CritiquePending.GetStepId()))
		case *planexv1.RunEvent_Finished:
			for _, s := range base.Run.GetSteps() {
				left(s)
			}
		}
	}
	for pool, keys := range byPool {
		if err := e.pools.release(ctx, pool, e.poolLimit(pool), keys); err != nil {
			// Reclaimed later (poolReclaimAfter) by a dispatch that finds
			// the pool full.
			e.logger.WarnContext(ctx, "give back pool places", "pool", pool, "err", err)
		}
	}
}
