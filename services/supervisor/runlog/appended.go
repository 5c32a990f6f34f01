package runlog

import (
	"crypto/sha256"
	"sync"
)

// appendedSize is how many of its latest appends a Log remembers: a live
// watch reads each message a few milliseconds after it was appended.
const appendedSize = 16384

// appended remembers the SHA-256 of the latest appendedSize messages this
// process encoded to append to PLANEX_EVENTS. A watch that reads back a
// message whose bytes have one of these digests holds exactly events this
// process hashed in Tx.Emit before encoding them, so it checks their
// chain links without hashing each again (the version 2 hash walks every
// field; a digest of the bytes is one pass over them). The digest is
// recorded before the publish, so a watch that receives the message before
// the appender has its acknowledgement already finds it; a publish that
// then fails leaves a digest of bytes that are still events this process
// hashed. Any other message — appended by another process, evicted, or
// with other bytes — is verified in full.
type appended struct {
	mu   sync.Mutex
	by   map[[sha256.Size]byte]struct{}
	ring [][sha256.Size]byte // oldest at next once full
	next int
}

func newAppended(n int) *appended {
	return &appended{by: make(map[[sha256.Size]byte]struct{}, n), ring: make([][sha256.Size]byte, 0, n)}
}

// add remembers that this process encoded data to append it.
func (a *appended) add(data []byte) {
	d := sha256.Sum256(data)
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.by[d]; ok {
		return
	}
	if len(a.ring) < cap(a.ring) {
		a.ring = append(a.ring, d)
	} else {
		delete(a.by, a.ring[a.next])
		a.ring[a.next] = d
		a.next = (a.next + 1) % len(a.ring)
	}
	a.by[d] = struct{}{}
}

// matches reports whether this process encoded exactly data.
func (a *appended) matches(data []byte) bool {
	d := sha256.Sum256(data)
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.by[d]
	return ok
}
