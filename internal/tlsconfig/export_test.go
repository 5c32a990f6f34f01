package tlsconfig

import (
	"time"

	"google.golang.org/grpc/credentials"
)

// SetRecheckInterval sets how often c, credentials from
// Flags.ServerCredentials or Flags.ClientCredentials, re-reads its CA
// bundle while it holds connections (RecheckInterval in production). Call
// it before the first connection.
func SetRecheckInterval(c credentials.TransportCredentials, d time.Duration) {
	w := c.(*revalidating).w
	w.mu.Lock()
	defer w.mu.Unlock()
	w.interval = d
}
