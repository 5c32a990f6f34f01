package bus

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

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
// what is in flight. Each pool's OutputBucket gets poolOutputsShare; the
// shares add up to 100 with three pools (sql, email, search), and each
// further pool adds poolOutputsShare (the JetStream store should keep
// that much room above --jetstream-max-bytes, as deploy/k8s does). The
// run index's checkpoint (ObjectRunIndex, a cache whose size follows
// planex-runs') takes its share above the 100 the same way: a release
// that added it does not shrink what existing streams may hold.
var budgetShares = map[string]int64{
	StreamEvents:      35,
	ObjectOutputs:     10,
	StreamSteps:       10,
	StreamEngine:      5,
	StreamTimers:      5,
	BucketRuns:        8,
	BucketEffects:     4,
	BucketDrafts:      4,
	BucketIdempotency: 2,
	BucketTools:       2,
	ObjectRunIndex:    2,
}

// poolOutputsShare is the share of each pool's OutputBucket.
const poolOutputsShare = 5

// maxBytesFor is the MaxBytes of one stream or bucket under budget.
func maxBytesFor(budget int64, name string) int64 {
	share := budgetShares[name]
	if name != ObjectOutputs && CheckOutputBucket(name) == nil {
		share = poolOutputsShare
	}
	return max(budget/100*share, minShareBytes)
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

// usage are the live Resources whose streams the usage gauge reads: every
// Setup of the process (in `planex dev` every service shares one
// process), each through its own connection and only the streams it
// opened or may look up (Resources.UsageStreams), so a scrape stays
// inside the identity's NATS permissions.
var (
	usageMu   sync.Mutex
	usageRes  = map[*Resources]struct{}{}
	usageOnce sync.Once
)

// UsageStreams are the streams (and "KV_"/"OBJ_" bucket streams) whose
// usage this service reports: those Setup opened for its identity, and
// the buckets other packages create for it (the step replay cache, the
// supervisor's registrations), when they exist.
func (r *Resources) UsageStreams() []string {
	return slices.Clone(r.usage)
}

// registerUsage adds res to the usage gauge, and registers the gauge
// planex_jetstream_stream_usage_ratio once: the bytes of every planex
// stream and bucket over its MaxBytes, read at each scrape. Alerts fire
// near 1 (deploy/k8s/components/prometheus-operator).
func registerUsage(res *Resources) {
	usageMu.Lock()
	usageRes[res] = struct{}{}
	usageMu.Unlock()
	usageOnce.Do(func() {
		m := otel.Meter("github.com/planex-dev/planex/internal/bus")
		_, _ = m.Float64ObservableGauge("planex_jetstream_stream_usage_ratio",
			metric.WithDescription("Bytes stored in a planex JetStream stream or bucket divided by its MaxBytes (1 = full: writes are refused)"),
			metric.WithFloat64Callback(func(ctx context.Context, o metric.Float64Observer) error {
				ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				observeUsage(ctx, func(name string, ratio float64) {
					o.Observe(ratio, metric.WithAttributes(attribute.String("stream", name)))
				})
				return nil
			}))
	})
}

// observeUsage reports the usage ratio of every stream the live
// Resources may read, each once; Resources whose connection closed are
// dropped.
func observeUsage(ctx context.Context, observe func(name string, ratio float64)) {
	usageMu.Lock()
	live := make([]*Resources, 0, len(usageRes))
	for r := range usageRes {
		if nc := r.JS.Conn(); nc == nil || nc.IsClosed() {
			delete(usageRes, r)
			continue
		}
		live = append(live, r)
	}
	usageMu.Unlock()
	seen := map[string]bool{}
	for _, r := range live {
		for _, name := range r.UsageStreams() {
			if seen[name] {
				continue
			}
			s, err := r.JS.Stream(ctx, name)
			if err != nil {
				continue // not created (yet): nothing to report
			}
			seen[name] = true
			info := s.CachedInfo()
			if info == nil || info.Config.MaxBytes <= 0 {
				continue
			}
			observe(name, float64(info.State.Bytes)/float64(info.Config.MaxBytes))
		}
	}
}
