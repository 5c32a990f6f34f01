package grpcserver

import (
	"context"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the proto codec wrapped here
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A request whose string fields hold invalid UTF-8 cannot be decoded by
// protobuf, and grpc-go answers such a decoding failure with Internal —
// a server fault for what is a client's bad input. The server's codec
// therefore decodes such a request with the bad bytes replaced by U+FFFD
// and marks it (an unknown field listing the fields); the interceptors
// then answer InvalidArgument naming them, before any handler runs.

// invalidUTF8Field is the unknown field number carrying the mark: the
// largest field number, used by no planex message.
const invalidUTF8Field protowire.Number = protowire.MaxValidNumber

// lenientCodec is grpc's proto codec with the fallback above.
type lenientCodec struct{ base encoding.CodecV2 }

func newLenientCodec() encoding.CodecV2 {
	return lenientCodec{base: encoding.GetCodecV2("proto")}
}

func (c lenientCodec) Name() string { return c.base.Name() }

func (c lenientCodec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

func (c lenientCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.base.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return err
	}
	fixed, bad, ferr := fixUTF8(data.Materialize(), m.ProtoReflect().Descriptor(), "")
	if ferr != nil || len(bad) == 0 {
		return err
	}
	if uerr := proto.Unmarshal(fixed, m); uerr != nil {
		return err
	}
	r := m.ProtoReflect()
	mark := protowire.AppendTag(nil, invalidUTF8Field, protowire.BytesType)
	mark = protowire.AppendString(mark, strings.Join(bad, ", "))
	r.SetUnknown(append(r.GetUnknown(), mark...))
	return nil
}

// fixUTF8 rewrites an encoded message of descriptor md, replacing invalid
// UTF-8 in string fields (at any depth) and returning their names.
func fixUTF8(b []byte, md protoreflect.MessageDescriptor, prefix string) ([]byte, []string, error) {
	var out []byte
	var bad []string
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, nil, protowire.ParseError(n)
		}
		tag := b[:n]
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if typ == protowire.BytesType && fd != nil {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil, nil, protowire.ParseError(m)
			}
			b = b[m:]
			name := prefix + string(fd.Name())
			switch {
			case fd.Kind() == protoreflect.StringKind && !utf8.Valid(v):
				v = []byte(strings.ToValidUTF8(string(v), "\uFFFD"))
				bad = append(bad, name)
			case fd.Kind() == protoreflect.MessageKind:
				fixed, sub, err := fixUTF8(v, fd.Message(), name+".")
				if err != nil {
					return nil, nil, err
				}
				v = fixed
				bad = append(bad, sub...)
			}
			out = append(out, tag...)
			out = protowire.AppendBytes(out, v)
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return nil, nil, protowire.ParseError(m)
		}
		out = append(out, tag...)
		out = append(out, b[:m]...)
		b = b[m:]
	}
	return out, bad, nil
}

// invalidUTF8 returns the InvalidArgument error for a request the codec
// marked, or nil.
func invalidUTF8(req any) error {
	m, ok := req.(proto.Message)
	if !ok {
		return nil
	}
	unknown := m.ProtoReflect().GetUnknown()
	for len(unknown) > 0 {
		num, typ, n := protowire.ConsumeTag(unknown)
		if n < 0 {
			return nil
		}
		unknown = unknown[n:]
		if num == invalidUTF8Field && typ == protowire.BytesType {
			fields, _ := protowire.ConsumeString(unknown)
			return status.Errorf(codes.InvalidArgument, "%s: not valid UTF-8", fields)
		}
		l := protowire.ConsumeFieldValue(num, typ, unknown)
		if l < 0 {
			return nil
		}
		unknown = unknown[l:]
	}
	return nil
}

func unaryUTF8(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := invalidUTF8(req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func streamUTF8(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, utf8Stream{ss})
}

// utf8Stream refuses marked messages a stream receives.
type utf8Stream struct{ grpc.ServerStream }

func (s utf8Stream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return invalidUTF8(m)
}
