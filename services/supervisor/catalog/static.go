package catalog

import (
	"math"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// Static returns a catalog of fixed specs (a replica name per tool:
// "static"), for deciding without a planex-tools bucket, as replay does.
func Static(specs []*planexv1.ToolSpec) *Catalog {
	c := &Catalog{specs: map[string]*planexv1.ToolSpec{}, replicas: map[string][]string{}}
	for _, s := range specs {
		c.specs[s.GetName()] = s
		c.replicas[s.GetName()] = []string{"static"}
	}
	addChildTool(c)
	addHumanInput(c)
	return c
}

// StaticCache returns a Cache that always serves c and never reads a
// bucket.
func StaticCache(c *Catalog) *Cache {
	return &Cache{cur: c, loaded: time.Now(), ttl: time.Duration(math.MaxInt64)}
}
