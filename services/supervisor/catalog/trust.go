package catalog

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/plan"
)

// instrumentation names the meter of the catalog's metrics.
const instrumentation = "github.com/planex-dev/planex/services/supervisor/catalog"

// Reasons a registration is refused: the reason attribute of
// planex.catalog.registrations.refused.
const (
	// reasonMalformed: the key or the value cannot be decoded.
	reasonMalformed = "malformed"
	// reasonPoolMismatch: the spec's pool, or its name's pool, is not the
	// pool of its key.
	reasonPoolMismatch = "pool_mismatch"
	// reasonNameMismatch: same pool, but the spec names another tool than
	// its key.
	reasonNameMismatch = "name_mismatch"
	// reasonDowngrade: the spec lowers the tool's floor.
	reasonDowngrade = "downgrade"
)

const (
	// floorWriteTimeout bounds one write to planex-tool-floors, so that a
	// server refusing it (missing permission) does not hold a reload.
	floorWriteTimeout = 2 * time.Second
	// floorWriteAttempts bounds the writes of one floor that lose a race
	// with another supervisor replica.
	floorWriteAttempts = 5
)

// Trust is what a catalog load checks registrations against, beyond the
// agreement of each key with its spec.
type Trust struct {
	// Floors is the planex-tool-floors bucket
	// (bus.Resources.ToolFloorsBucket). A load reads each tool's floor
	// from it and, unless ReadOnly, raises it with Create/Update on the
	// revision read, so supervisor replicas racing on one floor never lose
	// a raise. Nil keeps floors in memory for one load: a registration is
	// then refused only when it lowers another live registration of its
	// tool.
	Floors jetstream.KeyValue
	// ReadOnly reads Floors without writing them, for readers other than
	// the supervisor.
	ReadOnly bool
	// Meter counts refused registrations in
	// planex.catalog.registrations.refused{reason}. Nil counts nothing in
	// LoadTrusted; NewCache then uses the global meter provider.
	Meter metric.Meter
}

// loader loads catalogs; a Cache keeps one, so that its refusals are
// reported once per key and revision.
type loader struct {
	tools   jetstream.KeyValue
	trust   Trust
	logger  *slog.Logger
	refused metric.Int64Counter // nil: not counted

	mu   sync.Mutex
	seen map[notice]uint64 // nil: report every time (one-off loads)
}

// notice identifies something a load reports: its kind and the key (or
// tool) it is about; seen maps it to the revision last reported.
type notice struct{ kind, key string }

func newLoader(tools jetstream.KeyValue, logger *slog.Logger, trust Trust, seen map[notice]uint64) *loader {
	l := &loader{tools: tools, trust: trust, logger: logger, seen: seen}
	if trust.Meter != nil {
		c, err := trust.Meter.Int64Counter("planex.catalog.registrations.refused",
			metric.WithDescription("Tool registrations the supervisor refused, once per key and revision, by reason: malformed, pool_mismatch, name_mismatch (the key's pool or tool differs from the spec's), downgrade (the spec lowers the tool's floor)."))
		if err != nil {
			logger.Warn("tool catalog metric", "err", err)
		} else {
			l.refused = c
		}
	}
	return l
}

// firstTime reports whether the notice (kind, key) at revision rev has not
// been reported yet, and records it.
func (l *loader) firstTime(kind, key string, rev uint64) bool {
	if l.seen == nil {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n := notice{kind, key}
	if r, ok := l.seen[n]; ok && r == rev {
		return false
	}
	l.seen[n] = rev
	return true
}

// prune forgets the notices about keys and tools no longer present, so
// that the record stays as small as the catalog.
func (l *loader) prune(present map[string]bool) {
	if l.seen == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for n := range l.seen {
		if !present[n.key] {
			delete(l.seen, n)
		}
	}
}

// registration is one decoded planex-tools entry.
type registration struct {
	key, tool, replica string
	rev                uint64
	spec               *planexv1.ToolSpec
}

// storedFloor is a tool's entry in planex-tool-floors.
type storedFloor struct {
	floor      Floor
	rev        uint64
	unreadable bool               // the value could not be decoded: floor is unreadableFloor
	spec       *planexv1.ToolSpec // the spec served last; nil: none recorded (or unreadable)
}

func (l *loader) load(ctx context.Context) (*Catalog, error) {
	entries, err := readAll(ctx, l.tools)
	if err != nil {
		return nil, fmt.Errorf("read tool catalog: %w", err)
	}
	var floors map[string]*storedFloor
	if l.trust.Floors != nil {
		if floors, err = l.readFloors(ctx); err != nil {
			return nil, fmt.Errorf("read tool floors (%s): %w", bus.BucketToolFloors, err)
		}
	}
	byTool := map[string][]registration{}
	present := map[string]bool{}
	for _, e := range entries {
		present[e.Key()] = true
		if r, ok := l.check(ctx, e); ok {
			byTool[r.tool] = append(byTool[r.tool], r)
			present[r.tool] = true
		}
	}
	c := &Catalog{specs: map[string]*planexv1.ToolSpec{}, replicas: map[string][]string{}, absent: map[string]bool{}}
	for tool, regs := range byTool {
		l.serve(ctx, c, tool, l.settle(ctx, tool, floors[tool], regs), regs)
	}
	livePools := map[string]bool{}
	for tool := range c.specs {
		livePools[bus.PoolOf(tool)] = true
	}
	for tool, sf := range floors {
		present[tool] = true
		// A pool with a live replica that lacks the tool removed it (an
		// MCP server dropped it, a new version no longer has it).
		if !livePools[bus.PoolOf(tool)] {
			l.serveAbsent(ctx, c, tool, sf)
		}
	}
	addChildTool(c)
	addHumanInput(c)
	l.prune(present)
	return c, nil
}

// readAll returns the live entries of a bucket.
func readAll(ctx context.Context, kv jetstream.KeyValue) ([]jetstream.KeyValueEntry, error) {
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	var out []jetstream.KeyValueEntry
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("watcher closed")
			}
			if e == nil {
				return out, nil // initial values done
			}
			out = append(out, e)
		}
	}
}

// check decodes an entry and refuses it when its key and spec disagree on
// the pool or the tool.
func (l *loader) check(ctx context.Context, e jetstream.KeyValueEntry) (registration, bool) {
	tool, replica, err := bus.ParseToolKey(e.Key())
	if err != nil {
		l.refuse(ctx, e.Key(), e.Revision(), reasonMalformed, "err", err)
		return registration{}, false
	}
	spec := &planexv1.ToolSpec{}
	if err := proto.Unmarshal(e.Value(), spec); err != nil {
		l.refuse(ctx, e.Key(), e.Revision(), reasonMalformed, "err", err)
		return registration{}, false
	}
	pool := bus.PoolOf(tool)
	if spec.GetName() == "" {
		spec.Name = tool
	}
	if spec.GetPool() == "" {
		spec.Pool = pool
	}
	if bus.PoolOf(spec.GetName()) != pool || spec.GetPool() != pool {
		l.refuse(ctx, e.Key(), e.Revision(), reasonPoolMismatch, "pool", pool, "spec_tool", clip(spec.GetName()), "spec_pool", clip(spec.GetPool()))
		return registration{}, false
	}
	if spec.GetName() != tool {
		l.refuse(ctx, e.Key(), e.Revision(), reasonNameMismatch, "pool", pool, "spec_tool", clip(spec.GetName()))
		return registration{}, false
	}
	if perrs := plan.CheckToolRetry(spec); len(perrs) > 0 && l.firstTime("retry", e.Key(), e.Revision()) {
		for _, perr := range perrs {
			// The policy still applies, with what is unsafe left out
			// (plan.RetryOf); the executor's registration needs fixing.
			l.logger.WarnContext(ctx, "tool retry policy", "key", e.Key(), "err", perr)
		}
	}
	return registration{key: e.Key(), tool: tool, replica: replica, rev: e.Revision(), spec: spec}, true
}

// refuse reports a refused registration, once per key and revision: a
// WARN naming the key, its pool and what is wrong (never a value of the
// spec's arguments), and the refused counter.
func (l *loader) refuse(ctx context.Context, key string, rev uint64, reason string, attrs ...any) {
	if !l.firstTime("refused", key, rev) {
		return
	}
	l.logger.WarnContext(ctx, "tool registration refused", append([]any{"key", clip(key), "revision", rev, "reason", reason}, attrs...)...)
	if l.refused != nil {
		l.refused.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", reason)))
	}
}

// proposed is the floor a tool gets from base (nil: none yet) and its
// live registrations: base raised by every registration that does not
// lower it. It does not depend on the order of regs, so replicas reading
// the same registrations agree.
func proposed(base *Floor, regs []registration) Floor {
	var f *Floor
	if base != nil {
		b := *base
		f = &b
	}
	for _, r := range regs {
		if base != nil && len(base.Lowered(r.spec)) > 0 {
			continue
		}
		g := FloorOf(r.spec)
		if f != nil {
			g = f.Join(g)
		}
		f = &g
	}
	return *f // regs is never empty
}

// settle returns the floor of tool after this load, recording it in
// planex-tool-floors when it is new or higher than cur. A write that loses
// a race with another replica is redone on the floor that replica wrote;
// a write that fails otherwise is logged, and the floor applies to this
// load only.
//
// The spec the catalog serves under that floor is recorded beside it, so
// that the tool stays known (served, without replicas) while no replica
// registers it: a pool whose replicas all restart.
func (l *loader) settle(ctx context.Context, tool string, cur *storedFloor, regs []registration) Floor {
	for attempt := 1; ; attempt++ {
		var base *Floor
		if cur != nil {
			base = &cur.floor
		}
		next := proposed(base, regs)
		if l.trust.Floors == nil || l.trust.ReadOnly || (cur != nil && cur.unreadable) {
			return next
		}
		ch := choose(next, regs)
		spec := ch.spec
		raised := cur == nil || !next.Equal(cur.floor)
		if !raised && ch.keeps(cur.spec) {
			return next
		}
		err := l.writeFloor(ctx, tool, cur, next, spec)
		if err == nil {
			if raised {
				l.logger.InfoContext(ctx, "tool floor recorded", "tool", tool, "side_effect", sideEffectName(next.SideEffect),
					"requires_approval", next.RequiresApproval, "sensitive_fields", next.SensitiveFields, "output_secrets_allowed", next.OutputSecretsAllowed, "idempotent", next.Idempotent)
			} else {
				l.logger.DebugContext(ctx, "tool spec recorded beside its floor", "tool", tool)
			}
			return next
		}
		conflict := errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
		if conflict && attempt < floorWriteAttempts {
			if cur, err = l.readFloor(ctx, tool); err == nil {
				continue
			}
		}
		var rev uint64
		if cur != nil {
			rev = cur.rev
		}
		if l.firstTime("floor-write", tool, rev) {
			l.logger.WarnContext(ctx, "record tool floor; it applies to this replica's catalog only until a write succeeds", "tool", tool, "err", err)
		}
		return next
	}
}

// writeFloor creates tool's floor (cur nil) or updates it from revision
// cur.rev, with spec, the registration served under it.
func (l *loader) writeFloor(ctx context.Context, tool string, cur *storedFloor, f Floor, spec *planexv1.ToolSpec) error {
	data, err := encodeRecord(f, spec)
	if err != nil {
		return fmt.Errorf("encode floor of %s: %w", tool, err)
	}
	ctx, cancel := context.WithTimeout(ctx, floorWriteTimeout)
	defer cancel()
	if cur == nil {
		_, err = l.trust.Floors.Create(ctx, tool, data)
	} else {
		_, err = l.trust.Floors.Update(ctx, tool, data, cur.rev)
	}
	if err != nil {
		return fmt.Errorf("write floor of %s: %w", tool, err)
	}
	return nil
}

// readFloors returns every tool's stored floor.
func (l *loader) readFloors(ctx context.Context) (map[string]*storedFloor, error) {
	entries, err := readAll(ctx, l.trust.Floors)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*storedFloor, len(entries))
	for _, e := range entries {
		out[e.Key()] = l.decodeFloor(ctx, e)
	}
	return out, nil
}

// readFloor returns tool's stored floor, nil when it has none.
func (l *loader) readFloor(ctx context.Context, tool string) (*storedFloor, error) {
	e, err := l.trust.Floors.Get(ctx, tool)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read floor of %s: %w", tool, err)
	}
	return l.decodeFloor(ctx, e), nil
}

// decodeFloor decodes a stored floor. One that cannot be decoded counts as
// every restriction a floor can hold without naming fields (fail closed)
// and is left as it is for an operator to delete.
func (l *loader) decodeFloor(ctx context.Context, e jetstream.KeyValueEntry) *storedFloor {
	var f Floor
	if err := json.Unmarshal(e.Value(), &f); err != nil {
		if l.firstTime("floor-unreadable", e.Key(), e.Revision()) {
			l.logger.ErrorContext(ctx, "unreadable tool floor; the tool is treated as EXTERNAL and requiring approval until an operator deletes the floor",
				"bucket", bus.BucketToolFloors, "tool", clip(e.Key()), "revision", e.Revision(), "err", err)
		}
		return &storedFloor{floor: unreadableFloor(), rev: e.Revision(), unreadable: true}
	}
	spec, err := decodeSpec(e.Value())
	if err != nil && l.firstTime("spec-unreadable", e.Key(), e.Revision()) {
		// The floor holds; only the tool's spec while no replica
		// registers it is lost (the next registration records it again).
		l.logger.WarnContext(ctx, "unreadable tool spec beside its floor; the tool is unknown while no replica registers it",
			"bucket", bus.BucketToolFloors, "tool", clip(e.Key()), "revision", e.Revision(), "err", err)
	}
	return &storedFloor{floor: f, rev: e.Revision(), spec: spec}
}

// serveAbsent puts in c a tool whose pool has no live registration but
// whose spec the floors record (a known tool of a pool whose replicas are
// all away, restarting):
// the recorded spec raised to the floor, with no replica. Steps for it
// wait in the pool's queue until a replica registers, within their
// schedule-to-start timeout or the run's deadline. A recorded spec that
// names another tool or pool than its key is ignored.
func (l *loader) serveAbsent(ctx context.Context, c *Catalog, tool string, sf *storedFloor) {
	if sf.spec == nil || sf.unreadable {
		return
	}
	spec := sf.spec
	if spec.GetName() != tool || spec.GetPool() != bus.PoolOf(tool) {
		if l.firstTime("spec-mismatch", tool, sf.rev) {
			l.logger.WarnContext(ctx, "tool spec beside its floor names another tool or pool; ignored", "bucket", bus.BucketToolFloors,
				"tool", clip(tool), "spec_tool", clip(spec.GetName()), "spec_pool", clip(spec.GetPool()))
		}
		return
	}
	c.specs[tool] = sf.floor.Raise(spec)
	c.absent[tool] = true
}

// serve puts tool in c: the latest registration that does not lower the
// floor f, or, when every one does, the latest raised to f. The
// registrations that lower f are refused.
func (l *loader) serve(ctx context.Context, c *Catalog, tool string, f Floor, regs []registration) {
	ch := choose(f, regs)
	c.specs[tool] = ch.spec
	for _, r := range ch.from {
		if !slices.Contains(c.replicas[tool], r.replica) {
			c.replicas[tool] = append(c.replicas[tool], r.replica)
		}
	}
	slices.Sort(c.replicas[tool])
	for _, x := range ch.refused {
		l.refuse(ctx, x.r.key, x.r.rev, reasonDowngrade, "pool", bus.PoolOf(tool), "tool", tool, "lowered", x.lowered, "serving", ch.serving)
	}
}

// refusal is a registration that lowers its tool's floor, with what it
// lowers.
type refusal struct {
	r       registration
	lowered []string
}

// choice is what a catalog serves of a tool's live registrations under
// its floor.
type choice struct {
	spec    *planexv1.ToolSpec // served
	from    []registration     // the registrations whose replicas serve it
	refused []refusal          // the registrations that lower the floor
	serving string             // what spec is, for the refusals' log
	raised  bool               // every registration lowers the floor: spec is the latest raised to it
}

// keeps reports whether a recorded spec may stay: it is the spec served,
// or one of the live registrations served from (replicas of two versions
// during a rollout, whose latest renewal alternates, do not rewrite the
// record at every load: the planex-tool-floors bucket keeps 8 revisions
// per tool within a small size budget).
func (ch choice) keeps(recorded *planexv1.ToolSpec) bool {
	if recorded == nil {
		return false
	}
	if proto.Equal(recorded, ch.spec) {
		return true
	}
	if ch.raised {
		return false // every registration lowers the floor: only the raised spec will do
	}
	for _, r := range ch.from {
		if proto.Equal(recorded, r.spec) {
			return true
		}
	}
	return false
}

// choose picks the spec served for a tool under floor f: the latest
// registration that does not lower f, or, when every one does, the latest
// raised to f. regs must not be empty.
func choose(f Floor, regs []registration) choice {
	var ch choice
	var accepted []registration
	for _, r := range regs {
		if low := f.Lowered(r.spec); len(low) > 0 {
			ch.refused = append(ch.refused, refusal{r, low})
		} else {
			accepted = append(accepted, r)
		}
	}
	ch.from = accepted
	if len(accepted) == 0 {
		ch.from, ch.serving, ch.raised = regs, "the latest registration raised to the floor", true
	}
	latest := slices.MaxFunc(ch.from, func(a, b registration) int { return cmp.Compare(a.rev, b.rev) })
	ch.spec = latest.spec
	if ch.raised {
		ch.spec = f.Raise(ch.spec)
	} else {
		ch.serving = "the registration of replica " + clip(latest.replica)
	}
	return ch
}
