package runlog

import (
	"iter"
	"maps"
	"math/bits"
	"slices"
	"sync/atomic"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// An index is what a State derives from its run so that the engine's
// questions about the current plan (which steps are ready, how many are in
// flight, is the plan complete) and lookups by step id cost the same for a
// plan of ten steps and one of thousands. It is never stored: a state
// folded from the log, from a snapshot or from a clone computes the same
// index from its run (buildIndex), and the fold keeps it up to date event
// by event (touch), at a cost that depends on the step the event changes
// and its dependents, not on the plan.
//
// Clones share it: the per-position data lives in chunks of 64 plan
// positions, copied one chunk at a time by the first write of a state
// that does not own it, so cloning copies len(plan)/64 pointers.
type index struct {
	// run is the run the index describes; a state whose run was replaced
	// builds a new one.
	run  *planexv1.Run
	plan *planexv1.Plan // the current plan (nil before the first)
	// slots maps every step id of the run's step states and of the
	// current plan to its positions. Shared with clones; copied before
	// an insert by an index that does not own it.
	slots       map[string]slot
	sharedSlots bool
	// dependents lists, for each plan position, the positions of the
	// steps that depend on it (once per occurrence in depends_on);
	// immutable, shared by every index of the same plan.
	dependents [][]int32
	// degenerate is set for a plan that names a step twice: the
	// per-position sets cannot follow such a plan and the queries walk
	// it (the planner's plans are validated, so this is a corrupt log).
	degenerate bool

	chunks       []*chunk
	sharedChunks bool // the chunks slice (not only its chunks) is another index's
	own          *owner

	inFlight, succeeded, waiting, ready, failing, retrying int
}

// slot is where a step id is: its position in Run.steps (-1: no state
// yet) and in the current plan (-1: not in it).
type slot struct{ step, plan int32 }

const chunkBits = 64

// chunk holds the derived facts of 64 consecutive plan positions.
type chunk struct {
	owner *owner
	// unmet counts the dependencies of each position that did not
	// succeed (or are not in the plan).
	unmet [chunkBits]int32
	// Sets over the positions: pending with every dependency succeeded;
	// failed or with an unknown outcome; pending with a retry time.
	ready, failing, retrying uint64
}

// owner identifies the writer of a state: chunks (and the step slice, the
// slots and the deadlines) of another owner are copied before a write.
// Cloning a state marks its owner cloned, so a state changed after it was
// cloned (replay does that) takes a new owner and copies too.
type owner struct{ cloned atomic.Bool }

// buildIndex computes the index of run from scratch, owned by own.
func buildIndex(run *planexv1.Run, own *owner) *index {
	ix := &index{run: run, own: own}
	ix.slots = make(map[string]slot, len(run.GetSteps()))
	for i, st := range run.GetSteps() {
		if _, dup := ix.slots[st.GetStepId()]; !dup {
			ix.slots[st.GetStepId()] = slot{step: int32(i), plan: -1}
		}
	}
	ix.setPlan(CurrentPlan(run))
	return ix
}

// setPlan (re)computes the plan-position data for p from the run's step
// states.
func (ix *index) setPlan(p *planexv1.Plan) {
	ix.plan = p
	ix.degenerate = false
	ix.inFlight, ix.succeeded, ix.waiting, ix.ready, ix.failing, ix.retrying = 0, 0, 0, 0, 0, 0
	steps := p.GetSteps()
	ix.chunks = make([]*chunk, (len(steps)+chunkBits-1)/chunkBits)
	ix.sharedChunks = false
	for i := range ix.chunks {
		ix.chunks[i] = &chunk{owner: ix.own}
	}
	// Positions of the previous plan are stale: forget them (a copy of
	// the map, since clones may share it).
	slots := make(map[string]slot, max(len(ix.slots), len(steps)))
	for id, s := range ix.slots {
		if s.step >= 0 {
			slots[id] = slot{step: s.step, plan: -1}
		}
	}
	for i, s := range steps {
		sl, ok := slots[s.GetId()]
		if !ok {
			sl.step = -1
		} else if sl.plan >= 0 {
			ix.degenerate = true
		}
		sl.plan = int32(i)
		slots[s.GetId()] = sl
	}
	ix.slots, ix.sharedSlots = slots, false
	ix.dependents = make([][]int32, len(steps))
	if ix.degenerate {
		return
	}
	for i, s := range steps {
		for _, d := range s.GetDependsOn() {
			if sl, ok := slots[d]; ok && sl.plan >= 0 {
				ix.dependents[sl.plan] = append(ix.dependents[sl.plan], int32(i))
			}
		}
	}
	for i, s := range steps {
		c, b := ix.chunks[i/chunkBits], i%chunkBits
		for _, d := range s.GetDependsOn() {
			if sl, ok := slots[d]; !ok || sl.plan < 0 || ix.stateAt(sl.plan).GetStatus() != planexv1.StepStatus_STEP_STATUS_SUCCEEDED {
				c.unmet[b]++
			}
		}
		ix.count(ix.stateAt(int32(i)), 1)
		ix.setBits(int32(i))
	}
}

// stateAt is the state of the step at plan position i, or nil.
func (ix *index) stateAt(i int32) *planexv1.StepState {
	if s := ix.slots[ix.plan.GetSteps()[i].GetId()]; s.step >= 0 {
		return ix.run.GetSteps()[s.step]
	}
	return nil
}

// lookup returns the position of step id in Run.steps, or -1.
func (ix *index) lookup(id string) int {
	if s, ok := ix.slots[id]; ok {
		return int(s.step)
	}
	return -1
}

// clone returns a copy for a clone of the run, owned by own, sharing
// everything until written.
func (ix *index) clone(run *planexv1.Run, own *owner) *index {
	return &index{
		run: run, plan: ix.plan, slots: ix.slots, sharedSlots: true, dependents: ix.dependents, degenerate: ix.degenerate,
		chunks: ix.chunks, sharedChunks: true, own: own,
		inFlight: ix.inFlight, succeeded: ix.succeeded, waiting: ix.waiting, ready: ix.ready, failing: ix.failing, retrying: ix.retrying,
	}
}

// added records that a state for step id was appended at position i of
// Run.steps.
func (ix *index) added(id string, i int) {
	if ix.sharedSlots {
		ix.slots = maps.Clone(ix.slots)
		ix.sharedSlots = false
	}
	s, ok := ix.slots[id]
	if !ok {
		s.plan = -1
	}
	s.step = int32(i)
	ix.slots[id] = s
}

// touch updates the index after the state of step id changed from old
// (nil: none) to its current one.
func (ix *index) touch(id string, old *planexv1.StepState) {
	s, ok := ix.slots[id]
	if !ok || s.plan < 0 || ix.degenerate {
		return
	}
	cur := ix.stateAt(s.plan)
	ix.count(old, -1)
	ix.count(cur, 1)
	ix.setBits(s.plan)
	was, is := succeeded(old), succeeded(cur)
	if was == is {
		return
	}
	delta := int32(1)
	if is {
		delta = -1
	}
	for _, q := range ix.dependents[s.plan] {
		ix.write(q).unmet[q%chunkBits] += delta
		ix.setBits(q)
	}
}

func succeeded(st *planexv1.StepState) bool {
	return st.GetStatus() == planexv1.StepStatus_STEP_STATUS_SUCCEEDED
}

// count adds n to the counters st's status contributes to.
func (ix *index) count(st *planexv1.StepState, n int) {
	switch s := st.GetStatus(); {
	case InFlight(s):
		ix.inFlight += n
	case s == planexv1.StepStatus_STEP_STATUS_SUCCEEDED:
		ix.succeeded += n
	case s == planexv1.StepStatus_STEP_STATUS_WAITING_APPROVAL:
		ix.waiting += n
	}
}

// setBits recomputes the set memberships of plan position i.
func (ix *index) setBits(i int32) {
	st := ix.stateAt(i)
	c, bit := ix.chunks[i/chunkBits], uint64(1)<<(i%chunkBits)
	status := st.GetStatus()
	pending := status == planexv1.StepStatus_STEP_STATUS_PENDING
	ready := pending && c.unmet[i%chunkBits] == 0
	failing := status == planexv1.StepStatus_STEP_STATUS_FAILED || status == planexv1.StepStatus_STEP_STATUS_OUTCOME_UNKNOWN
	retrying := pending && st.GetRetryAt() != nil
	if ready == (c.ready&bit != 0) && failing == (c.failing&bit != 0) && retrying == (c.retrying&bit != 0) {
		return
	}
	c = ix.write(i)
	ix.ready += flip(&c.ready, bit, ready)
	ix.failing += flip(&c.failing, bit, failing)
	ix.retrying += flip(&c.retrying, bit, retrying)
}

// flip sets or clears bit in *set and returns the change in members.
func flip(set *uint64, bit uint64, on bool) int {
	switch was := *set&bit != 0; {
	case on && !was:
		*set |= bit
		return 1
	case !on && was:
		*set &^= bit
		return -1
	}
	return 0
}

// write returns the chunk of plan position i ready to be written.
func (ix *index) write(i int32) *chunk {
	if ix.sharedChunks {
		ix.chunks = slices.Clone(ix.chunks)
		ix.sharedChunks = false
	}
	c := ix.chunks[i/chunkBits]
	if c.owner != ix.own {
		cp := *c
		cp.owner = ix.own
		c = &cp
		ix.chunks[i/chunkBits] = c
	}
	return c
}

// positions lists the members of a set (selected from each chunk by
// which) in plan order.
func (ix *index) positions(n int, which func(*chunk) uint64) []int {
	if n == 0 {
		return nil
	}
	out := make([]int, 0, n)
	for k, c := range ix.chunks {
		for w := which(c); w != 0; w &= w - 1 {
			out = append(out, k*chunkBits+bits.TrailingZeros64(w))
		}
		if len(out) == n {
			break
		}
	}
	return out
}

// complete reports whether every step of the current plan succeeded.
func (ix *index) complete() bool {
	return ix.plan != nil && ix.succeeded == len(ix.plan.GetSteps())
}

// view returns the index answering for s's run: its own, or one built for
// the occasion for a state assembled by hand (not stored: s may be shared).
// It returns nil for a plan the index cannot follow (see degenerate).
func (s *State) view() *index {
	ix := s.ix
	if ix == nil || ix.run != s.Run {
		ix = buildIndex(s.Run, nil)
	}
	if ix.degenerate {
		return nil
	}
	return ix
}

// Step returns the state of step id, or nil, like [Step] but without a
// walk whatever the order of the run's step states.
func (s *State) Step(id string) *planexv1.StepState {
	ix := s.ix
	if ix == nil || ix.run != s.Run {
		return Step(s.Run, id)
	}
	if i := ix.lookup(id); i >= 0 {
		return s.Run.GetSteps()[i]
	}
	return nil
}

// PlanStep returns the definition of step id in the current plan, or nil,
// like [PlanStep].
func (s *State) PlanStep(id string) *planexv1.Step {
	ix := s.ix
	if ix == nil || ix.run != s.Run || ix.degenerate {
		return PlanStep(s.Run, id)
	}
	if sl, ok := ix.slots[id]; ok && sl.plan >= 0 {
		return ix.plan.GetSteps()[sl.plan]
	}
	return nil
}

// PlanState returns the state of the step at position i of the current
// plan, or nil (see [PlanStates]).
func (s *State) PlanState(i int) *planexv1.StepState {
	if ix := s.view(); ix != nil {
		return ix.stateAt(int32(i))
	}
	return PlanStates(s.Run)[i]
}

// InFlight counts the current plan's steps with an attempt in flight.
func (s *State) InFlight() int {
	if ix := s.view(); ix != nil {
		return ix.inFlight
	}
	n := 0
	for _, st := range PlanStates(s.Run) {
		if InFlight(st.GetStatus()) {
			n++
		}
	}
	return n
}

// PlanComplete reports whether every step of the current plan succeeded
// (see [PlanComplete]).
func (s *State) PlanComplete() bool {
	if ix := s.view(); ix != nil {
		return ix.complete()
	}
	return PlanComplete(s.Run)
}

// Ready yields the positions in the current plan of the pending steps
// whose dependencies all succeeded (a dependency outside the plan never
// does), in plan order, without walking the plan. Steps backing off
// before a retry are included (see Retrying). The caller may emit events
// between yields (a dispatch, a gate): a step is yielded if it was ready
// when the iteration began and still is when reached, and no event the
// engine emits while scheduling makes another step ready.
func (s *State) Ready() iter.Seq[int] {
	ix := s.view()
	if ix == nil {
		return slices.Values(s.walk(nil, true))
	}
	return func(yield func(int) bool) {
		left := ix.ready
		for k := 0; left > 0 && k < len(ix.chunks); k++ {
			for w := ix.chunks[k].ready; w != 0 && left > 0; w &= w - 1 {
				i := k*chunkBits + bits.TrailingZeros64(w)
				left--
				if ix.chunks[k].ready&(1<<(i%chunkBits)) == 0 {
					continue // no longer ready
				}
				if !yield(i) {
					return
				}
			}
		}
	}
}

// Failed returns the positions in the current plan of the steps whose
// last attempt failed or has an unknown outcome, in plan order.
func (s *State) Failed() []int {
	if ix := s.view(); ix != nil {
		return ix.positions(ix.failing, func(c *chunk) uint64 { return c.failing })
	}
	return s.walk(func(st *planexv1.StepState) bool {
		return st.GetStatus() == planexv1.StepStatus_STEP_STATUS_FAILED || st.GetStatus() == planexv1.StepStatus_STEP_STATUS_OUTCOME_UNKNOWN
	}, false)
}

// Retrying returns the positions in the current plan of the pending steps
// with a retry time (StepRetrying), in plan order.
func (s *State) Retrying() []int {
	if ix := s.view(); ix != nil {
		return ix.positions(ix.retrying, func(c *chunk) uint64 { return c.retrying })
	}
	return s.walk(func(st *planexv1.StepState) bool {
		return st.GetStatus() == planexv1.StepStatus_STEP_STATUS_PENDING && st.GetRetryAt() != nil
	}, false)
}

// walk answers the queries above over the plan for a plan the index
// cannot follow: the positions whose state matches, or with ready the
// pending ones whose dependencies (found by id, PlanIndex) all succeeded.
func (s *State) walk(match func(*planexv1.StepState) bool, ready bool) []int {
	p := CurrentPlan(s.Run)
	states := PlanStates(s.Run)
	var out []int
	for i, st := range states {
		if !ready {
			if match(st) {
				out = append(out, i)
			}
			continue
		}
		if st.GetStatus() != planexv1.StepStatus_STEP_STATUS_PENDING {
			continue
		}
		ok := true
		for _, d := range p.GetSteps()[i].GetDependsOn() {
			if j, found := PlanIndex(p)[d]; !found || states[j].GetStatus() != planexv1.StepStatus_STEP_STATUS_SUCCEEDED {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, i)
		}
	}
	return out
}
