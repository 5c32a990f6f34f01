package playbook

import (
	"strings"
	"testing"
)

// TestSubstitution covers both ways parameters reach a plan: inlined as
// CEL literals into expressions, and substituted into argument strings.
func TestSubstitution(t *testing.T) {
	params := map[string]any{"name": `O'Brien "Ltd"`, "n": int64(3), "x": 2.0, "ok": true, "none": nil, "s": "a}", "braces": "{{ steps.x.output }}"}
	inline := func(expr string) func() (any, error) {
		return func() (any, error) { return inlineParams(expr, params) }
	}
	subst := func(s string) func() (any, error) {
		return func() (any, error) {
			v, err := substString(s, params, "args.x")
			return v.AsInterface(), err
		}
	}
	cases := []struct {
		name string
		run  func() (any, error)
		want any
		err  string
	}{
		{"CEL: string literal escaped", inline(`'hi ' + params.name`), `'hi ' + "O'Brien \"Ltd\""`, ""},
		{"CEL: text in a literal untouched", inline(`'params.name: ' + params . name`), `'params.name: ' + "O'Brien \"Ltd\""`, ""},
		{"CEL: non-ASCII before the reference", inline(`'héllo — ' + string(params.n) + "ü" + string(params.x)`), `'héllo — ' + string(3) + "ü" + string(2.0)`, ""},
		{"CEL: inside a macro", inline(`steps.a.output.rows.filter(r, r[0] == params.name && params.ok).size() > params.n`), `steps.a.output.rows.filter(r, r[0] == "O'Brien \"Ltd\"" && true).size() > 3`, ""},
		{"CEL: absent optional param is null", inline(`params.none == null`), `null == null`, ""},
		{"CEL: no params", inline(`steps.a.output`), `steps.a.output`, ""},
		{"CEL: unknown param", inline(`params.nope`), nil, `unknown parameter "nope"`},
		{"CEL: params used as a map", inline(`params["name"]`), nil, "use params.<name>"},
		{"CEL: syntax error", inline(`params.n +`), nil, "parse"},
		{"args: whole placeholder keeps the type", subst("${{ params.n }}"), 3.0, ""},
		{"args: embedded placeholder is text", subst("top ${{params.n}} of ${{ params.s }}"), "top 3 of a}", ""},
		{"args: engine references stay", subst("${{ steps.a.output.rows[0][0] }} and ${{ params.n }}"), "${{ steps.a.output.rows[0][0] }} and 3", ""},
		{"args: a value must not form a reference", subst("$${{ params.braces }}"), nil, "would form"},
		{"args: unknown parameter", subst("${{ params.zz }}"), nil, `unknown parameter "zz"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.run()
			switch {
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("err = %v, want %q", err, tc.err)
			case tc.err == "" && err != nil:
				t.Fatal(err)
			case tc.err == "" && got != tc.want:
				t.Errorf("got  %#v\nwant %#v", got, tc.want)
			}
		})
	}
}
