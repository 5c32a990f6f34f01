package quota

import (
	"context"
	"errors"
	"maps"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// pacedFair is a Fair with pacing at target on a clock the test moves.
type pacedFair struct {
	*Fair
	mu  sync.Mutex
	now time.Time
}

func newPacedFair(slots int, target float64) *pacedFair {
	p := &pacedFair{now: time.Date(2026, 11, 29, 0, 0, 30, 0, time.UTC)}
	p.Fair = NewFair(slots).Pace(target)
	p.Fair.now = func() time.Time {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.now
	}
	return p
}

func (p *pacedFair) advance(d time.Duration) {
	p.mu.Lock()
	p.now = p.now.Add(d)
	p.mu.Unlock()
}

// messages handles n engine messages of tenant one after another, each
// holding its slot for took on the test's clock.
func (p *pacedFair) messages(t *testing.T, tenant string, n int, took time.Duration) {
	t.Helper()
	for range n {
		rel := hold(t, p.Fair, tenant, 1)[0]
		p.advance(took)
		rel()
	}
}

// endWindow moves the clock past the window and lets tenant's next
// admission decide on it.
func (p *pacedFair) endWindow(t *testing.T, tenant string) PaceStats {
	t.Helper()
	p.advance(paceWindow)
	hold(t, p.Fair, tenant, 1)[0]()
	return p.Paced()
}

// backlog queues n waiters of tenant behind its held slots; they are
// released (with an error) when the test ends.
func (p *pacedFair) backlog(t *testing.T, tenant string, n int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	before := p.Stats().Waiting[tenant]
	for range n {
		wg.Go(func() {
			if rel, err := p.Acquire(ctx, tenant); err == nil {
				rel()
			}
		})
	}
	waitFor(t, 2*time.Second, "the backlog queued", func() bool { return p.Stats().Waiting[tenant] == before+n })
}

// TestFairPacesTheBackloggedTenant: while engine messages take more than
// the target times their floor and another tenant has work, a tenant with
// as many waiters as slots (or more) is paced at a rate cut by the excess — its next
// admission waits for a token while the other tenant's does not — raised
// by paceRaise each window under the target, and freed once the other
// tenant is idle for FairIdle.
func TestFairPacesTheBackloggedTenant(t *testing.T) {
	const slots = 2
	p := newPacedFair(slots, 1.5)

	// The floor: b's messages alone at 1ms.
	p.messages(t, "b", 20, time.Millisecond)
	if s := p.endWindow(t, "b"); s.Floor != time.Millisecond || len(s.Rates) != 0 {
		t.Fatalf("after a window of 1ms messages: %+v, want floor 1ms and nothing paced", s)
	}

	// a takes every slot and queues more than the slots; b's messages
	// now take 4ms: a is paced, from the rate it was admitted at (5 in a
	// window of 140ms) cut by 1.5/4, at least paceMinRate.
	r, _ := pace(t, p, slots)

	// A window under the target raises a's rate by paceRaise.
	p.messages(t, "b", 10, time.Millisecond)
	s := p.endWindow(t, "b")
	if got, want := s.Rates["a"], r*paceRaise; got < want*0.999 || got > want*1.001 {
		t.Fatalf("after a window at the floor a is paced at %.1f/s, want %.1f×%g", got, r, paceRaise)
	}

	// b idle for FairIdle: nobody to protect, a (still backlogged) is no
	// longer paced.
	p.advance(FairIdle)
	if s := p.endWindow(t, "a"); len(s.Rates) != 0 {
		t.Fatalf("b idle: %v paced, want none", s.Rates)
	}
}

// pace makes tenant a paced on p, as TestFairPacesTheBackloggedTenant
// describes, and returns its rate and drain, which releases a's slots
// and waits until its backlog (granted in turn) has let them go too.
func pace(t *testing.T, p *pacedFair, slots int) (rate float64, drain func()) {
	t.Helper()
	p.messages(t, "b", 20, time.Millisecond)
	if s := p.endWindow(t, "b"); s.Floor != time.Millisecond || len(s.Rates) != 0 {
		t.Fatalf("after a window of 1ms messages: %+v, want floor 1ms and nothing paced", s)
	}
	a := hold(t, p.Fair, "a", slots)
	release := func() {
		for _, rel := range a {
			rel()
		}
	}
	t.Cleanup(release)
	p.backlog(t, "a", slots+1)
	p.messages(t, "b", 10, 4*time.Millisecond)
	s := p.endWindow(t, "b")
	if s.Median != 4*time.Millisecond || s.Floor != time.Millisecond {
		t.Fatalf("window of 4ms messages: %+v, want median 4ms over a floor of 1ms", s)
	}
	r, paced := s.Rates["a"]
	if !paced || len(s.Rates) != 1 {
		t.Fatalf("a with %d waiters beside b: paced %v, want only a", slots+1, s.Rates)
	}
	if want := max(5/(paceWindow+40*time.Millisecond).Seconds()*1.5/4, paceMinRate); r < want*0.999 || r > want*1.001 {
		t.Fatalf("a paced at %.1f/s, want %.1f", r, want)
	}
	return r, func() {
		release()
		waitFor(t, 2*time.Second, "a's slots free", func() bool {
			s := p.Stats()
			return s.Held["a"] == 0 && s.Waiting["a"] == 0
		})
	}
}

// TestFairPacedTenantWaitsForItsToken: a paced tenant's admissions wait
// for its tokens (one at once, the next 1/rate later: a cancelled
// context fails it), another tenant's never do.
func TestFairPacedTenantWaitsForItsToken(t *testing.T) {
	const slots = 2
	p := newPacedFair(slots, 1.5)
	_, drain := pace(t, p, slots)
	drain()
	// No window ends (the clock stands): a stays paced.
	hold(t, p.Fair, "a", 1)[0]() // the limiter's one token
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Acquire(cancelled, "a"); !errors.Is(err, context.Canceled) {
		t.Fatalf("paced a's second admission with no slot held: %v, want to wait for its token", err)
	}
	for _, rel := range hold(t, p.Fair, "b", slots) { // b is not paced
		rel()
	}
	if s := p.Paced(); len(s.Rates) != 1 {
		t.Fatalf("paced: %v, want a", s.Rates)
	}
}

// TestFairPacingEndWakesTokenWaiters: when pacing ends, a tenant's
// admissions waiting for tokens far ahead (100 at about 13 a second:
// seconds) go on at once.
func TestFairPacingEndWakesTokenWaiters(t *testing.T) {
	const slots, waiters = 2, 100
	p := newPacedFair(slots, 1.5)
	r, drain := pace(t, p, slots)
	drain()
	var done sync.WaitGroup
	for range waiters {
		done.Go(func() {
			if rel, err := p.Acquire(context.Background(), "a"); err == nil {
				rel()
			}
		})
	}
	waitFor(t, 2*time.Second, "a's admissions waiting for tokens", func() bool {
		p.Fair.mu.Lock()
		defer p.Fair.mu.Unlock()
		return p.pace.waiting["a"] >= waiters-1
	})
	// b idle for FairIdle: the next window ends a's pacing.
	p.advance(FairIdle + paceWindow)
	p.Fair.mu.Lock()
	p.decide(p.Fair.now())
	p.Fair.mu.Unlock()
	ended := make(chan struct{})
	go func() { done.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(time.Duration(float64(waiters)/r*float64(time.Second)) / 2):
		t.Fatalf("a's token waiters still waiting after pacing ended (%d at %.1f/s would take %.1fs)", waiters, r, waiters/r)
	}
}

// TestFairPacingNeedsAReason: no tenant is paced while messages stay
// within the target of their floor, or when pacing is off. (A tenant
// alone is never backlogged: its waiters are admitted at once.)
func TestFairPacingNeedsAReason(t *testing.T) {
	const slots = 2
	for _, tc := range []struct {
		name   string
		target float64
		slow   time.Duration // how long messages take under a's backlog
	}{
		{"within the target", 1.5, 1400 * time.Microsecond},
		{"pacing off", 0, 10 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPacedFair(slots, tc.target)
			p.messages(t, "b", 20, time.Millisecond)
			p.endWindow(t, "b")
			a := hold(t, p.Fair, "a", slots)
			p.backlog(t, "a", slots+1)
			p.messages(t, "b", 20, tc.slow)
			for range 3 {
				if s := p.endWindow(t, "b"); len(s.Rates) != 0 {
					t.Fatalf("%+v: a paced, want not", s)
				}
				p.messages(t, "b", 20, tc.slow)
			}
			for _, rel := range a {
				rel()
			}
		})
	}
}

// TestFairPacingGauges: the paced tenant's rate and the handling ratio
// are gauges.
func TestFairPacingGauges(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	p := newPacedFair(2, 1.5)
	reg, err := p.Instrument(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Unregister()
	r, _ := pace(t, p, 2)
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			for _, dp := range m.Data.(metricdata.Gauge[float64]).DataPoints {
				tenant, _ := dp.Attributes.Value(attribute.Key("tenant"))
				got[m.Name+"/"+tenant.AsString()] = dp.Value
			}
		}
	}
	want := map[string]float64{"planex.tenant.fair.paced.rate/a": r, "planex.fair.handling.ratio/": 4}
	if !maps.Equal(got, want) {
		t.Fatalf("gauges %v, want %v", got, want)
	}
}
