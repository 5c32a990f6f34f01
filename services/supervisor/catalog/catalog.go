// Package catalog reads the tool catalog executor replicas register in the
// planex-tools bucket (key "<pool>.<verb>.<replica>", value a proto-encoded
// ToolSpec, expiring unless renewed) and caches it briefly, so planning and
// dispatching many runs do not each list the bucket.
package catalog

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/plan"
)

// Catalog is the set of registered tools at one moment. It implements
// [plan.Catalog]. Specs must not be modified.
type Catalog struct {
	specs    map[string]*planexv1.ToolSpec
	replicas map[string][]string
}

var _ plan.Catalog = (*Catalog)(nil)

// Tool returns the spec of a registered tool.
func (c *Catalog) Tool(name string) (*planexv1.ToolSpec, bool) {
	s, ok := c.specs[name]
	return s, ok
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
// tool name; a non-empty pool keeps only that pool's tools.
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

// Load reads every live registration from the bucket. Entries whose key or
// value cannot be decoded are logged and skipped; replicas of one tool that
// disagree on its spec are resolved by keeping the latest registration.
func Load(ctx context.Context, kv jetstream.KeyValue, logger *slog.Logger) (*Catalog, error) {
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("read tool catalog: %w", err)
	}
	defer func() { _ = w.Stop() }()
	c := &Catalog{specs: map[string]*planexv1.ToolSpec{}, replicas: map[string][]string{}}
	revs := map[string]uint64{}
	for {
		var e jetstream.KeyValueEntry
		var ok bool
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("read tool catalog: %w", ctx.Err())
		case e, ok = <-w.Updates():
		}
		if !ok {
			return nil, errors.New("read tool catalog: watcher closed")
		}
		if e == nil {
			break // initial values done
		}
		tool, replica, err := bus.ParseToolKey(e.Key())
		if err != nil {
			logger.WarnContext(ctx, "skipping tool registration", "key", e.Key(), "err", err)
			continue
		}
		spec := &planexv1.ToolSpec{}
		if err := proto.Unmarshal(e.Value(), spec); err != nil {
			logger.WarnContext(ctx, "skipping tool registration", "key", e.Key(), "err", err)
			continue
		}
		if spec.GetName() == "" {
			spec.Name = tool
		}
		if spec.GetName() != tool {
			logger.WarnContext(ctx, "skipping tool registration whose key and spec disagree", "key", e.Key(), "tool", spec.GetName())
			continue
		}
		if spec.GetPool() == "" {
			spec.Pool = bus.PoolOf(tool)
		}
		for _, perr := range plan.CheckToolRetry(spec) {
			// The policy still applies, with what is unsafe left out
			// (plan.RetryOf); the executor's registration needs fixing.
			logger.WarnContext(ctx, "tool retry policy", "key", e.Key(), "err", perr)
		}
		if e.Revision() >= revs[tool] {
			c.specs[tool], revs[tool] = spec, e.Revision()
		}
		if !slices.Contains(c.replicas[tool], replica) {
			c.replicas[tool] = append(c.replicas[tool], replica)
		}
	}
	for _, r := range c.replicas {
		slices.Sort(r)
	}
	return c, nil
}

// Cache serves a catalog no older than its TTL, loading it at most once at
// a time. It is safe for concurrent use.
type Cache struct {
	kv     jetstream.KeyValue
	logger *slog.Logger
	ttl    time.Duration

	mu      sync.Mutex
	cur     *Catalog
	loaded  time.Time
	loading bool // a reload runs; callers meanwhile get cur
}

// loadTimeout bounds one catalog reload.
const loadTimeout = 5 * time.Second

// NewCache returns a cache over the planex-tools bucket; ttl 0 means one
// second.
func NewCache(kv jetstream.KeyValue, logger *slog.Logger, ttl time.Duration) *Cache {
	if ttl <= 0 {
		ttl = time.Second
	}
	return &Cache{kv: kv, logger: logger, ttl: ttl}
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

func (c *Cache) load(ctx context.Context) (*Catalog, error) {
	ctx, cancel := context.WithTimeout(ctx, loadTimeout)
	defer cancel()
	return Load(ctx, c.kv, c.logger)
}
