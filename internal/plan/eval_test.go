package plan

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// testEnv is a run where step "find" returned two rows and step "count"
// returned an int.
func testEnv() Env {
	return Env{
		Goal:   "weekly report",
		Inputs: map[string]any{"team": "infra", "limit": float64(10)},
		Outputs: map[string]any{
			"find": map[string]any{
				"rows": []any{
					map[string]any{"id": float64(1), "email": "a@x.io"},
					map[string]any{"id": float64(2), "email": "b@x.io"},
				},
				"total": float64(2),
			},
			"count": int64(7),
		},
	}
}

func TestResolveArgs(t *testing.T) {
	// want is the JSON of the resolved args.
	tests := []struct{ name, args, want string }{
		{name: "no references", args: `{"q": "plain", "n": 1}`, want: `{"q": "plain", "n": 1}`},
		{name: "whole string", args: `{"q": "${{ goal }}"}`, want: `{"q": "weekly report"}`},
		{name: "whole int keeps integral", args: `{"n": "${{ steps.count.output + 1 }}"}`, want: `{"n": 8}`},
		{name: "whole double", args: `{"n": "${{ steps.find.output.total / 4.0 }}"}`, want: `{"n": 0.5}`},
		{name: "whole bool", args: `{"b": "${{ steps.count.output > 5 }}"}`, want: `{"b": true}`},
		{name: "whole null", args: `{"v": "${{ null }}"}`, want: `{"v": null}`},
		{name: "whole list", args: `{"to": "${{ steps.find.output.rows.map(r, r.email) }}"}`, want: `{"to": ["a@x.io", "b@x.io"]}`},
		{name: "whole map", args: `{"row": "${{ steps.find.output.rows[0] }}"}`, want: `{"row": {"id": 1, "email": "a@x.io"}}`},
		{name: "map literal with closing braces", args: `{"m": "${{ {'a': {'b': 1}} }}"}`, want: `{"m": {"a": {"b": 1}}}`},
		{name: "braces inside a string literal", args: `{"s": "${{ '}}' + \"{\" }}"}`, want: `{"s": "}}{"}`},
		{name: "interpolation", args: `{"s": "Report for ${{ inputs.team }}: ${{ steps.find.output.total }} users"}`, want: `{"s": "Report for infra: 2 users"}`},
		{name: "interpolated list is compact JSON", args: `{"s": "ids=${{ steps.find.output.rows.map(r, r.id) }}"}`, want: `{"s": "ids=[1,2]"}`},
		{name: "interpolated map keeps <>&", args: `{"s": "m=${{ {'k': '<&>'} }}"}`, want: `{"s": "m={\"k\":\"<&>\"}"}`},
		{name: "interpolated int and null", args: `{"s": "${{ steps.count.output }}/${{ null }}"}`, want: `{"s": "7/null"}`},
		{
			name: "nested objects and lists",
			args: `{"outer": {"inner": ["${{ inputs.team }}", "lit", {"deep": "${{ inputs.limit }}"}]}, "same": {"x": [1]}}`,
			want: `{"outer": {"inner": ["infra", "lit", {"deep": 10}]}, "same": {"x": [1]}}`,
		},
		{name: "extensions: strings", args: `{"s": "${{ goal.upperAscii() }}"}`, want: `{"s": "WEEKLY REPORT"}`},
		{name: "extensions: math and lists", args: `{"n": "${{ math.greatest([1, 5, 3]) }}", "l": "${{ [3, 1, 2].sort() }}"}`, want: `{"n": 5, "l": [1, 2, 3]}`},
		{name: "extensions: base64", args: `{"s": "${{ base64.encode(b'hi') }}"}`, want: `{"s": "aGk="}`},
		{name: "optional value", args: `{"v": "${{ steps.find.output.?missing.orValue('none') }}"}`, want: `{"v": "none"}`},
		{name: "bytes become base64", args: `{"v": "${{ b'hi' }}"}`, want: `{"v": "aGk="}`},
		{name: "timestamp becomes RFC 3339", args: `{"v": "${{ timestamp('2026-01-02T03:04:05Z') }}"}`, want: `{"v": "2026-01-02T03:04:05Z"}`},
		{name: "duration becomes a string", args: `{"v": "${{ duration('90s') }}"}`, want: `{"v": "90s"}`},
		{name: "cross-type comparison", args: `{"b": "${{ steps.find.output.total == 2 && inputs.limit > 5 }}"}`, want: `{"b": true}`},
	}
	env := testEnv()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := jsonStruct(t, tt.args)
			orig := proto.Clone(args)
			got, err := ResolveArgs(args, env)
			if err != nil {
				t.Fatalf("ResolveArgs: %v", err)
			}
			if want := jsonStruct(t, tt.want); !proto.Equal(got, want) {
				t.Errorf("ResolveArgs = %s, want %s", protojson.Format(got), tt.want)
			}
			if !proto.Equal(args, orig) {
				t.Errorf("ResolveArgs modified its input: %s", protojson.Format(args))
			}
			if _, err := protojson.Marshal(got); err != nil {
				t.Errorf("result does not marshal: %v", err)
			}
		})
	}
}

func TestResolveArgsErrors(t *testing.T) {
	tests := []struct{ name, args, field, want string }{
		{name: "missing output key", args: `{"to": "${{ steps.find.output.missing }}"}`, field: "args.to", want: "args.to: ${{ steps.find.output.missing }}: no such key: missing"},
		{name: "missing step output", args: `{"x": {"y": ["${{ steps.later.output }}"]}}`, field: "args.x.y[0]", want: "no such key: later"},
		{name: "interpolation error", args: `{"s": "a ${{ inputs.nope }} b"}`, field: "args.s", want: "args.s: ${{ inputs.nope }}: no such key: nope"},
		{name: "compile error", args: `{"s": "${{ 1 + }}"}`, field: "args.s", want: "compile: 1:4: Syntax error"},
		{name: "not JSON", args: `{"s": "${{ 0.0 / 0.0 }}"}`, field: "args.s", want: "NaN is not a JSON number"},
		{name: "unterminated", args: `{"s": "${{ goal"}`, field: "args.s", want: "no closing"},
		{name: "odd key", args: `{"a.b": "${{ nope }}"}`, field: `args["a.b"]`, want: "undeclared reference"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ResolveArgs(jsonStruct(t, tt.args), testEnv())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ResolveArgs error = %v, want it to contain %q", err, tt.want)
			}
			var eerr *EvalError
			if !errors.As(err, &eerr) || eerr.Field != tt.field {
				t.Errorf("error %v: want *EvalError with Field %q", err, tt.field)
			}
		})
	}
}

func TestResolveArgsSharesUnchangedValues(t *testing.T) {
	args := jsonStruct(t, `{"ref": "${{ goal }}", "big": {"rows": [1, 2, 3]}}`)
	got, err := ResolveArgs(args, testEnv())
	if err != nil {
		t.Fatal(err)
	}
	if got == args {
		t.Error("ResolveArgs returned its input Struct")
	}
	if got.Fields["big"] != args.Fields["big"] {
		t.Error("unchanged subtree was copied")
	}
}

func TestCheckExpect(t *testing.T) {
	output := map[string]any{"rows": []any{float64(1)}, "sent": float64(2)}
	args := map[string]any{"to": []any{"a", "b"}}
	tests := []struct {
		name, expr, wantErr string
		output              any
		args                map[string]any
		want                bool
	}{
		{name: "empty holds", expr: "", want: true},
		{name: "true", expr: "output.rows.size() > 0", output: output, want: true},
		{name: "false", expr: "output.rows.size() > 1", output: output, want: false},
		{name: "uses args", expr: "output.sent == size(args.to)", output: output, args: args, want: true},
		{name: "nil args are empty", expr: "size(args) == 0", output: output, want: true},
		{name: "scalar output", expr: "output == 'ok'", output: "ok", want: true},
		{name: "missing key", expr: "output.nope == 1", output: output, wantErr: "expect: output.nope == 1: no such key: nope"},
		{name: "null output", expr: "output.rows.size() > 0", output: nil, wantErr: "expect: "},
		{name: "not a bool", expr: "output.sent", output: output, wantErr: "result is double, want bool"},
		{name: "compile error", expr: "output.(", wantErr: "compile: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := CheckExpect(tt.expr, tt.output, tt.args)
			if tt.wantErr != "" {
				var eerr *EvalError
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.As(err, &eerr) {
					t.Fatalf("CheckExpect = %v, %v; want *EvalError containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("CheckExpect = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestEvalAnswer(t *testing.T) {
	tests := []struct {
		name, expr, wantErr string
		want                any
	}{
		{name: "map with int and list", expr: `{"count": steps.count.output, "emails": steps.find.output.rows.map(r, r.email)}`,
			want: map[string]any{"count": int64(7), "emails": []any{"a@x.io", "b@x.io"}}},
		{name: "string", expr: `goal + " done"`, want: "weekly report done"},
		{name: "uint", expr: `uint(3)`, want: int64(3)},
		{name: "int keys become strings", expr: `{1: "a"}`, want: map[string]any{"1": "a"}},
		{name: "optional none is null", expr: `optional.none()`, want: nil},
		{name: "missing output", expr: `steps.nope.output`, wantErr: "answer: steps.nope.output: no such key: nope"},
		{name: "empty", expr: ``, wantErr: "empty expression"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := EvalAnswer(tt.expr, testEnv())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("EvalAnswer = %v, %v; want error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("EvalAnswer = %#v, %v; want %#v", got, err, tt.want)
			}
		})
	}
}

func TestResult(t *testing.T) {
	p := newPlan(
		step(t, "find", "sql.query", `{}`),
		step(t, "count", "sql.query", `{}`),
		step(t, "use", "free.form", `{}`, "find"),
	)
	env := testEnv()
	got, err := Result(p, env)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"count": int64(7), "use": nil}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Result without answer = %#v, want %#v", got, want)
	}
	p.Answer = "steps.count.output * 2"
	if got, err := Result(p, env); err != nil || got != int64(14) {
		t.Errorf("Result with answer = %#v, %v; want 14", got, err)
	}
}

func TestParseTemplate(t *testing.T) {
	tests := []struct {
		in    string
		segs  []segment
		whole bool
		err   string
	}{
		{in: "plain"},
		{in: "${{ a }}", segs: []segment{{"a", true}}, whole: true},
		{in: "${{a}}", segs: []segment{{"a", true}}, whole: true},
		{in: " ${{ a }}", segs: []segment{{" ", false}, {"a", true}}},
		{in: "${{ a }}${{ b }}", segs: []segment{{"a", true}, {"b", true}}},
		{in: "x ${{ {'k': {'v': 1}} }} y", segs: []segment{{"x ", false}, {"{'k': {'v': 1}}", true}, {" y", false}}},
		{in: `${{ "}}" }}`, segs: []segment{{`"}}"`, true}}, whole: true},
		{in: `${{ '''a}}'b''' }}`, segs: []segment{{`'''a}}'b'''`, true}}, whole: true},
		{in: `${{ r'\' }}`, segs: []segment{{`r'\'`, true}}, whole: true},
		{in: `${{ 'it\'s }}' }}`, segs: []segment{{`'it\'s }}'`, true}}, whole: true},
		{in: "${{ a", err: "no closing"},
		{in: "${{ 'a }}", err: "no closing"},
		{in: "${{ }}", err: "empty reference"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseTemplate(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("parseTemplate = %v, %v; want error %q", got, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.segs == nil {
				if got != nil {
					t.Fatalf("parseTemplate = %+v, want nil", got)
				}
				return
			}
			if !reflect.DeepEqual(got.segs, tt.segs) || got.whole() != tt.whole {
				t.Fatalf("parseTemplate = %+v (whole %v), want %+v (whole %v)", got.segs, got.whole(), tt.segs, tt.whole)
			}
		})
	}
}

func TestProgramCacheIsBounded(t *testing.T) {
	c := &progCache{limit: 2}
	for i, e := range []string{"1", "2", "3", "4", "5"} {
		c.put(progKey{kindRun, e}, &compiled{})
		if n := len(c.cur) + len(c.old); n > 4 {
			t.Fatalf("after %d puts the cache holds %d entries", i+1, n)
		}
	}
	if c.get(progKey{kindRun, "5"}) == nil || c.get(progKey{kindRun, "4"}) == nil {
		t.Error("recent entries were evicted")
	}
	if c.get(progKey{kindRun, "1"}) != nil {
		t.Error("oldest entry is still cached")
	}
}

// TestNoPanics feeds degenerate inputs to every entry point.
func TestNoPanics(t *testing.T) {
	nilValues := &structpb.Struct{Fields: map[string]*structpb.Value{"x": nil, "y": {}, "l": structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{nil}})}}
	plans := []*planexv1.Plan{
		nil,
		{},
		{Steps: []*planexv1.Step{nil}},
		{Steps: []*planexv1.Step{{}}},
		{Steps: []*planexv1.Step{{Id: "a", DependsOn: []string{"a", "", "zz"}, Args: nilValues}, nil}},
		{Steps: []*planexv1.Step{{Id: "a", DependsOn: []string{"b"}}, {Id: "b", DependsOn: []string{"a"}}}, Answer: "steps.a.output"},
	}
	cat := testCatalog(t)
	for i, p := range plans {
		_ = Validate(p, cat, DefaultLimits())
		_ = Validate(p, nil, Limits{})
		_ = Ready(p, nil, nil)
		_ = Descendants(p, "a")
		_ = Leaves(p)
		_ = Lineage(p, p, nil)
		_ = Lineage(nil, p, map[string]bool{"a": true})
		_ = Lineage(p, nil, nil)
		_, _ = Result(p, Env{})
		t.Logf("plan %d ok", i)
	}
	if got, err := ResolveArgs(nil, Env{}); got != nil || err != nil {
		t.Errorf("ResolveArgs(nil) = %v, %v", got, err)
	}
	got, err := ResolveArgs(nilValues, Env{})
	if err != nil {
		t.Fatalf("ResolveArgs(nil values): %v", err)
	}
	if _, err := protojson.Marshal(got); err != nil {
		t.Errorf("resolved nil values do not marshal: %v", err)
	}
	_ = ValidateArgs(nil, nil)
	_ = ValidateArgs(&planexv1.ToolSpec{}, nilValues)
	_, _ = CheckExpect("output", nil, nil)
	_, _ = EvalAnswer("inputs", Env{})
}

func FuzzResolveArgs(f *testing.F) {
	for _, s := range []string{"", "${{", "${{ }}", "${{ goal }}", "a ${{ '}}' }} b", "${{ {'a': {}} }}", "${{ r'", "${{ \"\"\" }}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		args := &structpb.Struct{Fields: map[string]*structpb.Value{"s": structpb.NewStringValue(s)}}
		_, _ = ResolveArgs(args, testEnv())
		_ = Validate(newPlan(&planexv1.Step{Id: "a", Tool: "free.form", Args: args}), nil, DefaultLimits())
	})
}
