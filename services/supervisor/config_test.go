package supervisor_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/supervisor"
)

func parse(t *testing.T, args ...string) supervisor.Config {
	t.Helper()
	var cfg supervisor.Config
	fs := pflag.NewFlagSet("supervisor", pflag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	if err := parse(t, "--plaintext", "--auth-disabled").Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--planner-addr", "nowhere"}, `--planner-addr "nowhere"`},
		{[]string{"--engine-workers", "0"}, "--engine-workers 0"},
		{[]string{"--fair-pace-target", "1"}, "--fair-pace-target 1: want 0 (never pace) or 1.1 to 100"},
		{[]string{"--fair-pace-target", "NaN"}, "--fair-pace-target NaN"},
		{[]string{"--fair-pace-target", "-2"}, "--fair-pace-target -2"},
		{[]string{"--engine-ack-wait", "10ms"}, "--engine-ack-wait 10ms"},
		{[]string{"--events-max-age", "5m"}, "--events-max-age 5m0s"},
		{[]string{"--inline-output-bytes", "10"}, "--inline-output-bytes 10"},
		{[]string{"--default-planning-mode", "yolo"}, `--default-planning-mode "yolo"`},
		{[]string{"--default-max-steps", "50", "--ceiling-max-steps", "10"}, "--ceiling-max-steps 10: below --default-max-steps 50"},
		{[]string{"--default-step-timeout", "0s"}, "--default-step-timeout 0s"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			err := parse(t, tt.args...).Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

// Run serves the API through the common service lifecycle and stops when
// its context ends.
func TestRunServesAndStops(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	planner := startPlanner(t)
	planner.on("served", always(step("a", "test.echo", map[string]any{"value": 1})))
	_, res := srv.Setup(t)
	startPool(t, srv, res)

	plis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	planexv1.RegisterPlannerServiceServer(gs, planner)
	go func() { _ = gs.Serve(plis) }()
	t.Cleanup(gs.Stop)

	cfg := parse(t, "--grpc-addr", "127.0.0.1:0", "--nats-url", srv.URL(), "--planner-addr", plis.Addr().String(),
		"--shutdown-grace", "5s", "--engine-ack-wait", "2s", "--plaintext", "--auth-disabled")
	ready := make(chan net.Addr, 1)
	cfg.OnReady = func(a net.Addr) { ready <- a }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- supervisor.Run(ctx, cfg, natstest.Logger(t), nil) }()
	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("supervisor not ready")
	}
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := planexv1.NewSupervisorServiceClient(conn)
	id := start(t, client, &planexv1.StartRunRequest{Goal: "served"})
	if run := waitTerminal(t, client, id, 20*time.Second); run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("status %s %q", run.GetStatus(), run.GetStopMessage())
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}
