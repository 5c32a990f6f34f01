package natstest

import (
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// External connects to the machine's own NATS server — typically an older,
// distribution-packaged one, to test compatibility — at
// PLANEX_TEST_NATS_URL (default nats://127.0.0.1:4222), closed when the
// test ends. The test is skipped when none answers.
func External(t testing.TB) (url string, nc *nats.Conn) {
	t.Helper()
	url = os.Getenv("PLANEX_TEST_NATS_URL")
	if url == "" {
		url = "nats://127.0.0.1:4222"
	}
	nc, err := nats.Connect(url, nats.Timeout(2*time.Second))
	if err != nil {
		t.Skipf("no NATS server at %s (set PLANEX_TEST_NATS_URL): %v", url, err)
	}
	t.Cleanup(nc.Close)
	return url, nc
}
