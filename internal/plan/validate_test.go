package plan

import (
	"errors"
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

func TestValidate(t *testing.T) {
	cat := testCatalog(t)
	find := func() *planexv1.Step {
		return step(t, "find", "sql.query", `{"query": "select email from users where team = ?", "params": ["${{ inputs.team }}"], "limit": 10}`)
	}
	tests := []struct {
		name string
		plan *planexv1.Plan
		cat  Catalog
		lim  Limits
		// want lists substrings that must each appear in one problem;
		// empty means the plan is valid.
		want []string
	}{
		{
			name: "valid plan with references",
			plan: func() *planexv1.Plan {
				p := newPlan(
					find(),
					step(t, "send", "email.send", `{
						"to": "${{ steps.find.output.rows.map(r, r.email) }}",
						"subject": "Report for ${{ goal }}",
						"body": "${{ steps.find.output.rows.size() }} users",
						"format": "text"}`, "find"),
				)
				p.Steps[1].Expect = "output.sent == size(args.to)"
				p.Answer = `{"sent": steps.send.output.sent, "users": steps.find.output.rows.size()}`
				return p
			}(),
		},
		{name: "nil plan", plan: nil, want: []string{"plan: missing"}},
		{name: "no steps", plan: newPlan(), want: []string{"steps: plan has no steps"}},
		{name: "nil step", plan: newPlan(find(), nil), want: []string{"steps[1]: missing step"}},
		{
			name: "step without id",
			plan: newPlan(step(t, "", "sql.query", `{"query": 5}`)),
			want: []string{`steps[0].id: "" does not match`, `steps[0].args.query: expected string, got number 5`},
		},
		{
			name: "duplicate id",
			plan: newPlan(find(), find()),
			want: []string{`step "find": id: duplicate step id "find"`},
		},
		{
			name: "bad id",
			plan: newPlan(step(t, "Find-Users", "sql.query", `{"query": "q"}`)),
			want: []string{`step "Find-Users": id: "Find-Users" does not match ^[a-z][a-z0-9_]{0,62}$`},
		},
		{
			name: "id too long",
			plan: newPlan(step(t, strings.Repeat("a", 64), "sql.query", `{"query": "q"}`)),
			want: []string{"does not match"},
		},
		{
			name: "longest id",
			plan: newPlan(step(t, strings.Repeat("a", 63), "sql.query", `{"query": "q"}`)),
		},
		{
			name: "unknown dependency",
			plan: newPlan(step(t, "q", "sql.query", `{"query": "q"}`, "nope")),
			want: []string{`step "q": depends_on: unknown step "nope"`},
		},
		{
			name: "self dependency",
			plan: newPlan(step(t, "q", "sql.query", `{"query": "q"}`, "q")),
			want: []string{`step "q": depends_on: step depends on itself`},
		},
		{
			name: "duplicate dependency",
			plan: newPlan(find(), step(t, "q", "sql.query", `{"query": "q"}`, "find", "find")),
			want: []string{`step "q": depends_on: duplicate dependency "find"`},
		},
		{
			name: "two-node cycle",
			plan: newPlan(
				step(t, "a", "sql.query", `{"query": "q"}`, "b"),
				step(t, "b", "sql.query", `{"query": "q"}`, "a"),
			),
			want: []string{`step "a": depends_on: dependency cycle a -> b -> a`},
		},
		{
			name: "three-node cycle behind an entry step",
			plan: newPlan(
				step(t, "entry", "sql.query", `{"query": "q"}`, "a"),
				step(t, "a", "sql.query", `{"query": "q"}`, "b"),
				step(t, "b", "sql.query", `{"query": "q"}`, "c"),
				step(t, "c", "sql.query", `{"query": "q"}`, "a"),
			),
			want: []string{"dependency cycle a -> b -> c -> a"},
		},
		{
			name: "unknown tool",
			plan: newPlan(step(t, "q", "sql.drop", `{}`)),
			want: []string{`step "q": tool: unknown tool "sql.drop"`},
		},
		{
			name: "missing tool",
			plan: newPlan(step(t, "q", "", `{}`)),
			want: []string{`step "q": tool: missing`},
		},
		{
			name: "nil catalog knows no tool",
			plan: newPlan(find()),
			cat:  MapCatalog(nil),
			want: []string{`unknown tool "sql.query"`},
		},
		{
			name: "tool without schema accepts any args",
			plan: newPlan(step(t, "f", "free.form", `{"anything": [1, {"x": null}]}`)),
		},
		{
			name: "tool with a broken schema",
			plan: newPlan(step(t, "b", "broken.schema", `{}`)),
			want: []string{`step "b": args: tool "broken.schema": args schema:`},
		},
		{
			name: "schema: wrong type",
			plan: newPlan(step(t, "send", "email.send", `{"to": "x", "subject": "hello"}`)),
			want: []string{`step "send": args.to: expected array, got string "x"`},
		},
		{
			name: "schema: missing required",
			plan: newPlan(step(t, "send", "email.send", `{"to": ["a@b.c"]}`)),
			want: []string{`step "send": args.subject: missing required field`},
		},
		{
			name: "schema: nil args and a required field",
			plan: newPlan(step(t, "q", "sql.query", ``)),
			want: []string{`step "q": args.query: missing required field`},
		},
		{
			name: "schema: extra field with additionalProperties false",
			plan: newPlan(step(t, "send", "email.send", `{"to": ["a@b.c"], "subject": "hello", "cc": "x@y.z"}`)),
			want: []string{`step "send": args.cc: field not allowed by the schema, got string "x@y.z"`},
		},
		{
			name: "schema: enum",
			plan: newPlan(step(t, "send", "email.send", `{"to": ["a@b.c"], "subject": "hello", "format": "pdf"}`)),
			want: []string{`args.format: expected one of ["text","html"], got string "pdf"`},
		},
		{
			name: "schema: whole number is an integer",
			plan: newPlan(step(t, "q", "sql.query", `{"query": "q", "limit": 3}`)),
		},
		{
			name: "schema: fraction is not an integer",
			plan: newPlan(step(t, "q", "sql.query", `{"query": "q", "limit": 2.5}`)),
			want: []string{`step "q": args.limit: expected integer, got number 2.5`},
		},
		{
			name: "schema: maximum names the value",
			plan: newPlan(step(t, "q", "sql.query", `{"query": "q", "limit": 5000}`)),
			want: []string{`step "q": args.limit: expected <= 1000, got number 5000`},
		},
		{
			name: "schema: minLength, minimum and pattern",
			plan: newPlan(
				step(t, "q", "sql.query", `{"query": "", "limit": 0}`),
				step(t, "send", "email.send", `{"to": ["nobody"], "subject": "hello"}`),
			),
			want: []string{
				`step "q": args.query: expected at least 1 characters, got string ""`,
				`step "q": args.limit: expected >= 1, got number 0`,
				`step "send": args.to[0]: expected a string matching "@", got string "nobody"`,
			},
		},
		{
			name: "schema: item of a list",
			plan: newPlan(step(t, "send", "email.send", `{"to": ["a@b.c", 5], "subject": "hello"}`)),
			want: []string{`step "send": args.to[1]: expected string, got number 5`},
		},
		{
			name: "schema: anyOf reports its alternatives",
			plan: newPlan(step(t, "s", "search.query", `{"q": "x", "k": "ten"}`)),
			want: []string{`step "s": args.k: `, `expected integer, got string "ten"`},
		},
		{
			name: "reference: whole reference skips the type check",
			plan: newPlan(find(), step(t, "send", "email.send", `{"to": "${{ steps.find.output.rows }}", "subject": "${{ goal }}"}`, "find")),
		},
		{
			name: "reference: interpolation skips string constraints",
			plan: newPlan(find(), step(t, "send", "email.send", `{"to": ["${{ goal }}"], "subject": "${{ goal }}!", "format": "${{ inputs.format }}"}`, "find")),
		},
		{
			name: "reference: interpolated string is still a string",
			plan: newPlan(find(), step(t, "send", "email.send", `{"to": "to: ${{ goal }}", "subject": "hello"}`, "find")),
			want: []string{`step "send": args.to: expected array, got string "to: ${{ goal }}"`},
		},
		{
			name: "reference: non-reference sibling still checked",
			plan: newPlan(find(), step(t, "send", "email.send", `{"to": "${{ steps.find.output.rows }}", "subject": 5, "bcc": "x"}`, "find")),
			want: []string{
				`step "send": args.subject: expected string, got number 5`,
				`step "send": args.bcc: field not allowed by the schema`,
			},
		},
		{
			name: "reference: item reference next to a bad item",
			plan: newPlan(step(t, "send", "email.send", `{"to": ["${{ inputs.to }}", 5], "subject": "hello"}`)),
			want: []string{`args.to[1]: expected string, got number 5`},
		},
		{
			name: "reference: anyOf satisfiable through a reference",
			plan: newPlan(step(t, "s", "search.query", `{"q": "x", "k": "${{ inputs.k }}"}`)),
		},
		{
			name: "reference: transitive dependency",
			plan: newPlan(
				find(),
				step(t, "mid", "free.form", `{}`, "find"),
				step(t, "last", "free.form", `{"n": "${{ steps['find'].output.rows.size() }}"}`, "mid"),
			),
		},
		{
			name: "reference: non-dependency",
			plan: newPlan(
				find(),
				step(t, "other", "free.form", `{}`),
				step(t, "b", "free.form", `{"x": {"y": ["${{ steps.other.output.v }}"]}}`, "find"),
			),
			want: []string{`step "b": args.x.y[0]: ${{ steps.other.output.v }}: step "other" is not a dependency of "b"`},
		},
		{
			name: "reference: unknown step",
			plan: newPlan(step(t, "b", "free.form", `{"x": "${{ steps.ghost.output }}"}`)),
			want: []string{`step "b": args.x: ${{ steps.ghost.output }}: unknown step "ghost"`},
		},
		{
			name: "reference: own output",
			plan: newPlan(step(t, "b", "free.form", `{"x": "${{ steps.b.output }}"}`)),
			want: []string{`step "b" cannot read its own output`},
		},
		{
			name: "reference: steps as a whole",
			plan: newPlan(step(t, "b", "free.form", `{"x": "${{ steps }}"}`)),
			want: []string{`steps may only be used as steps.<id>.output`},
		},
		{
			name: "reference: another field of a step",
			plan: newPlan(find(), step(t, "b", "free.form", `{"x": "${{ steps.find.status }}"}`, "find")),
			want: []string{`steps.find may only be used as steps.find.output`},
		},
		{
			name: "reference: presence test, optional and index syntax",
			plan: newPlan(find(), step(t, "b", "free.form", `{
				"x": "${{ has(steps.find.output.rows) }}",
				"y": "${{ steps.?find.output.orValue(null) }}",
				"z": "${{ has(steps.find.output) && steps['find']['output'] != null }}"}`, "find")),
		},
		{
			name: "reference: presence test on a non-dependency",
			plan: newPlan(find(), step(t, "b", "free.form", `{"x": "${{ has(steps.find.output) }}"}`)),
			want: []string{`step "find" is not a dependency of "b"`},
		},
		{
			name: "reference: comprehension variable named steps",
			plan: newPlan(step(t, "b", "free.form", `{"x": "${{ [1, 2].map(steps, steps * 2) }}"}`)),
		},
		{
			name: "reference: CEL syntax error",
			plan: newPlan(step(t, "b", "free.form", `{"x": "${{ 1 + }}"}`)),
			want: []string{`step "b": args.x: ${{ 1 + }}: 1:`},
		},
		{
			name: "reference: undeclared variable",
			plan: newPlan(step(t, "b", "free.form", `{"x": "${{ output.x }}"}`)),
			want: []string{`undeclared reference to 'output'`},
		},
		{
			name: "reference: unterminated",
			plan: newPlan(step(t, "b", "free.form", `{"x": "${{ goal"}`)),
			want: []string{`step "b": args.x: reference at offset 0 has no closing "}}"`},
		},
		{
			name: "reference: empty",
			plan: newPlan(step(t, "b", "free.form", `{"x": "${{ }}"}`)),
			want: []string{`empty reference`},
		},
		{
			name: "expect: syntax error",
			plan: func() *planexv1.Plan {
				p := newPlan(find())
				p.Steps[0].Expect = "output.rows.size( > 0"
				return p
			}(),
			want: []string{`step "find": expect: "output.rows.size( > 0": 1:`},
		},
		{
			name: "expect: not a bool",
			plan: func() *planexv1.Plan {
				p := newPlan(find())
				p.Steps[0].Expect = "size(args)"
				return p
			}(),
			want: []string{`step "find": expect: "size(args)": result is int, want bool`},
		},
		{
			name: "expect: cannot see steps",
			plan: func() *planexv1.Plan {
				p := newPlan(find())
				p.Steps[0].Expect = "steps.find.output != null"
				return p
			}(),
			want: []string{`undeclared reference to 'steps'`},
		},
		{
			name: "answer: compile error",
			plan: func() *planexv1.Plan {
				p := newPlan(find())
				p.Answer = "steps.find.output.rows["
				return p
			}(),
			want: []string{`answer: ${{ steps.find.output.rows[ }}: 1:`},
		},
		{
			name: "answer: unknown step",
			plan: func() *planexv1.Plan {
				p := newPlan(find())
				p.Answer = "steps.nope.output"
				return p
			}(),
			want: []string{`answer: ${{ steps.nope.output }}: unknown step "nope"`},
		},
		{
			name: "limits: too many steps",
			plan: newPlan(find(), step(t, "b", "free.form", `{}`), step(t, "c", "free.form", `{}`)),
			lim:  Limits{MaxSteps: 2},
			want: []string{"steps: 3 steps, limit is 2"},
		},
		{
			name: "limits: as many steps as allowed",
			plan: newPlan(find(), step(t, "b", "free.form", `{}`)),
			lim:  Limits{MaxSteps: 2},
		},
		{
			name: "limits: oversized args",
			plan: newPlan(step(t, "b", "free.form", `{"text": "`+strings.Repeat("x", 100)+`"}`)),
			lim:  Limits{MaxArgsBytes: 64},
			want: []string{`step "b": args: 111 bytes of JSON, limit is 64`},
		},
		{
			name: "limits: oversized plan",
			plan: newPlan(find()),
			lim:  Limits{MaxPlanBytes: 16},
			want: []string{"plan: ", "bytes encoded, limit is 16"},
		},
		{
			name: "limits: expression too long",
			plan: newPlan(step(t, "b", "free.form", `{"x": "${{ goal + goal + goal }}"}`)),
			lim:  Limits{MaxExpressionLength: 8},
			want: []string{`step "b": args.x: expression "goal + goal + goal" is 18 bytes, limit is 8`},
		},
		{
			name: "confidence above 1",
			plan: func() *planexv1.Plan { p := newPlan(find()); p.Confidence = 1.5; return p }(),
			want: []string{"confidence: must be in [0, 1], got 1.5"},
		},
		{
			name: "confidence below 0",
			plan: func() *planexv1.Plan { p := newPlan(find()); p.Confidence = -0.1; return p }(),
			want: []string{"confidence: must be in [0, 1], got -0.1"},
		},
		{
			name: "confidence NaN",
			plan: func() *planexv1.Plan { p := newPlan(find()); p.Confidence = math.NaN(); return p }(),
			want: []string{"confidence: must be in [0, 1], got NaN"},
		},
		{
			name: "confidence bounds are valid",
			plan: func() *planexv1.Plan { p := newPlan(find()); p.Confidence = 1; return p }(),
		},
		{
			name: "negative timeout",
			plan: func() *planexv1.Plan {
				p := newPlan(find())
				p.Steps[0].Timeout = durationpb.New(-1)
				return p
			}(),
			want: []string{`step "find": timeout: must be positive, got -1ns`},
		},
		{
			name: "empty value in args is null",
			plan: newPlan(&planexv1.Step{Id: "f", Tool: "free.form", Args: &structpb.Struct{Fields: map[string]*structpb.Value{"x": nil, "y": {}}}}),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.cat
			if c == nil {
				c = cat
			}
			err := Validate(tt.plan, c, tt.lim)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate = nil, want problems %q", tt.want)
			}
			if !errors.Is(err, ErrInvalidPlan) || errors.Is(err, ErrInvalidArgs) {
				t.Errorf("errors.Is(ErrInvalidPlan) false or errors.Is(ErrInvalidArgs) true for %v", err)
			}
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("error %T is not a *ValidationError", err)
			}
			for _, w := range tt.want {
				if !hasProblem(verr, w) {
					t.Errorf("no problem contains %q; problems:\n%s", w, problemList(verr))
				}
			}
		})
	}
}

func hasProblem(verr *ValidationError, want string) bool {
	for _, p := range verr.Problems {
		if strings.Contains(p.String(), want) {
			return true
		}
	}
	return false
}

func problemList(verr *ValidationError) string {
	var b strings.Builder
	for _, p := range verr.Problems {
		b.WriteString("  " + p.String() + "\n")
	}
	return b.String()
}

func TestValidateAllProblemsAtOnce(t *testing.T) {
	p := newPlan(
		step(t, "a", "sql.drop", `{}`, "nope"),
		step(t, "b", "email.send", `{"to": "x"}`),
	)
	p.Confidence = 2
	err := Validate(p, testCatalog(t), DefaultLimits())
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("Validate = %v, want *ValidationError", err)
	}
	want := []Problem{
		{Field: "confidence", Message: "must be in [0, 1], got 2"},
		{Step: "a", Field: "depends_on", Message: `unknown step "nope"`},
		{Step: "a", Field: "tool", Message: `unknown tool "sql.drop"`},
		{Step: "b", Field: "args.subject", Message: "missing required field"},
		{Step: "b", Field: "args.to", Message: `expected array, got string "x"`},
	}
	if len(verr.Problems) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%s", len(verr.Problems), len(want), problemList(verr))
	}
	for i := range want {
		if verr.Problems[i] != want[i] {
			t.Errorf("problem %d = %+v, want %+v", i, verr.Problems[i], want[i])
		}
	}
	if !strings.HasPrefix(err.Error(), "invalid plan: confidence: must be in [0, 1], got 2; step \"a\": ") {
		t.Errorf("Error() = %q", err.Error())
	}
}

func TestValidateArgs(t *testing.T) {
	cat := testCatalog(t)
	// want is a substring of the error; "" for valid arguments.
	tests := []struct{ name, tool, args, want string }{
		{name: "valid", tool: "email.send", args: `{"to": ["a@b.c"], "subject": "hello"}`},
		{name: "wrong type", tool: "email.send", args: `{"to": "x", "subject": "hello"}`, want: `args.to: expected array, got string "x"`},
		{name: "nested item", tool: "email.send", args: `{"to": ["a@b.c", "nobody"], "subject": "hello"}`, want: `args.to[1]: `},
		{name: "nil args", tool: "sql.query", args: ``, want: `args.query: missing required field`},
		{name: "leftover reference is literal", tool: "email.send", args: `{"to": "${{ inputs.to }}", "subject": "hello"}`, want: `args.to: expected array, got string "${{ inputs.to }}"`},
		{name: "no schema", tool: "free.form", args: `{"x": 1}`},
		{name: "broken schema", tool: "broken.schema", args: `{}`, want: `tool "broken.schema": args schema:`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, _ := cat.Tool(tt.tool)
			err := ValidateArgs(spec, jsonStruct(t, tt.args))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("ValidateArgs: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ValidateArgs = %v, want it to contain %q", err, tt.want)
			}
			if tt.name != "broken schema" && (!errors.Is(err, ErrInvalidArgs) || errors.Is(err, ErrInvalidPlan)) {
				t.Errorf("error %v does not match ErrInvalidArgs only", err)
			}
		})
	}
	if err := ValidateArgs(nil, nil); err == nil {
		t.Error("ValidateArgs(nil, nil) = nil, want an error")
	}
}

func TestSchemaCacheRecompilesChangedSchema(t *testing.T) {
	var c SchemaCache
	spec := &planexv1.ToolSpec{Name: "t.x", ArgsSchema: jsonStruct(t, `{"properties": {"n": {"type": "string"}}}`)}
	args := jsonStruct(t, `{"n": 1}`)
	if err := c.Validate(spec, args); err == nil {
		t.Fatal("n: 1 passed a string schema")
	}
	// Same schema in a new message: still cached, still enforced.
	same := &planexv1.ToolSpec{Name: "t.x", ArgsSchema: jsonStruct(t, `{"properties": {"n": {"type": "string"}}}`)}
	if err := c.Validate(same, args); err == nil {
		t.Fatal("n: 1 passed an equal string schema")
	}
	changed := &planexv1.ToolSpec{Name: "t.x", ArgsSchema: jsonStruct(t, `{"properties": {"n": {"type": "number"}}}`)}
	if err := c.Validate(changed, args); err != nil {
		t.Fatalf("changed schema not recompiled: %v", err)
	}
}

func TestSchemaCacheLimit(t *testing.T) {
	c := SchemaCache{Limit: 2}
	for _, name := range []string{"a.x", "b.x", "c.x", "d.x"} {
		spec := &planexv1.ToolSpec{Name: name, ArgsSchema: jsonStruct(t, `{"type": "object"}`)}
		if err := c.Validate(spec, nil); err != nil {
			t.Fatalf("Validate %s: %v", name, err)
		}
	}
	if n := len(c.entries); n > 2 {
		t.Errorf("cache holds %d schemas, limit is 2", n)
	}
}

func TestSchemaRefusesExternalRefs(t *testing.T) {
	spec := &planexv1.ToolSpec{Name: "ext.ref", ArgsSchema: jsonStruct(t, `{"$ref": "file:///etc/passwd"}`)}
	err := ValidateArgs(spec, nil)
	if err == nil || !strings.Contains(err.Error(), "not allowed") {
		t.Fatalf("ValidateArgs = %v, want external schema refused", err)
	}
}
