package catalog

import (
	"encoding/json"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

func execSpec(desc string) *planexv1.ToolSpec {
	schema, _ := structpb.NewStruct(map[string]any{"type": "object", "properties": map[string]any{"sql": map[string]any{"type": "string"}}})
	return &planexv1.ToolSpec{Name: "sql.exec", Pool: "sql", SideEffect: write, RequiresApproval: true, Description: desc, ArgsSchema: schema}
}

// TestKnownToolStaysWhileItsPoolIsAway: a tool the supervisors served
// stays in the catalog, with its last spec and no replica, while every
// replica of its pool is gone — for the supervisor that saw it and for a
// restarted one — so that plans using it stay valid and its steps wait
// (issue 27: "unknown tool sql.exec" while the sql pool re-registered).
func TestKnownToolStaysWhileItsPoolIsAway(t *testing.T) {
	f := newFixture(t)
	c := f.cache()
	f.register("sql.exec.r1", execSpec("v1"))
	if cat := f.load(c); cat.Absent("sql.exec") || len(cat.MissingPools([]string{"sql"})) != 0 {
		t.Fatalf("live tool: absent %v, missing pools %v", cat.Absent("sql.exec"), cat.MissingPools([]string{"sql"}))
	}
	// A new version of the spec is recorded too.
	f.register("sql.exec.r1", execSpec("v2"))
	f.load(c)
	f.deregister("sql.exec.r1")

	for name, cache := range map[string]*Cache{"same supervisor": c, "restarted supervisor": f.cache()} {
		cat := f.load(cache)
		spec, ok := cat.Tool("sql.exec")
		if !ok || !cat.Absent("sql.exec") {
			t.Fatalf("%s: sql.exec served %v, absent %v; want the known tool, absent", name, ok, cat.Absent("sql.exec"))
		}
		if spec.GetDescription() != "v2" || spec.GetArgsSchema().GetFields()["properties"] == nil || !spec.GetRequiresApproval() {
			t.Fatalf("%s: served %v, want the last registration's spec (v2, with its schema and approval)", name, spec)
		}
		if reg := cat.Registered("sql"); len(reg) != 1 || len(reg[0].GetReplicas()) != 0 {
			t.Fatalf("%s: registered %v, want sql.exec without replicas", name, reg)
		}
		if got := cat.MissingPools([]string{"sql", "email", "sql"}); strings.Join(got, ",") != "email" {
			t.Fatalf("%s: missing pools %v, want [email]", name, got)
		}
	}

	// A replica of the pool that no longer has the tool: the pool dropped
	// it, and it is unknown again.
	query := &planexv1.ToolSpec{Name: "sql.query", Pool: "sql", SideEffect: read}
	f.register("sql.query.r3", query)
	if cat := f.load(c); func() bool { _, ok := cat.Tool("sql.exec"); return ok }() {
		t.Fatal("sql.exec served while a live replica of its pool does not register it")
	}
	f.deregister("sql.query.r3")

	// A replica back: live again.
	f.register("sql.exec.r2", execSpec("v2"))
	if cat := f.load(c); cat.Absent("sql.exec") || len(cat.Registered("sql")[0].GetReplicas()) != 1 {
		t.Fatalf("after re-registration: absent %v, registered %v", cat.Absent("sql.exec"), cat.Registered("sql"))
	}
}

// TestKnownToolIsServedAtItsFloor: the spec kept beside a floor is served
// raised to the floor, and one naming another tool or pool than its key is
// ignored.
func TestKnownToolIsServedAtItsFloor(t *testing.T) {
	f := newFixture(t)
	spec := execSpec("v1")
	spec.RequiresApproval = false
	raised := FloorOf(spec)
	raised.RequiresApproval = true
	raised.SensitiveFields = []string{"sql"}
	data, err := encodeRecord(raised, spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.floors.Put(ctx(t), "sql.exec", data); err != nil {
		t.Fatal(err)
	}
	other := execSpec("evil")
	other.Name, other.Pool = "email.send", "email"
	data, err = encodeRecord(FloorOf(other), other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.floors.Put(ctx(t), "sql.query", data); err != nil {
		t.Fatal(err)
	}
	cat := f.load(f.cache())
	checkServed(t, cat, "sql.exec", raised)
	if _, ok := cat.Tool("sql.query"); ok {
		t.Fatal("a spec naming email.send beside the floor of sql.query was served")
	}
	if _, ok := cat.Tool("email.send"); ok {
		t.Fatal("a spec naming email.send beside the floor of sql.query was served as email.send")
	}
	if !strings.Contains(f.logs.String(), "names another tool or pool") {
		t.Errorf("log %q: want the mismatching spec named", f.logs.String())
	}
	// The stored record stays a floor for readers that know nothing of
	// the spec.
	var fl Floor
	if err := json.Unmarshal(data, &fl); err != nil || !fl.Equal(FloorOf(other)) {
		t.Fatalf("record read as a floor: %+v %v", fl, err)
	}
}

// TestTwoVersionsDoNotChurnTheRecord: replicas of two versions renewing
// in turn (a rollout) do not rewrite the tool's record at every load.
func TestTwoVersionsDoNotChurnTheRecord(t *testing.T) {
	f := newFixture(t)
	c := f.cache()
	f.register("sql.exec.r1", execSpec("v1"))
	f.register("sql.exec.r2", execSpec("v2"))
	f.load(c)
	e, err := f.floors.Get(ctx(t), "sql.exec")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		f.register("sql.exec.r1", execSpec("v1"))
		f.load(c)
		f.register("sql.exec.r2", execSpec("v2"))
		f.load(c)
	}
	after, err := f.floors.Get(ctx(t), "sql.exec")
	if err != nil {
		t.Fatal(err)
	}
	if after.Revision() != e.Revision() {
		t.Fatalf("record rewritten from revision %d to %d by renewals of the same two versions", e.Revision(), after.Revision())
	}
}
