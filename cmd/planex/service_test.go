package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/planex-dev/planex/internal/demo"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/testbin"
)

var planexBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "planex-bin")
	if err != nil {
		panic(err)
	}
	if planexBin, err = testbin.Planex(filepath.Join("..", ".."), dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// serviceEnv is the environment of the services these tests start: JSON
// logs, and plaintext, unauthenticated, unsigned hops (the security
// tests configure them explicitly).
func serviceEnv() []string {
	return append(os.Environ(), "PLANEX_LOG_FORMAT=json", "PLANEX_PLAINTEXT=true", "PLANEX_AUTH_DISABLED=true",
		"PLANEX_GRPC_REFLECTION=true", "PLANEX_ALLOW_UNSIGNED_STEPS=true")
}

// startService starts `planex <args>` and returns the process and the gRPC
// address it logged once serving.
func startService(t *testing.T, args ...string) (*exec.Cmd, string) {
	t.Helper()
	return startLogged(t, nil, args...)
}

// startLogged is startService keeping every log line in log (when not nil).
func startLogged(t *testing.T, log *lines, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(planexBin, args...)
	cmd.Env = serviceEnv()
	addr := startWatching(t, cmd, cmd.StderrPipe, log, fmt.Sprintf("planex %v did not log serving", args), func(line string) (string, bool) {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "serving" {
			return rec["grpc_addr"].(string), true
		}
		return "", false
	})
	return cmd, addr
}

// startWatching starts cmd, killed when the test ends, and returns what
// find reports of the first line of out (cmd.StdoutPipe or
// cmd.StderrPipe) that it matches; every line also goes to log when not
// nil. Without a match within 30s the test fails: "<what> within 30s".
func startWatching(t *testing.T, cmd *exec.Cmd, out func() (io.ReadCloser, error), log *lines, what string, find func(line string) (string, bool)) string {
	t.Helper()
	r, err := out()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(r)
		sent := false
		for sc.Scan() {
			if log != nil {
				log.add(sc.Text())
			}
			if v, ok := find(sc.Text()); ok && !sent {
				found <- v
				sent = true
			}
		}
	}()
	select {
	case v := <-found:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("%s within 30s", what)
		return ""
	}
}

// stopWithSIGTERM sends cmd SIGTERM and waits for it to exit cleanly
// within 10s; name names it in failures.
func stopWithSIGTERM(t *testing.T, cmd *exec.Cmd, name string) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s exit after SIGTERM: %v", name, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not exit within 10s of SIGTERM", name)
	}
}

func TestServicesServeHealthReflectionAndStopOnSIGTERM(t *testing.T) {
	srv := natstest.Start(t)
	tests := []struct {
		name    string
		args    []string
		service string
	}{
		{name: "supervisor", args: []string{"supervisor"}, service: "planex.v1.SupervisorService"},
		{name: "planner", args: []string{"planner"}, service: "planex.v1.PlannerService"},
		{name: "executor sql", args: []string{"executor", "--pool=sql", "--sql-dsn=" + demoDB(t)}, service: "planex.v1.ExecutorService"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append(slices.Clone(tt.args), "--grpc-addr=127.0.0.1:0", "--nats-url="+srv.URL())
			cmd, addr := startService(t, args...)

			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()

			for _, svc := range []string{"", tt.service} {
				resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
				if err != nil {
					t.Fatalf("health check %q: %v", svc, err)
				}
				if resp.Status != healthpb.HealthCheckResponse_SERVING {
					t.Fatalf("health %q = %v, want SERVING", svc, resp.Status)
				}
			}

			stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
				t.Fatal(err)
			}
			resp, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, s := range resp.GetListServicesResponse().GetService() {
				names = append(names, s.Name)
			}
			for _, want := range []string{tt.service, "grpc.health.v1.Health"} {
				if !slices.Contains(names, want) {
					t.Fatalf("reflection lists %v, missing %s", names, want)
				}
			}
			_ = stream.CloseSend()

			start := time.Now()
			stopWithSIGTERM(t, cmd, tt.name)
			t.Logf("stopped %s in %v", tt.name, time.Since(start))
		})
	}
}

func TestStartupErrorsAreOneClearLine(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{name: "unreachable nats", args: []string{"supervisor", "--grpc-addr=127.0.0.1:0", "--nats-url=nats://127.0.0.1:1"}, want: "nats://127.0.0.1:1"},
		{name: "bad pool", args: []string{"executor", "--pool=gpu"}, want: `--pool "gpu"`},
		{name: "bad grpc addr", args: []string{"planner", "--grpc-addr=nope"}, want: `--grpc-addr "nope"`},
		{name: "bad log level env", args: []string{"planner", "--grpc-addr=127.0.0.1:0"}, env: []string{"PLANEX_LOG_LEVEL=loud"}, want: `--log-level "loud"`},
		{name: "bad duration env", args: []string{"planner"}, env: []string{"PLANEX_SHUTDOWN_GRACE=soon"}, want: `PLANEX_SHUTDOWN_GRACE="soon"`},
		{name: "bad flag syntax", args: []string{"planner", "--shutdown-grace=soon"}, want: `"soon"`},
		{name: "bad redact pattern", args: []string{"supervisor", "--redact-pattern=ssn=("}, want: `--redact-pattern: redact pattern "ssn"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, planexBin, tt.args...)
			cmd.Env = append(append(os.Environ(), "PLANEX_PLAINTEXT=true", "PLANEX_AUTH_DISABLED=true"), tt.env...)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("exit: %v, want non-zero; output:\n%s", err, out)
			}
			text := strings.TrimSpace(string(out))
			lines := strings.Split(text, "\n")
			last := lines[len(lines)-1]
			if !strings.HasPrefix(last, "planex: ") || !strings.Contains(last, tt.want) {
				t.Fatalf("last line %q: want a 'planex: ' error naming %s", last, tt.want)
			}
			if strings.Contains(text, "panic") || strings.Contains(text, "goroutine ") {
				t.Fatalf("output looks like a crash:\n%s", text)
			}
		})
	}
}

// demoDB generates the demo SQLite database for the sql pool.
func demoDB(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "demo.db")
	if err := demo.GenerateDB(t.Context(), path); err != nil {
		t.Fatal(err)
	}
	return path
}
