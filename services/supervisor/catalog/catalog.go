// Package catalog reads the tool catalog executor replicas register in the
// planex-tools bucket (key "<pool>.<verb>.<replica>", value a proto-encoded
// ToolSpec, expiring unless renewed) and caches it briefly, so planning and
// dispatching many runs do not each list the bucket.
//
// The catalog does not take a registration at face value: an executor
// credential can write keys of planex-tools, so a registration whose key
// names another pool than its spec, or which lowers a tool's floor (its
// side effect, default approval, sensitive fields or output masking, as
// the most restrictive registration accepted so far set them, kept by the
// supervisors in planex-tool-floors) is refused, logged and counted, and
// never served. See LoadTrusted and docs/security.md, "Tool catalog
// trust".
//
// Beside each floor the supervisors keep the spec they served last, so
// that the tools of a pool whose replicas are all away (restarting) stay
// in the catalog, without replicas (Catalog.Absent): plans naming them
// stay valid and their steps wait in the pool's queue.
package catalog

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/plan"
)

// Catalog is the set of registered tools at one moment. It implements
// [plan.Catalog]. Specs must not be modified.
type Catalog struct {
	specs    map[string]*planexv1.ToolSpec
	replicas map[string][]string
	absent   map[string]bool // known tools no replica registers now
}

var _ plan.Catalog = (*Catalog)(nil)

// Tool returns the spec of a registered tool.
func (c *Catalog) Tool(name string) (*planexv1.ToolSpec, bool) {
	s, ok := c.specs[name]
	return s, ok
}

// Absent reports whether name is a known tool of a pool that no replica
// registers right now: the supervisors served it before and
// planex-tool-floors keeps its spec, so plans may use it and its steps
// wait in the pool's queue until a replica registers again (a pool whose
// replicas all restart). A tool missing from a pool that has a live
// replica is not served: the pool dropped it. An operator forgets a
// retired pool's tools by deleting their keys in planex-tool-floors.
func (c *Catalog) Absent(name string) bool { return c.absent[name] }

// MissingPools returns, sorted and without duplicates, those of pools of
// which the catalog holds no tool, live or absent: pools that never
// registered with these supervisors (or whose floors were deleted).
func (c *Catalog) MissingPools(pools []string) []string {
	have := map[string]bool{}
	for _, s := range c.specs {
		have[s.GetPool()] = true
	}
	var out []string
	for _, p := range pools {
		if !have[p] && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// Specs returns every tool spec, sorted by name.
func (c *Catalog) Specs() []*planexv1.ToolSpec {
	out := make([]*planexv1.ToolSpec, 0, len(c.specs))
	for _, s := range c.specs {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *planexv1.ToolSpec) int { return cmp.Compare(a.GetName(), b.GetName()) })
	return out
}

// Registered returns the catalog entries with their replicas, sorted by
// tool name; a non-empty pool keeps only that pool's tools. An absent tool
// has no replica.
func (c *Catalog) Registered(pool string) []*planexv1.RegisteredTool {
	var out []*planexv1.RegisteredTool
	for _, s := range c.Specs() {
		if pool != "" && s.GetPool() != pool {
			continue
		}
		out = append(out, &planexv1.RegisteredTool{Spec: s, Replicas: slices.Clone(c.replicas[s.GetName()])})
	}
	return out
}

// Load reads every live registration from the bucket and checks it
// against the other live registrations of its tool (LoadTrusted without
// stored floors): entries that cannot be decoded, whose key names another
// pool or tool than the spec, or that lower what another live
// registration of the tool declares are logged and left out. Readers other
// than the supervisor (the CLI) use it.
func Load(ctx context.Context, kv jetstream.KeyValue, logger *slog.Logger) (*Catalog, error) {
	return LoadTrusted(ctx, kv, logger, Trust{})
}

// LoadTrusted reads every live registration from the planex-tools bucket
// kv and keeps what trust lets through: a spec whose name or pool differs
// from its key's is refused, and so is one that lowers the tool's floor
// (Floor.Lowered). Of the registrations accepted, the latest is served;
// when none is, the latest one raised to the floor (Floor.Raise), so a
// lowered spec is never served. A tool of a pool with no live
// registration whose floor keeps its last spec is served too, raised to
// the floor and without replicas (Catalog.Absent). Each refusal is logged (WARN) and, with
// trust.Meter, counted in planex.catalog.registrations.refused{reason}.
func LoadTrusted(ctx context.Context, kv jetstream.KeyValue, logger *slog.Logger, trust Trust) (*Catalog, error) {
	return newLoader(kv, logger, trust, nil).load(ctx)
}

// Cache serves a catalog no older than its TTL, loading it at most once at
// a time. It is safe for concurrent use. Its loads share one record of the
// refusals already reported, so a refused registration is logged and
// counted once per key and revision, however often the catalog reloads.
type Cache struct {
	loader *loader // nil: a static catalog
	logger *slog.Logger
	ttl    time.Duration

	mu      sync.Mutex
	cur     *Catalog
	loaded  time.Time
	loading bool // a reload runs; callers meanwhile get cur
}

// loadTimeout bounds one catalog reload.
const loadTimeout = 5 * time.Second

// NewCache returns a cache over the planex-tools bucket kv, checking
// registrations against trust (the supervisor passes its
// planex-tool-floors bucket); ttl 0 means one second. A nil trust.Meter
// counts refusals with the global meter provider.
func NewCache(kv jetstream.KeyValue, logger *slog.Logger, ttl time.Duration, trust Trust) *Cache {
	if ttl <= 0 {
		ttl = time.Second
	}
	if trust.Meter == nil {
		trust.Meter = otel.Meter(instrumentation)
	}
	return &Cache{loader: newLoader(kv, logger, trust, map[notice]uint64{}), logger: logger, ttl: ttl}
}

// Get returns the cached catalog, reloading it when older than the TTL.
// While one caller reloads, the others get the previous catalog instead of
// waiting; when a reload fails, the previous catalog is returned if there
// is one. A reload is bounded by a few seconds.
func (c *Cache) Get(ctx context.Context) (*Catalog, error) {
	c.mu.Lock()
	if c.cur != nil && (c.loading || time.Since(c.loaded) < c.ttl) {
		cur := c.cur
		c.mu.Unlock()
		return cur, nil
	}
	if c.cur == nil {
		// Nothing to serve yet: load under the lock, once.
		defer c.mu.Unlock()
		cat, err := c.load(ctx)
		if err != nil {
			return nil, err
		}
		c.cur, c.loaded = cat, time.Now()
		return cat, nil
	}
	c.loading = true
	prev := c.cur
	c.mu.Unlock()
	cat, err := c.load(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.loading = false
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			c.logger.WarnContext(ctx, "using the previous tool catalog", "err", err)
		}
		return prev, nil
	}
	c.cur, c.loaded = cat, time.Now()
	return cat, nil
}

// Fresh loads the catalog now, whatever its age, and caches it: for
// answers that must show a registration made a moment ago (ListTools).
// Unlike Get it returns the error of a failed load. A static cache returns
// its catalog.
func (c *Cache) Fresh(ctx context.Context) (*Catalog, error) {
	if c.loader == nil {
		return c.Get(ctx)
	}
	cat, err := c.load(ctx)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cur, c.loaded = cat, time.Now()
	return cat, nil
}

// Refresh loads the catalog every interval until ctx ends, so that the
// floors of newly registered tools are recorded (and refusals reported)
// while no run asks for the catalog. It leaves the cached catalog and its
// age alone: what Get serves keeps the TTL it always had. Failed loads are
// logged at debug level: the callers of Get see them.
func (c *Cache) Refresh(ctx context.Context, interval time.Duration) {
	if c.loader == nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := c.load(ctx); err != nil && ctx.Err() == nil {
			c.logger.DebugContext(ctx, "refresh tool catalog", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (c *Cache) load(ctx context.Context) (*Catalog, error) {
	ctx, cancel := context.WithTimeout(ctx, loadTimeout)
	defer cancel()
	return c.loader.load(ctx)
}
