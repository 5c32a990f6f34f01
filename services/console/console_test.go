package console

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/grpc/metadata"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"loopback", Config{HTTPAddr: "127.0.0.1:7480"}, ""},
		{"localhost with jaeger", Config{HTTPAddr: "localhost:0", JaegerURL: "http://127.0.0.1:16686"}, ""},
		{"ipv6 loopback", Config{HTTPAddr: "[::1]:7480"}, ""},
		{"all interfaces without TLS", Config{HTTPAddr: ":7480"}, "--http-addr"},
		{"public address without TLS", Config{HTTPAddr: "192.0.2.1:7480"}, "not a loopback address"},
		{"public address with TLS", Config{HTTPAddr: "0.0.0.0:7480", TLSCertFile: "c.pem", TLSKeyFile: "k.pem"}, ""},
		{"cert without key", Config{HTTPAddr: "127.0.0.1:7480", TLSCertFile: "c.pem"}, "--http-tls-cert-file and --http-tls-key-file"},
		{"no port", Config{HTTPAddr: "127.0.0.1"}, "--http-addr"},
		{"jaeger not http", Config{HTTPAddr: "127.0.0.1:0", JaegerURL: "javascript:alert(1)"}, "--jaeger-url"},
		{"jaeger without host", Config{HTTPAddr: "127.0.0.1:0", JaegerURL: "http://"}, "--jaeger-url"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate: %v, want an error naming %q", err, tt.wantErr)
			}
		})
	}
}

// TestOutgoingToken: exactly one "Bearer <token>" header is forwarded, and
// only over TLS; anything else is refused before the supervisor is called.
func TestOutgoingToken(t *testing.T) {
	tests := []struct {
		name    string
		forward bool
		headers []string
		want    string // forwarded authorization, "" for none
		wantErr bool
	}{
		{"bearer", true, []string{"Bearer planex_abc"}, "Bearer planex_abc", false},
		{"scheme case and spaces", true, []string{"bearer   planex_abc "}, "Bearer planex_abc", false},
		{"no header", true, nil, "", false},
		{"plaintext supervisor never gets a token", false, []string{"Bearer planex_abc"}, "", false},
		{"two headers", true, []string{"Bearer a", "Bearer b"}, "", true},
		{"basic auth", true, []string{"Basic dXNlcjpwdw=="}, "", true},
		{"empty token", true, []string{"Bearer  "}, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &proxy{forwardTokens: tt.forward, logger: slog.Default()}
			h := http.Header{}
			for _, v := range tt.headers {
				h.Add("Authorization", v)
			}
			ctx, err := p.outgoing(t.Context(), h)
			if tt.wantErr {
				if connect.CodeOf(err) != connect.CodeUnauthenticated {
					t.Fatalf("outgoing: %v, want Unauthenticated", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			md, _ := metadata.FromOutgoingContext(ctx)
			got := strings.Join(md.Get("authorization"), ",")
			if got != tt.want {
				t.Fatalf("forwarded %q, want %q", got, tt.want)
			}
		})
	}
}

// TestHandlerServesEmbeddedAssets: the page and its assets come from the
// binary, with a CSP that keeps everything on the console's origin.
func TestHandlerServesEmbeddedAssets(t *testing.T) {
	h, err := Handler(Config{HTTPAddr: "127.0.0.1:0", JaegerURL: "http://127.0.0.1:16686"}, nil, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ path, contains string }{
		{"/", `data-jaeger-url="http://127.0.0.1:16686"`},
		{"/assets/app.js", "WatchRun"},
		{"/assets/dag.js", "layout"},
		{"/assets/connect.js", "application/connect+json"},
		{"/assets/app.css", "prefers-color-scheme: dark"},
	} {
		rec := httptest.NewRecorder()
		req, _ := http.NewRequest(http.MethodGet, tt.path, nil)
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), tt.contains) {
			t.Errorf("GET %s: %d, body without %q", tt.path, rec.Code, tt.contains)
		}
		if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
			t.Errorf("GET %s: CSP %q", tt.path, csp)
		}
	}
}
