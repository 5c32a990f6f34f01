// Package warm runs short tasks on goroutines that are kept for a while
// after their task, so that a busy service reuses them rather than
// starting a goroutine per message: a new goroutine's stack starts small
// and is copied each time it grows (runtime.morestack), which for a deep
// call path (decode, decide, publish) costs as much as the work. grpc-go's
// server stream workers exist for the same reason.
package warm

import (
	"sync/atomic"
	"time"
)

// Pool runs tasks on its goroutines. A goroutine waits idle for another
// task after each one, then exits: an idle pool holds no goroutine. At
// most maxWaiting goroutines wait at once; the others exit after their
// task, so a burst (thousands of timers firing together) leaves no crowd
// behind. The caller bounds how many tasks run at once; the pool starts a
// goroutine whenever none is waiting. The zero Pool is not usable; use
// New.
type Pool struct {
	idle       time.Duration
	maxWaiting int32
	tasks      chan func()
	// waiting counts the goroutines waiting for a task.
	waiting atomic.Int32
	// started counts the goroutines ever started.
	started atomic.Int64
}

// Defaults for a service's message handlers: a goroutine waits 10 s for
// the next message, at most 64 wait.
const (
	DefaultIdle       = 10 * time.Second
	DefaultMaxWaiting = 64
)

// New returns a pool whose goroutines wait idle for another task before
// they exit, at most maxWaiting of them at once.
func New(idle time.Duration, maxWaiting int) *Pool {
	return &Pool{idle: idle, maxWaiting: int32(max(maxWaiting, 1)), tasks: make(chan func())}
}

// Go runs f on a waiting goroutine of the pool, or on a new one.
func (p *Pool) Go(f func()) {
	select {
	case p.tasks <- f:
	default:
		p.started.Add(1)
		go p.loop(f)
	}
}

func (p *Pool) loop(f func()) {
	t := time.NewTimer(p.idle)
	defer t.Stop()
	for {
		f()
		f = nil // what the task holds is not kept while waiting
		if p.waiting.Add(1) > p.maxWaiting {
			p.waiting.Add(-1)
			return
		}
		t.Reset(p.idle)
		select {
		case f = <-p.tasks:
			p.waiting.Add(-1)
		case <-t.C:
			p.waiting.Add(-1)
			return
		}
	}
}

// Waiting returns how many goroutines wait for a task.
func (p *Pool) Waiting() int { return int(p.waiting.Load()) }

// Started returns how many goroutines the pool has started.
func (p *Pool) Started() int64 { return p.started.Load() }
