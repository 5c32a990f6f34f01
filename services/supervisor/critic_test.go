package supervisor_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/supervisor/engine"
)

// Critique answers with the scripted critic (p.critic) and records the
// request.
func (p *fakePlanner) Critique(_ context.Context, req *planexv1.CritiqueRequest) (*planexv1.CritiqueResponse, error) {
	p.mu.Lock()
	c := p.critic
	n := len(p.critiques[req.GetRunId()])
	p.critiques[req.GetRunId()] = append(p.critiques[req.GetRunId()], proto.CloneOf(req))
	p.mu.Unlock()
	if c == nil {
		return &planexv1.CritiqueResponse{Passed: true, Backend: "fake"}, nil
	}
	return c(n, req)
}

func (p *fakePlanner) setCritic(c func(n int, req *planexv1.CritiqueRequest) (*planexv1.CritiqueResponse, error)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.critic = c
}

func (p *fakePlanner) critiqueRequests(runID string) []*planexv1.CritiqueRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*planexv1.CritiqueRequest(nil), p.critiques[runID]...)
}

// withCritic turns the model critic on for every tool.
func withCritic(maxTokens int64) func(*engine.Config) {
	return func(c *engine.Config) {
		c.Critic = engine.ModelCritic{Backend: "fake", Tools: []string{"*"}, MaxTokens: maxTokens}
	}
}

// verdictOn fails the results whose output is "wrong" and passes the
// others, spending 10+5 tokens per call.
func verdictOn(_ int, req *planexv1.CritiqueRequest) (*planexv1.CritiqueResponse, error) {
	u := &planexv1.TokenUsage{InputTokens: 10, OutputTokens: 5}
	if req.GetOutput().GetStructValue().GetFields()["value"].GetStringValue() == "wrong" {
		return &planexv1.CritiqueResponse{Reason: "the value is not the ticket count", Usage: u, Backend: "fake", Model: "m"}, nil
	}
	return &planexv1.CritiqueResponse{Passed: true, Reason: "looks right", Usage: u, Backend: "fake", Model: "m"}, nil
}

func critiqueEvents(t *testing.T, r *replica, id string) (pending []*planexv1.CritiquePending, verdicts []*planexv1.CriticVerdict) {
	t.Helper()
	for _, ev := range watchAll(t, r.client, id, 0) {
		if c := ev.GetCritiquePending(); c != nil {
			pending = append(pending, c)
		}
		if v := ev.GetCriticVerdict(); v != nil {
			verdicts = append(verdicts, v)
		}
	}
	return pending, verdicts
}

func TestModelCriticRejectionReplansOnce(t *testing.T) {
	h, r := setup(t, withCritic(1000))
	h.planner.setCritic(verdictOn)
	id := h.runGoal(t, r, "model critic", sequence(
		planOf(noRetry(step("a", "test.echo", map[string]any{"value": "wrong"}))),
		planOf(step("b", "test.echo", map[string]any{"value": "42"})),
	))
	run := succeeded(t, r, id)
	if run.GetUsage().GetReplans() != 1 || len(h.planner.requests(id)) != 2 {
		t.Fatalf("replans %d, planner calls %d; want exactly one replan", run.GetUsage().GetReplans(), len(h.planner.requests(id)))
	}
	hist := h.planner.requests(id)[1].GetHistory()
	if !strings.Contains(hist.GetReplanReason(), "the value is not the ticket count") {
		t.Fatalf("replan reason %q does not carry the critic's reason", hist.GetReplanReason())
	}
	var sawA bool
	for _, o := range hist.GetSteps() {
		if o.GetStepId() == "a" {
			sawA = o.GetStatus() == planexv1.StepStatus_STEP_STATUS_FAILED && o.GetError().GetCode() == planexv1.ErrorCode_ERROR_CODE_EXPECTATION_FAILED &&
				strings.Contains(o.GetError().GetMessage(), "the value is not the ticket count")
		}
	}
	if !sawA {
		t.Fatalf("history %v: step a is not failed with the verdict", hist.GetSteps())
	}
	reqs := h.planner.critiqueRequests(id)
	if len(reqs) != 2 || reqs[0].GetStepId() != "a" || reqs[0].GetGoal() != "model critic" || reqs[0].GetTool().GetName() != "test.echo" ||
		reqs[0].GetBackend() != "fake" || reqs[0].GetRemainingTokens() != 1000 || reqs[1].GetRemainingTokens() != 985 {
		t.Fatalf("critique requests %v", reqs)
	}
	pending, verdicts := critiqueEvents(t, r, id)
	if len(pending) != 2 || len(verdicts) != 2 ||
		verdicts[0].GetStepId() != "a" || verdicts[0].GetPassed() || verdicts[0].GetAction() != "replan" || verdicts[0].GetVerifier() != "model:fake" ||
		verdicts[1].GetStepId() != "b" || !verdicts[1].GetPassed() || verdicts[1].GetAction() != "pass" {
		t.Fatalf("pending %v, verdicts %v", pending, verdicts)
	}
	if run.GetCriticTokens() != 30 || run.GetUsage().GetTokens() != 30 {
		// The planner's two calls spent 15 each; the critic's are apart.
		t.Fatalf("critic tokens %d, planner tokens %d; want 30 and 30", run.GetCriticTokens(), run.GetUsage().GetTokens())
	}
	// The critic's events are inputs to a replay, like planner answers:
	// the engine decides the rest of the log as recorded.
	res, err := engine.Replay(t.Context(), watchAll(t, r.client, id, 0), engine.ReplayConfig{Tools: toolSpecs()})
	if err != nil || res.Divergence != nil {
		t.Fatalf("replay: %v, divergence %+v", err, res.Divergence)
	}
}

func TestModelCriticEscalates(t *testing.T) {
	h, r := setup(t, func(c *engine.Config) {
		withCritic(1000)(c)
		c.Critic.Escalate = true
	})
	h.planner.setCritic(verdictOn)
	id := h.runGoal(t, r, "critic escalates", always(step("a", "test.echo", map[string]any{"value": "wrong"})))
	run := waitTerminal(t, r.client, id, 20*time.Second)
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_ESCALATED || !strings.Contains(run.GetStopMessage(), "the value is not the ticket count") {
		t.Fatalf("run %s %q, want ESCALATED with the verdict", run.GetStatus(), run.GetStopMessage())
	}
}

func TestModelCriticBudgetExhausted(t *testing.T) {
	h, r := setup(t, withCritic(15))
	h.planner.setCritic(verdictOn)
	id := h.runGoal(t, r, "critic budget", always(
		step("a", "test.echo", map[string]any{"value": "1"}),
		step("b", "test.echo", map[string]any{"value": "2"}, "a"),
		step("c", "test.echo", map[string]any{"value": "3"}, "b"),
	))
	run := succeeded(t, r, id)
	if n := len(h.planner.critiqueRequests(id)); n != 1 {
		t.Fatalf("critic asked %d times, want once (its budget of 15 tokens is spent by the first call)", n)
	}
	_, verdicts := critiqueEvents(t, r, id)
	if len(verdicts) != 3 || verdicts[0].GetAction() != "pass" {
		t.Fatalf("verdicts %v", verdicts)
	}
	for _, v := range verdicts[1:] {
		if !v.GetPassed() || v.GetAction() != "skipped" || !strings.Contains(v.GetReason(), "token budget is spent (15 of 15 tokens") {
			t.Fatalf("verdict %v, want a skipped one naming the budget", v)
		}
	}
	if run.GetCriticTokens() != 15 {
		t.Fatalf("critic tokens %d, want 15", run.GetCriticTokens())
	}
}

// TestModelCriticSurvivesReplicaCrash kills the replica that judges a
// result between the CritiquePending event and the verdict: right after
// the append (before the critique kick is out) and during the critic call.
// Another replica asks the critic again and the run completes, with one
// verdict.
func TestModelCriticSurvivesReplicaCrash(t *testing.T) {
	t.Run("after the pending append", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		var victim *replica
		var once sync.Once
		crashed := make(chan struct{})
		a := h.startReplica(withCritic(1000), func(c *engine.Config) {
			c.Hooks.AfterAppend = func(_ string, evs []*planexv1.RunEvent) {
				for _, ev := range evs {
					if ev.GetCritiquePending() != nil {
						once.Do(func() {
							victim.nc.Close() // kill -9: the kick is never published
							close(crashed)
						})
					}
				}
			}
		})
		victim = a
		h.planner.setCritic(verdictOn)
		h.planner.on("critic crash 1", always(step("a", "test.echo", map[string]any{"value": "1"})))
		id := start(t, a.client, &planexv1.StartRunRequest{Goal: "critic crash 1"})
		select {
		case <-crashed:
		case <-time.After(15 * time.Second):
			t.Fatal("the replica never appended a CritiquePending")
		}
		if n := len(h.planner.critiqueRequests(id)); n != 0 {
			t.Fatalf("the critic was asked %d times before the crash", n)
		}
		a.kill()
		b := h.startReplica(withCritic(1000))
		succeeded(t, b, id)
		_, verdicts := critiqueEvents(t, b, id)
		if len(verdicts) != 1 || !verdicts[0].GetPassed() || len(h.planner.critiqueRequests(id)) != 1 {
			t.Fatalf("verdicts %v after %d critic calls", verdicts, len(h.planner.critiqueRequests(id)))
		}
	})
	t.Run("during the critic call", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		a := h.startReplica(withCritic(1000))
		asked, release := make(chan struct{}), make(chan struct{})
		h.planner.setCritic(func(n int, req *planexv1.CritiqueRequest) (*planexv1.CritiqueResponse, error) {
			if n == 0 {
				close(asked)
				<-release // the first replica dies while it waits for the verdict
			}
			return verdictOn(n, req)
		})
		h.planner.on("critic crash 2", always(step("a", "test.echo", map[string]any{"value": "1"})))
		id := start(t, a.client, &planexv1.StartRunRequest{Goal: "critic crash 2"})
		select {
		case <-asked:
		case <-time.After(15 * time.Second):
			t.Fatal("the critic was never asked")
		}
		a.nc.Close() // kill -9 while the call is out
		close(release)
		a.kill()
		b := h.startReplica(withCritic(1000))
		succeeded(t, b, id)
		_, verdicts := critiqueEvents(t, b, id)
		if n := len(h.planner.critiqueRequests(id)); len(verdicts) != 1 || !verdicts[0].GetPassed() || n != 2 {
			t.Fatalf("verdicts %v after %d critic calls; want one verdict after the critic was asked again", verdicts, n)
		}
	})
}

// TestModelCriticWhileReplanning judges a result while a parallel step's
// failure sends the run back to the planner: the planning round still
// happens, once, and the judged step keeps its result.
func TestModelCriticWhileReplanning(t *testing.T) {
	h, r := setup(t, withCritic(1000))
	var id string
	var idMu sync.Mutex
	h.planner.setCritic(func(n int, req *planexv1.CritiqueRequest) (*planexv1.CritiqueResponse, error) {
		if req.GetStepId() == "a" {
			// Judge a only once b failed and the run replans.
			idMu.Lock()
			runID := id
			idMu.Unlock()
			waitRun(t, r.client, runID, 15*time.Second, "replanning", func(run *planexv1.Run) bool {
				return run.GetUsage().GetReplans() == 1
			})
		}
		return verdictOn(n, req)
	})
	idMu.Lock()
	id = h.runGoal(t, r, "critic while replanning", sequence(
		planOf(step("a", "test.echo", map[string]any{"value": "1"}), noRetry(step("b", "test.fail", map[string]any{"message": "boom"}))),
		planOf(step("a", "test.echo", map[string]any{"value": "1"}), step("c", "test.echo", map[string]any{"value": "2"}, "a")),
	))
	idMu.Unlock()
	run := succeeded(t, r, id)
	if n := len(h.planner.requests(id)); n != 2 || run.GetUsage().GetReplans() != 1 {
		t.Fatalf("planner calls %d, replans %d; want 2 and 1", n, run.GetUsage().GetReplans())
	}
}
