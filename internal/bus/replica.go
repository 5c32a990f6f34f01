package bus

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
)

// NewReplicaID returns "<hostname>-<random>", unique per process start and
// usable as a subject token and KV key: the host name lower-cased, other
// characters than [a-z0-9-] replaced by '-', at most 48 of them, or
// fallback when the host has no name.
func NewReplicaID(fallback string) string {
	host, _ := os.Hostname()
	var b strings.Builder
	for _, c := range strings.ToLower(host) {
		if (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' {
			b.WriteRune(c)
		} else {
			b.WriteByte('-')
		}
		if b.Len() >= 48 {
			break
		}
	}
	if b.Len() == 0 {
		b.WriteString(fallback)
	}
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	return b.String() + "-" + hex.EncodeToString(suffix[:])
}
