package plan_test

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/planex-dev/planex/internal/plan"
)

func TestArgSteps(t *testing.T) {
	for _, tc := range []struct {
		name string
		args map[string]any
		want []string
		ok   bool
	}{
		{name: "no reference", args: map[string]any{"a": "plain", "n": 3}, ok: true},
		{name: "nested and repeated", args: map[string]any{
			"a": "${{ steps.x.output.v }} and ${{ steps.y.output }}",
			"b": map[string]any{"c": []any{"${{ steps.x.output }}", "${{ inputs.q }}"}},
		}, want: []string{"x", "y"}, ok: true},
		{name: "misuse of steps", args: map[string]any{"a": "${{ steps.x }}"}, ok: false},
		{name: "unclosed reference", args: map[string]any{"a": "${{ steps.x.output"}, ok: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args, err := structpb.NewStruct(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := plan.ArgSteps(args)
			if ok != tc.ok || (ok && !slices.Equal(got, tc.want)) {
				t.Fatalf("ArgSteps = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
