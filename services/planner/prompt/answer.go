package prompt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// SchemaName names the answer schema (OpenAI json_schema name, Anthropic
// tool name).
const SchemaName = "submit_plan"

// ArgsEncoding says how the answer schema carries a step's arguments.
type ArgsEncoding int

const (
	// ArgsObject declares args as a JSON object, for APIs that accept free
	// form objects (Anthropic tool input).
	ArgsObject ArgsEncoding = iota
	// ArgsString declares args as a string holding a JSON object, for
	// strict structured output (OpenAI strict mode allows no free-form
	// objects).
	ArgsString
)

// Schema returns the JSON Schema of the answer. Every property is required
// and no other is allowed, as OpenAI's strict mode demands; tool names are
// limited to the catalog.
func Schema(tools []*planexv1.ToolSpec, enc ArgsEncoding) map[string]any {
	names := make([]any, 0, len(tools))
	for _, t := range tools {
		if !slices.Contains(names, any(t.GetName())) {
			names = append(names, t.GetName())
		}
	}
	tool := map[string]any{"type": "string", "description": "a tool name from the catalog"}
	if len(names) > 0 {
		tool["enum"] = names
	}
	args := map[string]any{"type": "object", "description": "the tool's arguments, valid for its argument schema"}
	if enc == ArgsString {
		args = map[string]any{"type": "string", "description": "the tool's arguments: a JSON object, valid for its argument schema, encoded as a string"}
	}
	str := func(desc string) map[string]any { return map[string]any{"type": "string", "description": desc} }
	step := map[string]any{
		"type":                 "object",
		"additionalProperties": false,
		"required":             []any{"id", "description", "tool", "args", "depends_on", "expect"},
		"properties": map[string]any{
			"id":          str("unique step id matching ^[a-z][a-z0-9_]{0,62}$"),
			"description": str("what the step is for"),
			"tool":        tool,
			"args":        args,
			"depends_on":  map[string]any{"type": "array", "items": map[string]any{"type": "string"}, "description": "ids of steps that must succeed first"},
			"expect":      str(`CEL boolean over output that must hold, or ""`),
		},
	}
	return map[string]any{
		"type":                 "object",
		"additionalProperties": false,
		"required":             []any{"rationale", "confidence", "stop", "escalate", "stop_message", "final_answer", "answer", "steps"},
		"properties": map[string]any{
			"rationale":    str("why these steps"),
			"confidence":   map[string]any{"type": "number", "description": "confidence in [0, 1] that the plan reaches the goal"},
			"stop":         map[string]any{"type": "boolean", "description": "true when the goal is met or you cannot proceed"},
			"escalate":     map[string]any{"type": "boolean", "description": "true when a human should take over"},
			"stop_message": str(`why you stop, or ""`),
			"final_answer": str(`the result for the user when the goal is met, or ""`),
			"answer":       str(`CEL expression over steps computing the run's result, or ""`),
			"steps":        map[string]any{"type": "array", "items": step},
		},
	}
}

// AnswerError lists why a model's answer could not be turned into a plan.
type AnswerError struct {
	// Problems, each naming the field at fault.
	Problems []string
}

// Error joins the problems.
func (e *AnswerError) Error() string {
	return "malformed answer: " + strings.Join(e.Problems, "; ")
}

type answer struct {
	Rationale   string          `json:"rationale"`
	Confidence  *float64        `json:"confidence"`
	Stop        bool            `json:"stop"`
	Escalate    bool            `json:"escalate"`
	StopMessage string          `json:"stop_message"`
	FinalAnswer json.RawMessage `json:"final_answer"`
	Answer      string          `json:"answer"`
	Steps       []answerStep    `json:"steps"`
}

type answerStep struct {
	ID          string          `json:"id"`
	Description string          `json:"description"`
	Tool        string          `json:"tool"`
	Args        json.RawMessage `json:"args"`
	DependsOn   []string        `json:"depends_on"`
	Expect      string          `json:"expect"`
}

// Parse turns a model's JSON answer into a plan response (plan, or stop
// with a final answer or an escalation). Fields the schema does not know
// are ignored; a Markdown code fence around the JSON is tolerated. Errors
// are [*AnswerError] values, fit to be sent back with [Repair]. The plan is
// not validated against the catalog here.
func Parse(text string) (*planexv1.PlanResponse, error) {
	raw := StripFence(text)
	if raw == "" {
		return nil, &AnswerError{Problems: []string{"the answer is empty; expected a JSON object"}}
	}
	var a answer
	dec := json.NewDecoder(strings.NewReader(raw))
	if err := dec.Decode(&a); err != nil {
		return nil, &AnswerError{Problems: []string{"the answer is not a valid JSON object: " + jsonProblem(err)}}
	}
	if dec.More() {
		return nil, &AnswerError{Problems: []string{"the answer has text after the JSON object"}}
	}
	resp := &planexv1.PlanResponse{}
	if a.Stop || a.Escalate {
		resp.Stop = true
		resp.Escalate = a.Escalate
		resp.StopMessage = strings.TrimSpace(a.StopMessage)
		if fa := finalAnswer(a.FinalAnswer); fa != nil {
			resp.FinalAnswer = fa
		}
		if resp.Escalate && resp.StopMessage == "" {
			resp.StopMessage = "the planner escalated without giving a reason"
		}
		if !resp.Escalate && resp.FinalAnswer == nil && resp.StopMessage == "" {
			return nil, &AnswerError{Problems: []string{"stop is true but final_answer and stop_message are empty; give the final answer, or escalate with a reason"}}
		}
		return resp, nil
	}
	var problems []string
	p := &planexv1.Plan{Rationale: strings.TrimSpace(a.Rationale), Answer: strings.TrimSpace(a.Answer)}
	switch {
	case a.Confidence == nil:
		problems = append(problems, "confidence: missing")
	case math.IsNaN(*a.Confidence) || *a.Confidence < 0 || *a.Confidence > 1:
		problems = append(problems, fmt.Sprintf("confidence: must be in [0, 1], got %v", *a.Confidence))
	default:
		p.Confidence = *a.Confidence
	}
	for i, s := range a.Steps {
		args, err := parseArgs(s.Args)
		if err != nil {
			problems = append(problems, fmt.Sprintf("steps[%d] (%q).args: %v", i, s.ID, err))
		}
		p.Steps = append(p.Steps, &planexv1.Step{
			Id:          strings.TrimSpace(s.ID),
			Description: strings.TrimSpace(s.Description),
			Tool:        strings.TrimSpace(s.Tool),
			Args:        args,
			DependsOn:   s.DependsOn,
			Expect:      strings.TrimSpace(s.Expect),
		})
	}
	if len(a.Steps) == 0 {
		problems = append(problems, "steps: empty while stop is false; return the steps, or stop")
	}
	if len(problems) > 0 {
		return nil, &AnswerError{Problems: problems}
	}
	resp.Plan = p
	return resp, nil
}

// StripFence returns a model's JSON answer without the Markdown code fence
// some models wrap it in ("```json … ```", "``` … ```", any info string
// after the opening backticks) and without surrounding space. Text without
// a fence is returned trimmed. Every structured answer (plan, verdict) is
// read through it, so that what the planner accepts the critic accepts.
func StripFence(text string) string {
	raw := strings.TrimSpace(text)
	if !strings.HasPrefix(raw, "```") {
		return raw
	}
	body := strings.TrimPrefix(raw, "```")
	// The info string ("json", "JSON", "jsonc") runs to the end of the
	// opening line; a one-line fence ("```{…}```") has none.
	if nl := strings.IndexByte(body, '\n'); nl >= 0 && !strings.ContainsAny(body[:nl], "{[\"") {
		body = body[nl+1:]
	} else {
		body = strings.TrimLeft(body, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
	}
	body = strings.TrimSpace(body)
	body = strings.TrimSuffix(body, "```")
	return strings.TrimSpace(body)
}

// parseArgs accepts an object, or a string holding one.
func parseArgs(raw json.RawMessage) (*structpb.Struct, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return &structpb.Struct{Fields: map[string]*structpb.Value{}}, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("not a JSON string: %s", jsonProblem(err))
		}
		s = strings.TrimSpace(s)
		if s == "" {
			return &structpb.Struct{Fields: map[string]*structpb.Value{}}, nil
		}
		raw = json.RawMessage(s)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("want a JSON object: %s", jsonProblem(err))
	}
	st, err := structpb.NewStruct(m)
	if err != nil {
		return nil, err
	}
	return st, nil
}

// finalAnswer keeps a string as text and any other JSON value as it is.
func finalAnswer(raw json.RawMessage) *structpb.Value {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) || bytes.Equal(raw, []byte(`""`)) {
		return nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil
	}
	val, err := structpb.NewValue(v)
	if err != nil {
		return nil
	}
	return val
}

func jsonProblem(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("%v (at byte %d)", se, se.Offset)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("field %s: got JSON %s, want %s", te.Field, te.Value, te.Type)
	}
	return err.Error()
}
