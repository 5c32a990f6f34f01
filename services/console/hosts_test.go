package console

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/grpc"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/gen/planex/v1/planexv1connect"
)

// countingSupervisor answers StartRun and CancelRun and counts the calls
// that reached it.
type countingSupervisor struct {
	planexv1.SupervisorServiceClient
	calls atomic.Int64
}

func (c *countingSupervisor) StartRun(context.Context, *planexv1.StartRunRequest, ...grpc.CallOption) (*planexv1.StartRunResponse, error) {
	c.calls.Add(1)
	return &planexv1.StartRunResponse{Run: &planexv1.Run{Id: "r1"}}, nil
}

func (c *countingSupervisor) CancelRun(context.Context, *planexv1.CancelRunRequest, ...grpc.CallOption) (*planexv1.CancelRunResponse, error) {
	c.calls.Add(1)
	return &planexv1.CancelRunResponse{}, nil
}

// TestHostAndOrigin reproduces issue 26's DNS rebinding: a page on
// http://evil.example:7480 whose name now resolves to 127.0.0.1 sends its
// requests with Host evil.example:7480 (and its own Origin); the console
// must refuse them before the supervisor (plaintext, auth disabled) sees
// anything, and serve its own origin as before.
func TestHostAndOrigin(t *testing.T) {
	sup := &countingSupervisor{}
	h, err := Handler(Config{HTTPAddr: "127.0.0.1:7480", AllowedHosts: []string{"console.internal", "ops.example.com:8443", "*.planex.test"}}, sup, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	const cancelPath = "/" + planexv1connect.SupervisorServiceName + "/CancelRun"
	tests := []struct {
		name, method, path, host string
		headers                  map[string]string
		want                     int
		wantBody                 string
	}{
		{"page on the listen address", "GET", "/", "127.0.0.1:7480", nil, 200, ""},
		{"page on localhost", "GET", "/", "localhost:7480", nil, 200, ""},
		{"page on [::1]", "GET", "/", "[::1]:7480", nil, 200, ""},
		{"page on a configured name", "GET", "/", "console.internal:7480", nil, 200, ""},
		{"host case and trailing dot", "GET", "/", "Console.Internal.:7480", nil, 200, ""},
		{"configured name with its port", "GET", "/", "ops.example.com:8443", nil, 200, ""},
		{"wildcard name", "GET", "/", "eu.planex.test", nil, 200, ""},
		{"rebinding: page", "GET", "/", "evil.example:7480", nil, 403, `Host "evil.example:7480"`},
		{"rebinding: asset", "GET", "/assets/app.js", "evil.example:7480", nil, 403, "--allowed-hosts"},
		{"rebinding: cancel a run", "POST", cancelPath, "evil.example:7480",
			map[string]string{"Origin": "http://evil.example:7480", "Sec-Fetch-Site": "same-origin"}, 403, "not one of the console's names"},
		{"configured name on another port", "GET", "/", "ops.example.com:9999", nil, 403, ""},
		{"wildcard is one label", "GET", "/", "a.b.planex.test", nil, 403, ""},
		{"no Host", "GET", "/", "", nil, 403, ""},
		{"foreign Origin on the console's Host", "POST", cancelPath, "127.0.0.1:7480",
			map[string]string{"Origin": "http://evil.example"}, 403, `origin "http://evil.example"`},
		{"another local port's Origin", "POST", cancelPath, "127.0.0.1:7480",
			map[string]string{"Origin": "http://127.0.0.1:8080"}, 403, "cross-origin request refused"},
		{"null Origin", "POST", cancelPath, "127.0.0.1:7480", map[string]string{"Origin": "null"}, 403, ""},
		{"cross-site fetch without Origin", "POST", cancelPath, "127.0.0.1:7480", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403, "Sec-Fetch-Site"},
		{"own Origin", "POST", cancelPath, "127.0.0.1:7480",
			map[string]string{"Origin": "http://127.0.0.1:7480", "Sec-Fetch-Site": "same-origin"}, 200, ""},
		{"own Origin on a configured name", "POST", cancelPath, "console.internal:7480", map[string]string{"Origin": "http://console.internal:7480"}, 200, ""},
		{"non-browser client (no Origin)", "POST", cancelPath, "127.0.0.1:7480", nil, 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := sup.calls.Load()
			var body *strings.Reader
			if tt.method == "POST" {
				body = strings.NewReader(`{"runId":"r1"}`)
			} else {
				body = strings.NewReader("")
			}
			req := httptest.NewRequest(tt.method, tt.path, body)
			req.Host = tt.host
			if tt.method == "POST" {
				req.Header.Set("Content-Type", "application/json")
			}
			for k, v := range tt.headers {
				req.Header.Set(k, v)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.want || !strings.Contains(rec.Body.String(), tt.wantBody) {
				t.Fatalf("%s %s Host %q: %d %.200q, want %d with %q", tt.method, tt.path, tt.host, rec.Code, rec.Body.String(), tt.want, tt.wantBody)
			}
			reached := sup.calls.Load() > before
			if tt.method == "POST" && reached != (tt.want == 200) {
				t.Errorf("the supervisor was reached: %v, want %v", reached, tt.want == 200)
			}
			if csp := rec.Header().Get("Content-Security-Policy"); csp == "" {
				t.Error("the answer has no CSP")
			}
		})
	}
}

// TestHostsOverTheNetwork: the generated Connect client against a real
// listener on loopback reaches the console by its address, and a client
// that sends another Host is refused with PermissionDenied.
func TestHostsOverTheNetwork(t *testing.T) {
	sup := &countingSupervisor{}
	h, err := Handler(Config{HTTPAddr: "127.0.0.1:0"}, sup, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := planexv1connect.NewSupervisorServiceClient(srv.Client(), srv.URL)
	if _, err := c.StartRun(t.Context(), connect.NewRequest(&planexv1.StartRunRequest{Goal: "g"})); err != nil {
		t.Fatalf("StartRun by the console's address: %v", err)
	}
	req := connect.NewRequest(&planexv1.StartRunRequest{Goal: "g"})
	rebound := &http.Client{Transport: hostRewriter{host: "attacker.example:80"}}
	_, err = planexv1connect.NewSupervisorServiceClient(rebound, srv.URL).StartRun(t.Context(), req)
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("StartRun with a foreign Host: %v, want PermissionDenied", err)
	}
	if n := sup.calls.Load(); n != 1 {
		t.Errorf("the supervisor saw %d calls, want 1", n)
	}
}

// hostRewriter sends requests with another Host header, as a browser does
// for a page whose DNS name was rebound to the console's address.
type hostRewriter struct{ host string }

func (h hostRewriter) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Host = h.host
	return http.DefaultTransport.RoundTrip(r)
}
