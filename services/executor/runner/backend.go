package runner

import (
	"context"
	"sync"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// DefaultProbeInterval is how often Options.Probe checks the backend.
const DefaultProbeInterval = 5 * time.Second

// backendHealth tracks whether the pool's backend (the SMTP relay, the
// database, the index) answers. Steps tell it passively — a tool failing
// with UNAVAILABLE marks the backend down at once; without a probe, a tool
// succeeding marks it up — and Options.Probe, when set, actively: it alone
// marks the backend up again, without traffic. A backend outage never stops the replica: its
// steps fail with retryable UNAVAILABLE errors meanwhile.
type backendHealth struct {
	mu       sync.Mutex
	known    bool
	up       bool
	reason   string
	since    time.Time
	onChange func(up bool, reason string)
}

// set records the backend's state and reports a change.
func (b *backendHealth) set(up bool, reason string) {
	b.mu.Lock()
	changed := !b.known || b.up != up
	b.known, b.up, b.reason = true, up, reason
	if changed {
		b.since = time.Now()
	}
	onChange := b.onChange
	b.mu.Unlock()
	if changed && onChange != nil {
		onChange(up, reason)
	}
}

// observe updates the state from a tool's outcome: UNAVAILABLE is down,
// success is up unless a probe decides that (a pool's tools need not all
// use the backend: email.draft succeeds while the SMTP relay is down), any
// other failure says nothing about the backend.
func (b *backendHealth) observe(terr *Error, probed bool) {
	switch {
	case terr == nil:
		if !probed {
			b.set(true, "")
		}
	case terr.Code == planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE:
		b.set(false, terr.Error())
	}
}

// state returns whether the backend is up (true until told otherwise),
// why not, and since when.
func (b *backendHealth) state() (up bool, reason string, since time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.known || b.up, b.reason, b.since
}

// Backend reports whether the pool's backend answers as far as the
// replica knows (from its steps and Options.Probe), the last reason it did
// not, and since when it is in that state.
func (r *Runner) Backend() (up bool, reason string, since time.Time) {
	return r.backend.state()
}

// probeLoop runs Options.Probe every Options.ProbeInterval until ctx ends.
func (r *Runner) probeLoop(ctx context.Context) {
	t := time.NewTicker(r.opts.ProbeInterval)
	defer t.Stop()
	for {
		r.probe(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *Runner) probe(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, r.opts.ProbeInterval)
	err := r.opts.Probe(pctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		r.backend.set(false, err.Error())
		return
	}
	r.backend.set(true, "")
}
