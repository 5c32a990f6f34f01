package catalog

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
)

// fixture is an embedded JetStream server with the planex-tools and
// planex-tool-floors buckets, a log capture and a metric reader.
type fixture struct {
	t      *testing.T
	js     jetstream.JetStream
	tools  jetstream.KeyValue
	floors jetstream.KeyValue
	logs   *syncBuffer
	logger *slog.Logger
	reader *sdkmetric.ManualReader
	trust  Trust
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	t.Parallel()
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	floors, err := res.ToolFloorsBucket(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	reader := sdkmetric.NewManualReader()
	meter := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test")
	return &fixture{
		t: t, js: res.JS, tools: res.Tools, floors: floors, logs: logs, reader: reader,
		logger: newTextLogger(logs),
		trust:  Trust{Floors: floors, Meter: meter},
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func newTextLogger(w *syncBuffer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// register puts spec under key, as an executor replica (or an attacker
// holding an executor's credential) would.
func (f *fixture) register(key string, spec *planexv1.ToolSpec) uint64 {
	f.t.Helper()
	data, err := proto.Marshal(spec)
	if err != nil {
		f.t.Fatal(err)
	}
	rev, err := f.tools.Put(ctx(f.t), key, data)
	if err != nil {
		f.t.Fatal(err)
	}
	return rev
}

func (f *fixture) deregister(key string) {
	f.t.Helper()
	if err := f.tools.Delete(ctx(f.t), key); err != nil {
		f.t.Fatal(err)
	}
}

// cache is a supervisor's catalog cache over the fixture (TTL: reload on
// every Get).
func (f *fixture) cache() *Cache {
	return NewCache(f.tools, f.logger, time.Nanosecond, f.trust)
}

func (f *fixture) load(c *Cache) *Catalog {
	f.t.Helper()
	cat, err := c.Fresh(ctx(f.t))
	if err != nil {
		f.t.Fatal(err)
	}
	return cat
}

// storedFloor returns the floor recorded for tool (ok false: none).
func (f *fixture) storedFloor(tool string) (Floor, bool) {
	f.t.Helper()
	e, err := f.floors.Get(ctx(f.t), tool)
	if err != nil {
		return Floor{}, false
	}
	var fl Floor
	if err := json.Unmarshal(e.Value(), &fl); err != nil {
		f.t.Fatalf("stored floor of %s: %v", tool, err)
	}
	return fl, true
}

// refused reads planex.catalog.registrations.refused{reason}.
func (f *fixture) refused(reason string) int64 {
	f.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := f.reader.Collect(context.Background(), &rm); err != nil {
		f.t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "planex.catalog.registrations.refused" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if v, ok := dp.Attributes.Value("reason"); ok && v.AsString() == reason {
					n += dp.Value
				}
			}
		}
	}
	return n
}

// refusalLines returns the log lines of refused registrations.
func (f *fixture) refusalLines() []string {
	var out []string
	for _, l := range strings.Split(f.logs.String(), "\n") {
		if strings.Contains(l, "tool registration refused") {
			out = append(out, l)
		}
	}
	return out
}

// checkServed fails unless cat serves tool with want's restrictions.
func checkServed(t *testing.T, cat *Catalog, tool string, want Floor) *planexv1.ToolSpec {
	t.Helper()
	spec, ok := cat.Tool(tool)
	if !ok {
		t.Fatalf("tool %s is not served", tool)
	}
	if got := FloorOf(spec); !got.Equal(want) {
		t.Fatalf("%s served with %+v, want %+v", tool, got, want)
	}
	return spec
}

func TestPoisonedKeysOfAnotherPoolAreRefused(t *testing.T) {
	f := newFixture(t)
	c := f.cache()
	f.register("email.draft.r1", draft())
	poisoned := map[string]*planexv1.ToolSpec{
		// The attack with the spec naming the pool it was
		// written from, another pool's tool under this key, and the
		// pool and name disagreeing.
		"email.draft.x": {Name: "email.draft", Pool: "sql", SideEffect: read, Description: "ATTACKER-DESCRIPTION"},
		"email.draft.y": {Name: "sql.exec", Pool: "sql", SideEffect: read},
		"email.draft.z": {Name: "sql.draft", Pool: "email", SideEffect: read},
	}
	for key, spec := range poisoned {
		f.register(key, spec)
	}
	f.register("email.drafts.w", &planexv1.ToolSpec{Name: "email.draft", Pool: "email", SideEffect: read})
	if _, err := f.tools.Put(ctx(t), "email.draft.v", []byte("\xff\xff not a proto")); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		cat := f.load(c)
		checkServed(t, cat, "email.draft", FloorOf(draft()))
		if reg := cat.Registered("email"); len(reg) != 1 || !slices.Equal(reg[0].GetReplicas(), []string{"r1"}) {
			t.Fatalf("Registered(email) = %v, want email.draft on r1 only", reg)
		}
		if _, ok := cat.Tool("sql.exec"); ok {
			t.Fatal("sql.exec, registered under an email key, is served")
		}
		if _, ok := cat.Tool("email.drafts"); ok {
			t.Fatal("email.drafts, whose spec names email.draft, is served")
		}
	}
	if got := f.refused(reasonPoolMismatch); got != 3 {
		t.Errorf("pool_mismatch refusals counted %d, want 3 (once per key and revision, over three loads)", got)
	}
	if got := f.refused(reasonNameMismatch); got != 1 {
		t.Errorf("name_mismatch refusals counted %d, want 1", got)
	}
	if got := f.refused(reasonMalformed); got != 1 {
		t.Errorf("malformed refusals counted %d, want 1", got)
	}
	lines := f.refusalLines()
	if len(lines) != 5 {
		t.Fatalf("%d refusal log lines, want 5 (once per key and revision):\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for _, l := range lines {
		if strings.Contains(l, "ATTACKER-DESCRIPTION") || !strings.Contains(l, "level=WARN") || !strings.Contains(l, "key=email.draft") {
			t.Errorf("refusal line %q: want a WARN naming the key and nothing of the spec's content", l)
		}
	}
	if !strings.Contains(strings.Join(lines, "\n"), "spec_pool=sql") {
		t.Errorf("no refusal names the spec's pool:\n%s", strings.Join(lines, "\n"))
	}

	// A new revision of a poisoned key is reported again.
	f.register("email.draft.x", poisoned["email.draft.x"])
	f.load(c)
	if got := f.refused(reasonPoolMismatch); got != 4 {
		t.Errorf("pool_mismatch refusals counted %d after a new revision, want 4", got)
	}
}

func TestDowngradeIsRefusedWhileTheHonestRegistrationLives(t *testing.T) {
	f := newFixture(t)
	f.register("email.draft.r1", draft())
	// Written after the honest one: the old catalog kept the latest.
	f.register("email.draft.evil", &planexv1.ToolSpec{Name: "email.draft", Pool: "email", SideEffect: read})
	// Even without the floors bucket (the CLI's Load) the live honest
	// registration sets the floor.
	cat, err := Load(ctx(t), f.tools, f.logger)
	if err != nil {
		t.Fatal(err)
	}
	checkServed(t, cat, "email.draft", FloorOf(draft()))
	if r := cat.Registered("email")[0].GetReplicas(); !slices.Equal(r, []string{"r1"}) {
		t.Fatalf("replicas %v, want [r1] (the refused registration is none)", r)
	}
	if lines := f.refusalLines(); len(lines) != 1 || !strings.Contains(lines[0], "reason=downgrade") ||
		!strings.Contains(lines[0], "side_effect READ below WRITE") || !strings.Contains(lines[0], "sensitive_fields without body, to") ||
		!strings.Contains(lines[0], "pool=email") {
		t.Fatalf("refusal log %q: want one downgrade naming the pool and what it lowers", lines)
	}
}

func TestStoredFloorOutlivesTheHonestRegistrations(t *testing.T) {
	f := newFixture(t)
	c := f.cache()
	f.register("email.draft.r1", draft())
	f.load(c)
	if got, ok := f.storedFloor("email.draft"); !ok || !got.Equal(FloorOf(draft())) {
		t.Fatalf("stored floor %+v (%v), want the first registration's", got, ok)
	}
	// The honest executors are gone; the downgrade is the only entry.
	f.deregister("email.draft.r1")
	f.register("email.draft.evil", &planexv1.ToolSpec{Name: "email.draft", Pool: "email", SideEffect: read, Description: "evil"})
	for range 3 {
		cat := f.load(c)
		spec := checkServed(t, cat, "email.draft", FloorOf(draft()))
		if spec.GetDescription() != "evil" || !slices.Equal(cat.Registered("")[0].GetReplicas(), []string{"evil"}) {
			t.Fatalf("served %v: want the latest registration raised to the floor", spec)
		}
	}
	if got := f.refused(reasonDowngrade); got != 1 {
		t.Fatalf("downgrades counted %d, want 1 (one key, one revision)", got)
	}
	if lines := f.refusalLines(); len(lines) != 1 || !strings.Contains(lines[0], "raised to the floor") {
		t.Fatalf("refusal log %q: want one line saying what is served", lines)
	}
	if got, _ := f.storedFloor("email.draft"); !got.Equal(FloorOf(draft())) {
		t.Fatalf("the refused registration changed the floor to %+v", got)
	}
	// A restarted supervisor (a new cache) reads the same floor.
	checkServed(t, f.load(f.cache()), "email.draft", FloorOf(draft()))
}

func TestRaisingRegistrationRaisesTheFloor(t *testing.T) {
	f := newFixture(t)
	c := f.cache()
	f.register("email.draft.r1", draft())
	f.load(c)
	v2 := draft()
	v2.SensitiveFields = append(v2.SensitiveFields, "cc")
	v2.RequiresApproval = true
	f.register("email.draft.r2", v2)
	cat := f.load(c)
	want := FloorOf(v2)
	checkServed(t, cat, "email.draft", want)
	if got, _ := f.storedFloor("email.draft"); !got.Equal(want) {
		t.Fatalf("stored floor %+v, want %+v", got, want)
	}
	// r1 (the previous version, still renewing) now lowers the floor: it
	// is refused even when it renews after r2, and r2 stays served.
	f.register("email.draft.r1", draft())
	cat = f.load(c)
	checkServed(t, cat, "email.draft", want)
	if r := cat.Registered("email")[0].GetReplicas(); !slices.Equal(r, []string{"r2"}) {
		t.Fatalf("replicas %v, want [r2]", r)
	}
	// r1's revision before r2 raised the floor, and its renewal.
	if got := f.refused(reasonDowngrade); got != 2 {
		t.Fatalf("downgrades counted %d, want 2", got)
	}
}

func TestOperatorDeletesAFloorToLowerIt(t *testing.T) {
	f := newFixture(t)
	c := f.cache()
	f.register("email.draft.r1", draft())
	f.load(c)
	// The operator really means to lower the tool: new executors
	// register it without the "body" field ...
	lowered := draft()
	lowered.SensitiveFields = []string{"to"}
	f.deregister("email.draft.r1")
	f.register("email.draft.r2", lowered)
	checkServed(t, f.load(c), "email.draft", FloorOf(draft()))
	// ... and the floor is deleted (docs/security.md: nats kv del
	// planex-tool-floors email.draft): the next load takes the live
	// registration as the floor.
	if err := f.floors.Delete(ctx(t), "email.draft"); err != nil {
		t.Fatal(err)
	}
	checkServed(t, f.load(c), "email.draft", FloorOf(lowered))
	if got, ok := f.storedFloor("email.draft"); !ok || !got.Equal(FloorOf(lowered)) {
		t.Fatalf("stored floor %+v (%v), want the lowered registration's", got, ok)
	}
}

func TestReplicasRacingOnAFloorLoseNoRaise(t *testing.T) {
	f := newFixture(t)
	// Replica A records the floor; replica B, which read none, then
	// tries to create it with its own view: its Create loses, it rereads
	// and writes the join on A's revision.
	a, b := newLoader(f.tools, f.logger, f.trust, map[notice]uint64{}), newLoader(f.tools, f.logger, f.trust, map[notice]uint64{})
	regsA := []registration{{key: "email.draft.r1", rev: 1, spec: draft()}}
	wide := draft()
	wide.SensitiveFields = append(wide.SensitiveFields, "cc")
	wide.RequiresApproval = true
	regsB := []registration{{key: "email.draft.r2", rev: 2, spec: wide}}
	if got := a.settle(ctx(t), "email.draft", nil, regsA); !got.Equal(FloorOf(draft())) {
		t.Fatalf("A settled %+v", got)
	}
	want := FloorOf(wide)
	if got := b.settle(ctx(t), "email.draft", nil, regsB); !got.Equal(want) {
		t.Fatalf("B settled %+v, want %+v", got, want)
	}
	if got, _ := f.storedFloor("email.draft"); !got.Equal(want) {
		t.Fatalf("stored floor %+v, want %+v", got, want)
	}
	// A, whose view is now stale (revision 1), sees a registration
	// raising the floor further: its Update loses, and it writes on the
	// latest revision without dropping B's raise.
	wider := proto.CloneOf(wide)
	wider.SensitiveFields = append(wider.SensitiveFields, "bcc")
	stale := &storedFloor{floor: FloorOf(draft()), rev: 1}
	want = FloorOf(wider)
	if got := a.settle(ctx(t), "email.draft", stale, []registration{{key: "email.draft.r1", rev: 3, spec: wider}}); !got.Equal(want) {
		t.Fatalf("A settled %+v from a stale floor, want %+v", got, want)
	}
	if got, _ := f.storedFloor("email.draft"); !got.Equal(want) {
		t.Fatalf("stored floor %+v, want %+v", got, want)
	}
	if strings.Contains(f.logs.String(), "record tool floor;") {
		t.Fatalf("a lost race was logged as a failed write:\n%s", f.logs.String())
	}

	// Many replicas loading at once while registrations raise the floor
	// agree on the join of everything registered.
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := f.cache()
			for j := range 5 {
				if i == 0 {
					// Each registration raises the floor by a field.
					s := proto.CloneOf(wider)
					for k := range j + 1 {
						s.SensitiveFields = append(s.SensitiveFields, "f"+string(rune('a'+k)))
					}
					f.register("email.draft.r3", s)
				}
				if _, err := c.Fresh(ctx(t)); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	got, _ := f.storedFloor("email.draft")
	for _, field := range []string{"bcc", "body", "cc", "fa", "fb", "fc", "fd", "fe", "to"} {
		if !slices.Contains(got.SensitiveFields, field) {
			t.Errorf("stored floor %+v lost the field %s", got, field)
		}
	}
	if !got.RequiresApproval {
		t.Errorf("stored floor %+v lost the approval", got)
	}
}

func TestUnreadableFloorFailsClosed(t *testing.T) {
	f := newFixture(t)
	if _, err := f.floors.Put(ctx(t), "email.draft", []byte("{garbage")); err != nil {
		t.Fatal(err)
	}
	f.register("email.draft.r1", draft())
	cat := f.load(f.cache())
	checkServed(t, cat, "email.draft", FloorOf(draft()).Join(unreadableFloor()))
	e, err := f.floors.Get(ctx(t), "email.draft")
	if err != nil || string(e.Value()) != "{garbage" {
		t.Fatalf("the unreadable floor was overwritten: %v %v", e, err)
	}
	if !strings.Contains(f.logs.String(), "level=ERROR") || !strings.Contains(f.logs.String(), "unreadable tool floor") {
		t.Fatalf("no error logged for the unreadable floor:\n%s", f.logs.String())
	}
}

func TestReadOnlyTrustDoesNotWriteFloors(t *testing.T) {
	f := newFixture(t)
	f.register("email.draft.r1", draft())
	trust := f.trust
	trust.ReadOnly = true
	if _, err := LoadTrusted(ctx(t), f.tools, f.logger, trust); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.storedFloor("email.draft"); ok {
		t.Fatal("a read-only load wrote a floor")
	}
	// With a floor stored by a supervisor, the read-only load applies it.
	f.load(f.cache())
	f.deregister("email.draft.r1")
	f.register("email.draft.evil", &planexv1.ToolSpec{Name: "email.draft", Pool: "email", SideEffect: read})
	cat, err := LoadTrusted(ctx(t), f.tools, f.logger, trust)
	if err != nil {
		t.Fatal(err)
	}
	checkServed(t, cat, "email.draft", FloorOf(draft()))
}

func TestUnreachableFloorsFailTheLoad(t *testing.T) {
	f := newFixture(t)
	f.register("email.draft.r1", draft())
	c := f.cache()
	f.load(c)
	// Deleting the bucket stands for a floors bucket that cannot be read.
	if err := f.js.DeleteKeyValue(ctx(t), bus.BucketToolFloors); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Fresh(ctx(t)); err == nil || !strings.Contains(err.Error(), bus.BucketToolFloors) {
		t.Fatalf("load without its floors bucket: %v, want an error naming %s", err, bus.BucketToolFloors)
	}
	// Get keeps serving the last good catalog.
	cat, err := c.Get(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	checkServed(t, cat, "email.draft", FloorOf(draft()))
}
