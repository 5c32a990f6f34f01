package mcppool_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/executor/mcppool"
	"github.com/planex-dev/planex/services/executor/runner"
)

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func ptr[T any](v T) *T { return &v }

// calcServer is a Go SDK MCP server over streamable HTTP that demands a
// bearer token and a header, and counts the calls it received.
type calcServer struct {
	url       string
	calls     atomic.Int64
	cancelled atomic.Int64
	meta      atomic.Value // _meta of the last call
}

type addIn struct {
	A float64 `json:"a" jsonschema:"first addend"`
	B float64 `json:"b" jsonschema:"second addend"`
}
type addOut struct {
	Sum float64 `json:"sum"`
}

func startCalcServer(t *testing.T, token string) *calcServer {
	t.Helper()
	cs := &calcServer{}
	srv := mcp.NewServer(&mcp.Implementation{Name: "calc", Version: "1.2.3"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "add", Description: "Adds two numbers.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest, in addIn) (*mcp.CallToolResult, addOut, error) {
			cs.calls.Add(1)
			cs.meta.Store(req.Params.Meta)
			return nil, addOut{Sum: in.A + in.B}, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "fail", Description: "Always fails.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			cs.calls.Add(1)
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "the widget is broken"}}}, nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "delete-item", Description: "Deletes an item.", Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(false)}},
		func(ctx context.Context, req *mcp.CallToolRequest, in struct {
			ID string `json:"id"`
		}) (*mcp.CallToolResult, any, error) {
			cs.calls.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "deleted " + in.ID}}}, nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "slow", Description: "Waits until cancelled."},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			cs.calls.Add(1)
			<-ctx.Done()
			cs.cancelled.Add(1)
			return nil, nil, ctx.Err()
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token || r.Header.Get("X-Tenant") != "acme" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	cs.url = hs.URL
	return cs
}

// startPool opens the pool and a runner serving it on an embedded
// JetStream.
func startPool(t *testing.T, fc mcppool.FileConfig, opts ...func(*mcppool.Config)) (*mcppool.Pool, *runner.Runner, *bus.Resources) {
	t.Helper()
	cfg := mcppool.Config{File: fc, Logger: natstest.Logger(t)}
	for _, o := range opts {
		o(&cfg)
	}
	p, err := mcppool.Open(ctxT(t, 90*time.Second), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close pool: %v", err)
		}
	})
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	r, err := runner.New(res, runner.Options{Pool: "mcp", Tools: p.Tools(), AckWait: 2 * time.Second, Logger: natstest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	return p, r, res
}

var stepN atomic.Int64

func execute(t *testing.T, r *runner.Runner, tool string, args map[string]any, timeout time.Duration) *planexv1.StepResult {
	t.Helper()
	a, err := structpb.NewStruct(args)
	if err != nil {
		t.Fatal(err)
	}
	req := &planexv1.StepRequest{RunId: "run1", StepId: "s" + string(rune('a'+stepN.Add(1)%26)) + time.Now().Format("150405.000000000"), Attempt: 1, PlanRevision: 1, Tool: tool, Args: a}
	if timeout > 0 {
		req.Timeout = durationpb.New(timeout)
	}
	res, err := r.Execute(ctxT(t, 60*time.Second), req)
	if err != nil {
		t.Fatalf("execute %s: %v", tool, err)
	}
	return res
}

func specOf(t *testing.T, r *runner.Runner, name string) *planexv1.ToolSpec {
	t.Helper()
	for _, s := range r.Specs() {
		if s.GetName() == name {
			return s
		}
	}
	var names []string
	for _, s := range r.Specs() {
		names = append(names, s.GetName())
	}
	t.Fatalf("no tool %s; have %s", name, strings.Join(names, ", "))
	return nil
}

func TestStreamableHTTPServer(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	calc := startCalcServer(t, "s3cret")
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fc := mcppool.FileConfig{Servers: map[string]mcppool.ServerConfig{
		"calc": {URL: calc.url, Headers: map[string]string{"X-Tenant": "acme"}, BearerTokenFile: tokenFile,
			Tools: map[string]mcppool.ToolOverride{"fail": {Timeout: "5s"}}},
	}}
	_, r, res := startPool(t, fc)

	t.Run("catalog", func(t *testing.T) {
		add := specOf(t, r, "mcp.calc_add")
		if add.GetSideEffect() != planexv1.SideEffect_SIDE_EFFECT_READ || add.GetRequiresApproval() || !add.GetIdempotent() {
			t.Errorf("add: side effect %v, approval %v, idempotent %v; want READ, false, true", add.GetSideEffect(), add.GetRequiresApproval(), add.GetIdempotent())
		}
		props := add.GetArgsSchema().GetFields()["properties"].GetStructValue().GetFields()
		if props["a"] == nil || props["b"] == nil {
			t.Errorf("add args_schema lacks a and b: %v", add.GetArgsSchema())
		}
		if add.GetOutputSchema().GetFields()["properties"].GetStructValue().GetFields()["sum"] == nil {
			t.Errorf("add output_schema lacks sum: %v", add.GetOutputSchema())
		}
		if !strings.Contains(add.GetDescription(), "Adds two numbers.") {
			t.Errorf("add description %q", add.GetDescription())
		}
		del := specOf(t, r, "mcp.calc_delete_item")
		if del.GetSideEffect() != planexv1.SideEffect_SIDE_EFFECT_WRITE || !del.GetRequiresApproval() || del.GetIdempotent() {
			t.Errorf("delete-item: side effect %v, approval %v, idempotent %v; want WRITE, true, false", del.GetSideEffect(), del.GetRequiresApproval(), del.GetIdempotent())
		}
		slow := specOf(t, r, "mcp.calc_slow")
		if slow.GetSideEffect() != planexv1.SideEffect_SIDE_EFFECT_EXTERNAL || !slow.GetRequiresApproval() {
			t.Errorf("slow (no annotations): side effect %v, approval %v; want EXTERNAL, true", slow.GetSideEffect(), slow.GetRequiresApproval())
		}
		if d := specOf(t, r, "mcp.calc_fail").GetDefaultTimeout().AsDuration(); d != 5*time.Second {
			t.Errorf("fail default timeout %v, want the configured 5s", d)
		}
		// The runner put the specs into planex-tools.
		keys, err := res.Tools.ListKeys(ctxT(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var found bool
		for k := range keys.Keys() {
			if strings.HasPrefix(k, "mcp.calc_add") {
				e, err := res.Tools.Get(ctxT(t, 5*time.Second), k)
				if err != nil {
					t.Fatal(err)
				}
				got := &planexv1.ToolSpec{}
				if err := proto.Unmarshal(e.Value(), got); err != nil {
					t.Fatal(err)
				}
				found = proto.Equal(got, add)
			}
		}
		if !found {
			t.Error("mcp.calc_add is not registered in planex-tools with its spec")
		}
	})

	t.Run("structured output and trace context", func(t *testing.T) {
		res := execute(t, r, "mcp.calc_add", map[string]any{"a": 2, "b": 3}, 0)
		if res.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
			t.Fatalf("add: %v %v", res.GetStatus(), res.GetError())
		}
		if got := res.GetOutput().GetStructValue().GetFields()["sum"].GetNumberValue(); got != 5 {
			t.Errorf("sum = %v, want 5 (output %v)", got, res.GetOutput())
		}
		meta, _ := calc.meta.Load().(mcp.Meta)
		tp, _ := meta["traceparent"].(string)
		var call sdktrace.ReadOnlySpan
		var tool sdktrace.ReadOnlySpan
		for _, s := range rec.Ended() {
			switch s.Name() {
			case "tools/call add":
				call = s
			case "tool mcp.calc_add":
				tool = s
			}
		}
		if call == nil || tool == nil {
			t.Fatalf("spans: tools/call %v, tool %v", call, tool)
		}
		if call.Parent().SpanID() != tool.SpanContext().SpanID() {
			t.Error("the tools/call span is not a child of the tool span")
		}
		if want := call.SpanContext().TraceID().String(); !strings.Contains(tp, want) || !strings.Contains(tp, call.SpanContext().SpanID().String()) {
			t.Errorf("_meta.traceparent %q does not carry the tools/call span (trace %s)", tp, want)
		}
	})

	t.Run("invalid argument refused before the call", func(t *testing.T) {
		before := calc.calls.Load()
		res := execute(t, r, "mcp.calc_add", map[string]any{"a": "two", "b": 3}, 0)
		if res.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || res.GetError().GetField() != "args.a" {
			t.Fatalf("got %v %v, want INVALID_ARGUMENT on args.a", res.GetStatus(), res.GetError())
		}
		if n := calc.calls.Load(); n != before {
			t.Errorf("the server received %d calls for an invalid argument", n-before)
		}
	})

	t.Run("isError fails the step with the server's text", func(t *testing.T) {
		res := execute(t, r, "mcp.calc_fail", map[string]any{}, 0)
		if res.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_FAILED || res.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED ||
			!strings.Contains(res.GetError().GetMessage(), "the widget is broken") || res.GetError().GetRetryable() {
			t.Fatalf("got %v %v", res.GetStatus(), res.GetError())
		}
	})

	t.Run("text content", func(t *testing.T) {
		res := execute(t, r, "mcp.calc_delete_item", map[string]any{"id": "42"}, 0)
		if got := res.GetOutput().GetStructValue().GetFields()["text"].GetStringValue(); got != "deleted 42" {
			t.Fatalf("output %v (%v), want {text: deleted 42}", res.GetOutput(), res.GetError())
		}
	})

	t.Run("timeout cancels the call on the server", func(t *testing.T) {
		res := execute(t, r, "mcp.calc_slow", map[string]any{}, 300*time.Millisecond)
		if res.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_TIMEOUT {
			t.Fatalf("got %v %v, want TIMEOUT", res.GetStatus(), res.GetError())
		}
		deadline := time.Now().Add(10 * time.Second)
		for calc.cancelled.Load() == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the server never saw notifications/cancelled")
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

func TestOpenFailsNamingTheServer(t *testing.T) {
	calc := startCalcServer(t, "right")
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("wrong"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := mcppool.Open(ctxT(t, 30*time.Second), mcppool.Config{File: mcppool.FileConfig{Servers: map[string]mcppool.ServerConfig{
		"calc": {URL: calc.url, Headers: map[string]string{"X-Tenant": "acme"}, BearerTokenFile: tokenFile},
	}}, StartTimeout: 20 * time.Second, Logger: natstest.Logger(t)})
	if err == nil || !strings.Contains(err.Error(), "mcp server calc") {
		t.Fatalf("Open with a wrong token: %v, want an error naming server calc", err)
	}
	if strings.Contains(err.Error(), "wrong") {
		t.Errorf("the error shows the token: %v", err)
	}
}

// TestToolListChangedIsFollowed: a tool the server adds at runtime is
// registered in planex-tools and served by the running replica; a tool it
// removes stops being advertised and served.
func TestToolListChangedIsFollowed(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "dyn", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "one", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "1"}}}, nil, nil
		})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(hs.Close)
	p, r, res := startPool(t, mcppool.FileConfig{Servers: map[string]mcppool.ServerConfig{"dyn": {URL: hs.URL}}})
	p.OnToolsChanged(r.SetTools)
	if n := len(p.Tools()); n != 1 {
		t.Fatalf("%d tools, want 1", n)
	}

	mcp.AddTool(srv, &mcp.Tool{Name: "two", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, in addIn) (*mcp.CallToolResult, addOut, error) {
			return nil, addOut{Sum: in.A + in.B}, nil
		})
	srv.RemoveTools("one")
	registered := func(tool string) bool {
		_, err := res.Tools.Get(ctxT(t, 5*time.Second), bus.ToolKey(tool, r.ID()))
		return err == nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for !registered("mcp.dyn_two") || registered("mcp.dyn_one") {
		if time.Now().After(deadline) {
			t.Fatalf("list_changed not followed: two registered %v, one registered %v", registered("mcp.dyn_two"), registered("mcp.dyn_one"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := execute(t, r, "mcp.dyn_two", map[string]any{"a": 2, "b": 3}, 0); got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED ||
		got.GetOutput().GetStructValue().GetFields()["sum"].GetNumberValue() != 5 {
		t.Fatalf("new tool: %v", got)
	}
	if got := execute(t, r, "mcp.dyn_one", nil, 0); got.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_UNKNOWN_TOOL {
		t.Fatalf("removed tool: %v", got)
	}
	if names := r.Specs(); len(names) != 1 || names[0].GetName() != "mcp.dyn_two" {
		t.Fatalf("specs after the change: %v", names)
	}
}
