package bus

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// DefaultMaxBytes is the default budget of all planex streams and buckets
// together: it fits a laptop and the dev overlay's 1.5 GiB JetStream store.
// A production cluster sets --jetstream-max-bytes to what its volume holds
// (deploy/k8s: 8GiB of a 9Gi store).
const DefaultMaxBytes int64 = 1 << 30

// minShareBytes is the smallest MaxBytes any stream or bucket gets.
const minShareBytes int64 = 1 << 20

// budgetShares split Options.MaxBytes between the streams and buckets, in
// percent: the run log and large outputs hold most, the work queues only
// what is in flight.
var budgetShares = map[string]int64{
	StreamEvents:      35,
	ObjectOutputs:     25,
	StreamSteps:       10,
	StreamEngine:      10,
	BucketRuns:        8,
	BucketEffects:     4,
	BucketDrafts:      4,
	BucketIdempotency: 2,
	BucketTools:       2,
}

// maxBytesFor is the MaxBytes of one stream or bucket under budget.
func maxBytesFor(budget int64, name string) int64 {
	return max(budget/100*budgetShares[name], minShareBytes)
}

// ParseBytes parses a size such as 8GiB, 512MiB, 1GB, 1048576 (bytes).
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   int64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
	}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("size %q: want a non-negative number of bytes with an optional unit (KiB, MiB, GiB, TiB, KB, MB, GB, TB)", s)
	}
	if n > 0 && mult > (1<<62)/n {
		return 0, fmt.Errorf("size %q: too large", s)
	}
	return n * mult, nil
}

// usageJS is the JetStream context the usage gauge reads; the latest
// Setup wins (in `planex dev` every service shares one server).
var (
	usageJS    atomic.Pointer[jetstream.JetStream]
	usageOnce  sync.Once
	usageNames = []string{
		StreamEvents, StreamSteps, StreamEngine,
		"KV_" + BucketRuns, "KV_" + BucketTools, "KV_" + BucketEffects, "KV_" + BucketIdempotency, "KV_" + BucketDrafts,
		"KV_" + BucketSupervisors, "KV_" + BucketStepReplay, "OBJ_" + ObjectOutputs,
	}
)

// registerUsage reports planex_jetstream_stream_usage_ratio: the bytes
// of every planex stream and bucket over its MaxBytes, read at each scrape.
// Alerts fire near 1 (deploy/k8s/components/prometheus-operator).
func registerUsage(js jetstream.JetStream) {
	usageJS.Store(&js)
	usageOnce.Do(func() {
		m := otel.Meter("github.com/planex-dev/planex/internal/bus")
		_, _ = m.Float64ObservableGauge("planex_jetstream_stream_usage_ratio",
			metric.WithDescription("Bytes stored in a planex JetStream stream or bucket divided by its MaxBytes (1 = full: writes are refused)"),
			metric.WithFloat64Callback(func(ctx context.Context, o metric.Float64Observer) error {
				p := usageJS.Load()
				if p == nil {
					return nil
				}
				ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				for _, name := range usageNames {
					s, err := (*p).Stream(ctx, name)
					if err != nil {
						continue
					}
					info := s.CachedInfo()
					if info == nil || info.Config.MaxBytes <= 0 {
						continue
					}
					o.Observe(float64(info.State.Bytes)/float64(info.Config.MaxBytes), metric.WithAttributes(attribute.String("stream", name)))
				}
				return nil
			}))
	})
}
