package mcppool_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/executor/mcppool"
)

// ServersEnv names the npm prefix where .ci/run installs the reference MCP
// servers (@modelcontextprotocol/server-everything and server-filesystem).
const ServersEnv = "PLANEX_TEST_MCP_SERVERS"

// referenceServers returns the entry points of the npm reference servers,
// skipping the test when they are not installed.
func referenceServers(t *testing.T) (node, everything, filesystem string) {
	t.Helper()
	dir := os.Getenv(ServersEnv)
	if dir == "" {
		t.Skipf("%s is unset: install the reference servers with `npm install --prefix DIR @modelcontextprotocol/server-everything @modelcontextprotocol/server-filesystem` and set %s=DIR", ServersEnv, ServersEnv)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skipf("node is not installed: %v", err)
	}
	mods := filepath.Join(dir, "node_modules", "@modelcontextprotocol")
	everything = filepath.Join(mods, "server-everything", "dist", "index.js")
	filesystem = filepath.Join(mods, "server-filesystem", "dist", "index.js")
	for _, f := range []string{everything, filesystem} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("%s=%s: %v (reinstall the reference servers)", ServersEnv, dir, err)
		}
	}
	return node, everything, filesystem
}

// TestReferenceServersOverStdio serves the npm reference servers, which
// nobody here wrote, through the pool.
func TestReferenceServersOverStdio(t *testing.T) {
	node, everything, filesystem := referenceServers(t)
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "hello.txt"), []byte("hello from planex\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fc := mcppool.FileConfig{Servers: map[string]mcppool.ServerConfig{
		"everything": {Command: node, Args: []string{everything, "stdio"}, Env: map[string]string{"PLANEX_MCP_TEST": "1"}},
		// The same server again, with the long-running tool declared
		// external and not idempotent by a config override.
		"everything-ext": {Command: node, Args: []string{everything, "stdio"}, Tools: map[string]mcppool.ToolOverride{
			"trigger-long-running-operation": {SideEffect: "external", Idempotent: new(bool)},
			"get-tiny-image":                 {Disabled: true},
		}},
		"filesystem": {Command: node, Args: []string{filesystem, root}},
	}}
	var healthMu sync.Mutex
	health := map[string][]bool{} // server -> up/down transitions
	p, r, _ := startPool(t, fc, func(c *mcppool.Config) {
		c.OnHealth = func(server string, err error) {
			healthMu.Lock()
			health[server] = append(health[server], err == nil)
			healthMu.Unlock()
		}
	})

	t.Run("catalog", func(t *testing.T) {
		echo := specOf(t, r, "mcp.everything_echo")
		if echo.GetSideEffect() != planexv1.SideEffect_SIDE_EFFECT_READ || echo.GetRequiresApproval() {
			t.Errorf("echo: %v approval=%v, want READ without approval", echo.GetSideEffect(), echo.GetRequiresApproval())
		}
		if echo.GetArgsSchema().GetFields()["properties"].GetStructValue().GetFields()["message"] == nil {
			t.Errorf("echo args_schema lacks message: %v", echo.GetArgsSchema())
		}
		write := specOf(t, r, "mcp.filesystem_write_file")
		if write.GetSideEffect() != planexv1.SideEffect_SIDE_EFFECT_WRITE || !write.GetRequiresApproval() || !write.GetIdempotent() {
			t.Errorf("write_file: %v approval=%v idempotent=%v, want WRITE, approval, idempotent", write.GetSideEffect(), write.GetRequiresApproval(), write.GetIdempotent())
		}
		edit := specOf(t, r, "mcp.filesystem_edit_file")
		if !edit.GetRequiresApproval() || edit.GetIdempotent() {
			t.Errorf("edit_file: approval=%v idempotent=%v, want approval, not idempotent", edit.GetRequiresApproval(), edit.GetIdempotent())
		}
		ext := specOf(t, r, "mcp.everything_ext_trigger_long_running_operation")
		if ext.GetSideEffect() != planexv1.SideEffect_SIDE_EFFECT_EXTERNAL || ext.GetIdempotent() {
			t.Errorf("override: %v idempotent=%v, want EXTERNAL, not idempotent", ext.GetSideEffect(), ext.GetIdempotent())
		}
		for _, s := range r.Specs() {
			if s.GetName() == "mcp.everything_ext_get_tiny_image" {
				t.Error("a disabled tool is in the catalog")
			}
		}
	})

	t.Run("text output", func(t *testing.T) {
		res := execute(t, r, "mcp.everything_echo", map[string]any{"message": "hi"}, 0)
		if got := res.GetOutput().GetStructValue().GetFields()["text"].GetStringValue(); !strings.Contains(got, "hi") {
			t.Fatalf("echo: %v %v", res.GetOutput(), res.GetError())
		}
	})

	t.Run("structured output", func(t *testing.T) {
		res := execute(t, r, "mcp.everything_get_structured_content", map[string]any{"location": "New York"}, 0)
		if res.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED || res.GetOutput().GetStructValue() == nil ||
			res.GetOutput().GetStructValue().GetFields()["text"] != nil {
			t.Fatalf("get-structured-content: %v %v", res.GetOutput(), res.GetError())
		}
	})

	t.Run("invalid argument", func(t *testing.T) {
		res := execute(t, r, "mcp.everything_echo", map[string]any{"message": 5}, 0)
		if res.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || res.GetError().GetField() != "args.message" {
			t.Fatalf("got %v", res.GetError())
		}
	})

	t.Run("filesystem read and write", func(t *testing.T) {
		res := execute(t, r, "mcp.filesystem_write_file", map[string]any{"path": filepath.Join(root, "out.txt"), "content": "written by a step"}, 0)
		if res.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
			t.Fatalf("write_file: %v", res.GetError())
		}
		if b, err := os.ReadFile(filepath.Join(root, "out.txt")); err != nil || string(b) != "written by a step" {
			t.Fatalf("out.txt: %q %v", b, err)
		}
		res = execute(t, r, "mcp.filesystem_read_text_file", map[string]any{"path": filepath.Join(root, "hello.txt")}, 0)
		if s := res.GetOutput().String(); !strings.Contains(s, "hello from planex") {
			t.Fatalf("read_text_file: %v %v", res.GetOutput(), res.GetError())
		}
	})

	t.Run("isError outside the allowed directory", func(t *testing.T) {
		res := execute(t, r, "mcp.filesystem_read_text_file", map[string]any{"path": "/etc/hostname"}, 0)
		if res.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED || !strings.Contains(strings.ToLower(res.GetError().GetMessage()), "access denied") {
			t.Fatalf("got %v %v, want TOOL_FAILED with the server's access denied text", res.GetStatus(), res.GetError())
		}
	})

	// Killing the server mid-call: an idempotent (read-only) tool is
	// retried, a non-idempotent one escalated; the server comes back.
	for _, tc := range []struct {
		server, tool string
		want         planexv1.ErrorCode
		retryable    bool
	}{
		{"everything", "mcp.everything_trigger_long_running_operation", planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE, true},
		{"everything-ext", "mcp.everything_ext_trigger_long_running_operation", planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN, false},
	} {
		t.Run("kill "+tc.server+" mid-call", func(t *testing.T) {
			sent := make(chan struct{}, 1)
			mcppool.SetCallHook(func(tool string) {
				if tool == tc.tool {
					select {
					case sent <- struct{}{}:
					default:
					}
				}
			})
			t.Cleanup(func() { mcppool.SetCallHook(nil) })
			go func() {
				<-sent
				// Give the request time to reach the server; should it not, the
				// call still broke after it was sent, which is what is classified.
				time.Sleep(200 * time.Millisecond)
				if err := p.KillServer(tc.server); err != nil {
					t.Errorf("kill: %v", err)
				}
			}()
			start := time.Now()
			res := execute(t, r, tc.tool, map[string]any{"duration": 30, "steps": 30}, 45*time.Second)
			if res.GetError().GetCode() != tc.want || res.GetError().GetRetryable() != tc.retryable {
				t.Fatalf("got %v %v, want %v retryable=%v", res.GetStatus(), res.GetError(), tc.want, tc.retryable)
			}
			if d := time.Since(start); d > 20*time.Second {
				t.Errorf("the step ended after %v: the kill was not noticed", d)
			}
			waitHealthy(t, p)
			healthMu.Lock()
			got := slices.Clone(health[tc.server])
			healthMu.Unlock()
			if n := len(got); n < 3 || got[n-1] != true || !slices.Contains(got[1:], false) {
				t.Errorf("health transitions of %s: %v, want up, down, up", tc.server, got)
			}
			if res := execute(t, r, "mcp.everything_echo", map[string]any{"message": "back"}, 0); res.GetError() != nil {
				t.Fatalf("after restart: %v", res.GetError())
			}
		})
	}
}

func waitHealthy(t *testing.T, p *mcppool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for p.Health() != nil {
		select {
		case <-ctx.Done():
			t.Fatalf("servers not back: %v", p.Health())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
