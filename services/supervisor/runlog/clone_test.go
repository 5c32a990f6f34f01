package runlog

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// populate sets every field of m to a value other than its default (one
// element for a list or a map).
func populate(m protoreflect.Message) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case fd.IsList():
			l := m.Mutable(fd).List()
			if fd.Kind() == protoreflect.MessageKind {
				l.Append(protoreflect.ValueOfMessage(l.NewElement().Message()))
			} else {
				l.Append(scalar(fd))
			}
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			mp.Set(scalar(fd.MapKey()).MapKey(), scalar(fd.MapValue()))
		case fd.Kind() == protoreflect.MessageKind:
			m.Set(fd, protoreflect.ValueOfMessage(m.NewField(fd).Message()))
		default:
			m.Set(fd, scalar(fd))
		}
	}
}

func scalar(fd protoreflect.FieldDescriptor) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString("x")
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(fd.Enum().Values().Get(fd.Enum().Values().Len() - 1).Number())
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(7)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(7)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(7)
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(7)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(7)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(7)
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte("x"))
	case protoreflect.MessageKind:
		return protoreflect.ValueOfMessage(newMessage(fd))
	}
	panic("kind " + fd.Kind().String())
}

func newMessage(fd protoreflect.FieldDescriptor) protoreflect.Message {
	mt, err := protoregistryFind(fd.Message().FullName())
	if err != nil {
		panic(err)
	}
	return mt.New()
}

// cloneRun copies the run field by field: a field added to Run and not to
// cloneRun fails here.
func TestCloneRunCopiesEverySingularField(t *testing.T) {
	r := &planexv1.Run{}
	populate(r.ProtoReflect())
	c := cloneRun(r)
	fields := r.ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if !c.ProtoReflect().Has(fd) {
			t.Errorf("cloneRun does not copy %s", fd.Name())
		}
	}
	if !proto.Equal(c, r) {
		t.Errorf("clone differs:\n%v\n%v", c, r)
	}
	if c.GetUsage() == r.GetUsage() || c.GetProgress() == r.GetProgress() {
		t.Error("the usage and progress, changed in place by the fold, are shared")
	}
}

// cloneUsage copies every field of a BudgetUsage, into a message of its own.
func TestCloneUsageCopiesEveryField(t *testing.T) {
	u := &planexv1.BudgetUsage{}
	populate(u.ProtoReflect())
	c := cloneUsage(u)
	fields := u.ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		if fd := fields.Get(i); !c.ProtoReflect().Has(fd) {
			t.Errorf("cloneUsage does not copy %s", fd.Name())
		}
	}
	if !proto.Equal(c, u) || c == u {
		t.Errorf("clone %v of %v", c, u)
	}
	if cloneUsage(nil) != nil {
		t.Error("a nil usage cloned to a non-nil one")
	}
}

func protoregistryFind(name protoreflect.FullName) (protoreflect.MessageType, error) {
	return protoregistry.GlobalTypes.FindMessageByName(name)
}
