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
		{"bad url", `{"mcpServers":{"a":{"url":"ftp://h"}}}`, `mcpServers.a.url "ftp://h"`},
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
