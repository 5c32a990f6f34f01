package runlog

import (
	"crypto/sha256"
	"sync"
)

// appendedSize is how many of its latest appends a Log remembers: a live
// watch reads each message a few milliseconds after it was appended.
const appendedSize = 16384

// appended remembers the SHA-256 of the messages this process appended
// to PLANEX_EVENTS, by stream sequence, for the latest appendedSize. A
// watch that reads one of them back with the same bytes holds exactly the
// events this process encoded after hashing them in Tx.Emit, so it checks
// their chain links without hashing each again (the version 2 hash walks
// every field; a digest of the bytes is one pass over them). Any other
// message — appended elsewhere, evicted, or with other bytes — is verified
// in full.
type appended struct {
	mu   sync.Mutex
	by   map[uint64][sha256.Size]byte
	ring []uint64 // stream sequences, oldest at next once full
	next int
}

func newAppended(n int) *appended {
	return &appended{by: make(map[uint64][sha256.Size]byte, n), ring: make([]uint64, 0, n)}
}

// add remembers that the message at seq had digest d.
func (a *appended) add(seq uint64, d [sha256.Size]byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.by[seq]; ok {
		a.by[seq] = d
		return
	}
	if len(a.ring) < cap(a.ring) {
		a.ring = append(a.ring, seq)
	} else {
		delete(a.by, a.ring[a.next])
		a.ring[a.next] = seq
		a.next = (a.next + 1) % len(a.ring)
	}
	a.by[seq] = d
}

// matches reports whether this process appended exactly data at seq.
func (a *appended) matches(seq uint64, data []byte) bool {
	a.mu.Lock()
	d, ok := a.by[seq]
	a.mu.Unlock()
	return ok && d == sha256.Sum256(data)
}
