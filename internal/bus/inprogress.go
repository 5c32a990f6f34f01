package bus

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// KeepInProgress sends an in-progress acknowledgement for msg every
// interval until the returned stop is called, so that a long handling is
// not redelivered to another consumer. It holds a timer, not a goroutine,
// while it waits (one per message in hand adds up on a busy consumer).
// After stop returns no further acknowledgement is sent, so a Nak or Term
// that follows cannot be overtaken; stop may be called more than once.
// onErr, when set, receives the failures of the sends.
func KeepInProgress(msg jetstream.Msg, every time.Duration, onErr func(error)) (stop func()) {
	k := &inProgress{}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.timer = time.AfterFunc(every, func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		if k.stopped {
			return
		}
		if err := msg.InProgress(); err != nil && onErr != nil {
			onErr(err)
		}
		k.timer.Reset(every)
	})
	return k.stop
}

type inProgress struct {
	mu      sync.Mutex
	stopped bool
	timer   *time.Timer
}

func (k *inProgress) stop() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.stopped = true
	k.timer.Stop()
}

// PullHeartbeat is the idle heartbeat the services ask of the server on
// their long pulls (Consume). A pull request the server no longer serves
// is noticed after two missed heartbeats and sent again. nats.go's default
// for Consume is half its 30 s expiry, so such a pull held a consumer idle
// for 30 s: seen on a 3-node cluster, the engine's steps all finishing
// 30 s after dispatch until "no heartbeat received" (docs/performance.md,
// eleventh round). With 2 s it is noticed within 4 s; an idle consumer
// costs the server a heartbeat every 2 s.
const PullHeartbeat = 2 * time.Second
