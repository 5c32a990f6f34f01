package plannertest

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/plan"
	"github.com/planex-dev/planex/services/planner/llm"
	"github.com/planex-dev/planex/services/planner/prompt"
)

// Validate is the validator the planner server applies, for tests.
func Validate(req *planexv1.PlanRequest, p *planexv1.Plan) error {
	return plan.Validate(p, plan.NewCatalog(req.GetTools()), plan.DefaultLimits())
}

// Step is one step of a fake model answer.
type Step struct {
	ID        string
	Tool      string
	Args      map[string]any
	DependsOn []string
	Expect    string
}

// Answer renders a model answer with the given steps, in the answer
// schema; with argsAsString the arguments are JSON strings, as OpenAI's
// strict mode makes them.
func Answer(argsAsString bool, steps ...Step) string {
	out := map[string]any{
		"rationale": "count the open tickets", "confidence": 0.9, "stop": false, "escalate": false,
		"stop_message": "", "final_answer": "", "answer": "", "steps": []any{},
	}
	var list []any
	for _, s := range steps {
		var args any = s.Args
		if argsAsString {
			data, err := json.Marshal(s.Args)
			if err != nil {
				panic(err)
			}
			args = string(data)
		}
		deps := s.DependsOn
		if deps == nil {
			deps = []string{}
		}
		list = append(list, map[string]any{"id": s.ID, "description": "step " + s.ID, "tool": s.Tool, "args": args, "depends_on": deps, "expect": s.Expect})
	}
	if list != nil {
		out["steps"] = list
	}
	data, err := json.Marshal(out)
	if err != nil {
		panic(err)
	}
	return string(data)
}

// CountStep is a valid sql.query step.
var CountStep = Step{ID: "count", Tool: "sql.query", Args: map[string]any{"sql": "SELECT count(*) FROM support_tickets WHERE status = 'open'"}, Expect: "output.row_count == 1"}

// ProviderOptions are what the suite varies in a provider's config.
type ProviderOptions struct {
	MaxRetries    int
	CallTimeout   time.Duration
	RetryBudget   time.Duration
	MaxRetryAfter time.Duration
	Temperature   *float64
}

// Provider configuration the suite uses; CheckRequest can expect it.
const (
	SuiteModel  = "test-model"
	SuiteAPIKey = "sk-test"
)

// Harness adapts the provider suite to one provider's wire format.
type Harness struct {
	// Backend name.
	Name string
	// Path the provider must post to.
	Path string
	// ArgsAsString says whether answers carry args as JSON strings.
	ArgsAsString bool
	// MaxTokensField is the request field capping the answer.
	MaxTokensField string
	// BasePath is appended to the fake's URL to form the base URL.
	BasePath string
	// New builds the provider.
	New func(llm.ProviderConfig) llm.Provider
	// Answer wraps an answer (the round-th of the conversation) in a reply.
	Answer func(round int, answer string) Reply
	// Refusal is a refusal reply.
	Refusal func(text string) Reply
	// Truncated is an answer (the round-th of the conversation) cut off at
	// the output cap; partial is the answer as far as the model got.
	Truncated func(round int, partial string) Reply
	// Error is an error reply.
	Error func(code int, headers map[string]string, detail string) Reply
	// CheckRequest asserts the first request of a conversation: model,
	// schema, messages, temperature, key.
	CheckRequest func(t *testing.T, r Request, goal string)
	// RepairText asserts the shape of a repair request, whose previous
	// answer was bad, and returns the repair message it carries.
	RepairText func(t *testing.T, r Request, bad string) string
}

func firstRequest(tools []*planexv1.ToolSpec) *planexv1.PlanRequest {
	return &planexv1.PlanRequest{RunId: "run-1", Goal: "How many open support tickets are there?", Tools: tools, Revision: 3}
}

// RunProviderSuite runs the acceptance scenarios against a provider
// through the real llm backend and a fake server speaking the provider's
// wire format.
func RunProviderSuite(t *testing.T, h Harness) {
	tools := Catalog(t)
	valid := Answer(h.ArgsAsString, CountStep)
	backend := func(t *testing.T, f *Fake, o ProviderOptions) *llm.Backend {
		temp := 0.1
		if o.Temperature != nil {
			temp = *o.Temperature
		}
		p := h.New(llm.ProviderConfig{BaseURL: f.URL + h.BasePath, APIKey: SuiteAPIKey, Model: SuiteModel, Temperature: &temp,
			MaxRetries: o.MaxRetries, CallTimeout: o.CallTimeout, RetryBudget: o.RetryBudget, MaxRetryAfter: o.MaxRetryAfter})
		b, err := llm.New(p, llm.Options{Name: h.Name, Model: SuiteModel, Validate: Validate})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	wantUsage := func(t *testing.T, u *planexv1.TokenUsage, calls int64) {
		t.Helper()
		if u.GetInputTokens() != calls*FakeInputTokens || u.GetOutputTokens() != calls*FakeOutputTokens {
			t.Errorf("usage = %v, want %d calls' worth", u, calls)
		}
	}

	t.Run("valid plan", func(t *testing.T) {
		f := NewFake(t, h.Answer(0, valid))
		req := firstRequest(tools)
		resp, err := backend(t, f, ProviderOptions{}).Plan(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		reqs := f.Requests()
		if len(reqs) != 1 || reqs[0].Path != h.Path {
			t.Fatalf("requests = %d to %v, want 1 to %s", len(reqs), pathsOf(reqs), h.Path)
		}
		h.CheckRequest(t, reqs[0], req.GetGoal())
		p := resp.GetPlan()
		if p.GetRevision() != 3 || len(p.GetSteps()) != 1 || p.GetSteps()[0].GetArgs().GetFields()["sql"].GetStringValue() != CountStep.Args["sql"] {
			t.Errorf("plan = %v", p)
		}
		if resp.GetBackend() != h.Name || !strings.HasSuffix(resp.GetModel(), "-2025") || resp.GetPromptVersion() != prompt.Version || resp.GetStop() {
			t.Errorf("response = backend %q model %q prompt %q stop %v", resp.GetBackend(), resp.GetModel(), resp.GetPromptVersion(), resp.GetStop())
		}
		wantUsage(t, resp.GetUsage(), 1)
	})

	magic := Answer(h.ArgsAsString, Step{ID: "magic", Tool: "sql.magic", Args: map[string]any{"x": 1}})
	repairs := []struct {
		name          string
		first, second string
		repair        string // what the repair message must quote
		fails         bool   // the second answer is still invalid
	}{
		{"malformed JSON then a repaired plan", `{"rationale": "x", "steps": [{"id": "count"`, valid, "not a valid JSON object", false},
		{"unknown tool is repaired once then an error", magic, magic, `"sql.magic"`, true},
		{"cycle is repaired", Answer(h.ArgsAsString,
			Step{ID: "a", Tool: "sql.query", Args: map[string]any{"sql": "SELECT 1"}, DependsOn: []string{"b"}},
			Step{ID: "b", Tool: "sql.query", Args: map[string]any{"sql": "SELECT 2"}, DependsOn: []string{"a"}}), valid, "a -> b -> a", false},
	}
	for _, tc := range repairs {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFake(t, h.Answer(0, tc.first), h.Answer(1, tc.second))
			resp, err := backend(t, f, ProviderOptions{}).Plan(context.Background(), firstRequest(tools))
			reqs := f.Requests()
			if len(reqs) != 2 {
				t.Fatalf("%d requests, want exactly 2 (one repair)", len(reqs))
			}
			if repair := h.RepairText(t, reqs[1], tc.first); !strings.Contains(repair, tc.repair) {
				t.Errorf("repair message does not quote %q:\n%s", tc.repair, repair)
			}
			var ie *llm.InvalidAnswerError
			switch {
			case tc.fails && (!errors.Is(err, llm.ErrInvalidAnswer) || !errors.As(err, &ie) || !strings.Contains(err.Error(), tc.repair)):
				t.Fatalf("err = %v, want ErrInvalidAnswer quoting %s", err, tc.repair)
			case tc.fails:
				wantUsage(t, llm.UsageOf(err), 2)
			case err != nil:
				t.Fatal(err)
			default:
				if len(resp.GetPlan().GetSteps()) != 1 {
					t.Errorf("plan = %v", resp.GetPlan())
				}
				wantUsage(t, resp.GetUsage(), 2)
			}
		})
	}

	t.Run("429 with Retry-After then success", func(t *testing.T) {
		f := NewFake(t, h.Error(http.StatusTooManyRequests, map[string]string{"Retry-After": "1"}, "rate limited"), h.Answer(0, valid))
		if _, err := backend(t, f, ProviderOptions{MaxRetries: 2}).Plan(context.Background(), firstRequest(tools)); err != nil {
			t.Fatal(err)
		}
		reqs := f.Requests()
		if len(reqs) != 2 {
			t.Fatalf("%d requests, want 2", len(reqs))
		}
		if gap := reqs[1].At.Sub(reqs[0].At); gap < time.Second {
			t.Errorf("retried after %s, want at least the 1s of Retry-After", gap)
		}
	})

	t.Run("500 storm ends in a clear error", func(t *testing.T) {
		f := NewFake(t, h.Error(http.StatusInternalServerError, map[string]string{"Retry-After-Ms": "5"}, "upstream overloaded, request key "+SuiteAPIKey))
		_, err := backend(t, f, ProviderOptions{MaxRetries: 2}).Plan(context.Background(), firstRequest(tools))
		var pe *llm.ProviderError
		var ex *llm.ExhaustedError
		if !errors.Is(err, llm.ErrUnavailable) || !errors.As(err, &pe) || pe.StatusCode != http.StatusInternalServerError || !errors.As(err, &ex) {
			t.Fatalf("err = %v, want an ExhaustedError wrapping ErrUnavailable with HTTP 500", err)
		}
		if n := len(f.Requests()); n != 3 || ex.Attempts != 3 {
			t.Errorf("%d attempts (error says %d), want 1 + 2 retries", n, ex.Attempts)
		}
		pub := ex.Public()
		if !strings.Contains(pub, h.Name+": HTTP 500 Internal Server Error") || !strings.Contains(pub, "upstream overloaded") || !strings.Contains(pub, "gave up after 3 attempts") {
			t.Errorf("public message %q, want the status, the provider's message and the attempts", pub)
		}
		if strings.Contains(pub, SuiteAPIKey) || strings.Contains(err.Error(), SuiteAPIKey) {
			t.Errorf("the API key leaks: %q", pub)
		}
	})

	t.Run("Retry-After beyond the maximum fails fast", func(t *testing.T) {
		f := NewFake(t, h.Error(http.StatusTooManyRequests, map[string]string{"Retry-After": "180"}, "rate limited"), h.Answer(0, valid))
		_, err := backend(t, f, ProviderOptions{MaxRetries: 3, MaxRetryAfter: 5 * time.Second}).Plan(context.Background(), firstRequest(tools))
		var ex *llm.ExhaustedError
		if !errors.As(err, &ex) || !strings.Contains(ex.Reason, "retry after 3m0s") || !strings.Contains(ex.Public(), "HTTP 429") {
			t.Fatalf("err = %v, want an ExhaustedError naming the 3m0s Retry-After", err)
		}
		if n := len(f.Requests()); n != 1 {
			t.Errorf("%d requests, want 1: the call must not wait 180s nor retry early", n)
		}
	})

	t.Run("the retry budget bounds an always-failing provider", func(t *testing.T) {
		f := NewFake(t, h.Error(http.StatusInternalServerError, nil, "always failing"))
		_, err := backend(t, f, ProviderOptions{MaxRetries: 10, RetryBudget: 1500 * time.Millisecond}).Plan(context.Background(), firstRequest(tools))
		var ex *llm.ExhaustedError
		if !errors.As(err, &ex) || !strings.Contains(ex.Reason, "retry budget") {
			t.Fatalf("err = %v, want an ExhaustedError for the spent retry budget", err)
		}
		if ex.Elapsed > 1500*time.Millisecond || ex.Attempts >= 11 || ex.Attempts != len(f.Requests()) {
			t.Errorf("gave up after %d attempts (%d requests) in %s, want fewer than 11 within the 1.5s budget", ex.Attempts, len(f.Requests()), ex.Elapsed)
		}
	})

	t.Run("the caller's deadline bounds retries", func(t *testing.T) {
		f := NewFake(t, Hang())
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := backend(t, f, ProviderOptions{MaxRetries: 5, CallTimeout: time.Minute}).Plan(ctx, firstRequest(tools))
		var ex *llm.ExhaustedError
		if !errors.As(err, &ex) || !errors.Is(err, llm.ErrTimeout) || ctx.Err() != nil {
			t.Fatalf("err = %v (caller's ctx %v), want an ExhaustedError timeout before the caller's deadline", err, ctx.Err())
		}
	})

	t.Run("the fake refuses what the provider refuses", func(t *testing.T) {
		f := NewFake(t, h.Answer(0, valid))
		hot := 2.5
		_, err := backend(t, f, ProviderOptions{MaxRetries: 3, Temperature: &hot}).Plan(context.Background(), firstRequest(tools))
		var pe *llm.ProviderError
		if !errors.Is(err, llm.ErrRejected) || !errors.As(err, &pe) || pe.StatusCode != http.StatusBadRequest || !strings.Contains(pe.Public(), "temperature") {
			t.Fatalf("temperature 2.5: %v, want a 400 naming temperature", err)
		}
		if len(f.Requests()) != 1 {
			t.Errorf("a 400 was retried: %d requests", len(f.Requests()))
		}
	})

	t.Run("401 is not retried", func(t *testing.T) {
		f := NewFake(t, h.Error(http.StatusUnauthorized, nil, "invalid x-api-key"))
		_, err := backend(t, f, ProviderOptions{MaxRetries: 3}).Plan(context.Background(), firstRequest(tools))
		if !errors.Is(err, llm.ErrRejected) || len(f.Requests()) != 1 {
			t.Fatalf("err = %v after %d requests, want ErrRejected after 1", err, len(f.Requests()))
		}
	})

	t.Run("timeout", func(t *testing.T) {
		f := NewFake(t, Hang())
		start := time.Now()
		_, err := backend(t, f, ProviderOptions{CallTimeout: 300 * time.Millisecond}).Plan(context.Background(), firstRequest(tools))
		if !errors.Is(err, llm.ErrTimeout) {
			t.Fatalf("err = %v, want ErrTimeout", err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("gave up after %s", d)
		}
	})

	t.Run("caller cancellation is not a timeout", func(t *testing.T) {
		f := NewFake(t, Hang())
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			for len(f.Requests()) == 0 && ctx.Err() == nil {
				time.Sleep(5 * time.Millisecond)
			}
			cancel()
		}()
		_, err := backend(t, f, ProviderOptions{MaxRetries: 3, CallTimeout: time.Minute}).Plan(ctx, firstRequest(tools))
		if !errors.Is(err, context.Canceled) || errors.Is(err, llm.ErrTimeout) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	})

	t.Run("refusal escalates", func(t *testing.T) {
		f := NewFake(t, h.Refusal("I can't help with planning that."))
		resp, err := backend(t, f, ProviderOptions{}).Plan(context.Background(), firstRequest(tools))
		if err != nil {
			t.Fatal(err)
		}
		if !resp.GetStop() || !resp.GetEscalate() || resp.GetPlan() != nil || !strings.Contains(resp.GetStopMessage(), "refused to plan: I can't help with planning that.") {
			t.Errorf("response = %v", resp)
		}
		wantUsage(t, resp.GetUsage(), 1)
		if len(f.Requests()) != 1 {
			t.Errorf("%d requests, want no repair after a refusal", len(f.Requests()))
		}
	})

	t.Run("an answer always cut at the output cap is a final error naming the flag", func(t *testing.T) {
		partial := `{"rationale": "count the open tickets by status, then", "confidence": 0.9, "stop": false`
		f := NewFake(t, h.Truncated(0, partial), h.Truncated(1, partial))
		_, err := backend(t, f, ProviderOptions{}).Plan(context.Background(), firstRequest(tools))
		reqs := f.Requests()
		if len(reqs) != 2 {
			t.Fatalf("%d requests, want 2: the cut answer, one retry asking for a shorter one, then give up", len(reqs))
		}
		if repair := h.RepairText(t, reqs[1], partial); !strings.Contains(repair, "cut off at the output token limit") {
			t.Errorf("the retry does not say the answer was cut off:\n%s", repair)
		}
		var te *llm.TruncatedError
		if !errors.Is(err, llm.ErrTruncated) || !errors.As(err, &te) || errors.Is(err, llm.ErrInvalidAnswer) || errors.Is(err, llm.ErrBudget) {
			t.Fatalf("err = %v, want a TruncatedError (not an invalid answer to replan, not the budget)", err)
		}
		if msg := err.Error(); !strings.Contains(msg, "--planner-max-output-tokens (now 4096)") || !strings.Contains(msg, "(4096 tokens, --planner-max-output-tokens) twice") {
			t.Errorf("message %q does not name the flag and its value", msg)
		}
		wantUsage(t, llm.UsageOf(err), 2)
	})

	t.Run("an answer cut once is repaired", func(t *testing.T) {
		f := NewFake(t, h.Truncated(0, `{"rationale": "count the open tickets", "confidence": 0.9`), h.Answer(1, valid))
		resp, err := backend(t, f, ProviderOptions{}).Plan(context.Background(), firstRequest(tools))
		if err != nil || len(resp.GetPlan().GetSteps()) != 1 {
			t.Fatalf("resp %v, err %v; want the repaired plan", resp, err)
		}
	})

	t.Run("an answer cut at what the budget allows is the budget", func(t *testing.T) {
		partial := `{"rationale": "count the open tickets by status, then", "confidence": 0.9`
		f := NewFake(t, h.Truncated(0, partial))
		req := firstRequest(tools)
		est := llm.EstimateTokens(llm.Call{System: prompt.System(), Turns: []llm.Turn{{Text: prompt.User(req, nil)}}, Tools: tools})
		req.Constraints = &planexv1.PlanConstraints{RemainingTokens: est + 2000}
		_, err := backend(t, f, ProviderOptions{}).Plan(context.Background(), req)
		var te *llm.TruncatedError
		if !errors.As(err, &te) || !errors.Is(err, llm.ErrBudget) || te.Cap >= 4096 || !strings.Contains(err.Error(), "remaining token budget") {
			t.Fatalf("err = %v, want a TruncatedError that is ErrBudget (cap below 4096)", err)
		}
	})

	t.Run("budget", func(t *testing.T) {
		f := NewFake(t, h.Answer(0, valid))
		req := firstRequest(tools)
		req.Constraints = &planexv1.PlanConstraints{RemainingTokens: 500}
		_, err := backend(t, f, ProviderOptions{}).Plan(context.Background(), req)
		if !errors.Is(err, llm.ErrBudget) || len(f.Requests()) != 0 {
			t.Fatalf("err = %v after %d requests, want ErrBudget before any call", err, len(f.Requests()))
		}
		est := llm.EstimateTokens(llm.Call{System: prompt.System(), Turns: []llm.Turn{{Text: prompt.User(req, nil)}}, Tools: tools})
		req.Constraints.RemainingTokens = est + 1000
		if _, err := backend(t, f, ProviderOptions{}).Plan(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		got, _ := f.Requests()[0].Body[h.MaxTokensField].(float64)
		if got <= 0 || int64(got) > 1000 {
			t.Errorf("%s = %v, want the answer capped by the remaining budget (<= 1000)", h.MaxTokensField, got)
		}
	})
}

func pathsOf(reqs []Request) []string {
	var p []string
	for _, r := range reqs {
		p = append(p, r.Path)
	}
	return p
}
