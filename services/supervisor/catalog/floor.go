package catalog

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// Floor is the most restrictive registration of a tool the supervisors
// have accepted, in the four respects that decide its gates and masks:
// side effect, default approval, sensitive fields and output masking. It
// is the value of the tool's key in planex-tool-floors, as JSON, e.g.
//
//	{"side_effect":"SIDE_EFFECT_WRITE","requires_approval":true,"sensitive_fields":["body","to"],"output_secrets_allowed":false,"idempotent":false}
//
// Idempotence is part of it too: a tool declared idempotent is retried
// after a timeout, so turning it on for a tool with side effects could
// repeat them.
//
// A registration is refused when it lowers any of them (Floor.Lowered);
// floors only rise, except when an operator deletes one
// (docs/security.md, "Tool catalog trust").
type Floor struct {
	// SideEffect is the most careful side effect class registered;
	// SIDE_EFFECT_UNSPECIFIED is stored as SIDE_EFFECT_EXTERNAL, which it
	// means.
	SideEffect planexv1.SideEffect
	// RequiresApproval is true once a registration asked for approval.
	RequiresApproval bool
	// SensitiveFields is the union of the sensitive fields registered,
	// sorted.
	SensitiveFields []string
	// OutputSecretsAllowed is true only while every accepted registration
	// opted out of output masking.
	OutputSecretsAllowed bool
	// Idempotent is true only while every accepted registration declared
	// the tool idempotent.
	Idempotent bool
}

// sideEffectRank orders side effects from the least careful (READ) to the
// most careful. Unspecified and unknown values count as EXTERNAL, as the
// proto says of SIDE_EFFECT_UNSPECIFIED.
func sideEffectRank(s planexv1.SideEffect) int {
	switch s {
	case planexv1.SideEffect_SIDE_EFFECT_READ:
		return 1
	case planexv1.SideEffect_SIDE_EFFECT_WRITE:
		return 2
	default:
		return 3
	}
}

// normalSideEffect maps a side effect to the named class of its rank.
func normalSideEffect(s planexv1.SideEffect) planexv1.SideEffect {
	switch sideEffectRank(s) {
	case 1:
		return planexv1.SideEffect_SIDE_EFFECT_READ
	case 2:
		return planexv1.SideEffect_SIDE_EFFECT_WRITE
	}
	return planexv1.SideEffect_SIDE_EFFECT_EXTERNAL
}

// sideEffectName is the short name of a side effect class for messages.
func sideEffectName(s planexv1.SideEffect) string {
	return strings.TrimPrefix(normalSideEffect(s).String(), "SIDE_EFFECT_")
}

// FloorOf returns the floor a registration of spec alone would set.
func FloorOf(spec *planexv1.ToolSpec) Floor {
	return Floor{
		SideEffect:           normalSideEffect(spec.GetSideEffect()),
		RequiresApproval:     spec.GetRequiresApproval(),
		SensitiveFields:      fieldSet(spec.GetSensitiveFields()),
		OutputSecretsAllowed: spec.GetOutputSecretsAllowed(),
		Idempotent:           spec.GetIdempotent(),
	}
}

// fieldSet returns fields sorted, without duplicates or empty names.
func fieldSet(fields []string) []string {
	out := slices.DeleteFunc(slices.Clone(fields), func(f string) bool { return f == "" })
	slices.Sort(out)
	return slices.Compact(out)
}

// Join returns the most restrictive of f and g in every respect.
func (f Floor) Join(g Floor) Floor {
	out := Floor{
		SideEffect:           f.SideEffect,
		RequiresApproval:     f.RequiresApproval || g.RequiresApproval,
		SensitiveFields:      fieldSet(append(slices.Clone(f.SensitiveFields), g.SensitiveFields...)),
		OutputSecretsAllowed: f.OutputSecretsAllowed && g.OutputSecretsAllowed,
		Idempotent:           f.Idempotent && g.Idempotent,
	}
	if sideEffectRank(g.SideEffect) > sideEffectRank(f.SideEffect) {
		out.SideEffect = g.SideEffect
	}
	out.SideEffect = normalSideEffect(out.SideEffect)
	return out
}

// Equal reports whether f and g hold the same restrictions.
func (f Floor) Equal(g Floor) bool {
	return sideEffectRank(f.SideEffect) == sideEffectRank(g.SideEffect) && f.RequiresApproval == g.RequiresApproval &&
		f.OutputSecretsAllowed == g.OutputSecretsAllowed && f.Idempotent == g.Idempotent && slices.Equal(fieldSet(f.SensitiveFields), fieldSet(g.SensitiveFields))
}

// Lowered lists, in words and without any value, what spec lowers
// relative to f: a less careful side effect, no approval where f has it,
// sensitive fields f has and spec lacks, output masking turned off where f
// has it on. It is empty when spec is at least as restrictive as f.
func (f Floor) Lowered(spec *planexv1.ToolSpec) []string {
	var out []string
	if sideEffectRank(spec.GetSideEffect()) < sideEffectRank(f.SideEffect) {
		out = append(out, fmt.Sprintf("side_effect %s below %s", sideEffectName(spec.GetSideEffect()), sideEffectName(f.SideEffect)))
	}
	if f.RequiresApproval && !spec.GetRequiresApproval() {
		out = append(out, "requires_approval off")
	}
	have := fieldSet(spec.GetSensitiveFields())
	var missing []string
	for _, field := range f.SensitiveFields {
		if _, found := slices.BinarySearch(have, field); !found {
			missing = append(missing, field)
		}
	}
	if len(missing) > 0 {
		out = append(out, "sensitive_fields without "+strings.Join(missing, ", "))
	}
	if !f.OutputSecretsAllowed && spec.GetOutputSecretsAllowed() {
		out = append(out, "output_secrets_allowed on")
	}
	if !f.Idempotent && spec.GetIdempotent() {
		out = append(out, "idempotent on")
	}
	return out
}

// Raise returns a copy of spec with every restriction of f added: the
// spec a catalog serves for a tool when no live registration satisfies
// its floor.
func (f Floor) Raise(spec *planexv1.ToolSpec) *planexv1.ToolSpec {
	out := proto.CloneOf(spec)
	if sideEffectRank(out.GetSideEffect()) < sideEffectRank(f.SideEffect) {
		out.SideEffect = f.SideEffect
	}
	out.RequiresApproval = out.GetRequiresApproval() || f.RequiresApproval
	for _, field := range f.SensitiveFields {
		if !slices.Contains(out.SensitiveFields, field) {
			out.SensitiveFields = append(out.SensitiveFields, field)
		}
	}
	out.OutputSecretsAllowed = out.GetOutputSecretsAllowed() && f.OutputSecretsAllowed
	out.Idempotent = out.GetIdempotent() && f.Idempotent
	return out
}

// unreadableFloor stands for a stored floor that cannot be decoded: every
// restriction a floor can hold without naming fields (fail closed).
func unreadableFloor() Floor {
	return Floor{SideEffect: planexv1.SideEffect_SIDE_EFFECT_EXTERNAL, RequiresApproval: true}
}

// floorJSON is Floor's stored form.
type floorJSON struct {
	SideEffect           string   `json:"side_effect"`
	RequiresApproval     bool     `json:"requires_approval"`
	SensitiveFields      []string `json:"sensitive_fields"`
	OutputSecretsAllowed bool     `json:"output_secrets_allowed"`
	Idempotent           bool     `json:"idempotent"`
	// Spec is the registration served last (protojson), kept so that the
	// tool stays known while no replica registers it (LoadTrusted).
	Spec json.RawMessage `json:"spec,omitempty"`
}

// MarshalJSON encodes f with the side effect by name.
func (f Floor) MarshalJSON() ([]byte, error) {
	return json.Marshal(f.stored(nil))
}

// stored returns f's stored form with spec (nil: none).
func (f Floor) stored(spec json.RawMessage) floorJSON {
	fields := fieldSet(f.SensitiveFields)
	if fields == nil {
		fields = []string{}
	}
	return floorJSON{
		SideEffect: normalSideEffect(f.SideEffect).String(), RequiresApproval: f.RequiresApproval,
		SensitiveFields: fields, OutputSecretsAllowed: f.OutputSecretsAllowed, Idempotent: f.Idempotent,
		Spec: spec,
	}
}

// encodeRecord encodes a tool's entry in planex-tool-floors: its floor and
// the spec served last.
func encodeRecord(f Floor, spec *planexv1.ToolSpec) ([]byte, error) {
	var raw json.RawMessage
	if spec != nil {
		b, err := protojson.Marshal(spec)
		if err != nil {
			return nil, err
		}
		raw = b
	}
	return json.Marshal(f.stored(raw))
}

// decodeSpec returns the spec stored beside a floor: nil when there is
// none, an error when it cannot be decoded.
func decodeSpec(data []byte) (*planexv1.ToolSpec, error) {
	var j struct {
		Spec json.RawMessage `json:"spec"`
	}
	if err := json.Unmarshal(data, &j); err != nil || len(j.Spec) == 0 || string(j.Spec) == "null" {
		return nil, err
	}
	spec := &planexv1.ToolSpec{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(j.Spec, spec); err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	return spec, nil
}

// UnmarshalJSON decodes a stored floor; an unknown side effect name is an
// error.
func (f *Floor) UnmarshalJSON(data []byte) error {
	var j floorJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	se, ok := planexv1.SideEffect_value[j.SideEffect]
	if !ok || planexv1.SideEffect(se) == planexv1.SideEffect_SIDE_EFFECT_UNSPECIFIED {
		return fmt.Errorf("side_effect %q: want SIDE_EFFECT_READ, SIDE_EFFECT_WRITE or SIDE_EFFECT_EXTERNAL", clip(j.SideEffect))
	}
	*f = Floor{
		SideEffect: planexv1.SideEffect(se), RequiresApproval: j.RequiresApproval,
		SensitiveFields: fieldSet(j.SensitiveFields), OutputSecretsAllowed: j.OutputSecretsAllowed, Idempotent: j.Idempotent,
	}
	return nil
}

// clip shortens an untrusted string for a log line or an error.
func clip(s string) string {
	const limit = 64
	if r := []rune(s); len(r) > limit {
		return string(r[:limit]) + "…"
	}
	return s
}
