package planner

import (
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// TestCacheKeyTenant: a tenant's plan is never another tenant's cache
// hit, and the default tenant's keys are those of releases before tenants
// (its cached plans stay valid across the upgrade).
func TestCacheKeyTenant(t *testing.T) {
	req := func(tenant string) *planexv1.PlanRequest {
		return &planexv1.PlanRequest{Goal: "Report revenue", Tenant: tenant,
			Tools: []*planexv1.ToolSpec{{Name: "sql.query", Version: "1"}}}
	}
	base := cacheKey(req(""))
	if got := cacheKey(req("default")); got != base {
		t.Errorf("default tenant key %s differs from the tenant-less key %s", got, base)
	}
	a, b := cacheKey(req("team-a")), cacheKey(req("team-b"))
	if a == base || b == base || a == b {
		t.Errorf("tenant keys collide: base %s, team-a %s, team-b %s", base, a, b)
	}
	if cacheKey(req("team-a")) != a {
		t.Error("cache key not deterministic")
	}
}
