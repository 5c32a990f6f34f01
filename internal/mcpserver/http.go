package mcpserver

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
)

// Path is where the supervisor serves MCP over streamable HTTP.
const Path = "/mcp"

// Handler serves MCP over streamable HTTP in front of srv, the
// supervisor's own SupervisorService. Every request is authenticated
// like a gRPC call (bearer API key or JWT, or a verified client
// certificate): without valid credentials the answer is 401 with
// WWW-Authenticate: Bearer and no detail. Each request then gets a
// server acting as the caller's identity, so every tool needs the role
// of its API method (viewer for get_run, list_runs, list_tools and the
// events resource; runner for start_run and cancel_run; approver for
// decide) and a missing role is a tool error saying only "permission
// denied".
//
// The endpoint is stateless (no Mcp-Session-Id): nothing is kept between
// requests, so an identity is never carried over from one request to the
// next and any supervisor replica can answer. Progress notifications of
// start_run travel on the response stream of its own request.
//
// Authenticated requests are then bounded: a body of at most
// MaxRequestBytes, a JSON-RPC batch of at most MaxBatch calls (else a
// JSON-RPC error, HTTP 413 or 400), and an answer of at most
// MaxResponseBytes (a message past it is replaced by a JSON-RPC error for
// its id, never cut).
//
// opts configures each request's server (Options.Fold for progress at each
// event); Options.Error is always the default.
func Handler(srv planexv1.SupervisorServiceServer, auth *authn.Authenticator, logger *slog.Logger, opts Options) http.Handler {
	return handler(srv, auth, logger, defaultLimits, opts)
}

func handler(srv planexv1.SupervisorServiceServer, auth *authn.Authenticator, logger *slog.Logger, l limits, opts Options) http.Handler {
	type idKey struct{}
	opts.Error = nil
	h := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		id, _ := r.Context().Value(idKey{}).(authn.Identity)
		if opts.ScheduleServer != nil {
			o := opts
			o.Schedules = LocalSchedules(opts.ScheduleServer, id)
			return New(Local(srv, id), o)
		}
		return New(Local(srv, id), opts)
	}, &mcp.StreamableHTTPOptions{Stateless: true, Logger: logger, MaxRequestBodyBytes: int64(l.request)})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := auth.AuthenticateHTTP(r)
		if err != nil {
			logger.WarnContext(r.Context(), "unauthenticated MCP request", "remote", r.RemoteAddr, "reason", err.Error())
			w.Header().Set("WWW-Authenticate", `Bearer realm="planex"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		if !l.checkRequest(w, r) {
			logger.WarnContext(r.Context(), "MCP request over the limits refused", "subject", id.Subject, "remote", r.RemoteAddr)
			return
		}
		cw := &cappedWriter{ResponseWriter: w, limit: l.response}
		h.ServeHTTP(cw, r.WithContext(context.WithValue(r.Context(), idKey{}, id)))
		if cw.exceeded {
			logger.WarnContext(r.Context(), "MCP response over the limit replaced by errors", "subject", id.Subject, "limit_bytes", l.response)
		}
	})
}
