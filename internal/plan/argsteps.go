package plan

import (
	"slices"

	"google.golang.org/protobuf/types/known/structpb"
)

// ArgSteps lists the step ids the references in args read as
// steps.<id>.output, sorted and unique, so a caller can build an Env with
// only those outputs instead of every dependency's. ok is false when a
// reference does not parse or compile, or uses `steps` in another shape:
// the caller then builds the whole Env and ResolveArgs reports the error.
func ArgSteps(args *structpb.Struct) (ids []string, ok bool) {
	ok = true
	var walk func(v *structpb.Value)
	walk = func(v *structpb.Value) {
		switch k := v.GetKind().(type) {
		case *structpb.Value_StringValue:
			t, err := parseTemplate(k.StringValue)
			if err != nil {
				ok = false
				return
			}
			for _, seg := range t.segmentsOrNil() {
				if !seg.isExpr {
					continue
				}
				c := compile(kindRun, seg.text)
				if c.err != nil || c.misuse != "" {
					ok = false
					return
				}
				ids = append(ids, c.steps...)
			}
		case *structpb.Value_StructValue:
			for _, f := range k.StructValue.GetFields() {
				walk(f)
			}
		case *structpb.Value_ListValue:
			for _, e := range k.ListValue.GetValues() {
				walk(e)
			}
		}
	}
	for _, f := range args.GetFields() {
		walk(f)
	}
	slices.Sort(ids)
	return slices.Compact(ids), ok
}

func (t *template) segmentsOrNil() []segment {
	if t == nil {
		return nil
	}
	return t.segs
}
