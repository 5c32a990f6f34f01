package runner

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// metricSet holds the runner's instruments, created from the global meter
// provider that telemetry.Setup installs.
type metricSet struct {
	steps    metric.Int64Counter
	latency  metric.Float64Histogram
	inflight metric.Int64UpDownCounter
	poolAttr metric.MeasurementOption
}

func newMetrics(m metric.Meter) (metricSet, error) {
	var s metricSet
	var err error
	if s.steps, err = m.Int64Counter("planex.executor.steps",
		metric.WithDescription("Step deliveries handled, by tool and outcome (succeeded, failed, outcome_unknown, replayed, retried, poison)."),
		metric.WithUnit("{step}")); err != nil {
		return s, fmt.Errorf("create metric planex.executor.steps: %w", err)
	}
	if s.latency, err = m.Float64Histogram("planex.executor.step.duration",
		metric.WithDescription("Time from the start of an attempt to its result, by tool and outcome."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)); err != nil {
		return s, fmt.Errorf("create metric planex.executor.step.duration: %w", err)
	}
	if s.inflight, err = m.Int64UpDownCounter("planex.executor.steps.in_flight",
		metric.WithDescription("Steps this replica is running now."),
		metric.WithUnit("{step}")); err != nil {
		return s, fmt.Errorf("create metric planex.executor.steps.in_flight: %w", err)
	}
	return s, nil
}

func (s metricSet) count(ctx context.Context, tool, outcome string) {
	s.steps.Add(ctx, 1, metric.WithAttributes(attribute.String("tool", tool), attribute.String("outcome", outcome)))
}

// observeBackend registers planex.executor.backend.up, 1 while the pool's
// backend answers and 0 while it does not (see Runner.Backend).
func (s metricSet) observeBackend(m metric.Meter, pool string, up func() bool) error {
	attrs := metric.WithAttributes(attribute.String("pool", pool))
	_, err := m.Int64ObservableGauge("planex.executor.backend.up",
		metric.WithDescription("1 while the pool's backend (SMTP relay, database, index) answers, 0 during an outage; the replica keeps running and its steps fail with retryable UNAVAILABLE errors."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			v := int64(0)
			if up() {
				v = 1
			}
			o.Observe(v, attrs)
			return nil
		}))
	if err != nil {
		return fmt.Errorf("create metric planex.executor.backend.up: %w", err)
	}
	return nil
}
