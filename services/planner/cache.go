package planner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// PlanCacheBucket is the JetStream KV bucket of the plan cache.
const PlanCacheBucket = "planex-plans"

// planCache remembers the first plan a model gave for a goal and catalog.
// Entries are advisory: a failure to read or write one is logged, never
// returned, so a cache outage only costs tokens.
type planCache struct {
	kv     jetstream.KeyValue
	reuse  bool
	logger *slog.Logger
}

// cacheKey hashes the normalized goal and the catalog: the names, argument
// schemas and versions of the tools, in name order; and the tenant, when
// the run is not the default tenant's (whose keys are as before tenants).
func cacheKey(req *planexv1.PlanRequest) string {
	h := sha256.New()
	if t := req.GetTenant(); t != "" && t != "default" {
		h.Write([]byte("tenant\x00" + t + "\x00"))
	}
	h.Write([]byte(normalizeGoal(req.GetGoal())))
	h.Write([]byte{0})
	tools := slices.Clone(req.GetTools())
	slices.SortFunc(tools, func(a, b *planexv1.ToolSpec) int { return strings.Compare(a.GetName(), b.GetName()) })
	for _, t := range tools {
		data, err := proto.MarshalOptions{Deterministic: true}.Marshal(&planexv1.ToolSpec{
			Name: t.GetName(), ArgsSchema: t.GetArgsSchema(), OutputSchema: t.GetOutputSchema(), Version: t.GetVersion(),
		})
		if err == nil {
			h.Write(data)
		}
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// normalizeGoal lower-cases the goal, collapses white space and drops
// trailing punctuation, so that trivially different spellings share plans.
func normalizeGoal(goal string) string {
	g := strings.Join(strings.Fields(strings.ToLower(goal)), " ")
	return strings.TrimRight(g, ".?! ")
}

func (c *planCache) lookup(ctx context.Context, req *planexv1.PlanRequest) *planexv1.Plan {
	entry, err := c.kv.Get(ctx, cacheKey(req))
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			c.logger.WarnContext(ctx, "plan cache read", "err", err)
		}
		return nil
	}
	p := &planexv1.Plan{}
	if err := proto.Unmarshal(entry.Value(), p); err != nil {
		c.logger.WarnContext(ctx, "plan cache entry unreadable", "key", entry.Key(), "err", err)
		return nil
	}
	return p
}

func (c *planCache) store(ctx context.Context, req *planexv1.PlanRequest, p *planexv1.Plan) {
	cp := proto.Clone(p).(*planexv1.Plan)
	cp.Revision = 0
	cp.Lineage = nil
	data, err := proto.Marshal(cp)
	if err != nil {
		c.logger.WarnContext(ctx, "plan cache encode", "err", err)
		return
	}
	if _, err := c.kv.Put(ctx, cacheKey(req), data); err != nil {
		c.logger.WarnContext(ctx, "plan cache write", "err", err)
	}
}
