package runner

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/cassette"
)

func TestCassetteToolsRecordReplayAndFaults(t *testing.T) {
	cas, err := cassette.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := &planexv1.ToolSpec{Name: "kv.get", Pool: "kv"}
	calls := 0
	live := NewTool(spec, func(_ context.Context, c Call) (any, error) {
		calls++
		if c.Args.GetFields()["key"].GetStringValue() == "missing" {
			return nil, &Error{Code: planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, Field: "args.key", Message: "no such key"}
		}
		return map[string]any{"value": 42}, nil
	})
	args := func(k string) *structpb.Struct { s, _ := structpb.NewStruct(map[string]any{"key": k}); return s }
	rec := RecordTool(live, cas)
	ctx := t.Context()
	if _, err := rec.Run(ctx, Call{RunID: "R1", Attempt: 1, Args: args("a")}); err != nil {
		t.Fatal(err)
	}
	if _, err := rec.Run(ctx, Call{RunID: "R1", Attempt: 1, Args: args("missing")}); err == nil {
		t.Fatal("want the tool's error")
	}
	rep := ReplayTool(spec, cas, nil)
	out, err := rep.Run(ctx, Call{RunID: "R2", Attempt: 3, Args: args("a")})
	if err != nil || string(out.(json.RawMessage)) != `{"value":42}` {
		t.Fatalf("replayed %s, %v", out, err)
	}
	var te *Error
	if _, err := rep.Run(ctx, Call{RunID: "R2", Args: args("missing")}); !errors.As(err, &te) || te.Code != planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || te.Field != "args.key" {
		t.Fatalf("replayed failure: %v", err)
	}
	if _, err := rep.Run(ctx, Call{RunID: "R2", Args: args("b")}); !errors.As(err, &te) || te.Code != planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED || !strings.Contains(te.Message, `no recorded answer for tool "kv.get"`) {
		t.Fatalf("miss: %v", err)
	}
	if out, err := ReplayTool(spec, cas, live).Run(ctx, Call{Args: args("b")}); err != nil || out == nil || calls != 3 {
		t.Fatalf("miss falls through to live: %v %v (calls %d)", out, err, calls)
	}

	faulty := FaultTool(live, func(c Call) Fault {
		switch c.Attempt {
		case 1:
			return Fault{Err: &Error{Code: planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE, Message: "injected"}}
		case 2:
			return Fault{Drop: true}
		}
		return Fault{}
	})
	if _, err := faulty.Run(ctx, Call{Attempt: 1, Args: args("a")}); !errors.As(err, &te) || te.Message != "injected" || te.Retryable {
		t.Fatalf("fail fault: %v", err)
	}
	// Outside a runner's delivery there is no result to lose: the tool runs.
	before := calls
	if out, err := faulty.Run(ctx, Call{Attempt: 2, Args: args("a")}); err != nil || out == nil || calls != before+1 {
		t.Fatalf("drop fault outside a runner: %v %v (calls %d)", out, err, calls-before)
	}
	if _, err := faulty.Run(ctx, Call{Attempt: 3, Args: args("a")}); err != nil {
		t.Fatalf("no fault: %v", err)
	}
}
