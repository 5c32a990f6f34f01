package llm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/planner/prompt"
)

// CritiqueSchemaName names the critic's answer (OpenAI json_schema name,
// Anthropic tool name).
const CritiqueSchemaName = "submit_verdict"

// maxCritiqueOutputBytes bounds the output shown to the critic; a longer
// one is cut and marked as such.
const maxCritiqueOutputBytes = 16 << 10

// maxReasonBytes bounds a verdict's reason.
const maxReasonBytes = 2000

// critiqueSystem is the critic's system prompt.
const critiqueSystem = `You are the critic of an AI agent platform. A planner split a goal into tool calls; an executor ran one of them and it succeeded technically. Judge whether its result is good enough for the run to move on towards the goal: it must be relevant to the goal and the step's description, plausible, and not empty, an error message or a placeholder. Do not judge style. Answer through the submit_verdict schema: verdict "pass" or "fail", and a short reason (one or two sentences) the planner can act on when you fail the result.`

var critiqueSchema = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"verdict": map[string]any{"type": "string", "enum": []any{"pass", "fail"}, "description": "pass when the result is good enough to move on"},
		"reason":  map[string]any{"type": "string", "description": "why; what is wrong when the verdict is fail"},
	},
	"required":             []any{"verdict", "reason"},
	"additionalProperties": false,
}

// Critique asks the model for a verdict on one step result. Like Plan, an
// invalid answer gets one repair round; a refusal is a failing verdict
// (the critic fails closed).
func (b *Backend) Critique(ctx context.Context, req *planexv1.CritiqueRequest) (*planexv1.CritiqueResponse, error) {
	call := Call{
		System: critiqueSystem,
		Turns:  []Turn{{Role: RoleUser, Text: critiquePrompt(req)}},
		Answer: &AnswerSchema{Name: CritiqueSchemaName, Description: "Submit the verdict on the step result.", Schema: critiqueSchema},
	}
	return ask(ctx, b, call, req.GetRemainingTokens(),
		func(reply Reply, model string, spent Usage) (*planexv1.CritiqueResponse, []string) {
			finish := func(resp *planexv1.CritiqueResponse) *planexv1.CritiqueResponse {
				resp.Backend, resp.Model = b.opts.Name, model
				resp.Usage = &planexv1.TokenUsage{InputTokens: spent.Input, OutputTokens: spent.Output}
				return resp
			}
			if reply.Refusal != "" {
				return finish(&planexv1.CritiqueResponse{Reason: "the critic model refused to judge the result: " + oneLine(reply.Refusal)}), nil
			}
			resp, problems := ParseVerdict(reply.Text)
			if problems == nil {
				return finish(resp), nil
			}
			if reply.Truncated {
				problems = append([]string{"the answer was cut off at the output token limit; keep the reason short"}, problems...)
			}
			return nil, problems
		},
		func(problems []string) string {
			return "Your verdict is invalid:\n- " + strings.Join(problems, "\n- ") + "\nAnswer again through submit_verdict."
		})
}

// ParseVerdict parses and validates a critic's answer: an object with
// exactly verdict ("pass" or "fail") and reason (required, at most 2000
// bytes, when the verdict is fail). Like a plan (prompt.Parse), the object
// may come in a Markdown code fence (prompt.StripFence). problems is nil
// when it is good.
func ParseVerdict(text string) (*planexv1.CritiqueResponse, []string) {
	var a struct {
		Verdict *string `json:"verdict"`
		Reason  *string `json:"reason"`
	}
	dec := json.NewDecoder(strings.NewReader(prompt.StripFence(text)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return nil, []string{fmt.Sprintf("the answer is not a verdict object: %v", err)}
	}
	var problems []string
	switch {
	case a.Verdict == nil:
		problems = append(problems, "verdict: required")
	case *a.Verdict != "pass" && *a.Verdict != "fail":
		problems = append(problems, fmt.Sprintf("verdict: %q, want pass or fail", *a.Verdict))
	}
	reason := ""
	if a.Reason != nil {
		reason = strings.TrimSpace(*a.Reason)
	}
	switch {
	case a.Reason == nil:
		problems = append(problems, "reason: required")
	case reason == "" && a.Verdict != nil && *a.Verdict == "fail":
		problems = append(problems, "reason: required when the verdict is fail")
	case len(reason) > maxReasonBytes:
		problems = append(problems, fmt.Sprintf("reason: %d bytes, limit is %d", len(reason), maxReasonBytes))
	}
	if problems != nil {
		return nil, problems
	}
	return &planexv1.CritiqueResponse{Passed: *a.Verdict == "pass", Reason: oneLine(reason)}, nil
}

// critiquePrompt renders what the critic judges.
func critiquePrompt(req *planexv1.CritiqueRequest) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Goal: %s\n\nStep %q (attempt %d): %s\n", req.GetGoal(), req.GetStepId(), req.GetAttempt(), req.GetDescription())
	t := req.GetTool()
	fmt.Fprintf(&b, "Tool: %s — %s\n", t.GetName(), t.GetDescription())
	if req.GetExpect() != "" {
		fmt.Fprintf(&b, "The step's expectation (it held): %s\n", req.GetExpect())
	}
	fmt.Fprintf(&b, "\nArguments:\n%s\n\nResult:\n%s\n", compactJSON(req.GetArgs()), compactJSON(req.GetOutput()))
	return b.String()
}

// compactJSON renders a message as one-line JSON ("null" when unset),
// cut at maxCritiqueOutputBytes.
func compactJSON(m proto.Message) string {
	if m == nil || !m.ProtoReflect().IsValid() {
		return "null"
	}
	b, err := protojson.MarshalOptions{}.Marshal(m)
	if err != nil {
		return fmt.Sprintf("(unprintable: %v)", err)
	}
	var out bytes.Buffer
	if json.Compact(&out, b) == nil {
		b = out.Bytes()
	}
	if len(b) > maxCritiqueOutputBytes {
		return string(b[:maxCritiqueOutputBytes]) + fmt.Sprintf(" … (cut: %d bytes in all)", len(b))
	}
	return string(b)
}
