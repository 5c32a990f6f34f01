package api

import (
	"context"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/redact"
)

// sensitiveMask hides the fields tools declare sensitive
// (ToolSpec.sensitive_fields: e-mail recipients and bodies, for example) in
// everything the API returns: runs, plans and WatchRun events. The run log
// keeps the real values because the engine needs them to repeat a dispatch
// after a crash; access to the PLANEX_EVENTS stream is an operator's, not a
// client's. Event hashes cover the stored payloads, so a client verifying
// the chain of a redacted event stream must use the stored log.
type sensitiveMask struct {
	// fields maps a tool name to its sensitive fields.
	fields map[string][]string
	// all hides every argument and output, used when the catalog cannot
	// be read (fail closed).
	all bool
}

func (s *Server) mask(ctx context.Context) sensitiveMask {
	m := sensitiveMask{fields: map[string][]string{}}
	if s.cfg.Tools == nil {
		return m
	}
	cat, err := s.cfg.Tools.Get(ctx)
	if err != nil {
		s.logger.WarnContext(ctx, "read tool catalog for redaction; hiding all arguments and outputs", "err", err)
		m.all = true
		return m
	}
	for _, spec := range cat.Specs() {
		if f := spec.GetSensitiveFields(); len(f) > 0 {
			m.fields[spec.GetName()] = f
		}
	}
	return m
}

func (m sensitiveMask) empty() bool { return !m.all && len(m.fields) == 0 }

func (m sensitiveMask) args(tool string, s *structpb.Struct) *structpb.Struct {
	if s == nil {
		return nil
	}
	if m.all {
		return &structpb.Struct{Fields: map[string]*structpb.Value{"redacted": structpb.NewStringValue(redact.Mask)}}
	}
	f, ok := m.fields[tool]
	if !ok {
		return s
	}
	return maskFields(s, f)
}

func (m sensitiveMask) value(tool string, v *structpb.Value) *structpb.Value {
	if v == nil {
		return nil
	}
	if m.all {
		return structpb.NewStringValue(redact.Mask)
	}
	f, ok := m.fields[tool]
	if !ok {
		return v
	}
	out, err := structpb.NewValue(fieldsOnly.Value(v.AsInterface(), f...))
	if err != nil {
		return structpb.NewStringValue(redact.Mask)
	}
	return out
}

// fieldsOnly masks sensitive fields without pattern redaction: clients see
// the addresses and text of non-sensitive fields as they are.
var fieldsOnly *redact.Redactor

// maskFields replaces whole values of the named fields (at any depth).
func maskFields(s *structpb.Struct, fields []string) *structpb.Struct {
	return fieldsOnly.Struct(s, fields...)
}

// run returns a copy of run with sensitive fields hidden.
func (m sensitiveMask) run(run *planexv1.Run) *planexv1.Run {
	if run == nil || m.empty() {
		return run
	}
	out := proto.Clone(run).(*planexv1.Run)
	for _, p := range out.GetPlans() {
		m.plan(p)
	}
	tools := map[string]bool{}
	for _, st := range out.GetSteps() {
		tools[st.GetTool()] = true
		st.ResolvedArgs = m.args(st.GetTool(), st.GetResolvedArgs())
		st.Output = m.value(st.GetTool(), st.GetOutput())
	}
	for _, p := range out.GetPlans() {
		for _, s := range p.GetSteps() {
			tools[s.GetTool()] = true
		}
	}
	out.Result = m.result(out.GetResult(), tools)
	return out
}

// result hides in a run's result every field that a tool of the run
// declares sensitive, at any depth: the result is built from step outputs
// (keyed by step id, or shaped by the plan's answer expression), so
// result.draft.to carries what step draft's output.to did.
func (m sensitiveMask) result(v *structpb.Value, tools map[string]bool) *structpb.Value {
	if v == nil {
		return nil
	}
	if m.all {
		return structpb.NewStringValue(redact.Mask)
	}
	var fields []string
	for tool := range tools {
		fields = append(fields, m.fields[tool]...)
	}
	if len(fields) == 0 {
		return v
	}
	out, err := structpb.NewValue(fieldsOnly.Value(v.AsInterface(), fields...))
	if err != nil {
		return structpb.NewStringValue(redact.Mask)
	}
	return out
}

func (m sensitiveMask) plan(p *planexv1.Plan) {
	for _, s := range p.GetSteps() {
		s.Args = m.args(s.GetTool(), s.GetArgs())
	}
}

// event returns a copy of ev with sensitive fields hidden; toolOf maps a
// step id to its tool.
func (m sensitiveMask) event(ev *planexv1.RunEvent, toolOf map[string]string) *planexv1.RunEvent {
	if m.empty() {
		return ev
	}
	switch p := ev.GetPayload().(type) {
	case *planexv1.RunEvent_PlanRevised:
		for _, s := range p.PlanRevised.GetPlan().GetSteps() {
			toolOf[s.GetId()] = s.GetTool()
		}
		out := proto.Clone(ev).(*planexv1.RunEvent)
		m.plan(out.GetPlanRevised().GetPlan())
		return out
	case *planexv1.RunEvent_StepDispatched:
		toolOf[p.StepDispatched.GetStepId()] = p.StepDispatched.GetTool()
		out := proto.Clone(ev).(*planexv1.RunEvent)
		d := out.GetStepDispatched()
		d.ResolvedArgs = m.args(d.GetTool(), d.GetResolvedArgs())
		return out
	case *planexv1.RunEvent_StepSucceeded:
		out := proto.Clone(ev).(*planexv1.RunEvent)
		s := out.GetStepSucceeded()
		s.Output = m.value(toolOf[s.GetStepId()], s.GetOutput())
		return out
	case *planexv1.RunEvent_Finished:
		if p.Finished.GetResult() == nil {
			return ev
		}
		tools := map[string]bool{}
		for _, tool := range toolOf {
			tools[tool] = true
		}
		out := proto.Clone(ev).(*planexv1.RunEvent)
		out.GetFinished().Result = m.result(out.GetFinished().GetResult(), tools)
		return out
	case *planexv1.RunEvent_GateDecided:
		if p.GateDecided.GetEditedArgs() == nil {
			return ev
		}
		out := proto.Clone(ev).(*planexv1.RunEvent)
		d := out.GetGateDecided()
		if m.all {
			d.EditedArgs = m.args("", d.GetEditedArgs())
			return out
		}
		// The event does not name the gated step's tool; hide every field
		// any tool declares sensitive.
		var all []string
		for _, f := range m.fields {
			all = append(all, f...)
		}
		d.EditedArgs = maskFields(d.GetEditedArgs(), all)
		return out
	}
	return ev
}
