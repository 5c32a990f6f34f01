package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/natstest"
)

// TestAlwaysFailingProviderEndsTheRun is issue 12's acceptance for
// provider failures, with the services as separate processes: against an
// OpenAI-compatible server that always answers 500, a run stops
// PLANNER_ERROR within --planner-timeout plus the retry bound, its stop
// message carries the provider's status and message without the API key,
// and the planner logs the failure at the default log level.
func TestAlwaysFailingProviderEndsTheRun(t *testing.T) {
	const apiKey = "sk-" + "acceptanceKey0123456789"
	var calls atomic.Int32
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"error":{"message":"The server had an error processing your request (key ` + apiKey + `)","type":"server_error","param":null,"code":null}}`))
	}))
	t.Cleanup(provider.Close)
	keyFile := writeTemp(t, "key", apiKey)

	srv := natstest.Start(t)
	common := []string{"--grpc-addr=127.0.0.1:0", "--nats-url=" + srv.URL()}
	const retryBudget, plannerTimeout = 3 * time.Second, 20 * time.Second
	plannerLog := &lines{}
	_, plannerAddr := startLogged(t, plannerLog, append([]string{"planner", "--planner-backend=openai", "--openai-base-url=" + provider.URL + "/v1",
		"--openai-api-key-file=" + keyFile, "--planner-max-retries=10", "--planner-retry-budget=" + retryBudget.String()}, common...)...)
	startService(t, append([]string{"executor", "--pool=sql", "--sql-dsn=" + demoDB(t)}, common...)...)
	_, supAddr := startService(t, append([]string{"supervisor", "--planner-addr=" + plannerAddr, "--planner-timeout=" + plannerTimeout.String()}, common...)...)

	conn, err := grpc.NewClient(supAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := planexv1.NewSupervisorServiceClient(conn)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	// The executor registers its tools shortly after serving.
	var started *planexv1.StartRunResponse
	for {
		tools, err := client.ListTools(ctx, &planexv1.ListToolsRequest{})
		if err == nil && len(tools.GetTools()) > 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no tools registered: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	begin := time.Now()
	if started, err = client.StartRun(ctx, &planexv1.StartRunRequest{Goal: "How many open support tickets are there?"}); err != nil {
		t.Fatal(err)
	}
	var run *planexv1.Run
	for {
		resp, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: started.GetRun().GetId()})
		if err != nil {
			t.Fatal(err)
		}
		run = resp.GetRun()
		if s := run.GetStatus(); s != planexv1.RunStatus_RUN_STATUS_PENDING && s != planexv1.RunStatus_RUN_STATUS_PLANNING && s != planexv1.RunStatus_RUN_STATUS_RUNNING {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("run still %s after %s", run.GetStatus(), time.Since(begin))
		}
		time.Sleep(100 * time.Millisecond)
	}
	took := time.Since(begin)
	t.Logf("run ended %s %s after %s and %d provider calls: %s", run.GetStatus(), run.GetStopReason(), took.Round(time.Millisecond), calls.Load(), run.GetStopMessage())
	if run.GetStopReason() != planexv1.StopReason_STOP_REASON_PLANNER_ERROR {
		t.Fatalf("stop reason %s %q, want PLANNER_ERROR", run.GetStopReason(), run.GetStopMessage())
	}
	msg := run.GetStopMessage()
	for _, want := range []string{"HTTP 500", "The server had an error processing your request", "gave up after"} {
		if !strings.Contains(msg, want) {
			t.Errorf("stop message %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "acceptanceKey") {
		t.Errorf("stop message leaks the API key: %q", msg)
	}
	if bound := plannerTimeout + retryBudget; took > bound {
		t.Errorf("the run took %s to end, beyond --planner-timeout + the retry budget (%s)", took, bound)
	}
	// Visible at the default log level, without the goal or the key.
	ok := false
	for _, l := range plannerLog.all() {
		if strings.Contains(l, `"level":"WARN"`) && strings.Contains(l, "plan failed") && strings.Contains(l, "HTTP 500") {
			ok = true
		}
		if strings.Contains(l, "acceptanceKey") || strings.Contains(l, "open support tickets") {
			t.Errorf("planner log line leaks the key or the goal: %s", l)
		}
	}
	if !ok {
		t.Errorf("no WARN line about the provider failure in the planner's log:\n%s", strings.Join(plannerLog.all(), "\n"))
	}
}

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	p := t.TempDir() + "/" + name
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// lines collects a process's log lines.
type lines struct {
	mu sync.Mutex
	l  []string
}

func (l *lines) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.l = append(l.l, s)
}

func (l *lines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.l...)
}
