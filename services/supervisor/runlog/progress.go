package runlog

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// StepKey identifies a step by what it does: its tool and planned
// arguments (SHA-256, hex). Two steps with the same key repeat each other.
func StepKey(tool string, args *structpb.Struct) string {
	h := sha256.New()
	h.Write([]byte(tool))
	h.Write([]byte{0})
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(args)
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

// PlanHash identifies a plan by its steps (ids, tools, arguments,
// dependencies, expectations), not by its revision, rationale or
// confidence: two revisions with the same hash would do the same thing.
func PlanHash(p *planexv1.Plan) string {
	h := sha256.New()
	for _, s := range p.GetSteps() {
		c := &planexv1.Step{Id: s.GetId(), Tool: s.GetTool(), Args: s.GetArgs(), DependsOn: s.GetDependsOn(), Expect: s.GetExpect()}
		b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(c)
		h.Write(b)
		h.Write([]byte{0})
	}
	h.Write([]byte(p.GetAnswer()))
	return hex.EncodeToString(h.Sum(nil))
}

// Failing returns the ledger entry of key, or nil.
func Failing(run *planexv1.Run, key string) *planexv1.FailingStep {
	for _, f := range run.GetProgress().GetFailing() {
		if f.GetKey() == key {
			return f
		}
	}
	return nil
}

// ledger returns the run's progress ledger for a change: a copy of it,
// since a cloned state (State.Clone, a cached run being read by GetRun)
// shares the ledger with the state being folded.
func ledger(run *planexv1.Run) *planexv1.ProgressLedger {
	if run.Progress == nil {
		run.Progress = &planexv1.ProgressLedger{}
	} else {
		run.Progress = proto.CloneOf(run.Progress)
	}
	return run.Progress
}

// noteFailure records that step id failed in its plan revision.
func noteFailure(run *planexv1.Run, id string) {
	s, st := PlanStep(run, id), Step(run, id)
	if s == nil || st == nil {
		return
	}
	key := StepKey(s.GetTool(), s.GetArgs())
	l := ledger(run)
	var f *planexv1.FailingStep
	for _, x := range l.GetFailing() {
		if x.GetKey() == key {
			f = x
		}
	}
	if f == nil {
		f = &planexv1.FailingStep{Key: key, Tool: s.GetTool()}
		l.Failing = append(l.Failing, f)
	}
	f.StepId = id
	if rev := st.GetPlanRevision(); !slices.Contains(f.Revisions, rev) {
		f.Revisions = append(f.Revisions, rev)
	}
}
