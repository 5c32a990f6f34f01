package main

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/telemetry/otlptest"
)

// planex run --dev exports the run's trace where OTEL_EXPORTER_OTLP_ENDPOINT
// says, flushed before the command returns: the root span written when
// the run finished, and the gate that run --yes approved as a span of its
// wait naming how it was decided.
func TestRunDevExportsTheRunTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the dev stack; skipped with -short")
	}
	recv := otlptest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.Endpoint)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")

	out, err := planexIn(t, "run", "--dev", "--data-dir", filepath.Join(t.TempDir(), "data"), "--json", "--yes", "Close support ticket 400")
	if err != nil {
		t.Fatalf("planex run: %v\n%s", err, out)
	}
	var run planexv1.Run
	if err := protojson.Unmarshal([]byte(out), &run); err != nil {
		t.Fatalf("stdout is not a Run (%v):\n%s", err, out)
	}
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED || len(run.GetGates()) != 1 {
		t.Fatalf("run %s: %s, %d gates; want SUCCEEDED through one gate", run.GetId(), run.GetStatus(), len(run.GetGates()))
	}
	// Everything was flushed when the command returned: no waiting.
	spans := recv.Trace(run.GetTraceId())
	root := slices.IndexFunc(spans, func(s otlptest.Span) bool { return s.Name == "run" && s.ParentSpanID == "" })
	if root < 0 {
		t.Fatalf("no root span of run %s reached the receiver; got %d spans of its trace", run.GetId(), len(spans))
	}
	if r := spans[root]; r.Service != "planex-dev" || r.Attrs["planex.run.status"] != "SUCCEEDED" {
		t.Errorf("root span from %q with status %v", r.Service, r.Attrs["planex.run.status"])
	}
	g := run.GetGates()[0]
	gate := slices.IndexFunc(spans, func(s otlptest.Span) bool {
		return strings.HasPrefix(s.Name, "gate ") && s.Attrs["planex.gate_id"] == g.GetId()
	})
	if gate < 0 {
		t.Fatalf("no span of gate %s", g.GetId())
	}
	s := spans[gate]
	if s.Attrs["planex.gate.via"] != "run --yes" || s.Attrs["planex.gate.decision"] != "approve" || s.ParentSpanID != spans[root].SpanID {
		t.Errorf("gate span %q: %v", s.Name, s.Attrs)
	}
	if want := g.GetDecidedAt().AsTime().Sub(g.GetOpenedAt().AsTime()); s.Duration() != want {
		t.Errorf("gate span lasts %s, the gate waited %s", s.Duration(), want)
	}
	for _, sp := range spans {
		if sp.End.After(spans[root].End.Add(time.Millisecond)) {
			t.Errorf("span %q ends %s after the root", sp.Name, sp.End.Sub(spans[root].End))
		}
	}
}

// planex replay exports one "replay" span where OTEL_EXPORTER_OTLP_ENDPOINT
// says, naming the run and whether it diverged, and none of the run's own
// spans (a replay decides again, it does not run again).
func TestReplayExportsItsSpan(t *testing.T) {
	recv := otlptest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.Endpoint)
	if out, err := planexIn(t, "replay", demoLogs+"top-customers-email.jsonl", "--tools", demoLogs+"tools.json", "--auto-approve", "email.send"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	spans := recv.Spans()
	if len(spans) != 1 || spans[0].Name != "replay" || spans[0].Service != "planex-replay" ||
		spans[0].Attrs["planex.replay.diverged"] != false || spans[0].Attrs["planex.replay.events"] != int64(14) || spans[0].Attrs["planex.run_id"] == nil {
		t.Fatalf("spans received: %+v", spans)
	}
}
