// Package plannertest holds what the planner's tests share: a tool catalog
// with the argument schemas of the executor pools' tools (sql, email,
// search), so that plans are validated the way the supervisor validates
// them.
package plannertest

import (
	_ "embed"
	"encoding/json"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

//go:embed testdata/catalog.json
var catalogJSON []byte

// Catalog returns a fresh copy of the test tool catalog.
func Catalog(t testing.TB) []*planexv1.ToolSpec {
	t.Helper()
	var raw []json.RawMessage
	if err := json.Unmarshal(catalogJSON, &raw); err != nil {
		t.Fatalf("test catalog: %v", err)
	}
	specs := make([]*planexv1.ToolSpec, len(raw))
	for i, r := range raw {
		specs[i] = &planexv1.ToolSpec{}
		if err := protojson.Unmarshal(r, specs[i]); err != nil {
			t.Fatalf("test catalog entry %d: %v", i, err)
		}
	}
	return specs
}

// Objects reads a JSON array of objects (as decoded into any), or the
// "content" array of an object; anything else gives nil.
func Objects(v any) []map[string]any {
	if m, ok := v.(map[string]any); ok {
		v = m["content"]
	}
	raw, _ := v.([]any)
	out := make([]map[string]any, len(raw))
	for i, o := range raw {
		out[i], _ = o.(map[string]any)
	}
	return out
}
