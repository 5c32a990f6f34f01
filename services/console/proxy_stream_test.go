package console

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/gen/planex/v1/planexv1connect"
)

// batchSupervisor answers RunBatch with a fixed progress stream (or an
// error after it) and ResetRun/ForkRun with what they were asked, and
// keeps the authorization each call carried.
type batchSupervisor struct {
	planexv1.SupervisorServiceClient
	progress []*planexv1.RunBatchResponse
	fail     error
	auth     []string
}

func (b *batchSupervisor) RunBatch(ctx context.Context, req *planexv1.RunBatchRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[planexv1.RunBatchResponse], error) {
	md, _ := metadata.FromOutgoingContext(ctx)
	b.auth = append(b.auth, md.Get("authorization")...)
	if req.GetFilter().GetLabelSelector() == "" {
		return nil, status.Error(codes.InvalidArgument, "filter: an empty filter selects every run")
	}
	return &fakeStream[planexv1.RunBatchResponse]{msgs: b.progress, err: b.fail}, nil
}

func (b *batchSupervisor) ResetRun(_ context.Context, req *planexv1.ResetRunRequest, _ ...grpc.CallOption) (*planexv1.ResetRunResponse, error) {
	return &planexv1.ResetRunResponse{Run: &planexv1.Run{Id: req.GetRunId()}, Rerun: []string{req.GetFromStep()}, DryRun: req.GetDryRun()}, nil
}

func (b *batchSupervisor) ForkRun(_ context.Context, req *planexv1.ForkRunRequest, _ ...grpc.CallOption) (*planexv1.ForkRunResponse, error) {
	return nil, status.Error(codes.InvalidArgument, "step_args[\""+req.GetFromStep()+"\"]: sql: want a string")
}

// fakeStream is a client stream that yields msgs, then err (io.EOF when
// nil).
type fakeStream[T any] struct {
	grpc.ClientStream
	msgs []*T
	err  error
}

func (f *fakeStream[T]) Recv() (*T, error) {
	if len(f.msgs) == 0 {
		if f.err != nil {
			return nil, f.err
		}
		return nil, io.EOF
	}
	m := f.msgs[0]
	f.msgs = f.msgs[1:]
	return m, nil
}

// TestRunBatchRelayedAsAStream: the console relays RunBatch's progress
// messages one by one with the browser's token, passes the supervisor's
// refusal and a mid-stream error through with their codes, and forwards
// ResetRun and ForkRun like every unary call.
func TestRunBatchRelayedAsAStream(t *testing.T) {
	sup := &batchSupervisor{progress: []*planexv1.RunBatchResponse{
		{BatchId: "b1", Matched: 3},
		{BatchId: "b1", Matched: 3, Done: 2, Items: []*planexv1.BatchItem{{RunId: "r1", Outcome: "done"}, {RunId: "r2", Outcome: "done"}}},
		{BatchId: "b1", Matched: 3, Done: 3, Failed: 1, Items: []*planexv1.BatchItem{{RunId: "r3", Outcome: "failed", Message: "not waiting"}}, Finished: true},
	}}
	h, err := Handler(Config{HTTPAddr: "127.0.0.1:0", ForwardTokens: true}, sup, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := planexv1connect.NewSupervisorServiceClient(srv.Client(), srv.URL, connect.WithProtoJSON())

	req := connect.NewRequest(&planexv1.RunBatchRequest{Filter: &planexv1.RunFilter{LabelSelector: "team=ops"}, ExpectedCount: 3, Reason: "r"})
	req.Header().Set("Authorization", "Bearer planex_op")
	st, err := c.RunBatch(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	var got []*planexv1.RunBatchResponse
	for st.Receive() {
		got = append(got, st.Msg())
	}
	if err := st.Err(); err != nil {
		t.Fatalf("RunBatch stream: %v", err)
	}
	if len(got) != 3 || got[2].GetDone() != 3 || got[2].GetFailed() != 1 || !got[2].GetFinished() || got[2].GetItems()[0].GetMessage() != "not waiting" {
		t.Fatalf("relayed %v, want the three progress messages", got)
	}
	if len(sup.auth) != 1 || sup.auth[0] != "Bearer planex_op" {
		t.Errorf("the supervisor got authorization %q, want the browser's token", sup.auth)
	}

	// A refusal before the stream and an error in it keep their codes.
	st, err = c.RunBatch(t.Context(), connect.NewRequest(&planexv1.RunBatchRequest{}))
	if err == nil {
		for st.Receive() {
		}
		err = st.Err()
	}
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("RunBatch without a filter: %v, want invalid_argument", err)
	}
	sup.progress = sup.progress[:1]
	sup.fail = status.Error(codes.FailedPrecondition, "the filter now selects 4 runs, not 3")
	st, err = c.RunBatch(t.Context(), connect.NewRequest(&planexv1.RunBatchRequest{Filter: &planexv1.RunFilter{LabelSelector: "team=ops"}}))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for st.Receive() {
		n++
	}
	if n != 1 || connect.CodeOf(st.Err()) != connect.CodeFailedPrecondition {
		t.Fatalf("stream failing after %d message(s): %v, want one message then failed_precondition", n, st.Err())
	}

	reset, err := c.ResetRun(t.Context(), connect.NewRequest(&planexv1.ResetRunRequest{RunId: "r9", FromStep: "count", DryRun: true}))
	if err != nil || reset.Msg.GetRerun()[0] != "count" || !reset.Msg.GetDryRun() {
		t.Fatalf("ResetRun through the console: %v %v", reset, err)
	}
	_, err = c.ForkRun(t.Context(), connect.NewRequest(&planexv1.ForkRunRequest{RunId: "r9", FromStep: "count"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("ForkRun refused: %v, want invalid_argument passed through", err)
	}
}
