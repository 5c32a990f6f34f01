package plan

import (
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// Fixtures shared by the tests of this package.

// jsonStruct parses a JSON object into a Struct; "" gives nil.
func jsonStruct(t testing.TB, js string) *structpb.Struct {
	t.Helper()
	if js == "" {
		return nil
	}
	s := &structpb.Struct{}
	if err := protojson.Unmarshal([]byte(js), s); err != nil {
		t.Fatalf("parse %s: %v", js, err)
	}
	return s
}

// step builds a step; args is a JSON object or "".
func step(t testing.TB, id, tool, args string, deps ...string) *planexv1.Step {
	t.Helper()
	return &planexv1.Step{Id: id, Tool: tool, Args: jsonStruct(t, args), DependsOn: deps}
}

func newPlan(steps ...*planexv1.Step) *planexv1.Plan {
	return &planexv1.Plan{Revision: 1, Steps: steps, Confidence: 0.8}
}

// testCatalog holds tools with representative schemas.
func testCatalog(t testing.TB) MapCatalog {
	t.Helper()
	return NewCatalog([]*planexv1.ToolSpec{
		{
			Name: "sql.query",
			Pool: "sql",
			ArgsSchema: jsonStruct(t, `{
				"type": "object",
				"properties": {
					"query":  {"type": "string", "minLength": 1},
					"params": {"type": "array"},
					"limit":  {"type": "integer", "minimum": 1, "maximum": 1000}
				},
				"required": ["query"],
				"additionalProperties": false
			}`),
		},
		{
			Name: "email.send",
			Pool: "email",
			ArgsSchema: jsonStruct(t, `{
				"type": "object",
				"properties": {
					"to":      {"type": "array", "items": {"type": "string", "pattern": "@"}, "minItems": 1},
					"subject": {"type": "string", "minLength": 3},
					"body":    {"type": "string"},
					"format":  {"enum": ["text", "html"]}
				},
				"required": ["to", "subject"],
				"additionalProperties": false
			}`),
		},
		{
			Name: "search.query",
			Pool: "search",
			ArgsSchema: jsonStruct(t, `{
				"type": "object",
				"properties": {
					"q": {"type": "string"},
					"k": {"anyOf": [{"type": "integer"}, {"type": "null"}]}
				},
				"required": ["q"]
			}`),
		},
		{Name: "free.form", Pool: "free"},
		{Name: "broken.schema", Pool: "broken", ArgsSchema: jsonStruct(t, `{"type": 5}`)},
	})
}
