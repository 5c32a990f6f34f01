package runlog

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// sameIndex reports how the index kept up to date by the fold differs
// from one computed from the run alone ("" if it does not).
func sameIndex(got *index, run *planexv1.Run) string {
	want := buildIndex(run, nil)
	switch {
	case got == nil:
		return "no index"
	case got.run != run:
		return "index of another run"
	case got.plan != want.plan:
		return "index of another plan"
	case got.degenerate != want.degenerate:
		return fmt.Sprintf("degenerate %v, want %v", got.degenerate, want.degenerate)
	}
	g := [6]int{got.inFlight, got.succeeded, got.waiting, got.ready, got.failing, got.retrying}
	w := [6]int{want.inFlight, want.succeeded, want.waiting, want.ready, want.failing, want.retrying}
	if g != w {
		return fmt.Sprintf("counters (in flight, succeeded, waiting, ready, failing, retrying) %v, want %v", g, w)
	}
	for id, s := range want.slots {
		if got.slots[id] != s {
			return fmt.Sprintf("slot of %s %v, want %v", id, got.slots[id], s)
		}
	}
	for id := range got.slots {
		if _, ok := want.slots[id]; !ok {
			return fmt.Sprintf("slot of %s, which the run does not have", id)
		}
	}
	if want.degenerate {
		return ""
	}
	for k, c := range want.chunks {
		gc := got.chunks[k]
		if gc.unmet != c.unmet || gc.ready != c.ready || gc.failing != c.failing || gc.retrying != c.retrying {
			return fmt.Sprintf("chunk %d: unmet %v ready %b failing %b retrying %b, want %v %b %b %b",
				k, gc.unmet[:8], gc.ready, gc.failing, gc.retrying, c.unmet[:8], c.ready, c.failing, c.retrying)
		}
	}
	return ""
}

// walkAnswers are the State's answers computed by walking the plan, the
// way the engine did before the index.
func walkAnswers(s *State) string {
	inFlight := 0
	for _, st := range PlanStates(s.Run) {
		if InFlight(st.GetStatus()) {
			inFlight++
		}
	}
	failed := s.walk(func(st *planexv1.StepState) bool {
		return st.GetStatus() == planexv1.StepStatus_STEP_STATUS_FAILED || st.GetStatus() == planexv1.StepStatus_STEP_STATUS_OUTCOME_UNKNOWN
	}, false)
	retrying := s.walk(func(st *planexv1.StepState) bool {
		return st.GetStatus() == planexv1.StepStatus_STEP_STATUS_PENDING && st.GetRetryAt() != nil
	}, false)
	return fmt.Sprint(inFlight, PlanComplete(s.Run), s.walk(nil, true), failed, retrying)
}

func indexAnswers(s *State) string {
	return fmt.Sprint(s.InFlight(), s.PlanComplete(), slices.Collect(s.Ready()), s.Failed(), s.Retrying())
}

// randomRun drives a run with random (mostly meaningful) events: plans
// with chains, fan-outs, joins, unknown dependencies and, rarely, a
// repeated step id; dispatches, starts, results, failures, retries,
// gates and their decisions, replans that keep, drop and reorder steps,
// and the end.
type randomRun struct {
	r     *rand.Rand
	rev   int32
	steps []string // ids of the current plan
	gates []string
	seq   int
}

func (g *randomRun) plan() *planexv1.RunEvent {
	g.rev++
	n := 1 + g.r.IntN(150)
	var steps []*planexv1.Step
	var lin planexv1.PlanLineage
	old := g.steps
	g.steps = nil
	for i := range n {
		id := "s" + strconv.Itoa(g.r.IntN(200))
		if slices.Contains(g.steps, id) && g.r.IntN(50) != 0 {
			continue
		}
		s := &planexv1.Step{Id: id, Tool: "t.x"}
		switch k := g.r.IntN(10); {
		case k < 5 && i > 0:
			s.DependsOn = []string{g.steps[len(g.steps)-1]}
		case k < 7 && i > 0:
			for range 1 + g.r.IntN(4) {
				s.DependsOn = append(s.DependsOn, g.steps[g.r.IntN(len(g.steps))])
			}
		case k == 7:
			s.DependsOn = []string{"missing"}
		}
		g.steps = append(g.steps, id)
		steps = append(steps, s)
		if slices.Contains(old, id) && g.r.IntN(2) == 0 {
			lin.Kept = append(lin.Kept, id)
		}
	}
	for _, id := range old {
		if !slices.Contains(g.steps, id) && g.r.IntN(3) > 0 {
			lin.Dropped = append(lin.Dropped, id)
		}
	}
	return &planexv1.RunEvent{Payload: &planexv1.RunEvent_PlanRevised{PlanRevised: &planexv1.PlanRevised{
		Plan: &planexv1.Plan{Revision: g.rev, Steps: steps, Lineage: &lin}}}}
}

// next returns an event for the run's state.
func (g *randomRun) next(s *State) *planexv1.RunEvent {
	g.seq++
	run := s.Run
	switch run.GetStatus() {
	case planexv1.RunStatus_RUN_STATUS_PENDING, planexv1.RunStatus_RUN_STATUS_PLANNING:
		return g.plan()
	}
	pick := func() (string, *planexv1.StepState) {
		id := g.steps[g.r.IntN(len(g.steps))]
		if g.r.IntN(20) == 0 {
			id = "x" + strconv.Itoa(g.r.IntN(3)) // a step no plan has
		}
		return id, Step(run, id)
	}
	id, st := pick()
	a := st.GetAttempt()
	switch k := g.r.IntN(100); {
	case k < 30:
		if ready := slices.Collect(s.Ready()); len(ready) > 0 && g.r.IntN(4) > 0 {
			id = g.steps[ready[g.r.IntN(len(ready))]]
			a = Step(run, id).GetAttempt()
		}
		return &planexv1.RunEvent{Payload: &planexv1.RunEvent_StepDispatched{StepDispatched: &planexv1.StepDispatched{
			StepId: id, Attempt: a + 1, PlanRevision: g.rev, Tool: "t.x"}}}
	case k < 38:
		return &planexv1.RunEvent{Payload: &planexv1.RunEvent_StepStarted{StepStarted: &planexv1.StepStarted{StepId: id, Attempt: a, Restart: g.r.IntN(5) == 0}}}
	case k < 60:
		return &planexv1.RunEvent{Payload: &planexv1.RunEvent_StepSucceeded{StepSucceeded: &planexv1.StepSucceeded{StepId: id, Attempt: a}}}
	case k < 68:
		code := planexv1.ErrorCode_ERROR_CODE_INTERNAL
		if g.r.IntN(3) == 0 {
			code = planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN
		}
		return &planexv1.RunEvent{Payload: &planexv1.RunEvent_StepFailed{StepFailed: &planexv1.StepFailed{
			StepId: id, Attempt: a, Error: &planexv1.StepError{Code: code, Message: "x"}}}}
	case k < 71:
		return &planexv1.RunEvent{Payload: &planexv1.RunEvent_ExpectationFailed{ExpectationFailed: &planexv1.ExpectationFailed{StepId: id, Attempt: a, Expect: "e"}}}
	case k < 77:
		return &planexv1.RunEvent{Payload: &planexv1.RunEvent_StepRetrying{StepRetrying: &planexv1.StepRetrying{
			StepId: id, Attempt: a, Retry: st.GetRetries() + 1, RetryAt: retryAt()}}}
	case k < 83:
		gid := GateID(id, st.GetPlanRevision())
		g.gates = append(g.gates, gid)
		return &planexv1.RunEvent{Payload: &planexv1.RunEvent_GateOpened{GateOpened: &planexv1.GateOpened{Gate: &planexv1.Gate{
			Id: gid, Kind: planexv1.GateKind_GATE_KIND_STEP, StepId: id, PlanRevision: st.GetPlanRevision()}}}}
	case k < 89 && len(g.gates) > 0:
		d := planexv1.DecisionKind(1 + g.r.IntN(3))
		return &planexv1.RunEvent{Payload: &planexv1.RunEvent_GateDecided{GateDecided: &planexv1.GateDecided{
			GateId: g.gates[g.r.IntN(len(g.gates))], Decision: d}}}
	case k < 91:
		return &planexv1.RunEvent{Payload: &planexv1.RunEvent_CritiquePending{CritiquePending: &planexv1.CritiquePending{StepId: id, Attempt: a}}}
	case k < 93:
		return &planexv1.RunEvent{Payload: &planexv1.RunEvent_CriticVerdict{CriticVerdict: &planexv1.CriticVerdict{StepId: id, Attempt: a}}}
	case k < 96:
		return &planexv1.RunEvent{Payload: &planexv1.RunEvent_ReplanRequested{ReplanRequested: &planexv1.ReplanRequested{Reason: "r"}}}
	case k < 99:
		return g.plan()
	default:
		return &planexv1.RunEvent{Payload: &planexv1.RunEvent_Finished{Finished: &planexv1.RunFinished{Status: planexv1.RunStatus_RUN_STATUS_FAILED}}}
	}
}

func retryAt() *timestamppb.Timestamp { return &timestamppb.Timestamp{Seconds: 1_800_000_000} }

// The index the fold keeps up to date event by event is the one computed
// from the run alone, the State's answers are those of a walk over the
// plan, the state's run is the one Fold computes, and clones (folded
// further, or whose original is folded further) never see each other's
// events — over random runs.
func TestIndexFollowsTheFold(t *testing.T) {
	var l Log
	for seed := range uint64(16) {
		g := &randomRun{r: rand.New(rand.NewPCG(seed, 7))}
		state := &State{}
		var bare *planexv1.Run
		emit := func(ev *planexv1.RunEvent) {
			t.Helper()
			tx := l.Begin(state)
			if err := tx.Emit(ev); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			var err error
			if bare, err = Fold(bare, ev); err != nil {
				t.Fatalf("seed %d: Fold: %v", seed, err)
			}
			state = tx.State()
		}
		emit(&planexv1.RunEvent{RunId: "R", Payload: &planexv1.RunEvent_Created{Created: &planexv1.RunCreated{Goal: "g"}}})
		var kept *State
		var keptRun *planexv1.Run
		for i := 0; i < 300 && !Terminal(state.Run.GetStatus()); i++ {
			ev := g.next(state)
			if i%3 == 0 {
				// Fold into the state itself (as replay does) after cloning
				// it: the clone must not change.
				kept, keptRun = state.Clone(), proto.CloneOf(state.Run)
				ev.Sequence = state.Run.GetLastSequence() + 1
				ev.RunId, ev.PrevHash = "R", state.Hash
				ev.Time = timestamppb.Now()
				h, err := Hash(ev)
				if err != nil {
					t.Fatal(err)
				}
				ev.Hash = h
				if err := state.Apply(ev, 0); err != nil {
					t.Fatalf("seed %d event %d: %v", seed, i, err)
				}
				if bare, err = Fold(bare, ev); err != nil {
					t.Fatalf("seed %d: Fold: %v", seed, err)
				}
			} else {
				emit(ev)
			}
			if d := sameIndex(state.ix, state.Run); d != "" {
				t.Fatalf("seed %d event %d (%s): %s", seed, i, PayloadName(ev), d)
			}
			if got, want := indexAnswers(state), walkAnswers(state); got != want {
				t.Fatalf("seed %d event %d (%s): answers %s, walk %s", seed, i, PayloadName(ev), got, want)
			}
			for _, id := range append(slices.Clone(g.steps), "x0", "missing") {
				if state.Step(id) != Step(state.Run, id) || state.PlanStep(id) != PlanStep(state.Run, id) {
					t.Fatalf("seed %d event %d (%s): lookup of %s differs from Step/PlanStep", seed, i, PayloadName(ev), id)
				}
			}
			if !proto.Equal(state.Run, bare) {
				t.Fatalf("seed %d event %d (%s): state's run differs from Fold's", seed, i, PayloadName(ev))
			}
			if i%50 == 0 {
				// A state read from a snapshot computes the same answers.
				data, err := encodeSnapshot(state)
				if err != nil {
					t.Fatal(err)
				}
				snap, err := decodeSnapshot(data)
				if err != nil {
					t.Fatal(err)
				}
				if got, want := indexAnswers(snap.Clone()), indexAnswers(state); got != want {
					t.Fatalf("seed %d event %d: snapshot's answers %s, want %s", seed, i, got, want)
				}
			}
			if kept != nil {
				if !proto.Equal(kept.Run, keptRun) {
					t.Fatalf("seed %d event %d (%s): folding into the original changed its clone", seed, i, PayloadName(ev))
				}
				if d := sameIndex(kept.ix, kept.Run); d != "" {
					t.Fatalf("seed %d event %d (%s): clone's index: %s", seed, i, PayloadName(ev), d)
				}
			}
		}
	}
}
