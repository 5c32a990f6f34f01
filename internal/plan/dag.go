package plan

import (
	"slices"

	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// The DAG helpers accept any plan, valid or not: nil plans and nil steps are
// skipped, unknown dependencies never become ready, cycles do not loop.

// Ready returns, in plan order, the steps that were neither started nor done
// and whose dependencies are all done (succeeded). A step without
// dependencies is ready at once.
func Ready(p *planexv1.Plan, done, started map[string]bool) []string {
	var ready []string
	for _, s := range p.GetSteps() {
		id := s.GetId()
		if s == nil || started[id] || done[id] {
			continue
		}
		ok := true
		for _, d := range s.GetDependsOn() {
			if !done[d] {
				ok = false
				break
			}
		}
		if ok {
			ready = append(ready, id)
		}
	}
	return ready
}

// Descendants returns, in plan order, the steps that depend on id directly
// or transitively; id itself is not included. The engine uses it to skip the
// steps a failure makes unreachable.
func Descendants(p *planexv1.Plan, id string) []string {
	dependents := make(map[string][]string)
	for _, s := range p.GetSteps() {
		for _, d := range s.GetDependsOn() {
			dependents[d] = append(dependents[d], s.GetId())
		}
	}
	seen := map[string]bool{id: true}
	queue := []string{id}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		for _, next := range dependents[cur] {
			if !seen[next] {
				seen[next] = true
				queue = append(queue, next)
			}
		}
	}
	var out []string
	for _, s := range p.GetSteps() {
		if sid := s.GetId(); sid != id && seen[sid] && !slices.Contains(out, sid) {
			out = append(out, sid)
		}
	}
	return out
}

// Leaves returns, in plan order, the steps no other step depends on: the
// steps whose outputs make the run's default result.
func Leaves(p *planexv1.Plan) []string {
	used := make(map[string]bool)
	for _, s := range p.GetSteps() {
		for _, d := range s.GetDependsOn() {
			if d != s.GetId() {
				used[d] = true
			}
		}
	}
	var out []string
	for _, s := range p.GetSteps() {
		if s != nil && !used[s.GetId()] {
			out = append(out, s.GetId())
		}
	}
	return out
}

// Lineage compares a new plan revision with the previous one. A step of next
// is:
//   - added when prev has no step with its id;
//   - changed when its tool, args, depends_on or expect differ (proto.Equal
//     on args), or when it completed in prev (completed[id]) but one of its
//     transitive dependencies is not kept, since its output was computed
//     from outputs that will be recomputed;
//   - kept otherwise: its definition, and its output if it completed, carry
//     over.
//
// Steps of prev missing from next are dropped. Lists follow plan order (of
// next, and of prev for dropped). A nil prev makes every step added.
func Lineage(prev, next *planexv1.Plan, completed map[string]bool) *planexv1.PlanLineage {
	l := &planexv1.PlanLineage{PreviousRevision: prev.GetRevision()}
	old := stepIndex(prev)
	cur := stepIndex(next)
	same := make(map[string]bool, len(cur))
	for id, s := range cur {
		if o, ok := old[id]; ok && sameDefinition(o, s) {
			same[id] = true
		}
	}
	// kept: identical, and for completed steps every dependency kept too.
	kept := make(map[string]bool, len(same))
	state := make(map[string]int8) // 0 unknown, 1 visiting, 2 done
	var isKept func(id string) bool
	isKept = func(id string) bool {
		switch state[id] {
		case 1:
			return false // a cycle; Validate reports it
		case 2:
			return kept[id]
		}
		state[id] = 1
		ok := same[id]
		if ok && completed[id] {
			for _, d := range cur[id].GetDependsOn() {
				if !isKept(d) {
					ok = false
				}
			}
		}
		state[id] = 2
		kept[id] = ok
		return ok
	}
	listed := make(map[string]bool, len(cur))
	for _, s := range next.GetSteps() {
		id := s.GetId()
		if s == nil || listed[id] {
			continue
		}
		listed[id] = true
		switch _, existed := old[id]; {
		case !existed:
			l.Added = append(l.Added, id)
		case isKept(id):
			l.Kept = append(l.Kept, id)
		default:
			l.Changed = append(l.Changed, id)
		}
	}
	for _, s := range prev.GetSteps() {
		id := s.GetId()
		if _, ok := cur[id]; s != nil && !ok && !slices.Contains(l.Dropped, id) {
			l.Dropped = append(l.Dropped, id)
		}
	}
	return l
}

// stepIndex maps step ids to their first step.
func stepIndex(p *planexv1.Plan) map[string]*planexv1.Step {
	m := make(map[string]*planexv1.Step, len(p.GetSteps()))
	for _, s := range p.GetSteps() {
		if _, dup := m[s.GetId()]; s != nil && !dup {
			m[s.GetId()] = s
		}
	}
	return m
}

// sameDefinition compares what decides a step's output. The order of
// depends_on does not matter, and missing args equal empty args.
func sameDefinition(a, b *planexv1.Step) bool {
	if a.GetTool() != b.GetTool() || a.GetExpect() != b.GetExpect() {
		return false
	}
	da, db := slices.Clone(a.GetDependsOn()), slices.Clone(b.GetDependsOn())
	slices.Sort(da)
	slices.Sort(db)
	if !slices.Equal(da, db) {
		return false
	}
	if len(a.GetArgs().GetFields()) == 0 && len(b.GetArgs().GetFields()) == 0 {
		return true
	}
	return proto.Equal(a.GetArgs(), b.GetArgs())
}
