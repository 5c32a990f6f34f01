package runlog

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// refDigest is the version 2 digest as commit.go defines it, written the
// plain way (Range, a salt per child from crypto/hmac's construction):
// the hasher must give the same bytes for every shape.
func refDigest(fd protoreflect.FieldDescriptor, v protoreflect.Value, salt []byte, root bool, list bool) []byte {
	mac := func(msg []byte) []byte {
		k := newKDF(salt)
		d := k.mac(msg)
		return d[:]
	}
	switch {
	case list && fd.IsList():
		l := v.List()
		b := protowire.AppendVarint(slices.Clone(tagList), uint64(l.Len()))
		for i := range l.Len() {
			b = append(b, refDigest(fd, l.Get(i), mac(protowire.AppendVarint([]byte{'i'}, uint64(i))), false, false)...)
		}
		d := sha256.Sum256(b)
		return d[:]
	case list && fd.IsMap():
		var keys []string
		vals := map[string]protoreflect.Value{}
		v.Map().Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
			keys = append(keys, k.String())
			vals[k.String()] = v
			return true
		})
		slices.Sort(keys)
		b := slices.Clone(tagMap)
		for _, k := range keys {
			b = append(append(protowire.AppendVarint(b, uint64(len(k))), k...), refDigest(fd.MapValue(), vals[k], mac(append([]byte{'k'}, k...)), false, false)...)
		}
		d := sha256.Sum256(b)
		return d[:]
	case fd == nil || isMessage(fd):
		m := v.Message()
		fds := populated(m, root) // Range, sorted
		b := slices.Clone(tagMessage)
		for _, fd := range fds {
			b = append(protowire.AppendVarint(b, uint64(fd.Number())), refDigest(fd, m.Get(fd), mac(protowire.AppendVarint([]byte{'f'}, uint64(fd.Number()))), false, true)...)
		}
		unknown := m.GetUnknown()
		if root {
			unknown = withoutSaltField(unknown)
		}
		if len(unknown) > 0 {
			b = append(protowire.AppendVarint(b, 0), leafDigest(mac([]byte{'u', 0}), protoreflect.BytesKind, protoreflect.ValueOfBytes(unknown))...)
		}
		d := sha256.Sum256(b)
		return d[:]
	}
	return leafDigest(salt, fd.Kind(), v)
}

// TestHasherIsTheDefinition: for an event of every payload with every
// field set, the golden events, and unknown fields inside messages, the
// hasher's digest is the definition's, and the walker (which hands the
// hasher every subtree it has a salt for) agrees.
func TestHasherIsTheDefinition(t *testing.T) {
	var evs []*planexv1.RunEvent
	oneof := (&planexv1.RunEvent{}).ProtoReflect().Descriptor().Oneofs().ByName("payload")
	for i := range oneof.Fields().Len() {
		fd := oneof.Fields().Get(i)
		ev := &planexv1.RunEvent{RunId: "RUN1", Sequence: 7, PrevHash: []byte{1}}
		m := ev.ProtoReflect()
		p := m.NewField(fd).Message()
		populateDeep(p, 3)
		m.Set(fd, protoreflect.ValueOfMessage(p))
		evs = append(evs, ev)
	}
	evs = append(evs, goldenEvents(t)...)
	nested, _ := structpb.NewValue(map[string]any{"a": []any{map[string]any{"b": nil, "c": false, "d": 0.0, "e": ""}}, "": "empty key"})
	withUnknown := &planexv1.RunEvent{RunId: "RUN2", Payload: &planexv1.RunEvent_StepSucceeded{StepSucceeded: &planexv1.StepSucceeded{StepId: "s", Output: nested}}}
	inner := withUnknown.GetStepSucceeded().ProtoReflect()
	inner.SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 77, protowire.BytesType), []byte("future field")))
	evs = append(evs, withUnknown)

	for i, ev := range evs {
		salt := make([]byte, saltLen)
		for j := range salt {
			salt[j] = byte(i + j*7)
		}
		setSalt(ev, salt)
		want := refDigest(nil, protoreflect.ValueOfMessage(ev.ProtoReflect()), salt, true, false)
		got := hashMessage(ev.ProtoReflect(), salt, true)
		if hex.EncodeToString(got[:]) != hex.EncodeToString(want) {
			t.Errorf("event %d (%s): hasher %x, definition %x", i, PayloadName(ev), got, want)
		}
		var w walker
		viaWalker, err := w.message(ev.ProtoReflect(), nil, salt, true)
		if err != nil || hex.EncodeToString(viaWalker) != hex.EncodeToString(want) {
			t.Errorf("event %d (%s): walker %x (%v), definition %x", i, PayloadName(ev), viaWalker, err, want)
		}
	}
}

// populateDeep sets every field of m, and of its message fields down to
// depth levels (structured values get a nested JSON value).
func populateDeep(m protoreflect.Message, depth int) {
	if depth == 0 {
		return
	}
	switch m.Descriptor().FullName() {
	case "google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue":
		v, _ := structpb.NewValue(map[string]any{"k": []any{1.5, "s", true, nil, map[string]any{"z": "y", "a": 2.0}}})
		switch x := m.Interface().(type) {
		case *structpb.Struct:
			x.Fields = v.GetStructValue().GetFields()
		case *structpb.Value:
			x.Kind = v.Kind
		case *structpb.ListValue:
			x.Values = v.GetStructValue().GetFields()["k"].GetListValue().GetValues()
		}
		return
	}
	populate(m)
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if !m.Has(fd) || !isMessage(fd) {
			continue
		}
		switch {
		case fd.IsList():
			l := m.Get(fd).List()
			for j := range l.Len() {
				populateDeep(l.Get(j).Message(), depth-1)
			}
		case fd.IsMap():
			if !isMessage(fd.MapValue()) {
				continue
			}
			m.Get(fd).Map().Range(func(_ protoreflect.MapKey, v protoreflect.Value) bool {
				populateDeep(v.Message(), depth-1)
				return true
			})
		default:
			populateDeep(m.Get(fd).Message(), depth-1)
		}
	}
}
