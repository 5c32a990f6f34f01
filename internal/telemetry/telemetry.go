// Package telemetry sets up OpenTelemetry for a planex process: traces
// exported over OTLP/gRPC when an endpoint is configured (nothing exported
// otherwise), metrics exposed in Prometheus format, W3C trace context and
// baggage propagation, and slog loggers that stamp trace and run ids on
// every line.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"

	"github.com/planex-dev/planex/internal/redact"
)

// Config selects what telemetry a process emits.
type Config struct {
	// ServiceName is service.name unless OTEL_SERVICE_NAME is set.
	ServiceName string
	// Version is service.version.
	Version string
	// OTLPEndpoint (host:port) overrides OTEL_EXPORTER_OTLP_ENDPOINT; traces
	// are exported only when one of them is set.
	OTLPEndpoint string
	// Insecure sends OTLP without TLS (default for loopback endpoints).
	Insecure bool
	// Redactor cleans span attributes before export; redact.New() when nil.
	Redactor *redact.Redactor
	// Exporter, when set, receives spans instead of an OTLP exporter
	// (tests, benchmarks). It is wrapped with the redactor too.
	Exporter sdktrace.SpanExporter
}

func (c Config) redactor() *redact.Redactor {
	if c.Redactor != nil {
		return c.Redactor
	}
	return redact.New()
}

// Telemetry holds the providers of one process.
type Telemetry struct {
	// TracerProvider is also installed as the global provider.
	TracerProvider *sdktrace.TracerProvider
	// MeterProvider is also installed as the global provider.
	MeterProvider *sdkmetric.MeterProvider
	// Metrics serves /metrics in Prometheus text format.
	Metrics http.Handler
	// Exporting reports whether traces leave the process.
	Exporting bool
}

// Setup builds the providers, installs them and the W3C propagators as the
// OpenTelemetry globals, and returns them. Call Shutdown before exit to
// flush spans.
func Setup(ctx context.Context, cfg Config) (*Telemetry, error) {
	if cfg.ServiceName == "" {
		cfg.ServiceName = "planex"
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(cfg.ServiceName), semconv.ServiceVersion(cfg.Version)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
		resource.WithHost(),
		resource.WithProcessPID(),
	)
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}

	t := &Telemetry{}
	// The SDK reads OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG itself
	// when no sampler is given.
	// Spans written after the fact (a run's root, gates, step attempts)
	// take the ids recorded in the run log: see ids.go.
	tpOpts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res), sdktrace.WithIDGenerator(IDGenerator())}
	export := func(exp sdktrace.SpanExporter) sdktrace.TracerProviderOption {
		return sdktrace.WithSpanProcessor(SpanProcessor(sdktrace.NewBatchSpanProcessor(redactingExporter{SpanExporter: exp, r: cfg.redactor()})))
	}
	endpoint := cfg.OTLPEndpoint
	if cfg.Exporter != nil {
		tpOpts = append(tpOpts, export(cfg.Exporter))
		t.Exporting = true
	} else if endpoint != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
		var eopts []otlptracegrpc.Option
		if endpoint != "" {
			eopts = append(eopts, otlptracegrpc.WithEndpoint(endpoint))
			if cfg.Insecure {
				eopts = append(eopts, otlptracegrpc.WithInsecure())
			}
		}
		exp, err := otlptracegrpc.New(ctx, eopts...)
		if err != nil {
			return nil, fmt.Errorf("OTLP trace exporter: %w", err)
		}
		tpOpts = append(tpOpts, export(exp))
		t.Exporting = true
	}
	t.TracerProvider = sdktrace.NewTracerProvider(tpOpts...)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	t.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(exp))
	t.Metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})

	otel.SetTracerProvider(t.TracerProvider)
	otel.SetMeterProvider(t.MeterProvider)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return t, nil
}

// Shutdown flushes and stops the providers.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return errors.Join(t.TracerProvider.Shutdown(ctx), t.MeterProvider.Shutdown(ctx))
}
