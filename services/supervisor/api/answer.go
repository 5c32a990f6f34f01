package api

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/supervisor/catalog"
)

// answered returns d with its decision defaulted: an answer without a
// decision approves (the gate it answers). d itself is left alone.
func answered(d *planexv1.GateDecision) *planexv1.GateDecision {
	if d.GetAnswer() == nil || d.GetDecision() != planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED {
		return d
	}
	d = proto.CloneOf(d)
	d.Decision = planexv1.DecisionKind_DECISION_KIND_APPROVE
	return d
}

// checkAnswer validates decision d on gate g as far as answers go: an
// input gate is answered (approved with an answer valid against its
// schema) or rejected, never edited; another gate takes no answer. A
// refused answer names the path in it and the schema's message; the gate
// stays open.
func checkAnswer(g *planexv1.Gate, d decisionAt) error {
	a := d.GetAnswer()
	if g.GetKind() != planexv1.GateKind_GATE_KIND_INPUT {
		if a != nil {
			return invalid("%sanswer: gate %s is not an input gate (it holds back %s); approve, edit or reject it", d.field, g.GetId(), gateWhat(g))
		}
		return nil
	}
	switch d.GetDecision() {
	case planexv1.DecisionKind_DECISION_KIND_REJECT:
		if a != nil {
			return invalid("%sanswer: not allowed with DECISION_KIND_REJECT", d.field)
		}
		return nil
	case planexv1.DecisionKind_DECISION_KIND_EDIT:
		return invalid("%sdecision: input gate %s is answered (answer) or rejected, not edited", d.field, g.GetId())
	}
	if a == nil {
		return invalid("%sanswer: required to approve input gate %s (step %q asks: %s)", d.field, g.GetId(), g.GetStepId(), clip(g.GetInput().GetQuestion()))
	}
	if n := proto.Size(a); n > catalog.MaxAnswerBytes {
		return invalid("%sanswer: %d bytes, at most %d", d.field, n, catalog.MaxAnswerBytes)
	}
	// The answer is recorded in the run log and passed to later steps: no
	// secret may ride along.
	js, err := protojson.Marshal(a)
	if err != nil {
		return invalid("%sanswer: %v", d.field, err)
	}
	if err := checkSecret(d.field+"answer", string(js)); err != nil {
		return err
	}
	if err := catalog.ValidateAnswer(g.GetInput().GetSchema(), a); err != nil {
		if errors.Is(err, catalog.ErrInvalidAnswer) {
			return invalid("%s%v", d.field, err)
		}
		return &preconditionError{msg: fmt.Sprintf("%sanswer: gate %s: its schema does not compile: %v", d.field, g.GetId(), err)}
	}
	return nil
}

// gateWhat says what a gate holds back, for messages.
func gateWhat(g *planexv1.Gate) string {
	if g.GetKind() == planexv1.GateKind_GATE_KIND_PLAN {
		return fmt.Sprintf("plan revision %d", g.GetPlanRevision())
	}
	return fmt.Sprintf("step %q", g.GetStepId())
}
