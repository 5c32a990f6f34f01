package grpcserver_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/grpcserver"
	"github.com/planex-dev/planex/internal/natstest"
)

// rawCodec sends pre-encoded bytes, as a client in another language may:
// Go's protobuf refuses to encode invalid UTF-8 itself.
type rawCodec struct{}

type raw []byte

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, ok := v.(*raw)
	if !ok {
		return nil, fmt.Errorf("rawCodec: %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(*b)}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if b, ok := v.(*raw); ok {
		*b = data.Materialize()
	}
	return nil
}

// echo answers GetRun and WatchRun with the id it got.
type echo struct {
	planexv1.UnimplementedSupervisorServiceServer
}

func (echo) GetRun(_ context.Context, req *planexv1.GetRunRequest) (*planexv1.GetRunResponse, error) {
	return &planexv1.GetRunResponse{Run: &planexv1.Run{Id: req.GetRunId()}}, nil
}

func (echo) WatchRun(req *planexv1.WatchRunRequest, s grpc.ServerStreamingServer[planexv1.WatchRunResponse]) error {
	return s.Send(&planexv1.WatchRunResponse{Event: &planexv1.RunEvent{RunId: req.GetRunId()}})
}

func (echo) StartRun(_ context.Context, req *planexv1.StartRunRequest) (*planexv1.StartRunResponse, error) {
	return &planexv1.StartRunResponse{Run: &planexv1.Run{Goal: req.GetGoal()}}, nil
}

func TestInvalidUTF8IsInvalidArgument(t *testing.T) {
	auth, err := authn.New(t.Context(), authn.Config{Disabled: true}, natstest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := grpcserver.New(natstest.Logger(t), grpcserver.Security{Creds: insecure.NewCredentials(), Auth: auth, Policy: authn.ServicePolicy(true, false)})
	if err != nil {
		t.Fatal(err)
	}
	planexv1.RegisterSupervisorServiceServer(srv.GRPC, echo{})
	lis := bufconn.Listen(1 << 20)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _ = srv.Serve(ctx, lis, time.Second) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	str := func(num protowire.Number, v string) []byte {
		return protowire.AppendString(protowire.AppendTag(nil, num, protowire.BytesType), v)
	}
	label := protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), append(str(1, "team"), str(2, "ops\xc3\x28")...))
	tests := []struct {
		name, method string
		body         []byte
		stream       bool
		want         string
	}{
		{name: "GetRun run_id", method: "/planex.v1.SupervisorService/GetRun", body: str(1, "01\xff\xfe"), want: "run_id: not valid UTF-8"},
		{name: "StartRun goal", method: "/planex.v1.SupervisorService/StartRun", body: str(1, "count \xffrows"), want: "goal: not valid UTF-8"},
		{name: "StartRun label value", method: "/planex.v1.SupervisorService/StartRun", body: append(str(1, "ok"), label...), want: "labels.value: not valid UTF-8"},
		{name: "WatchRun run_id", method: "/planex.v1.SupervisorService/WatchRun", body: str(1, "\x80"), stream: true, want: "run_id: not valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := raw(tt.body)
			var err error
			if tt.stream {
				var cs grpc.ClientStream
				cs, err = conn.NewStream(t.Context(), &grpc.StreamDesc{ServerStreams: true}, tt.method, grpc.ForceCodecV2(rawCodec{}))
				if err == nil {
					if err = cs.SendMsg(&req); err == nil {
						_ = cs.CloseSend()
						var resp raw
						err = cs.RecvMsg(&resp)
					}
				}
			} else {
				var resp raw
				err = conn.Invoke(t.Context(), tt.method, &req, &resp, grpc.ForceCodecV2(rawCodec{}))
			}
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.want) {
				t.Fatalf("err = %v, want InvalidArgument %q", err, tt.want)
			}
		})
	}
	// Valid requests still go through, unknown fields and all.
	b, _ := proto.Marshal(&planexv1.GetRunRequest{RunId: "01ABC"})
	req, resp := raw(append(b, str(999, "extra")...)), raw(nil)
	if err := conn.Invoke(t.Context(), "/planex.v1.SupervisorService/GetRun", &req, &resp, grpc.ForceCodecV2(rawCodec{})); err != nil {
		t.Fatal(err)
	}
	var got planexv1.GetRunResponse
	if err := proto.Unmarshal(resp, &got); err != nil || got.GetRun().GetId() != "01ABC" {
		t.Fatalf("valid request: %v %v", &got, err)
	}
}
