package natsauth_test

import (
	"context"
	"io"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/telemetry"
)

var (
	telemetryOnce sync.Once
	metricsTel    *telemetry.Telemetry
)

// processMetrics installs the process's telemetry as a service does
// (telemetry.Setup: the OTel Prometheus exporter behind /metrics) once.
func processMetrics(t *testing.T) *telemetry.Telemetry {
	t.Helper()
	telemetryOnce.Do(func() {
		tel, err := telemetry.Setup(context.Background(), telemetry.Config{ServiceName: "natsauth-test"})
		if err != nil {
			t.Fatal(err)
		}
		metricsTel = tel
	})
	if metricsTel == nil {
		t.Fatal("telemetry set-up failed earlier")
	}
	return metricsTel
}

var usageLine = regexp.MustCompile(`(?m)^planex_jetstream_stream_usage_ratio\{[^}]*stream="([^"]+)"`)

// TestMetricsScrapeStaysInsideGrants scrapes /metrics of each service,
// alone in its process as in production, under the generated permissions:
// the JetStream usage gauge reads only the streams the identity may look
// up, so the scrape causes no permissions violation (the issue's "2.2 s
// and Permissions Violation for Publish to $JS.API.STREAM.INFO.KV_planex-supervisors").
// The scrape's duration is logged (-v), not asserted.
func TestMetricsScrapeStaysInsideGrants(t *testing.T) {
	tel := processMetrics(t)
	for _, tc := range []struct {
		identity  string
		want      []string // streams the gauge reports
		forbidden []string // streams it must not look up
	}{
		{"supervisor", []string{bus.StreamEvents, bus.StreamSteps, bus.StreamEngine, "KV_" + bus.BucketRuns, "KV_" + bus.BucketSupervisors, "OBJ_" + bus.ObjectOutputs}, nil},
		{"planner", nil, []string{bus.StreamEvents, "KV_" + bus.BucketTools}},
		{"executor-sql", []string{bus.StreamSteps, bus.StreamEvents, bus.StreamEngine, "KV_" + bus.BucketTools, "KV_" + bus.BucketEffects, "OBJ_" + bus.OutputBucket("sql")},
			[]string{"KV_" + bus.BucketRuns, "KV_" + bus.BucketSupervisors, "KV_" + bus.BucketDrafts, "OBJ_" + bus.ObjectOutputs}},
		{"executor-email", []string{"KV_" + bus.BucketDrafts, "OBJ_" + bus.OutputBucket("email")}, []string{"KV_" + bus.BucketIdempotency}},
	} {
		t.Run(tc.identity, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			url := startServer(t)
			errs := make(chan error, 16)
			nc := connect(t, url, tc.identity, errs)
			res, err := bus.Setup(ctx, nc, bus.Options{})
			if err != nil {
				t.Fatalf("%s sets up JetStream: %v", tc.identity, err)
			}
			if tc.identity == "supervisor" {
				if _, err := res.SupervisorsBucket(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for _, s := range tc.forbidden {
				if slices.Contains(res.UsageStreams(), s) {
					t.Errorf("%s's usage gauge reads %s", tc.identity, s)
				}
			}

			start := time.Now()
			rec := httptest.NewRecorder()
			tel.Metrics.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
			took := time.Since(start)
			body, _ := io.ReadAll(rec.Result().Body)
			if rec.Code != 200 {
				t.Fatalf("/metrics answered %d", rec.Code)
			}
			t.Logf("%s: /metrics answered in %s", tc.identity, took)
			var got []string
			for _, m := range usageLine.FindAllStringSubmatch(string(body), -1) {
				got = append(got, m[1])
			}
			for _, s := range tc.want {
				if !slices.Contains(got, s) {
					t.Errorf("%s: usage gauge reports %v, missing %s", tc.identity, got, s)
				}
			}
			for _, s := range tc.forbidden {
				if slices.Contains(got, s) {
					t.Errorf("%s: usage gauge reports %s, outside its grants", tc.identity, s)
				}
			}

			// Async errors arrive in order: once a violation provoked after
			// the scrape is reported, any the scrape caused would have been.
			sentinel := "planex.sentinel.never-granted"
			if err := nc.Publish(sentinel, nil); err != nil {
				t.Fatal(err)
			}
			deadline := time.After(5 * time.Second)
			for {
				select {
				case err := <-errs:
					if strings.Contains(err.Error(), sentinel) {
						return
					}
					t.Fatalf("%s: the scrape caused an async error: %v", tc.identity, err)
				case <-deadline:
					t.Fatal("the sentinel's permissions violation was never reported")
				}
			}
		})
	}
}
