// Package metrictest reads OpenTelemetry metrics in tests: a manual reader
// installed as the global meter provider, and the sum of a counter's data
// points with given attributes.
package metrictest

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Global installs a meter provider reading into the returned manual reader
// as the global one (otel.SetMeterProvider) until the test ends, when the
// previous provider is put back. Tests that use it must not run in
// parallel with others that read global metrics.
func Global(t testing.TB) *sdkmetric.ManualReader {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	prev := otel.GetMeterProvider()
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	t.Cleanup(func() { otel.SetMeterProvider(prev) })
	return reader
}

// Sum collects reader and returns the sum of the int64 counter name's data
// points that carry every one of attrs (all of them when attrs is empty).
func Sum(t testing.TB, reader *sdkmetric.ManualReader, name string, attrs ...attribute.KeyValue) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != name || !ok {
				continue
			}
		points:
			for _, dp := range sum.DataPoints {
				for _, a := range attrs {
					if v, ok := dp.Attributes.Value(a.Key); !ok || v != a.Value {
						continue points
					}
				}
				n += dp.Value
			}
		}
	}
	return n
}
