package catalog

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

const (
	read     = planexv1.SideEffect_SIDE_EFFECT_READ
	write    = planexv1.SideEffect_SIDE_EFFECT_WRITE
	external = planexv1.SideEffect_SIDE_EFFECT_EXTERNAL
	unset    = planexv1.SideEffect_SIDE_EFFECT_UNSPECIFIED
)

// draft is the email.draft registration of the attack, with the
// restrictions it really has.
func draft() *planexv1.ToolSpec {
	return &planexv1.ToolSpec{Name: "email.draft", Pool: "email", SideEffect: write, SensitiveFields: []string{"to", "body"}}
}

func TestFloorLowered(t *testing.T) {
	floor := FloorOf(&planexv1.ToolSpec{SideEffect: write, RequiresApproval: true, SensitiveFields: []string{"to", "body"}})
	cases := []struct {
		name string
		spec *planexv1.ToolSpec
		want []string
	}{
		{name: "same", spec: &planexv1.ToolSpec{SideEffect: write, RequiresApproval: true, SensitiveFields: []string{"body", "to"}}},
		{name: "raised everywhere", spec: &planexv1.ToolSpec{SideEffect: external, RequiresApproval: true, SensitiveFields: []string{"to", "body", "cc"}}},
		{name: "unspecified is external", spec: &planexv1.ToolSpec{SideEffect: unset, RequiresApproval: true, SensitiveFields: []string{"to", "body"}}},
		{name: "unknown side effect is external", spec: &planexv1.ToolSpec{SideEffect: 42, RequiresApproval: true, SensitiveFields: []string{"to", "body"}}},
		{name: "the issue's downgrade", spec: &planexv1.ToolSpec{SideEffect: read},
			want: []string{"side_effect READ below WRITE", "requires_approval off", "sensitive_fields without body, to"}},
		{name: "one field dropped", spec: &planexv1.ToolSpec{SideEffect: write, RequiresApproval: true, SensitiveFields: []string{"to"}},
			want: []string{"sensitive_fields without body"}},
		{name: "approval dropped", spec: &planexv1.ToolSpec{SideEffect: external, SensitiveFields: []string{"to", "body"}},
			want: []string{"requires_approval off"}},
		{name: "output masking turned off", spec: &planexv1.ToolSpec{SideEffect: write, RequiresApproval: true, SensitiveFields: []string{"to", "body"}, OutputSecretsAllowed: true},
			want: []string{"output_secrets_allowed on"}},
		{name: "declared idempotent (retried after a timeout)", spec: &planexv1.ToolSpec{SideEffect: write, RequiresApproval: true, SensitiveFields: []string{"to", "body"}, Idempotent: true},
			want: []string{"idempotent on"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := floor.Lowered(tc.spec); !slices.Equal(got, tc.want) {
				t.Fatalf("Lowered = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestFloorJoinOnlyRises(t *testing.T) {
	cases := []struct {
		name string
		a, b *planexv1.ToolSpec
		want Floor
	}{
		{name: "side effect takes the more careful", a: &planexv1.ToolSpec{SideEffect: read}, b: &planexv1.ToolSpec{SideEffect: write},
			want: Floor{SideEffect: write, SensitiveFields: []string{}}},
		{name: "unspecified joins as external", a: &planexv1.ToolSpec{SideEffect: write}, b: &planexv1.ToolSpec{SideEffect: unset},
			want: Floor{SideEffect: external}},
		{name: "approval sticks", a: &planexv1.ToolSpec{SideEffect: read, RequiresApproval: true}, b: &planexv1.ToolSpec{SideEffect: read},
			want: Floor{SideEffect: read, RequiresApproval: true}},
		{name: "sensitive fields unite", a: &planexv1.ToolSpec{SideEffect: read, SensitiveFields: []string{"to", "to"}}, b: &planexv1.ToolSpec{SideEffect: read, SensitiveFields: []string{"body", ""}},
			want: Floor{SideEffect: read, SensitiveFields: []string{"body", "to"}}},
		{name: "output secrets need both", a: &planexv1.ToolSpec{SideEffect: read, OutputSecretsAllowed: true}, b: &planexv1.ToolSpec{SideEffect: read},
			want: Floor{SideEffect: read}},
		{name: "output secrets when both", a: &planexv1.ToolSpec{SideEffect: read, OutputSecretsAllowed: true}, b: &planexv1.ToolSpec{SideEffect: read, OutputSecretsAllowed: true},
			want: Floor{SideEffect: read, OutputSecretsAllowed: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, got := range []Floor{FloorOf(tc.a).Join(FloorOf(tc.b)), FloorOf(tc.b).Join(FloorOf(tc.a))} {
				if !got.Equal(tc.want) {
					t.Fatalf("join = %+v, want %+v", got, tc.want)
				}
				for _, s := range []*planexv1.ToolSpec{tc.a, tc.b} {
					if low := FloorOf(s).Lowered(specOf(got)); len(low) > 0 {
						t.Fatalf("the join is below one of its parts: %q", low)
					}
					if low := got.Lowered(got.Raise(s)); len(low) > 0 {
						t.Fatalf("a part raised to the join lowers it: %q", low)
					}
				}
			}
		})
	}
}

func TestFloorRaiseRestoresEveryRestriction(t *testing.T) {
	floor := FloorOf(draft()).Join(Floor{SideEffect: write, RequiresApproval: true})
	downgraded := &planexv1.ToolSpec{Name: "email.draft", Pool: "email", Description: "d", SideEffect: read, SensitiveFields: []string{"subject"}, OutputSecretsAllowed: true}
	got := floor.Raise(downgraded)
	if low := floor.Lowered(got); len(low) > 0 {
		t.Fatalf("raised spec still lowers the floor: %q", low)
	}
	if got.GetSideEffect() != write || !got.GetRequiresApproval() || got.GetOutputSecretsAllowed() || got.GetDescription() != "d" {
		t.Fatalf("raised spec %v", got)
	}
	if want := []string{"subject", "body", "to"}; !slices.Equal(got.GetSensitiveFields(), want) {
		t.Fatalf("sensitive fields %q, want %q (its own, then the floor's)", got.GetSensitiveFields(), want)
	}
	if downgraded.GetSideEffect() != read || len(downgraded.GetSensitiveFields()) != 1 {
		t.Fatal("Raise modified its argument")
	}
}

func TestFloorJSON(t *testing.T) {
	f := FloorOf(&planexv1.ToolSpec{SideEffect: unset, RequiresApproval: true, SensitiveFields: []string{"to", "body"}})
	data, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"side_effect":"SIDE_EFFECT_EXTERNAL","requires_approval":true,"sensitive_fields":["body","to"],"output_secrets_allowed":false,"idempotent":false}`
	if string(data) != want {
		t.Fatalf("encoded %s, want %s", data, want)
	}
	var back Floor
	if err := json.Unmarshal(data, &back); err != nil || !back.Equal(f) {
		t.Fatalf("decoded %+v, %v; want %+v", back, err, f)
	}
	for _, bad := range []string{`{"side_effect":"SIDE_EFFECT_NONE"}`, `{"side_effect":"SIDE_EFFECT_UNSPECIFIED"}`, `{}`, `not json`} {
		if err := json.Unmarshal([]byte(bad), &back); err == nil {
			t.Errorf("decoded %s without an error", bad)
		} else if strings.Contains(bad, "SIDE_EFFECT") && !strings.Contains(err.Error(), "side_effect") {
			t.Errorf("error %q does not name the field", err)
		}
	}
}

func TestProposedIsOrderIndependentAndSkipsLowerings(t *testing.T) {
	stored := FloorOf(draft())
	regs := []registration{
		{key: "email.draft.a", rev: 1, spec: draft()},
		{key: "email.draft.b", rev: 2, spec: &planexv1.ToolSpec{SideEffect: write, RequiresApproval: true, SensitiveFields: []string{"to", "body"}}},
		{key: "email.draft.c", rev: 3, spec: &planexv1.ToolSpec{SideEffect: read}}, // lowers the stored floor
		{key: "email.draft.d", rev: 4, spec: &planexv1.ToolSpec{SideEffect: external, SensitiveFields: []string{"to", "body", "cc"}}},
	}
	want := Floor{SideEffect: external, RequiresApproval: true, SensitiveFields: []string{"body", "cc", "to"}}
	if got := proposed(&stored, regs); !got.Equal(want) {
		t.Fatalf("proposed = %+v, want %+v", got, want)
	}
	rev := slices.Clone(regs)
	slices.Reverse(rev)
	if got := proposed(&stored, rev); !got.Equal(want) {
		t.Fatalf("proposed in reverse order = %+v, want %+v", got, want)
	}
	// Without a stored floor the first registrations set it: all of them.
	if got := proposed(nil, regs[2:3]); !got.Equal(Floor{SideEffect: read}) {
		t.Fatalf("first floor = %+v, want READ and nothing else", got)
	}
}

// specOf is a spec with exactly f's restrictions.
func specOf(f Floor) *planexv1.ToolSpec {
	return &planexv1.ToolSpec{SideEffect: f.SideEffect, RequiresApproval: f.RequiresApproval, SensitiveFields: f.SensitiveFields, OutputSecretsAllowed: f.OutputSecretsAllowed, Idempotent: f.Idempotent}
}
