package planner_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/planner"
	"github.com/planex-dev/planex/services/planner/internal/plannertest"
	"github.com/planex-dev/planex/services/planner/playbook"
)

// TestLogsCarryNoGoalAboveDebug: whatever fails, the planner's log at
// INFO and above never repeats the goal (goals may hold personal data);
// provider failures are logged at WARN with the provider's message.
func TestLogsCarryNoGoalAboveDebug(t *testing.T) {
	const goal = "Email the balance of customer Jane Roe (jane.roe@example.org) to her manager"
	t.Setenv("OPENAI_API_KEY", "sk-local")
	fake := plannertest.NewFake(t, plannertest.OpenAIError(http.StatusBadRequest, nil, "Invalid schema for response_format 'plan': unsupported"))
	for _, backend := range []string{planner.BackendPlaybook, planner.BackendOpenAI} {
		t.Run(backend, func(t *testing.T) {
			var buf bytes.Buffer
			logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
			cfg := modelConfig(fake)
			cfg.Backend = backend
			cfg.BuiltinPlaybooks = playbook.DemoFS
			srv, err := planner.NewServer(cfg, logger, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := srv.Plan(context.Background(), &planexv1.PlanRequest{RunId: "r1", Goal: goal, Tools: plannertest.Catalog(t)}); err == nil {
				t.Fatal("planned an unplannable goal")
			}
			out := buf.String()
			if !strings.Contains(out, "plan failed") {
				t.Fatalf("no log of the failure:\n%s", out)
			}
			for _, leak := range []string{"Jane", "jane.roe", "balance of customer"} {
				if strings.Contains(out, leak) {
					t.Fatalf("log at INFO carries the goal (%q):\n%s", leak, out)
				}
			}
			if backend == planner.BackendOpenAI && (!strings.Contains(out, `"level":"WARN"`) || !strings.Contains(out, "Invalid schema for response_format")) {
				t.Fatalf("provider rejection not logged at WARN with its message:\n%s", out)
			}
		})
	}
}
