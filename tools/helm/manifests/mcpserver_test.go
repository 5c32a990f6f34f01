package manifests

import (
	"encoding/json"
	"net"
	"net/http"
	"sync"
	"testing"
)

// mcpSink is a minimal MCP server over streamable HTTP (JSON responses,
// no SSE stream) standing in for the mcp-pool component's example server
// tickets-mcp: it answers initialize, ping and tools/list with one tool,
// and only requests carrying its bearer token, which the pool reads from
// the Secret planex-mcp (${MCP_TOKEN} in mcp.json).
type mcpSink struct {
	addr  string
	token string

	mu           sync.Mutex
	authorized   int
	unauthorized int
	listed       int
}

func (m *mcpSink) counts() (authorized, unauthorized, listed int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.authorized, m.unauthorized, m.listed
}

func (m *mcpSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+m.token {
		m.mu.Lock()
		m.unauthorized++
		m.mu.Unlock()
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	m.mu.Lock()
	m.authorized++
	m.mu.Unlock()
	if r.Method != http.MethodPost {
		// No standalone SSE stream; session end is a no-op.
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	var req struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			ProtocolVersion string `json:"protocolVersion"`
		} `json:"params"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if len(req.ID) == 0 { // a notification
		w.WriteHeader(http.StatusAccepted)
		return
	}
	resp := map[string]any{"jsonrpc": "2.0", "id": req.ID}
	switch req.Method {
	case "initialize":
		resp["result"] = map[string]any{
			"protocolVersion": req.Params.ProtocolVersion,
			"capabilities":    map[string]any{"tools": map[string]any{}},
			"serverInfo":      map[string]any{"name": "tickets", "version": "test"},
		}
	case "ping":
		resp["result"] = map[string]any{}
	case "tools/list":
		m.mu.Lock()
		m.listed++
		m.mu.Unlock()
		resp["result"] = map[string]any{"tools": []any{map[string]any{
			"name":        "close_ticket",
			"description": "Close a support ticket.",
			"inputSchema": map[string]any{"type": "object", "properties": map[string]any{"id": map[string]any{"type": "string"}}, "required": []string{"id"}},
		}}}
	default:
		resp["error"] = map[string]any{"code": -32601, "message": "method not found: " + req.Method}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

func startMCPSink(t *testing.T, token string) *mcpSink {
	t.Helper()
	m := &mcpSink{token: token}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m.addr = l.Addr().String()
	srv := &http.Server{Handler: m}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return m
}
