package plan

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// diamond: a -> (b, c) -> d.
func diamond(t *testing.T) *planexv1.Plan {
	return newPlan(
		step(t, "a", "sql.query", `{"query": "q"}`),
		step(t, "b", "sql.query", `{"query": "${{ steps.a.output }}"}`, "a"),
		step(t, "c", "sql.query", `{"query": "q"}`, "a"),
		step(t, "d", "free.form", `{}`, "b", "c"),
	)
}

func set(ids ...string) map[string]bool {
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}

func TestReady(t *testing.T) {
	p := diamond(t)
	tests := []struct {
		name          string
		done, started map[string]bool
		want          []string
	}{
		{name: "start", want: []string{"a"}},
		{name: "a running", started: set("a"), want: nil},
		{name: "a done", done: set("a"), started: set("a"), want: []string{"b", "c"}},
		{name: "b done, c running", done: set("a", "b"), started: set("a", "b", "c"), want: nil},
		{name: "b and c done", done: set("a", "b", "c"), started: set("a", "b", "c"), want: []string{"d"}},
		{name: "all done", done: set("a", "b", "c", "d"), started: set("a", "b", "c", "d"), want: nil},
		{name: "done counts as started", done: set("a"), want: []string{"b", "c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Ready(p, tt.done, tt.started); !slices.Equal(got, tt.want) {
				t.Errorf("Ready = %q, want %q", got, tt.want)
			}
		})
	}
	unknown := newPlan(step(t, "x", "free.form", `{}`, "ghost"))
	if got := Ready(unknown, nil, nil); got != nil {
		t.Errorf("Ready with an unknown dependency = %q, want none", got)
	}
}

func TestDescendants(t *testing.T) {
	p := diamond(t)
	cyclic := newPlan(step(t, "a", "free.form", `{}`, "b"), step(t, "b", "free.form", `{}`, "a"))
	tests := []struct {
		name string
		plan *planexv1.Plan
		id   string
		want []string
	}{
		{name: "root", plan: p, id: "a", want: []string{"b", "c", "d"}},
		{name: "middle", plan: p, id: "c", want: []string{"d"}},
		{name: "leaf", plan: p, id: "d", want: nil},
		{name: "unknown", plan: p, id: "zz", want: nil},
		{name: "cycle terminates", plan: cyclic, id: "a", want: []string{"b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Descendants(tt.plan, tt.id); !slices.Equal(got, tt.want) {
				t.Errorf("Descendants(%q) = %q, want %q", tt.id, got, tt.want)
			}
		})
	}
}

func TestLeaves(t *testing.T) {
	tests := []struct {
		name string
		plan *planexv1.Plan
		want []string
	}{
		{name: "diamond", plan: diamond(t), want: []string{"d"}},
		{name: "two leaves", plan: newPlan(step(t, "a", "x.y", ``), step(t, "b", "x.y", ``, "a"), step(t, "c", "x.y", ``, "a")), want: []string{"b", "c"}},
		{name: "self dependency is a leaf", plan: newPlan(step(t, "a", "x.y", ``, "a")), want: []string{"a"}},
		{name: "nil plan", plan: nil, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Leaves(tt.plan); !slices.Equal(got, tt.want) {
				t.Errorf("Leaves = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestLineage(t *testing.T) {
	prev := diamond(t)
	prev.Revision = 3
	// b gets new args, c is dropped, d now depends on b only (changed), e is
	// added, f is identical to a step that depends on b.
	prevWithF := proto.Clone(prev).(*planexv1.Plan)
	prevWithF.Steps = append(prevWithF.Steps, step(t, "f", "free.form", `{}`, "b"))
	next := newPlan(
		step(t, "a", "sql.query", `{"query": "q"}`),
		step(t, "b", "sql.query", `{"query": "other"}`, "a"),
		step(t, "d", "free.form", `{}`, "b"),
		step(t, "e", "free.form", `{}`, "a"),
		step(t, "f", "free.form", `{}`, "b"),
	)
	tests := []struct {
		name       string
		prev, next *planexv1.Plan
		completed  map[string]bool
		want       *planexv1.PlanLineage
	}{
		{
			name: "first plan", prev: nil, next: prev,
			want: &planexv1.PlanLineage{Added: []string{"a", "b", "c", "d"}},
		},
		{
			name: "unchanged", prev: prev, next: proto.Clone(prev).(*planexv1.Plan), completed: set("a", "b"),
			want: &planexv1.PlanLineage{PreviousRevision: 3, Kept: []string{"a", "b", "c", "d"}},
		},
		{
			name: "pending step downstream of a change is kept", prev: prevWithF, next: next, completed: set("a"),
			want: &planexv1.PlanLineage{PreviousRevision: 3, Kept: []string{"a", "f"}, Changed: []string{"b", "d"}, Added: []string{"e"}, Dropped: []string{"c"}},
		},
		{
			name: "completed step downstream of a change is changed", prev: prevWithF, next: next, completed: set("a", "b", "f"),
			want: &planexv1.PlanLineage{PreviousRevision: 3, Kept: []string{"a"}, Changed: []string{"b", "d", "f"}, Added: []string{"e"}, Dropped: []string{"c"}},
		},
		{
			name: "dependency order and empty args do not matter",
			prev: newPlan(step(t, "a", "x.y", ``), step(t, "b", "x.y", ``), step(t, "c", "x.y", `{}`, "a", "b")),
			next: newPlan(step(t, "a", "x.y", `{}`), step(t, "b", "x.y", ``), step(t, "c", "x.y", ``, "b", "a")),
			want: &planexv1.PlanLineage{PreviousRevision: 1, Kept: []string{"a", "b", "c"}},
		},
		{
			name: "expect change",
			prev: newPlan(&planexv1.Step{Id: "a", Tool: "x.y", Expect: "true"}),
			next: newPlan(&planexv1.Step{Id: "a", Tool: "x.y", Expect: "false"}),
			want: &planexv1.PlanLineage{PreviousRevision: 1, Changed: []string{"a"}},
		},
		{
			name: "tool change",
			prev: newPlan(&planexv1.Step{Id: "a", Tool: "x.y"}),
			next: newPlan(&planexv1.Step{Id: "a", Tool: "x.z"}),
			want: &planexv1.PlanLineage{PreviousRevision: 1, Changed: []string{"a"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Lineage(tt.prev, tt.next, tt.completed)
			if !proto.Equal(got, tt.want) {
				t.Errorf("Lineage = %v, want %v", got, tt.want)
			}
		})
	}
}
