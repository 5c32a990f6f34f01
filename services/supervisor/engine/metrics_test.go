package engine

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/telemetry/metrictest"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// redriven sums planex.runs.redriven{cause} as reader last collected it.
func redriven(t *testing.T, reader *sdkmetric.ManualReader, cause string) int64 {
	return metrictest.Sum(t, reader, "planex.runs.redriven", attribute.String("cause", cause))
}

// Two replicas sweeping at the same moment both find a stranded run and
// both publish its repair kick; the stream keeps one (same message id), and
// planex.runs.redriven counts that one.
func TestSweepCountsOneRedriveForADuplicateKick(t *testing.T) {
	t.Parallel()
	f := newKickFixture(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	tools := catalog.StaticCache(catalog.Static([]*planexv1.ToolSpec{{Name: "test.echo", Description: "echo"}}))
	e, err := New(f.ctx, Config{Now: func() time.Time { return f.now }, SweepInterval: -1, MeterProvider: mp}, f.res, f.log, tools, f.planner, f.e.logger)
	if err != nil {
		t.Fatal(err)
	}
	f.commit(&runlog.State{}, "lostkick", &planexv1.RunCreated{Goal: "How many open tickets?", Budget: testBudget()})
	f.now = time.Now().Add(planningStrandedAfter + time.Second)

	if n, err := e.Sweep(f.ctx); err != nil || n != 1 {
		t.Fatalf("sweep: %d runs re-driven, %v; want 1", n, err)
	}
	if got := redriven(t, reader, "planning"); got != 1 {
		t.Fatalf("planex.runs.redriven{cause=planning} = %d after one sweep, want 1", got)
	}
	// The other replica checked the inbox before this kick arrived: take
	// the kick out again, as its handling would, and sweep the same state.
	last, err := e.inbox.GetLastMsgForSubject(f.ctx, bus.EngineSubject("lostkick", bus.KindKick))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.inbox.DeleteMsg(f.ctx, last.Sequence); err != nil {
		t.Fatal(err)
	}
	if n, err := e.Sweep(f.ctx); err != nil || n != 1 {
		t.Fatalf("second sweep: %d runs re-driven, %v; want 1 (a duplicate publish)", n, err)
	}
	if got := redriven(t, reader, "planning"); got != 1 {
		t.Fatalf("planex.runs.redriven{cause=planning} = %d after a duplicate repair kick, want 1", got)
	}
	if got := redriven(t, reader, "stranded"); got != 0 {
		t.Fatalf("planex.runs.redriven{cause=stranded} = %d, want 0", got)
	}
}
