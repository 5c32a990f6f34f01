package supervisor_test

import (
	"strings"
	"testing"
)

// TestMCPAddrValidate: --mcp-addr is off by default and must be host:port.
func TestMCPAddrValidate(t *testing.T) {
	t.Parallel()
	if cfg := parse(t, "--plaintext", "--auth-disabled"); cfg.MCPAddr != "" {
		t.Fatalf("--mcp-addr defaults to %q, want off", cfg.MCPAddr)
	}
	if err := parse(t, "--plaintext", "--auth-disabled", "--mcp-addr", "127.0.0.1:0").Validate(); err != nil {
		t.Fatal(err)
	}
	err := parse(t, "--plaintext", "--auth-disabled", "--mcp-addr", "7403").Validate()
	if err == nil || !strings.Contains(err.Error(), `--mcp-addr "7403": want host:port`) {
		t.Fatalf("err = %v", err)
	}
}
