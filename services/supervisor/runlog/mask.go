package runlog

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/redact"
)

// Mask hides the fields tools declare sensitive (ToolSpec.sensitive_fields:
// e-mail recipients and bodies, for example) in runs and run log events
// shown outside the engine: the supervisor API's answers and WatchRun
// events, and `planex runs export`. The run log itself keeps the real
// values, because the engine needs them to repeat a dispatch after a
// crash. The zero Mask (or nil) hides nothing.
type Mask struct {
	// fields maps a tool name to its sensitive fields.
	fields map[string][]string
	// all hides every argument, input, output and result: the mask of a
	// reader that could not read the tool catalog (fail closed).
	all bool
	// r also redacts strings by pattern (credentials); nil masks the
	// sensitive fields only.
	r *redact.Redactor
}

// NewMask masks the sensitive fields the specs declare; r, when not nil,
// also redacts the other strings by its patterns.
func NewMask(specs []*planexv1.ToolSpec, r *redact.Redactor) *Mask {
	m := &Mask{fields: map[string][]string{}, r: r}
	for _, s := range specs {
		if f := s.GetSensitiveFields(); len(f) > 0 {
			m.fields[s.GetName()] = f
		}
	}
	return m
}

// MaskAll hides every argument, input, output and result, for a reader
// that does not know which fields are sensitive.
func MaskAll() *Mask { return &Mask{all: true} }

// empty reports a mask that changes nothing.
func (m *Mask) empty() bool { return m == nil || !m.all && m.r == nil && len(m.fields) == 0 }

// everyField lists every field any tool declares sensitive.
func (m *Mask) everyField() []string {
	var all []string
	for _, f := range m.fields {
		all = append(all, f...)
	}
	return all
}

// Struct masks fields in s (nil stays nil).
func (m *Mask) Struct(s *structpb.Struct, fields ...string) *structpb.Struct {
	switch {
	case s == nil:
		return nil
	case m.all:
		return &structpb.Struct{Fields: map[string]*structpb.Value{"redacted": structpb.NewStringValue(redact.Mask)}}
	case m.r == nil && len(fields) == 0:
		return s
	}
	out := m.r.Struct(s, fields...)
	// Each value read next to its key too: {"password": "hunter22"}.
	out, _ = m.r.LeavesStruct(out)
	return out
}

// Value masks fields in v (nil stays nil).
func (m *Mask) Value(v *structpb.Value, fields ...string) *structpb.Value {
	switch {
	case v == nil:
		return nil
	case m.all:
		return structpb.NewStringValue(redact.Mask)
	case m.r == nil && len(fields) == 0:
		return v
	}
	out, err := structpb.NewValue(m.r.Value(v.AsInterface(), fields...))
	if err != nil {
		return structpb.NewStringValue(redact.Mask)
	}
	out, _ = m.r.LeavesValue(out)
	return out
}

// Args masks the arguments (or output fields) of a call of tool.
func (m *Mask) Args(tool string, s *structpb.Struct) *structpb.Struct {
	return m.Struct(s, m.fields[tool]...)
}

// resultOf masks in a run's result every field a tool of the run
// declares sensitive, at any depth: the result is built from step outputs
// (keyed by step id, or shaped by the plan's answer expression), so
// result.draft.to carries what step draft's output.to did.
func (m *Mask) resultOf(v *structpb.Value, tools map[string]bool) *structpb.Value {
	var fields []string
	for tool := range tools {
		fields = append(fields, m.fields[tool]...)
	}
	return m.Value(v, fields...)
}

func (m *Mask) plan(p *planexv1.Plan) {
	for _, s := range p.GetSteps() {
		s.Args = m.Args(s.GetTool(), s.GetArgs())
	}
}

// Run returns a copy of run with sensitive fields hidden (run itself when
// the mask hides nothing).
func (m *Mask) Run(run *planexv1.Run) *planexv1.Run {
	if run == nil || m.empty() {
		return run
	}
	out := proto.CloneOf(run)
	tools := map[string]bool{}
	for _, p := range out.GetPlans() {
		m.plan(p)
		for _, s := range p.GetSteps() {
			tools[s.GetTool()] = true
		}
	}
	for _, st := range out.GetSteps() {
		tools[st.GetTool()] = true
		st.ResolvedArgs = m.Args(st.GetTool(), st.GetResolvedArgs())
		st.Output = m.Value(st.GetOutput(), m.fields[st.GetTool()]...)
	}
	out.Inputs = m.Struct(out.GetInputs(), m.everyField()...)
	out.Result = m.resultOf(out.GetResult(), tools)
	for _, g := range out.GetGates() {
		m.gateInput(g)
	}
	return out
}

// gateInput masks what an input gate asks (it comes from the step's
// arguments) and its answer (the step's output).
func (m *Mask) gateInput(g *planexv1.Gate) {
	if in := g.GetInput(); in != nil {
		g.Answer = m.Value(g.GetAnswer(), m.fields[HumanInputTool]...)
		if m.all {
			g.Input = &planexv1.HumanInput{Question: redact.Mask}
		}
	}
}

// HumanInputTool is the name of the built-in tool whose steps open input
// gates (catalog.HumanInput).
const HumanInputTool = "human.input"

// Event returns a copy of ev with sensitive fields hidden, or ev itself
// when nothing in it is masked. Events of one run must be masked in order
// with the same toolOf (step id → tool), which the plans and dispatches
// fill: an output is masked per the tool of its step.
//
// A copy that masks something has no salt (see [Hash]): with the salt,
// its hash could be tested against guesses of the masked values.
func (m *Mask) Event(ev *planexv1.RunEvent, toolOf map[string]string) *planexv1.RunEvent {
	if m.empty() {
		return ev
	}
	out := m.event(ev, toolOf)
	if m.r != nil {
		// With patterns (the export), every text of the event is redacted
		// as well: step errors, messages, reasons, a goal recorded before
		// the API refused secrets in it.
		red := proto.CloneOf(out)
		if redactStrings(m.r, red.ProtoReflect()) {
			out = red
		}
	}
	if out != ev && eventSalt(out) != nil && !proto.Equal(out, ev) {
		stripSalt(out) // out is a copy
	}
	return out
}

// event masks the fields of ev that tools declare sensitive and, with
// patterns, the strings of its structured values.
func (m *Mask) event(ev *planexv1.RunEvent, toolOf map[string]string) *planexv1.RunEvent {
	switch p := ev.GetPayload().(type) {
	case *planexv1.RunEvent_Created:
		if p.Created.GetInputs() == nil && p.Created.GetForkPlan() == nil {
			return ev
		}
		out := proto.CloneOf(ev)
		c := out.GetCreated()
		c.Inputs = m.Struct(c.GetInputs(), m.everyField()...)
		// A fork's first plan and the steps it shares with the original.
		for _, s := range c.GetForkPlan().GetSteps() {
			toolOf[s.GetId()] = s.GetTool()
		}
		m.plan(c.GetForkPlan())
		for _, st := range c.GetForkSteps() {
			st.ResolvedArgs = m.Args(st.GetTool(), st.GetResolvedArgs())
			st.Output = m.Value(st.GetOutput(), m.fields[st.GetTool()]...)
		}
		return out
	case *planexv1.RunEvent_RunReset:
		out := proto.CloneOf(ev)
		r := out.GetRunReset()
		for _, s := range r.GetPlan().GetSteps() {
			toolOf[s.GetId()] = s.GetTool()
		}
		m.plan(r.GetPlan())
		for _, u := range r.GetUnknownOutcomes() {
			u.Output = m.Value(u.GetOutput(), m.fields[toolOf[u.GetStepId()]]...)
		}
		return out
	case *planexv1.RunEvent_GateOpened:
		if p.GateOpened.GetGate().GetInput() == nil || !m.all {
			return ev
		}
		out := proto.CloneOf(ev)
		m.gateInput(out.GetGateOpened().GetGate())
		return out
	case *planexv1.RunEvent_PlanRevised:
		for _, s := range p.PlanRevised.GetPlan().GetSteps() {
			toolOf[s.GetId()] = s.GetTool()
		}
		out := proto.CloneOf(ev)
		m.plan(out.GetPlanRevised().GetPlan())
		return out
	case *planexv1.RunEvent_StepDispatched:
		toolOf[p.StepDispatched.GetStepId()] = p.StepDispatched.GetTool()
		out := proto.CloneOf(ev)
		d := out.GetStepDispatched()
		d.ResolvedArgs = m.Args(d.GetTool(), d.GetResolvedArgs())
		return out
	case *planexv1.RunEvent_StepSucceeded:
		out := proto.CloneOf(ev)
		s := out.GetStepSucceeded()
		s.Output = m.Value(s.GetOutput(), m.fields[toolOf[s.GetStepId()]]...)
		return out
	case *planexv1.RunEvent_Finished:
		if p.Finished.GetResult() == nil {
			return ev
		}
		tools := map[string]bool{}
		for _, tool := range toolOf {
			tools[tool] = true
		}
		out := proto.CloneOf(ev)
		out.GetFinished().Result = m.resultOf(out.GetFinished().GetResult(), tools)
		return out
	case *planexv1.RunEvent_GateDecided:
		if p.GateDecided.GetAnswer() != nil {
			out := proto.CloneOf(ev)
			d := out.GetGateDecided()
			d.Answer = m.Value(d.GetAnswer(), m.fields[HumanInputTool]...)
			return out
		}
		if p.GateDecided.GetEditedArgs() == nil {
			return ev
		}
		// The event does not name the gated step's tool; hide every field
		// any tool declares sensitive.
		out := proto.CloneOf(ev)
		d := out.GetGateDecided()
		d.EditedArgs = m.Struct(d.GetEditedArgs(), m.everyField()...)
		return out
	}
	return ev
}

// redactStrings redacts by r's patterns, in place, every string field of
// msg and of the messages it holds (lists and map values included), and
// reports whether it changed any.
func redactStrings(r *redact.Redactor, msg protoreflect.Message) bool {
	changed := false
	str := func(v protoreflect.Value) (protoreflect.Value, bool) {
		s := v.String()
		if red := r.String(s); red != s {
			changed = true
			return protoreflect.ValueOfString(red), true
		}
		return v, false
	}
	msg.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				switch fd.Kind() {
				case protoreflect.StringKind:
					if nv, ok := str(l.Get(i)); ok {
						l.Set(i, nv)
					}
				case protoreflect.MessageKind, protoreflect.GroupKind:
					if redactStrings(r, l.Get(i).Message()) {
						changed = true
					}
				}
			}
		case fd.IsMap():
			mp := v.Map()
			mp.Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				switch fd.MapValue().Kind() {
				case protoreflect.StringKind:
					if nv, ok := str(mv); ok {
						mp.Set(k, nv)
					}
				case protoreflect.MessageKind, protoreflect.GroupKind:
					if redactStrings(r, mv.Message()) {
						changed = true
					}
				}
				return true
			})
		case fd.Kind() == protoreflect.StringKind:
			if nv, ok := str(v); ok {
				msg.Set(fd, nv)
			}
		case fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind:
			if redactStrings(r, v.Message()) {
				changed = true
			}
		}
		return true
	})
	return changed
}

// Export masks a run's events in order for `planex runs export`, marking
// the ones it changed. A changed version 2 event gets the [Commitment]
// that proves its unmasked fields (one that cannot be built, as for an
// event protojson cannot encode, is left out: the verifier then reports
// the event unchecked rather than verified).
func (m *Mask) Export(events []*planexv1.RunEvent) []ExportedEvent {
	toolOf := map[string]string{}
	out := make([]ExportedEvent, len(events))
	for i, ev := range events {
		c := m.Event(ev, toolOf)
		e := ExportedEvent{Event: c, Redacted: c != ev && !proto.Equal(c, ev)}
		if salt := eventSalt(ev); e.Redacted && salt != nil {
			if shown, err := shownForm(c); err == nil {
				e.Event = shown
				e.Commitment, _ = commit(ev, salt, shown)
			}
		}
		out[i] = e
	}
	return out
}
