package api

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// benchRun is a finished run as a real one looks in planex-runs: a plan of
// two steps, their results, labels, an owner. Run i's goal names "acme
// refund" for 1 run in 100 and "escalation" for 1 in 10,000.
func benchRun(i int, t time.Time) *planexv1.Run {
	goal := fmt.Sprintf("Summarize support ticket %d for Globex and draft a reply", i)
	switch {
	case i%10000 == 7:
		goal = fmt.Sprintf("Prepare the escalation report of ticket %d for Initech", i)
	case i%100 == 3:
		goal = fmt.Sprintf("Refund order %d of ACME Corp and e-mail the customer", i)
	}
	out, _ := structpb.NewStruct(map[string]any{"rows": []any{map[string]any{"id": float64(i), "status": "open"}}})
	args, _ := structpb.NewStruct(map[string]any{"query": "select * from tickets where id = $1", "params": []any{float64(i)}})
	return &planexv1.Run{
		Id: ulid.MustNew(ulid.Timestamp(t), ulid.DefaultEntropy()).String(), Goal: goal,
		Status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED, StopReason: planexv1.StopReason_STOP_REASON_SUCCEEDED,
		Labels:    map[string]string{"team": []string{"billing", "support", "ops"}[i%3], "env": "prod"},
		StartedBy: "apikey:ci", CreatedAt: timestamppb.New(t), UpdatedAt: timestamppb.New(t), FinishedAt: timestamppb.New(t),
		LastSequence: 9,
		Plans: []*planexv1.Plan{{Revision: 1, Steps: []*planexv1.Step{
			{Id: "find", Tool: "sql.query", Args: args, Description: "find the ticket"},
			{Id: "reply", Tool: "email.draft", DependsOn: []string{"find"}, Description: "draft the reply"},
		}}},
		Steps: []*planexv1.StepState{
			{StepId: "find", Tool: "sql.query", Status: planexv1.StepStatus_STEP_STATUS_SUCCEEDED, Output: structpb.NewStructValue(out), Attempt: 1},
			{StepId: "reply", Tool: "email.draft", Status: planexv1.StepStatus_STEP_STATUS_SUCCEEDED, Attempt: 1},
		},
	}
}

// seedSnapshots writes n finished runs' snapshots straight to planex-runs
// (asynchronous publishes to $KV.planex-runs.<id>, as kv.Put would, 1,000
// in flight): creating them with StartRun would take minutes. Runs are
// finished so that ListRuns reads their snapshot only (a live run is read
// from its log, which these runs do not have).
func seedSnapshots(tb testing.TB, ctx context.Context, res *bus.Resources, n int) {
	tb.Helper()
	js, err := jetstream.New(res.JS.Conn(), jetstream.WithPublishAsyncMaxPending(1000))
	if err != nil {
		tb.Fatal(err)
	}
	start := time.Now().Add(-time.Duration(n) * time.Second)
	prefix := "$KV." + res.Runs.Bucket() + "."
	for i := range n {
		run := benchRun(i, start.Add(time.Duration(i)*time.Second))
		val, err := runlog.SnapshotValue(run)
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := js.PublishAsync(prefix+run.GetId(), val); err != nil {
			tb.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		tb.Fatal("seeding planex-runs: ", ctx.Err())
	}
}

// BenchmarkListRunsGoalText100k times the first page of ListRuns with a
// goal filter over 100,000 runs, matching 1% and 0.01% of them, in the
// basic view (from the index) and then the full one (a read per run), and
// reports how long the replica's index took to load them at start
// (index-load-ms). With -benchtime 1x each figure is one cold call: the
// runs' snapshots were written, not read, so a full page's reads load
// cold filestore blocks.
//
//	go test -run '^$' -bench BenchmarkListRunsGoalText100k -benchtime 1x ./services/supervisor/api/
func BenchmarkListRunsGoalText100k(b *testing.B) {
	const n = 100_000
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	srv := natstest.Start(b)
	_, res := srv.Setup(b)
	seedSnapshots(b, ctx, res, n)

	logger := slog.New(slog.DiscardHandler)
	log, err := runlog.New(ctx, res, logger, runlog.Options{})
	if err != nil {
		b.Fatal(err)
	}
	took, err := log.WaitIndexed(ctx)
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(Config{}, res, log, logger)
	if err != nil {
		b.Fatal(err)
	}
	for _, view := range []planexv1.RunView{planexv1.RunView_RUN_VIEW_BASIC, planexv1.RunView_RUN_VIEW_FULL} {
		for _, tc := range []struct {
			name, goal string
			want       int
		}{
			{"1pct", "acme refund", 50},   // 1,000 match: a full page
			{"0.01pct", "escalation", 10}, // 10 match: the whole index is scanned
			{"none", "no such words", 0},
		} {
			name := strings.ToLower(strings.TrimPrefix(view.String(), "RUN_VIEW_")) + "/" + tc.name
			b.Run(name, func(b *testing.B) {
				req := &planexv1.ListRunsRequest{View: view, Filter: &planexv1.RunFilter{GoalContains: tc.goal}}
				for b.Loop() {
					resp, err := s.ListRuns(ctx, req)
					if err != nil {
						b.Fatal(err)
					}
					if len(resp.GetRuns()) != tc.want {
						b.Fatalf("%d runs, want %d", len(resp.GetRuns()), tc.want)
					}
				}
				b.ReportMetric(float64(took.Milliseconds()), "index-load-ms")
			})
		}
	}
}
