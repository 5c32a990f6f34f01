package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// Human input over MCP (docs/human-input.md): the answer_input tool
// answers the question a human.input step asks, and start_run, when the
// client supports elicitation, asks the client's user for the answer
// itself (with the step's schema) and follows the run on.

type answerInputIn struct {
	RunID  string `json:"run_id" jsonschema:"the run waiting for an answer"`
	GateID string `json:"gate_id,omitempty" jsonschema:"the input gate (run.gates[].id) or its step id; empty: the run's only open input gate"`
	Answer any    `json:"answer" jsonschema:"the answer: any JSON value valid against the gate's schema (run.gates[].input.schema)"`
}

// maxElicitations bounds how often start_run asks for the answer to one
// gate (a refused answer is asked again with the schema's message).
const maxElicitations = 3

func (m *server) addInputTools(s *mcp.Server) {
	no := false
	mcp.AddTool(s, &mcp.Tool{Name: "answer_input", Description: "Answer the question a human.input step of a waiting run asks (run.gates[].input: question, JSON schema, choices). " +
		"The answer must be valid against the schema; a wrong one is refused with the schema's message and the run keeps waiting. To refuse to answer, reject the gate with decide.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &no}}, m.answerInput)
}

func (m *server) answerInput(ctx context.Context, _ *mcp.CallToolRequest, in answerInputIn) (*mcp.CallToolResult, any, error) {
	answer, err := structpb.NewValue(in.Answer)
	if err != nil {
		return nil, nil, fmt.Errorf("answer: %w", err)
	}
	got, err := m.client.GetRun(ctx, &planexv1.GetRunRequest{RunId: in.RunID})
	if err != nil {
		return nil, nil, m.opts.Error(err)
	}
	var gate *planexv1.Gate
	for _, g := range openInputGates(got.GetRun()) {
		if in.GateID == "" || g.GetId() == in.GateID || g.GetStepId() == in.GateID {
			if gate != nil {
				return nil, nil, fmt.Errorf("gate_id: run %s asks more than one question; name the gate", in.RunID)
			}
			gate = g
		}
	}
	if gate == nil {
		return nil, nil, fmt.Errorf("gate_id: run %s has no open input gate %q", in.RunID, in.GateID)
	}
	resp, err := m.client.Decide(ctx, &planexv1.DecideRequest{RunId: in.RunID, GateId: gate.GetId(), Answer: answer, Actor: m.opts.Actor})
	if err != nil {
		return nil, nil, m.opts.Error(err)
	}
	return result(resp.GetRun())
}

// openInputGates are the run's undecided input gates whose step waits.
func openInputGates(run *planexv1.Run) []*planexv1.Gate {
	waiting := map[string]bool{}
	for _, st := range run.GetSteps() {
		if st.GetStatus() == planexv1.StepStatus_STEP_STATUS_WAITING_APPROVAL {
			waiting[st.GetStepId()] = true
		}
	}
	var out []*planexv1.Gate
	for _, g := range run.GetGates() {
		if g.GetKind() == planexv1.GateKind_GATE_KIND_INPUT && g.GetDecision() == planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED && waiting[g.GetStepId()] {
			out = append(out, g)
		}
	}
	return out
}

// multiRoundTrip is the first MCP protocol version that forbids a server
// to send an elicitation request while it serves a tool call (SEP-2322:
// the tool returns its input requests instead, which this server does not
// do yet): a client on it answers with answer_input.
const multiRoundTrip = "2026-07-28"

// canElicit reports whether the client of req declared elicitation, on a
// protocol version that lets a tool call elicit.
func canElicit(req *mcp.CallToolRequest) bool {
	if req == nil || req.Session == nil {
		return false
	}
	p := req.Session.InitializeParams()
	return p != nil && p.Capabilities != nil && p.Capabilities.Elicitation != nil && p.ProtocolVersion < multiRoundTrip
}

// followAnswering is follow and, while the run waits at input gates and
// the client supports elicitation, asks the client's user for each
// answer and follows the run on. A question the user declines stays open
// (the run is returned waiting).
func (m *server) followAnswering(ctx context.Context, req *mcp.CallToolRequest, id string) (*planexv1.Run, error) {
	run, err := m.follow(ctx, req, id)
	asked := map[string]bool{}
	for err == nil && canElicit(req) && run.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING {
		var next *planexv1.Gate
		for _, g := range openInputGates(run) {
			if !asked[g.GetId()] {
				next = g
				break
			}
		}
		if next == nil {
			return run, nil
		}
		asked[next.GetId()] = true
		answered, eerr := m.elicit(ctx, req, id, next)
		if eerr != nil || !answered {
			return run, eerr
		}
		seen := map[string]bool{}
		for _, g := range run.GetGates() {
			seen[g.GetId()] = true
		}
		run, err = m.waitPast(ctx, id, seen)
	}
	return run, err
}

// elicit asks the client's user the question of gate g until an answer
// is accepted (true), the user declines or cancels (false), or
// maxElicitations answers were refused.
func (m *server) elicit(ctx context.Context, req *mcp.CallToolRequest, runID string, g *planexv1.Gate) (bool, error) {
	schema, wrapped := elicitSchema(g.GetInput())
	msg := g.GetInput().GetQuestion()
	for range maxElicitations {
		res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Mode: "form", Message: msg, RequestedSchema: schema})
		if err != nil {
			return false, fmt.Errorf("ask the answer to gate %s: %w", g.GetId(), err)
		}
		if res.Action != "accept" {
			return false, nil
		}
		answer, err := answerOf(res.Content, wrapped)
		if err == nil {
			_, err = m.client.Decide(ctx, &planexv1.DecideRequest{RunId: runID, GateId: g.GetId(), Answer: answer, Actor: m.opts.Actor})
			if err == nil {
				return true, nil
			}
			if status.Code(err) != codes.InvalidArgument {
				return false, m.opts.Error(err)
			}
			err = fmt.Errorf("%s", status.Convert(err).Message())
		}
		msg = fmt.Sprintf("%s\n(The previous answer was refused: %v)", g.GetInput().GetQuestion(), err)
	}
	return false, fmt.Errorf("gate %s: %d answers were refused; answer it with answer_input", g.GetId(), maxElicitations)
}

// elicitSchema is the form schema to ask the answer with: the gate's
// schema when it is an object of flat properties (what MCP forms allow),
// else one property "answer" (the schema itself when it is a primitive,
// JSON text otherwise); wrapped says the answer is that property.
func elicitSchema(in *planexv1.HumanInput) (schema any, wrapped bool) {
	s := in.GetSchema().AsMap()
	if s["type"] == "object" {
		flat := true
		props, _ := s["properties"].(map[string]any)
		for _, p := range props {
			pm, _ := p.(map[string]any)
			if !primitive(pm) {
				flat = false
			}
		}
		if flat && len(props) > 0 {
			return s, false
		}
	}
	prop := s
	if !primitive(s) {
		b, _ := json.Marshal(s)
		prop = map[string]any{"type": "string", "description": "the answer as JSON matching " + string(b)}
	}
	return map[string]any{"type": "object", "properties": map[string]any{"answer": prop}, "required": []any{"answer"}}, true
}

func primitive(s map[string]any) bool {
	switch s["type"] {
	case "string", "number", "integer", "boolean":
		return true
	}
	return false
}

// answerOf reads the answer from an accepted form's content.
func answerOf(content map[string]any, wrapped bool) (*structpb.Value, error) {
	if !wrapped {
		return structpb.NewValue(content)
	}
	a, ok := content["answer"]
	if !ok {
		return nil, fmt.Errorf("answer: missing")
	}
	v, err := structpb.NewValue(a)
	if err != nil {
		return nil, err
	}
	return v, nil
}

// waitPast follows the run's events until it ends or opens a gate not in
// seen, and returns the run then.
func (m *server) waitPast(ctx context.Context, id string, seen map[string]bool) (*planexv1.Run, error) {
	err := m.watch(ctx, id, func(ev *planexv1.RunEvent) (bool, error) {
		g := ev.GetGateOpened().GetGate()
		return ev.GetFinished() != nil || (g != nil && !seen[g.GetId()]), nil
	})
	if err != nil {
		return nil, err
	}
	got, err := m.client.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
	if err != nil {
		return nil, m.opts.Error(err)
	}
	return got.GetRun(), nil
}
