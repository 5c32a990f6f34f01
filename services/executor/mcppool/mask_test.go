package mcppool

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/planex-dev/planex/services/executor/runner"
)

// logBuffer is a slog destination tests can read while the pool writes.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// closedURL is an http:// address nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return "http://" + addr
}

// loadConfig writes json to a file and loads it as --mcp-config does.
func loadConfig(t *testing.T, json string) FileConfig {
	t.Helper()
	path := filepath.Join(t.TempDir(), "mcp.json")
	if err := os.WriteFile(path, []byte(json), 0o600); err != nil {
		t.Fatal(err)
	}
	fc, err := LoadConfig(path)
	if err != nil {
		t.Fatalf("LoadConfig: %v", err)
	}
	return fc
}

// assertMasked fails when text shows the secret or does not name the
// variable.
func assertMasked(t *testing.T, what, text, secret, ref string) {
	t.Helper()
	if strings.Contains(text, secret) {
		t.Errorf("%s shows the expanded value %q:\n%s", what, secret, text)
	}
	if !strings.Contains(text, ref) {
		t.Errorf("%s does not name the variable %s:\n%s", what, ref, text)
	}
}

// TestExpandedValuesAreNeverPrinted reproduces issue 26: a URL holding
// ${VAR} with nothing listening, and a command that is ${VAR}, printed the
// value in the fatal error and in the WARN line of the reconnect loop.
func TestExpandedValuesAreNeverPrinted(t *testing.T) {
	const secret = "tok-9f8e7d6c5b4a-planex-secret"
	t.Setenv("PLANEX_TEST_MCP_SECRET", secret)
	tests := []struct {
		name, json string
	}{
		{"url with a token", `{"mcpServers":{"api":{"url":"` + closedURL(t) + `/mcp?token=${PLANEX_TEST_MCP_SECRET}"}}}`},
		{"url path", `{"mcpServers":{"api":{"url":"` + closedURL(t) + `/${PLANEX_TEST_MCP_SECRET}/mcp"}}}`},
		{"command on PATH", `{"mcpServers":{"cmd":{"command":"${PLANEX_TEST_MCP_SECRET}"}}}`},
		{"command path", `{"mcpServers":{"cmd":{"command":"/nonexistent/${env:PLANEX_TEST_MCP_SECRET}/server","args":["--token=${PLANEX_TEST_MCP_SECRET}"]}}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fc := loadConfig(t, tt.json)
			ref := "${PLANEX_TEST_MCP_SECRET}"

			// The fatal error of Open, and everything logged meanwhile.
			var logs logBuffer
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err := Open(ctx, Config{File: fc, StartTimeout: 10 * time.Second, Logger: logs.logger()})
			if err == nil {
				t.Fatal("Open reached a server that does not exist")
			}
			assertMasked(t, "Open's error", err.Error(), secret, ref)
			if strings.Contains(logs.String(), secret) {
				t.Errorf("the logs show the expanded value:\n%s", logs.String())
			}

			// The reconnect loop's WARN line.
			var name string
			for n := range fc.Servers {
				name = n
			}
			logs = logBuffer{}
			s := &server{name: name, cfg: fc.Servers[name], mask: fc.mask, logger: logs.logger(),
				ready: make(chan struct{}), connectTimeout: 5 * time.Second}
			sctx, stop := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				s.supervise(sctx, func(context.Context, *mcp.ClientSession) {})
			}()
			deadline := time.Now().Add(20 * time.Second)
			for !strings.Contains(logs.String(), "reconnecting") && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			stop()
			<-done
			assertMasked(t, "the reconnect WARN line", logs.String(), secret, ref)
			if _, err := s.current(); err == nil || strings.Contains(err.Error(), secret) {
				t.Errorf("the server's last error: %v", err)
			}
		})
	}
}

// TestStepErrorsMaskExpandedValues: a server echoing the token it was
// given in its error text, and a server gone away, fail steps whose
// message and cause never show the value.
func TestStepErrorsMaskExpandedValues(t *testing.T) {
	const secret = "tok-0a1b2c3d4e5f-planex-secret"
	t.Setenv("PLANEX_TEST_MCP_SECRET", secret)
	srv := mcp.NewServer(&mcp.Implementation{Name: "echo", Version: "1"}, nil)
	var mu sync.Mutex
	var lastToken string
	mcp.AddTool(srv, &mcp.Tool{Name: "whoami", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			mu.Lock()
			defer mu.Unlock()
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "token " + lastToken + " is not allowed here"}}}, nil, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		lastToken = r.URL.Query().Get("token")
		mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	defer hs.Close()
	fc := loadConfig(t, `{"mcpServers":{"echo":{"url":"`+hs.URL+`/mcp?token=${PLANEX_TEST_MCP_SECRET}"}}}`)
	var logs logBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := Open(ctx, Config{File: fc, StartTimeout: 10 * time.Second, Logger: logs.logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := p.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	tools := p.Tools()
	if len(tools) != 1 {
		t.Fatalf("tools: %d, want 1", len(tools))
	}
	check := func(what string, err error) {
		t.Helper()
		var te *runner.Error
		if !errors.As(err, &te) {
			t.Fatalf("%s: %v, want a *runner.Error", what, err)
		}
		assertMasked(t, what+": step message", te.Message, secret, "${PLANEX_TEST_MCP_SECRET}")
		if te.Err != nil && strings.Contains(te.Err.Error(), secret) {
			t.Errorf("%s: the logged cause shows the value: %v", what, te.Err)
		}
	}
	_, err = tools[0].Run(ctx, runner.Call{RunID: "r", StepID: "s", Attempt: 1, Args: &structpb.Struct{}})
	check("server echoing the token", err)

	// The server goes away: the transport's error names the URL.
	hs.CloseClientConnections()
	hs.Close()
	_, err = tools[0].Run(ctx, runner.Call{RunID: "r", StepID: "s", Attempt: 2, Args: &structpb.Struct{}})
	if err == nil {
		t.Fatal("a call to a closed server succeeded")
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("step error shows the value: %v", err)
	}
	var te *runner.Error
	if errors.As(err, &te) && te.Err != nil && strings.Contains(te.Err.Error(), secret) {
		t.Errorf("the logged cause shows the value: %v", te.Err)
	}
	if strings.Contains(logs.String(), secret) {
		t.Errorf("the logs show the value:\n%s", logs.String())
	}
}

func TestMaskForms(t *testing.T) {
	m := (*mask)(nil).clone()
	m.add("${K}", `a b"c/d?e`)
	m.add("${SHORT}", "on")
	for _, in := range []string{`a b"c/d?e`, `a+b%22c%2Fd%3Fe`, `a%20b%22c%2Fd%3Fe`, `a b\"c/d?e`} {
		if got := m.String("x " + in + " y"); got != "x ${K} y" {
			t.Errorf("mask(%q) = %q", in, got)
		}
	}
	if got := m.String("connection on hold"); got != "connection on hold" {
		t.Errorf("a short value was masked: %q", got)
	}
	if err := m.Error(nil); err != nil {
		t.Errorf("Error(nil) = %v", err)
	}
	cause := context.DeadlineExceeded
	if err := m.Error(cause); err != cause {
		t.Errorf("an error without values was wrapped: %v", err)
	}
}
