package runner_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/executor/runner"
)

func TestExecutorServiceOverGRPC(t *testing.T) {
	srv := natstest.Start(t)
	r, _ := startRunner(t, srv, runner.Options{Tools: []runner.Tool{
		newTool(t, "p.echo", planexv1.SideEffect_SIDE_EFFECT_READ, echo),
		newTool(t, "p.send", planexv1.SideEffect_SIDE_EFFECT_EXTERNAL, echo),
	}})

	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	planexv1.RegisterExecutorServiceServer(gs, runner.NewService(r, natstest.Logger(t)))
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return lis.Dial() }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := planexv1.NewExecutorServiceClient(conn)
	ctx := ctxT(t, 10*time.Second)

	desc, err := client.Describe(ctx, &planexv1.DescribeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if desc.GetPool() != "p" || desc.GetExecutorId() != r.ID() || len(desc.GetTools()) != 2 || desc.GetTools()[0].GetName() != "p.echo" {
		t.Fatalf("Describe = %v", desc)
	}

	tests := []struct {
		name     string
		step     *planexv1.StepRequest
		wantCode codes.Code
		want     planexv1.StepResultStatus
		replayed bool
	}{
		{name: "runs", step: step(t, "r1", "a", "p.echo", map[string]any{"n": 3}), want: planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED},
		{name: "side effect", step: step(t, "r1", "b", "p.send", map[string]any{"n": 3}), want: planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED},
		{name: "side effect again replays", step: step(t, "r1", "b", "p.send", map[string]any{"n": 3}), want: planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED, replayed: true},
		{name: "tool failure is a result", step: step(t, "r1", "c", "p.nope", map[string]any{"n": 3}), want: planexv1.StepResultStatus_STEP_RESULT_STATUS_FAILED},
		{name: "no step", step: nil, wantCode: codes.InvalidArgument},
		{name: "bad run id", step: step(t, "a.b", "c", "p.echo", map[string]any{"n": 3}), wantCode: codes.InvalidArgument},
		{name: "no attempt", step: &planexv1.StepRequest{RunId: "r", StepId: "s", Tool: "p.echo"}, wantCode: codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := client.Execute(ctx, &planexv1.ExecuteRequest{Step: tt.step})
			if tt.wantCode != codes.OK {
				if status.Code(err) != tt.wantCode {
					t.Fatalf("Execute error %v, want %v", err, tt.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.GetResult(); got.GetStatus() != tt.want || got.GetReplayed() != tt.replayed {
				t.Fatalf("result %v, want %v replayed=%v", got, tt.want, tt.replayed)
			}
		})
	}
}

// BenchmarkStepOverhead measures the runtime's cost per step: publish a
// step request where supervisors publish one apart from the run log
// (planex.events.requests.step.<pool>, which the pool's consumer on
// PLANEX_EVENTS delivers), fetch it, validate, run a no-op tool, publish
// the result, ack, and read the result back from the engine stream, all
// through an embedded JetStream server.
func BenchmarkStepOverhead(b *testing.B) {
	srv := natstest.Start(b)
	startRunner(b, srv, runner.Options{Tools: []runner.Tool{newTool(b, "p.noop", planexv1.SideEffect_SIDE_EFFECT_READ, echo)}, Concurrency: 16})
	_, res := srv.Setup(b)
	eng := newEngine(b, res)
	ctx := ctxT(b, 5*time.Minute)
	subj := bus.RequestSubject(bus.PoolOf("p.noop"))
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		req := step(b, "bench", fmt.Sprint("s", i), "p.noop", map[string]any{"n": i})
		if _, err := bus.Publish(ctx, res.JS, bus.Publication{Subject: subj, Msg: req, MsgID: fmt.Sprint("bench:", i)}); err != nil {
			b.Fatal(err)
		}
	}
	for range b.N {
		if got := eng.next(ctx); got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
			b.Fatalf("result %v", got)
		}
	}
	elapsed := time.Since(start)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "steps/s")
	b.ReportMetric(float64(elapsed.Microseconds())/float64(b.N), "µs/step")
}
