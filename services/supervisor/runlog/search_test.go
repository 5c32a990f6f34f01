package runlog

import (
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

func searchRun(id, goal string, status planexv1.RunStatus, labels map[string]string, tools ...string) *planexv1.Run {
	var steps []*planexv1.Step
	for i, t := range tools {
		steps = append(steps, &planexv1.Step{Id: fmt.Sprintf("s%d", i), Tool: t})
	}
	return &planexv1.Run{Id: id, Goal: goal, Status: status, Labels: labels, StartedBy: "apikey:ci",
		CreatedAt: timestamppb.New(time.Unix(1700000000, 0)), Plans: []*planexv1.Plan{{Revision: 1, Steps: steps}}}
}

// TestSearchIndex: loading in any order, updates by revision, deletion,
// paging before an id, and interned values freed with their last run.
func TestSearchIndex(t *testing.T) {
	var x searchIndex
	x.put(searchRun("00", "not indexed", planexv1.RunStatus_RUN_STATUS_RUNNING, nil), 1)
	if len(x.runs) != 0 {
		t.Fatal("a run was indexed before the index was started")
	}
	x.init()
	running := planexv1.RunStatus_RUN_STATUS_RUNNING
	// The watch delivers the bucket in revision order, not id order.
	x.put(searchRun("03", "Refund ACME", running, map[string]string{"env": "prod"}, "sql.query"), 3)
	x.put(searchRun("01", "refund globex", running, map[string]string{"env": "dev"}), 1)
	x.put(searchRun("02", "Summarize acme", running, map[string]string{"env": "prod"}, "email.send"), 2)
	if _, ok := x.search(&Query{}, "", 0); ok {
		t.Fatal("searched before the index was loaded")
	}
	x.complete(time.Millisecond)
	ids, _ := x.ids()
	if !slices.Equal(ids, []string{"01", "02", "03"}) {
		t.Fatalf("ids %v", ids)
	}
	search := func(q *Query, before string, limit int) []string {
		t.Helper()
		got, ok := x.search(q, before, limit)
		if !ok {
			t.Fatal("index not ready")
		}
		return got
	}
	if got := search(&Query{GoalWords: []string{"REFUND"}}, "", 0); !slices.Equal(got, []string{"03", "01"}) {
		t.Fatalf("refund: %v", got)
	}
	if got := search(&Query{GoalWords: []string{"acme"}}, "03", 0); !slices.Equal(got, []string{"02"}) {
		t.Fatalf("acme before 03: %v", got)
	}
	if got := search(&Query{Tools: []string{"http.get", "email.send"}}, "", 0); !slices.Equal(got, []string{"02"}) {
		t.Fatalf("tools: %v", got)
	}
	if got := search(&Query{}, "", 2); !slices.Equal(got, []string{"03", "02"}) {
		t.Fatalf("limit 2: %v", got)
	}
	// An older revision never replaces a newer one.
	x.put(searchRun("03", "refund acme", planexv1.RunStatus_RUN_STATUS_SUCCEEDED, nil), 10)
	x.put(searchRun("03", "refund acme", planexv1.RunStatus_RUN_STATUS_FAILED, nil), 9)
	if got := search(&Query{Statuses: []planexv1.RunStatus{planexv1.RunStatus_RUN_STATUS_SUCCEEDED}}, "", 0); !slices.Equal(got, []string{"03"}) {
		t.Fatalf("succeeded: %v", got)
	}
	x.put(searchRun("04", "new", running, nil), 11)
	x.remove("01")
	ids, _ = x.ids()
	if !slices.Equal(ids, []string{"02", "03", "04"}) {
		t.Fatalf("after adding 04 and removing 01: %v", ids)
	}
	// The env=dev set went with run 01.
	for k, s := range x.in.sets {
		if v, _ := s.get("env"); v == "dev" {
			t.Fatalf("a deleted run's labels are still interned: %q", k)
		}
	}
	if p := x.in.sets[x.runs[0].labels.key]; p == nil || p.refs != 1 {
		t.Fatalf("env=prod: %+v, want one reference (run 02; run 03 lost its labels)", p)
	}
}

// TestSearchIndexWaiting: a run is waiting when WAITING at an open gate.
func TestSearchIndexWaiting(t *testing.T) {
	run := searchRun("01", "g", planexv1.RunStatus_RUN_STATUS_WAITING, nil, "x.y")
	run.Plans[0].Steps[0].Id = "a"
	run.Steps = []*planexv1.StepState{{StepId: "a", Status: planexv1.StepStatus_STEP_STATUS_PENDING}}
	run.Gates = []*planexv1.Gate{{Id: "g1", Kind: planexv1.GateKind_GATE_KIND_PLAN, PlanRevision: 1}}
	if !(&Query{Waiting: true}).MatchRun(run) {
		t.Fatal("a run at an open plan gate is not waiting")
	}
	run.Gates[0].Decision = planexv1.DecisionKind_DECISION_KIND_APPROVE
	if (&Query{Waiting: true}).MatchRun(run) {
		t.Fatal("a run whose gate is decided is waiting")
	}
}

// BenchmarkSearchIndexBytesPerRun reports the heap the index holds per
// run (bytes/run), for runs with distinct goals and for runs sharing a
// few goals (a scheduled job), with two labels and a two-tool plan each.
//
//	go test -run '^$' -bench BenchmarkSearchIndexBytesPerRun ./services/supervisor/runlog/
func BenchmarkSearchIndexBytesPerRun(b *testing.B) {
	const n = 100_000
	for _, distinct := range []bool{true, false} {
		name := "shared-goals"
		if distinct {
			name = "distinct-goals"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				runs := make([]*planexv1.Run, n)
				for i := range runs {
					goal := fmt.Sprintf("Summarize support ticket %d for Globex and draft a reply", i)
					if !distinct {
						goal = fmt.Sprintf("Summarize the open support tickets of team %d", i%10)
					}
					runs[i] = searchRun(fmt.Sprintf("01JD%022d", i), goal, planexv1.RunStatus_RUN_STATUS_WAITING,
						map[string]string{"team": []string{"billing", "support", "ops"}[i%3], "env": "prod"}, "sql.query", "email.draft")
				}
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				x := &searchIndex{}
				x.init()
				for i, r := range runs {
					x.put(r, uint64(i+1))
				}
				x.complete(0)
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/run")
				runtime.KeepAlive(x)
				runtime.KeepAlive(runs) // measured apart from the index
			}
		})
	}
}

// BenchmarkIndexSnapshot is the index's cost per snapshot the watch
// delivers (decode and summarize) for a finished two-step run, and for a
// run waiting at the gate of its second step (what a restart with a
// million runs waiting reads a million times).
//
//	go test -run '^$' -bench BenchmarkIndexSnapshot ./services/supervisor/runlog/
func BenchmarkIndexSnapshot(b *testing.B) {
	out, _ := structpb.NewStruct(map[string]any{"rows": []any{map[string]any{"id": 7.0, "status": "open", "subject": "printer on fire"}}})
	for _, waiting := range []bool{false, true} {
		name, status := "finished", planexv1.RunStatus_RUN_STATUS_SUCCEEDED
		if waiting {
			name, status = "waiting", planexv1.RunStatus_RUN_STATUS_WAITING
		}
		b.Run(name, func(b *testing.B) {
			run := searchRun("01JD0000000000000000000000", "Summarize support ticket 7 for Globex", status,
				map[string]string{"team": "ops", "env": "prod"}, "sql.query", "email.draft")
			run.Steps = []*planexv1.StepState{{StepId: "s0", Tool: "sql.query", Status: planexv1.StepStatus_STEP_STATUS_SUCCEEDED, PlanRevision: 1, Output: structpb.NewStructValue(out)}}
			if waiting {
				run.Steps = append(run.Steps, &planexv1.StepState{StepId: "s1", Tool: "email.draft", Status: planexv1.StepStatus_STEP_STATUS_WAITING_APPROVAL, PlanRevision: 1, ResolvedArgs: out})
				run.Gates = []*planexv1.Gate{{Id: "g1", Kind: planexv1.GateKind_GATE_KIND_STEP, StepId: "s1", PlanRevision: 1}}
			}
			data, err := SnapshotValue(run)
			if err != nil {
				b.Fatal(err)
			}
			x := &searchIndex{}
			x.init()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				run, facts, err := indexedRun(data)
				if err != nil {
					b.Fatal(err)
				}
				s := summarizeTools(run, facts, 1, &x.in)
				if s.waiting != waiting {
					b.Fatalf("waiting %v", s.waiting)
				}
				x.in.release(&s)
			}
		})
	}
}

// TestIndexedRunSummarizesLikeTheRun: the index's partial decoding of a
// snapshot gives the summary of the whole run.
func TestIndexedRunSummarizesLikeTheRun(t *testing.T) {
	waiting := searchRun("01JD0000000000000000000001", "Wait for me", planexv1.RunStatus_RUN_STATUS_WAITING, map[string]string{"a": "b"}, "x.y", "z.w")
	waiting.Plans[0].Steps[0].Id = "a"
	waiting.Steps = []*planexv1.StepState{{StepId: "a", Status: planexv1.StepStatus_STEP_STATUS_PENDING}}
	waiting.Gates = []*planexv1.Gate{{Id: "g1", Kind: planexv1.GateKind_GATE_KIND_PLAN, PlanRevision: 1}}
	done := searchRun("r-not-a-ulid", "Done", planexv1.RunStatus_RUN_STATUS_FAILED, nil, "x.y", "x.y", "q.r")
	done.StopReason = planexv1.StopReason_STOP_REASON_STEP_FAILED
	done.ForkedFrom = &planexv1.ForkOrigin{RunId: "01JD0000000000000000000001"}
	done.Plans = append(done.Plans, &planexv1.Plan{Revision: 2, Steps: []*planexv1.Step{{Id: "b", Tool: "late.tool"}}})
	out, _ := structpb.NewStruct(map[string]any{"big": "output"})
	done.Steps = []*planexv1.StepState{{StepId: "s0", Output: structpb.NewStructValue(out)}, {StepId: "s1", Status: planexv1.StepStatus_STEP_STATUS_SUCCEEDED}}
	done.UpdatedAt = timestamppb.New(time.Date(2026, 11, 28, 1, 2, 3, 4, time.UTC))
	done.StartedBy = "apikey:ci"
	// Waiting at a step gate, with the bulk the index does not decode
	// (arguments, outputs, plan steps): open, then held for another plan
	// revision (not open), then decided (not open).
	atStep := func(stepRevision int32, decided bool) *planexv1.Run {
		r := searchRun("01JD0000000000000000000002", "Step gate", planexv1.RunStatus_RUN_STATUS_WAITING, nil, "x.y", "sql.write")
		r.Plans = append(r.Plans, &planexv1.Plan{Revision: 2, Steps: []*planexv1.Step{{Id: "a", Tool: "sql.write", Args: out}}})
		r.Steps = []*planexv1.StepState{
			{StepId: "s0", Status: planexv1.StepStatus_STEP_STATUS_SUCCEEDED, PlanRevision: 1, Output: structpb.NewStructValue(out)},
			{StepId: "a", Status: planexv1.StepStatus_STEP_STATUS_WAITING_APPROVAL, PlanRevision: stepRevision, ResolvedArgs: out},
		}
		r.Gates = []*planexv1.Gate{{Id: "g1", Kind: planexv1.GateKind_GATE_KIND_PLAN, PlanRevision: 1, Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE},
			{Id: "g2", Kind: planexv1.GateKind_GATE_KIND_STEP, StepId: "a", PlanRevision: 2}}
		if decided {
			r.Gates[1].Decision = planexv1.DecisionKind_DECISION_KIND_REJECT
		}
		return r
	}
	open, stale, decided := atStep(2, false), atStep(1, false), atStep(2, true)
	for _, c := range []struct {
		run  *planexv1.Run
		want bool
	}{{open, true}, {stale, false}, {decided, false}, {waiting, true}} {
		if got := summarize(c.run, 1, nil).waiting; got != c.want {
			t.Fatalf("fixture: run %s waiting %v, want %v", c.run.GetGoal(), got, c.want)
		}
	}
	for _, run := range []*planexv1.Run{waiting, done, open, stale, decided} {
		data, err := SnapshotValue(run)
		if err != nil {
			t.Fatal(err)
		}
		got, facts, err := indexedRun(data)
		if err != nil {
			t.Fatal(err)
		}
		a, b := summarizeTools(got, facts, 1, nil), summarize(run, 1, nil)
		if !proto.Equal(a.basic(), b.basic()) || !proto.Equal(a.basic(), BasicRun(run)) {
			t.Fatalf("run %s: basic view from the snapshot %v, from the run %v", run.GetId(), a.basic(), BasicRun(run))
		}
		if a.id.String() != b.id.String() || a.goal != b.goal || a.text() != run.GetGoal() || a.status != b.status || a.stop != b.stop || a.waiting != b.waiting ||
			a.created != b.created || a.startedBy.s != b.startedBy.s || (a.forkedFrom == nil) != (b.forkedFrom == nil) ||
			!slices.Equal(a.labels.pairsOrNil(), b.labels.pairsOrNil()) || !slices.Equal(a.tools.pairsOrNil(), b.tools.pairsOrNil()) {
			t.Fatalf("run %s: partial %+v, whole %+v", run.GetId(), a, b)
		}
	}
	if _, _, err := indexedRun([]byte("PXS1\x00\x00\x00\xffjunk")); err == nil {
		t.Fatal("a truncated snapshot decoded")
	}
}

func (t *tagSet) pairsOrNil() []string {
	if t == nil {
		return nil
	}
	return t.pairs
}

// TestMovingRunIDs: the sweeper's candidates are the runs pending,
// planning or running; runs waiting at gates and finished runs are not
// read at all.
func TestMovingRunIDs(t *testing.T) {
	l := &Log{}
	l.indexOnce.Do(func() {}) // the index is fed by hand, not by a watch
	l.index.init()
	for i, st := range []planexv1.RunStatus{
		planexv1.RunStatus_RUN_STATUS_PENDING, planexv1.RunStatus_RUN_STATUS_PLANNING,
		planexv1.RunStatus_RUN_STATUS_RUNNING, planexv1.RunStatus_RUN_STATUS_WAITING,
		planexv1.RunStatus_RUN_STATUS_SUCCEEDED, planexv1.RunStatus_RUN_STATUS_FAILED,
		planexv1.RunStatus_RUN_STATUS_CANCELLED,
	} {
		l.index.put(searchRun(fmt.Sprintf("0%d", i), "g", st, nil), uint64(i+1))
	}
	l.index.complete(time.Millisecond)
	ids, err := l.MovingRunIDs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"00", "01", "02"}) {
		t.Fatalf("moving runs %v, want the pending, planning and running ones (00, 01, 02)", ids)
	}
	if n := l.IndexedRuns(); n != 7 {
		t.Fatalf("IndexedRuns %d, want 7", n)
	}
}

// TestPackedGoalRestoresTheGoal: a summary keeps a goal lowercased (what
// goal words match) and restores it as written (what the basic view
// shows), for ASCII capitals (a bitmap) and others (the text).
func TestPackedGoalRestoresTheGoal(t *testing.T) {
	for _, goal := range []string{
		"", "refund order 7", "Refund Order 7 of ACME", "Z", "a\x00B", "Ünïcode Straße", "İstanbul rapor", "ΣΊΣΥΦΟΣ and ACME",
		strings.Repeat("Ab", 2048),
	} {
		var s runSummary
		s.goal, s.glen, s.caps = packGoal(goal)
		if got := s.text(); got != goal {
			t.Errorf("goal %.20q: restored %.20q", goal, got)
		}
		if got := s.lowerGoal(); got != strings.ToLower(goal) {
			t.Errorf("goal %.20q: lowercased %.20q", goal, got)
		}
	}
	if s := summarize(&planexv1.Run{Goal: "no capitals"}, 0, nil); s.caps != capsNone || len(s.goal) != len("no capitals") {
		t.Fatalf("a goal without capitals is kept %d bytes, caps %d", len(s.goal), s.caps)
	}
}

// entry is one update of a planex-runs watch, as the loader gets it.
type entry struct {
	key string
	val []byte
	rev uint64
	op  jetstream.KeyValueOp
}

func (e entry) Bucket() string                  { return "planex-runs" }
func (e entry) Key() string                     { return e.key }
func (e entry) Value() []byte                   { return e.val }
func (e entry) Revision() uint64                { return e.rev }
func (e entry) Created() time.Time              { return time.Time{} }
func (e entry) Delta() uint64                   { return 0 }
func (e entry) Operation() jetstream.KeyValueOp { return e.op }

// TestIndexLoaderKeepsEachRunsOrder: the initial values are applied on
// several goroutines, but a run's updates in the order delivered — a run
// put then deleted stays deleted, a run put twice keeps the later value,
// whichever lane it lands on.
func TestIndexLoaderKeepsEachRunsOrder(t *testing.T) {
	x := &searchIndex{}
	x.init()
	x.reserve(3000)
	load := newIndexLoader(t.Context(), x, slog.New(slog.DiscardHandler))
	rev := uint64(0)
	put := func(id, goal string) {
		rev++
		data, err := SnapshotValue(searchRun(id, goal, planexv1.RunStatus_RUN_STATUS_RUNNING, nil))
		if err != nil {
			t.Fatal(err)
		}
		load.add(entry{key: id, val: data, rev: rev, op: jetstream.KeyValuePut})
	}
	for i := range 1000 {
		put(fmt.Sprintf("01JD%022d", i), "first")
	}
	for i := range 1000 {
		id := fmt.Sprintf("01JD%022d", i)
		switch i % 3 {
		case 0:
			rev++
			load.add(entry{key: id, rev: rev, op: jetstream.KeyValueDelete})
		case 1:
			put(id, "second")
		}
	}
	load.wait()
	x.complete(0)
	if got, want := x.len(), 1000-334; got != want {
		t.Fatalf("%d runs indexed, want %d (the deleted ones gone)", got, want)
	}
	second, _ := x.search(&Query{GoalWords: []string{"second"}}, "", 0)
	if len(second) != 333 {
		t.Fatalf("%d runs with their later goal, want 333", len(second))
	}
}
