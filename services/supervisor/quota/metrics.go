package quota

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// metrics are a tenant's usage and refusal counters, all with the
// attribute tenant (docs/operations.md).
type metrics struct {
	name                             string
	tenant                           metric.MeasurementOption
	input, output                    metric.MeasurementOption
	started, finished, steps, tokens metric.Int64Counter
	cost, refusals                   metric.Int64Counter
}

func newMetrics(m metric.Meter, tenant string) (*metrics, error) {
	out := &metrics{
		name:   tenant,
		tenant: metric.WithAttributes(attribute.String("tenant", tenant)),
		input:  metric.WithAttributes(attribute.String("tenant", tenant), attribute.String("direction", "input")),
		output: metric.WithAttributes(attribute.String("tenant", tenant), attribute.String("direction", "output")),
	}
	var err error
	for _, c := range []struct {
		dst        *metric.Int64Counter
		name, desc string
	}{
		{&out.started, "planex.tenant.runs.started", "Runs of the tenant that the engine started (first decision after StartRun)."},
		{&out.finished, "planex.tenant.runs.finished", "Runs of the tenant that finished."},
		{&out.steps, "planex.tenant.steps.finished", "Step attempts of the tenant that finished, any outcome."},
		{&out.tokens, "planex.tenant.model.tokens", "Model tokens (planner and model critic) of the tenant, by direction (input, output)."},
		{&out.cost, "planex.tenant.model.cost.micros", "Cost of the tenant's model tokens in micro-dollars, per --model-prices."},
		{&out.refusals, "planex.tenant.quota.refusals", "StartRun calls of the tenant refused by a quota, by quota."},
	} {
		if *c.dst, err = m.Int64Counter(c.name, metric.WithDescription(c.desc)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// add records usage counted from a run's events.
func (m *metrics) add(ctx context.Context, started, finished, steps, in, out, cost int64) {
	if started > 0 {
		m.started.Add(ctx, started, m.tenant)
	}
	if finished > 0 {
		m.finished.Add(ctx, finished, m.tenant)
	}
	if steps > 0 {
		m.steps.Add(ctx, steps, m.tenant)
	}
	if in > 0 {
		m.tokens.Add(ctx, in, m.input)
	}
	if out > 0 {
		m.tokens.Add(ctx, out, m.output)
	}
	if cost > 0 {
		m.cost.Add(ctx, cost, m.tenant)
	}
}

// refused counts a start refused by quota.
func (m *metrics) refused(ctx context.Context, quota string) {
	m.refusals.Add(ctx, 1, metric.WithAttributes(attribute.String("tenant", m.name), attribute.String("quota", quota)))
}

// Instrument registers the Fair's pacing as gauges on mp's meter:
// planex.tenant.fair.paced.rate (admissions a second each paced tenant is
// held to, attribute tenant; absent while not paced) and
// planex.fair.handling.ratio (the engine messages' median handling time
// over its floor in the last window; absent when it had too few). Unregister the
// returned registration when the Fair is done with.
func (f *Fair) Instrument(mp metric.MeterProvider) (metric.Registration, error) {
	m := mp.Meter(instrumentation)
	rate, err := m.Float64ObservableGauge("planex.tenant.fair.paced.rate",
		metric.WithDescription("Admissions a second (engine messages and run creations) a backlogged tenant is paced to while another tenant has work; absent while not paced."))
	if err != nil {
		return nil, err
	}
	ratio, err := m.Float64ObservableGauge("planex.fair.handling.ratio",
		metric.WithDescription("Median time to handle an engine message over its floor of the last five minutes; pacing starts above --fair-pace-target."))
	if err != nil {
		return nil, err
	}
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := f.Paced()
		for t, r := range s.Rates {
			o.ObserveFloat64(rate, r, metric.WithAttributes(attribute.String("tenant", t)))
		}
		if s.Floor > 0 && s.Median > 0 {
			o.ObserveFloat64(ratio, float64(s.Median)/float64(s.Floor))
		}
		return nil
	}, rate, ratio)
}
