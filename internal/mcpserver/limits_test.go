package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
)

// bigRuns answers ListRuns with runs whose goals add up to about size
// bytes.
type bigRuns struct {
	planexv1.UnimplementedSupervisorServiceServer
	size int
}

func (b *bigRuns) ListRuns(context.Context, *planexv1.ListRunsRequest) (*planexv1.ListRunsResponse, error) {
	var runs []*planexv1.Run
	for i := 0; i*1000 < b.size; i++ {
		runs = append(runs, &planexv1.Run{Id: fmt.Sprintf("r%d", i), Goal: strings.Repeat("g", 1000)})
	}
	return &planexv1.ListRunsResponse{Runs: runs}, nil
}

// endpoint serves the MCP handler with limits l behind an API key.
func endpoint(t *testing.T, srv planexv1.SupervisorServiceServer, l limits) (url, key string) {
	t.Helper()
	key, line, err := authn.GenerateAPIKey("mcp-client", authn.RoleAdmin)
	if err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	auth, err := authn.New(t.Context(), authn.Config{APIKeysFile: keys}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(handler(srv, auth, slog.New(slog.DiscardHandler), l, Options{}))
	t.Cleanup(hs.Close)
	return hs.URL + Path, key
}

// batch is a JSON-RPC batch of n calls of method (ids 1..n).
func batch(n int, method string, params string) []byte {
	var b bytes.Buffer
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s}`, i+1, method, params)
	}
	b.WriteByte(']')
	return b.Bytes()
}

type answer struct {
	status int
	body   []byte
	msgs   []map[string]any // JSON-RPC messages, from SSE events or a JSON body
}

func post(t *testing.T, url, key string, body []byte) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := answer{status: resp.StatusCode, body: data}
	parse := func(b []byte) {
		var one map[string]any
		var many []map[string]any
		switch {
		case json.Unmarshal(b, &many) == nil:
			a.msgs = append(a.msgs, many...)
		case json.Unmarshal(b, &one) == nil:
			a.msgs = append(a.msgs, one)
		default:
			t.Fatalf("a message is not JSON (truncated?): %.200q", b)
		}
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		for _, ev := range strings.Split(string(data), "\n\n") {
			for _, line := range strings.Split(ev, "\n") {
				if d, ok := strings.CutPrefix(line, "data: "); ok {
					parse([]byte(d))
				}
			}
		}
	} else if len(bytes.TrimSpace(data)) > 0 && resp.StatusCode != http.StatusUnauthorized {
		parse(data)
	}
	return a
}

func errMessage(m map[string]any) string {
	e, _ := m["error"].(map[string]any)
	s, _ := e["message"].(string)
	return s
}

// TestBatchAndBodyLimits reproduces issue 26: 5,000 tools/list calls in
// one 279 KB request answered 17.6 MB. A batch over MaxBatch calls and a
// body over MaxRequestBytes are refused with a JSON-RPC error before any
// call runs; MaxBatch calls are served; anonymous callers are refused
// before their body is read.
func TestBatchAndBodyLimits(t *testing.T) {
	url, key := endpoint(t, &bigRuns{}, defaultLimits)

	attack := batch(5000, "tools/list", "{}")
	a := post(t, url, key, attack)
	if a.status != http.StatusBadRequest || len(a.msgs) != 1 || !strings.Contains(errMessage(a.msgs[0]), "batch of 5000 calls exceeds the limit of 50") {
		t.Fatalf("5,000 calls (%d bytes): %d %.300q", len(attack), a.status, a.body)
	}
	if len(a.body) > 1000 {
		t.Errorf("the refusal is %d bytes", len(a.body))
	}

	a = post(t, url, key, batch(MaxBatch, "tools/list", "{}"))
	if a.status != http.StatusOK || len(a.msgs) != MaxBatch {
		t.Fatalf("%d calls: %d, %d messages: %.300q", MaxBatch, a.status, len(a.msgs), a.body)
	}
	for _, m := range a.msgs {
		if _, ok := m["result"]; !ok {
			t.Fatalf("a call of an allowed batch failed: %v", m)
		}
	}

	big := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"start_run","arguments":{"goal":"` + strings.Repeat("x", MaxRequestBytes) + `"}}}`)
	a = post(t, url, key, big)
	if a.status != http.StatusRequestEntityTooLarge || len(a.msgs) != 1 || !strings.Contains(errMessage(a.msgs[0]), "request body exceeds 1048576 bytes") {
		t.Fatalf("a body over the limit: %d %.300q", a.status, a.body)
	}

	a = post(t, url, "", attack)
	if a.status != http.StatusUnauthorized {
		t.Fatalf("anonymous batch: %d %.300q, want 401", a.status, a.body)
	}

	a = post(t, url, key, []byte(`[{"jsonrpc":"2.0","id":1,"method":"tools/list"},`))
	if a.status != http.StatusBadRequest || len(a.msgs) != 1 || !strings.Contains(errMessage(a.msgs[0]), "malformed batch") {
		t.Fatalf("malformed batch: %d %.300q", a.status, a.body)
	}
}

// TestResponseLimit: a response that would cross the cap is replaced by a
// JSON-RPC error with the call's id; the answer stays well-formed and
// bounded, and the calls before it are answered in full.
func TestResponseLimit(t *testing.T) {
	const limit = 64 << 10
	url, key := endpoint(t, &bigRuns{size: 20 << 10}, limits{batch: MaxBatch, request: MaxRequestBytes, response: limit})

	a := post(t, url, key, batch(10, "tools/call", `{"name":"list_runs","arguments":{}}`))
	if a.status != http.StatusOK || len(a.msgs) != 10 {
		t.Fatalf("10 list_runs: %d, %d messages: %.300q", a.status, len(a.msgs), a.body)
	}
	var ok, refused int
	ids := map[float64]bool{}
	for _, m := range a.msgs {
		id, _ := m["id"].(float64)
		ids[id] = true
		switch {
		case m["result"] != nil:
			ok++
		case strings.Contains(errMessage(m), fmt.Sprintf("the response exceeds the limit of %d bytes", limit)):
			refused++
		default:
			t.Errorf("unexpected message %v", m)
		}
	}
	if ok == 0 || refused == 0 || len(ids) != 10 {
		t.Errorf("%d answered, %d refused, %d distinct ids; want some of each and every id once", ok, refused, len(ids))
	}
	if len(a.body) > limit+10*300 {
		t.Errorf("the answer is %d bytes, over the limit %d", len(a.body), limit)
	}

	// One call alone over the limit.
	url, key = endpoint(t, &bigRuns{size: 2 * limit}, limits{batch: MaxBatch, request: MaxRequestBytes, response: limit})
	a = post(t, url, key, []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"list_runs","arguments":{}}}`))
	if len(a.msgs) != 1 || a.msgs[0]["id"] != float64(7) || !strings.Contains(errMessage(a.msgs[0]), "exceeds the limit") {
		t.Fatalf("one call over the limit: %d %.300q", a.status, a.body)
	}
}
