package bus

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// A dispatching decision read by scanning gives the request decoding it
// whole gives, and is refused for the same reasons.
func TestScannedDispatchIsTheDecodedOne(t *testing.T) {
	const run = "01JRUNRUNRUNRUNRUNRUNRUNRU"
	at := timestamppb.New(time.Date(2026, 11, 26, 17, 0, 0, 0, time.UTC))
	args, _ := structpb.NewStruct(map[string]any{"q": "SELECT 1", "n": 2})
	out, _ := structpb.NewValue(map[string]any{"rows": []any{"x"}})
	dispatch := func(runID, step string) *planexv1.RunEvent {
		return &planexv1.RunEvent{RunId: runID, Sequence: 7, Time: at, PrevHash: []byte("p"), Hash: []byte("h"),
			Payload: &planexv1.RunEvent_StepDispatched{StepDispatched: &planexv1.StepDispatched{
				StepId: step, Attempt: 2, PlanRevision: 3, Tool: "sql.query", ResolvedArgs: args,
				StartToCloseTimeout: durationpb.New(time.Minute), ScheduleToStartTimeout: durationpb.New(time.Second),
				Deadline: timestamppb.New(at.AsTime().Add(time.Hour)),
			}}}
	}
	succeeded := &planexv1.RunEvent{RunId: run, Sequence: 6, Time: at, Payload: &planexv1.RunEvent_StepSucceeded{
		StepSucceeded: &planexv1.StepSucceeded{StepId: "a", Attempt: 1, Output: out}}}
	batch := func(evs ...*planexv1.RunEvent) *nats.Msg {
		data, err := proto.Marshal(&planexv1.RunEventBatch{Events: evs})
		if err != nil {
			t.Fatal(err)
		}
		return &nats.Msg{Subject: DispatchSubject(run, "sql"), Data: data, Header: nats.Header{HeaderContentType: []string{batchType}}}
	}
	single := func(ev *planexv1.RunEvent) *nats.Msg {
		data, err := proto.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		return &nats.Msg{Subject: DispatchSubject(run, "sql"), Data: data, Header: nats.Header{}}
	}
	// The time field twice: protobuf merges the two, the scan leaves it to
	// protobuf.
	twoTimes := single(dispatch(run, "b"))
	extra, _ := proto.Marshal(&planexv1.RunEvent{Time: timestamppb.New(at.AsTime().Add(time.Second))})
	twoTimes.Data = append(twoTimes.Data, extra...)

	for _, tc := range []struct {
		name    string
		msg     *nats.Msg
		wantErr string
	}{
		{name: "result then dispatch", msg: batch(succeeded, dispatch(run, "b"))},
		{name: "one event", msg: single(dispatch(run, "b"))},
		{name: "time twice", msg: twoTimes},
		{name: "two dispatches", msg: batch(dispatch(run, "b"), dispatch(run, "c")), wantErr: "dispatches two steps"},
		{name: "no dispatch", msg: batch(succeeded, succeeded), wantErr: "dispatches no step"},
		{name: "another run's event", msg: batch(succeeded, dispatch("01JOTHEROTHEROTHEROTHEROTH", "b")), wantErr: "of run"},
		{name: "empty batch", msg: batch(), wantErr: "empty event batch"},
		{name: "garbage", msg: &nats.Msg{Subject: DispatchSubject(run, "sql"), Data: []byte{0xff, 0xff, 0xff}, Header: nats.Header{HeaderContentType: []string{batchType}}}, wantErr: "decode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, werr := decodeDispatchRequest(tc.msg)
			got, err := StepRequestOf(tc.msg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || werr == nil {
					t.Fatalf("StepRequestOf: %v (whole decode: %v), want an error with %q", err, werr, tc.wantErr)
				}
				return
			}
			if err != nil || werr != nil {
				t.Fatalf("StepRequestOf: %v (whole decode: %v)", err, werr)
			}
			if !proto.Equal(got, want) {
				t.Fatalf("scanned %v\nwhole   %v", got, want)
			}
			if got.GetStepId() != "b" || got.GetStartBy() == nil || got.GetArgs().GetFields()["q"].GetStringValue() != "SELECT 1" {
				t.Fatalf("request %v", got)
			}
		})
	}
}

// decodeDispatchRequest is StepRequestOf decoding the decision whole.
func decodeDispatchRequest(msg *nats.Msg) (*planexv1.StepRequest, error) {
	runID, _, _ := ParseDispatchSubject(msg.Subject)
	d, at, err := decodeDispatch(msg, runID)
	if err != nil {
		return nil, err
	}
	return requestOf(runID, d, at), nil
}
