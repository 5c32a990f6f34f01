package e2e

import (
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/natstest"
)

// TestClusterOnExternalNATS runs the services as processes against the
// NATS server of the machine (PLANEX_TEST_NATS_URL, default
// nats://127.0.0.1:4222) — typically an older, distribution-packaged
// nats-server — so planex keeps working on servers older than the one it
// embeds.
func TestClusterOnExternalNATS(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test; skipped with -short")
	}
	url, nc := natstest.External(t)
	t.Logf("external NATS %s, server version %s", url, nc.ConnectedServerVersion())

	c := startCluster(t, url, nil, "sql", "email")
	for _, goal := range []string{
		"How many open support tickets does Acme Corp have?",
		"What is the average order value by region in 2025?",
		"Email the finance team a summary of the top 3 customers by revenue in 2025",
	} {
		run := runToEnd(t, c.supervisor, goal)
		if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
			t.Fatalf("%q: %v %v %s", goal, run.GetStatus(), run.GetStopReason(), run.GetStopMessage())
		}
	}
	c.stop(t)
}
