package quota

import (
	"context"
	"maps"
	"slices"
	"time"

	"golang.org/x/time/rate"
)

// Pacing (Fair.Pace) keeps a backlogged tenant from saturating what the
// Fair does not schedule. The slots order the supervisor's own work, but a
// tenant with thousands of runs queued keeps every CPU, NATS and the
// executors busy with the messages its slots let through, and another
// tenant's run then waits at every hop — in the kernel's run queue, in
// NATS, in the planner — for no slot at all (docs/performance.md, the
// deployed shape). So while tenants share the supervisor, the Fair also
// watches how long engine messages take to handle once admitted (a load
// of the run, a conditional append to its log, a dispatch: the NATS round
// trips and CPU every run pays, whatever its tenant), against the fastest
// it has seen them lately; when they take more than the target times
// that, each backlogged tenant's admissions are paced — a token per
// message or run creation, at a rate cut in proportion to the excess and
// raised by paceRaise each window they are under it (a sharp decrease and
// a gentle increase, as TCP congestion control and adaptive concurrency
// limiters probe for capacity). The other tenants are never paced.

const (
	// paceWindow is how often pacing is decided, over the samples of the
	// window that ended.
	paceWindow = 100 * time.Millisecond
	// paceRaise is the factor a paced tenant's rate grows by each window
	// under the target.
	paceRaise = 1.05
	// paceFloorSpan is how far back the floor (the fastest window median
	// of engine message handling) is remembered: a floor bucket per
	// minute, the last five.
	paceFloorSpan = 5
	// paceMinSamples is the samples a window needs for its median to count.
	paceMinSamples = 8
	// paceMaxSamples bounds the samples kept per window.
	paceMaxSamples = 4096
	// paceMinRate is the lowest rate (admissions a second) a paced tenant
	// is held to: its runs always move.
	paceMinRate = 10
)

// pacer is a Fair's pacing state; the Fair's mu guards it.
type pacer struct {
	target   float64   // handling time over the floor that paces; 0: off
	winStart time.Time // start of the current window
	samples  []time.Duration
	floors   [paceFloorSpan]floorBucket
	limits   map[string]*rate.Limiter // paced tenants
	waiting  map[string]int           // waiters on a tenant's token
	wake     map[string]chan struct{} // closed when a tenant's pacing ends
	admitted map[string]int           // admissions per tenant this window
	last     PaceStats
}

// floorBucket is the fastest window median of one minute.
type floorBucket struct {
	minute int64
	median time.Duration
}

// PaceStats is the pacing decided at the end of the last window.
type PaceStats struct {
	// Median is the median handling time of engine messages in the last
	// window (0 when it had fewer than paceMinSamples), and Floor the
	// fastest such median of the last five minutes.
	Median, Floor time.Duration
	// Rates are the admissions a second each paced tenant is held to.
	Rates map[string]float64
}

// Pace turns pacing on (target > 0, the supervisor defaults to 1.3) or off (0): while more
// than one tenant has work and engine messages take more than target times
// their floor to handle, each backlogged tenant is paced (see pacer). It
// must be called before the Fair is used.
func (f *Fair) Pace(target float64) *Fair {
	f.pace = pacer{target: target, limits: map[string]*rate.Limiter{}, waiting: map[string]int{},
		wake: map[string]chan struct{}{}, admitted: map[string]int{}}
	return f
}

// Paced returns the pacing decided at the end of the last window.
func (f *Fair) Paced() PaceStats {
	if f == nil {
		return PaceStats{}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.pace.last
	s.Rates = maps.Clone(s.Rates)
	return s
}

// waitToken waits for tenant's token when it is paced; f.mu is held and
// is held again on return.
func (f *Fair) waitToken(ctx context.Context, tenant string, now time.Time) error {
	p := &f.pace
	if p.target <= 0 {
		return nil
	}
	p.admitted[tenant]++
	lim := p.limits[tenant]
	if lim == nil {
		return nil
	}
	r := lim.ReserveN(now, 1)
	d := r.DelayFrom(now)
	if d <= 0 {
		return nil
	}
	p.waiting[tenant]++
	wake := p.wake[tenant]
	if wake == nil {
		wake = make(chan struct{})
		p.wake[tenant] = wake
	}
	f.mu.Unlock()
	t := time.NewTimer(d)
	var err error
	select {
	case <-t.C:
	case <-wake: // no longer paced: the reservation no longer matters
		t.Stop()
	case <-ctx.Done():
		t.Stop()
		err = ctx.Err()
	}
	f.mu.Lock()
	if p.waiting[tenant]--; p.waiting[tenant] <= 0 {
		delete(p.waiting, tenant)
	}
	if err != nil {
		r.CancelAt(f.now())
	}
	return err
}

// sample records how long an engine message held its slot; f.mu is held.
func (f *Fair) sample(d time.Duration) {
	if p := &f.pace; p.target > 0 && len(p.samples) < paceMaxSamples {
		p.samples = append(p.samples, d)
	}
}

// decide ends the window when it is over: it updates the floor and paces,
// re-paces or frees the backlogged tenants; f.mu is held.
func (f *Fair) decide(now time.Time) {
	p := &f.pace
	if p.target <= 0 {
		return
	}
	if p.winStart.IsZero() {
		p.winStart = now
		return
	}
	elapsed := now.Sub(p.winStart)
	if elapsed < paceWindow {
		return
	}
	median := time.Duration(0)
	if len(p.samples) >= paceMinSamples {
		slices.Sort(p.samples)
		median = p.samples[len(p.samples)/2]
		p.noteFloor(now, median)
	}
	floor := p.floor(now)
	backlogged, others := f.backlogged(now)
	if !others {
		backlogged = nil // nobody to protect: the slots alone share
	}
	for t := range p.limits {
		if !slices.Contains(backlogged, t) {
			p.unpace(t)
		}
	}
	if median > 0 && floor > 0 {
		ratio := float64(median) / float64(floor)
		for _, t := range backlogged {
			lim := p.limits[t]
			if lim == nil {
				if ratio <= p.target {
					continue
				}
				// Paced from the rate it was admitted at.
				r := max(float64(p.admitted[t])/elapsed.Seconds(), paceMinRate)
				lim = rate.NewLimiter(rate.Limit(r), 1)
				p.limits[t] = lim
			}
			r := float64(lim.Limit())
			if ratio > p.target {
				r *= max(p.target/ratio, 0.25)
			} else {
				r *= paceRaise
			}
			lim.SetLimitAt(now, rate.Limit(max(r, paceMinRate)))
		}
	}
	rates := make(map[string]float64, len(p.limits))
	for t, lim := range p.limits {
		rates[t] = float64(lim.Limit())
	}
	p.last = PaceStats{Median: median, Floor: floor, Rates: rates}
	p.winStart = now
	p.samples = p.samples[:0]
	clear(p.admitted)
}

// unpace ends tenant's pacing and wakes its waiters.
func (p *pacer) unpace(tenant string) {
	delete(p.limits, tenant)
	if w := p.wake[tenant]; w != nil {
		close(w)
		delete(p.wake, tenant)
	}
}

// backlogged returns the tenants with at least as many waiters (for a
// slot or a token) as the shared slots — more work queued than the slots
// hold, as a tenant starting runs one after another never has — and
// whether any other tenant has work or
// asked within FairIdle; f.mu is held.
func (f *Fair) backlogged(now time.Time) (out []string, others bool) {
	for t, at := range f.lastSeen {
		if len(f.queues[t])+f.pace.waiting[t] >= f.slots {
			out = append(out, t)
			continue
		}
		if f.held[t] > 0 || len(f.queues[t]) > 0 || now.Sub(at) < FairIdle {
			others = true
		}
	}
	slices.Sort(out)
	return out, others
}

// noteFloor records a window median in its minute's bucket.
func (p *pacer) noteFloor(now time.Time, median time.Duration) {
	m := now.Unix() / 60
	b := &p.floors[m%paceFloorSpan]
	if b.minute != m || median < b.median {
		*b = floorBucket{minute: m, median: median}
	}
}

// floor is the fastest window median of the last paceFloorSpan minutes
// (0: none).
func (p *pacer) floor(now time.Time) time.Duration {
	m := now.Unix() / 60
	var out time.Duration
	for _, b := range p.floors {
		if b.median > 0 && m-b.minute < paceFloorSpan && (out == 0 || b.median < out) {
			out = b.median
		}
	}
	return out
}
