package mcppool

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

func TestLoadConfigErrors(t *testing.T) {
	tests := []struct {
		name, json, want string
	}{
		{"no servers", `{"mcpServers":{}}`, "no servers configured"},
		{"unknown field", `{"mcpServers":{"a":{"command":"x","comand":"y"}}}`, `unknown field "comand"`},
		{"neither", `{"mcpServers":{"a":{}}}`, "mcpServers.a: set command (stdio) or url"},
		{"both", `{"mcpServers":{"a":{"command":"x","url":"http://h/mcp"}}}`, "mcpServers.a: set command or url, not both"},
		{"bad url", `{"mcpServers":{"a":{"url":"ftp://h"}}}`, `mcpServers.a.url: want an http:// or https:// URL`},
		{"stdio fields on url", `{"mcpServers":{"a":{"url":"http://h/mcp","args":["x"]}}}`, "args, env and cwd apply to stdio servers only"},
		{"http fields on stdio", `{"mcpServers":{"a":{"command":"x","bearerTokenFile":"/t"}}}`, "headers and bearerTokenFile apply to url servers only"},
		{"bad timeout", `{"mcpServers":{"a":{"command":"x","timeout":"soon"}}}`, `mcpServers.a.timeout: "soon"`},
		{"bad side effect", `{"mcpServers":{"a":{"command":"x","tools":{"t":{"sideEffect":"maybe"}}}}}`, `mcpServers.a.tools.t.sideEffect: "maybe"`},
		{"bad name", `{"mcpServers":{"9lives":{"command":"x"}}}`, `server name "9lives"`},
		{"clashing names", `{"mcpServers":{"my-fs":{"command":"x"},"my_fs":{"command":"y"}}}`, `maps to "my_fs"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "mcp.json")
			if err := os.WriteFile(path, []byte(tt.json), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := LoadConfig(path)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("LoadConfig: %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if _, err := LoadConfig(""); err == nil || !strings.Contains(err.Error(), "--mcp-config: required") {
		t.Errorf("empty path: %v", err)
	}
}

func TestExpandVariables(t *testing.T) {
	t.Setenv("PLANEX_TEST_MCP_TOKEN", "s3cret-token")
	t.Setenv("PLANEX_TEST_MCP_HOST", "127.0.0.1:9")
	t.Setenv("PLANEX_TEST_MCP_ROOT", "/srv/files")
	path := filepath.Join(t.TempDir(), "mcp.json")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"mcpServers":{
	  "fs":   {"command":"npx","args":["-y","server-filesystem","${PLANEX_TEST_MCP_ROOT}/a"],
	           "env":{"TOKEN":"${PLANEX_TEST_MCP_TOKEN}","MODE":"${PLANEX_TEST_MCP_UNSET:-ro}"}},
	  "api":  {"url":"http://${PLANEX_TEST_MCP_HOST}/mcp","headers":{"Authorization":"Bearer ${env:PLANEX_TEST_MCP_TOKEN}"}}}}`)
	fc, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	fs, api := fc.Servers["fs"], fc.Servers["api"]
	if fs.Args[2] != "/srv/files/a" || fs.Env["TOKEN"] != "s3cret-token" || fs.Env["MODE"] != "ro" {
		t.Errorf("stdio server: args %q env %q", fs.Args, fs.Env)
	}
	if api.URL != "http://127.0.0.1:9/mcp" || api.Headers["Authorization"] != "Bearer s3cret-token" {
		t.Errorf("http server: url %q headers %q", api.URL, api.Headers)
	}

	tests := []struct{ name, json, want string }{
		{"unset in env", `{"mcpServers":{"fs":{"command":"x","env":{"TOKEN":"${PLANEX_TEST_MCP_UNSET}"}}}}`,
			"mcpServers.fs.env.TOKEN: ${PLANEX_TEST_MCP_UNSET}: environment variable PLANEX_TEST_MCP_UNSET is not set"},
		{"unset in args", `{"mcpServers":{"fs":{"command":"x","args":["a","${PLANEX_TEST_MCP_UNSET}"]}}}`, "mcpServers.fs.args[1]: ${PLANEX_TEST_MCP_UNSET}"},
		{"unset in url", `{"mcpServers":{"api":{"url":"http://${PLANEX_TEST_MCP_UNSET}/mcp"}}}`, "mcpServers.api.url: ${PLANEX_TEST_MCP_UNSET}"},
		{"unset in a header", `{"mcpServers":{"api":{"url":"http://h/mcp","headers":{"X-Key":"${env:PLANEX_TEST_MCP_UNSET}"}}}}`, "mcpServers.api.headers.X-Key: ${env:PLANEX_TEST_MCP_UNSET}"},
		{"expanded url is not echoed", `{"mcpServers":{"api":{"url":"ftp://h/?k=${PLANEX_TEST_MCP_TOKEN}"}}}`, "mcpServers.api.url: want an http"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			write(tt.json)
			_, err := LoadConfig(path)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("LoadConfig: %v, want an error containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("the error shows a secret: %v", err)
			}
		})
	}
}

func TestSemantics(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		name       string
		ann        *mcp.ToolAnnotations
		effect     planexv1.SideEffect
		approval   bool
		idempotent bool
	}{
		{"absent: safe by default", nil, planexv1.SideEffect_SIDE_EFFECT_EXTERNAL, true, false},
		{"read only", &mcp.ToolAnnotations{ReadOnlyHint: true}, planexv1.SideEffect_SIDE_EFFECT_READ, false, true},
		{"empty annotations: destructive by MCP default", &mcp.ToolAnnotations{}, planexv1.SideEffect_SIDE_EFFECT_EXTERNAL, true, false},
		{"not destructive", &mcp.ToolAnnotations{DestructiveHint: &no}, planexv1.SideEffect_SIDE_EFFECT_EXTERNAL, false, false},
		{"closed world, idempotent", &mcp.ToolAnnotations{DestructiveHint: &yes, OpenWorldHint: &no, IdempotentHint: true}, planexv1.SideEffect_SIDE_EFFECT_WRITE, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := &planexv1.ToolSpec{}
			idem := semantics(spec, tt.ann)
			if spec.GetSideEffect() != tt.effect || spec.GetRequiresApproval() != tt.approval || idem != tt.idempotent {
				t.Errorf("got %v approval=%v idempotent=%v, want %v %v %v", spec.GetSideEffect(), spec.GetRequiresApproval(), idem, tt.effect, tt.approval, tt.idempotent)
			}
		})
	}
}

func TestSanitizedNamesAreToolNames(t *testing.T) {
	for in, want := range map[string]string{"get-sum": "get_sum", "Read.File": "read_file", "déjà": "d_j_"} {
		if got := sanitize(in); got != want {
			t.Errorf("sanitize(%q) = %q, want %q", in, got, want)
		}
	}
}
