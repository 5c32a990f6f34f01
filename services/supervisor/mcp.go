package supervisor

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/mcpserver"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// serveMCP serves MCP over streamable HTTP at cfg.MCPAddr + mcpserver.Path
// with the gRPC API's TLS and authentication settings, calling api (the
// supervisor's router: each call goes to the caller's tenant, as over
// gRPC); the returned stop shuts the listener down. A nil stop and error mean the endpoint is off.
func serveMCP(ctx context.Context, cfg Config, api planexv1.SupervisorServiceServer, logger *slog.Logger) (stop func(context.Context) error, err error) {
	if cfg.MCPAddr == "" {
		return func(context.Context) error { return nil }, nil
	}
	if api == nil {
		return nil, errors.New("--mcp-addr: the SupervisorService was not registered")
	}
	auth, err := authn.New(ctx, cfg.Common.Auth, logger)
	if err != nil {
		return nil, err
	}
	tlsCfg, err := cfg.Common.TLS.HTTPServerConfig()
	if err != nil {
		return nil, fmt.Errorf("--mcp-addr: %w", err)
	}
	lis, err := net.Listen("tcp", cfg.MCPAddr)
	if err != nil {
		return nil, fmt.Errorf("listen on --mcp-addr %s: %w", cfg.MCPAddr, err)
	}
	mux := http.NewServeMux()
	opts := mcpserver.Options{Fold: runlog.Fold}
	if r, ok := api.(*router); ok {
		// Schedule tools, routed to the caller's tenant like the API.
		opts.ScheduleServer = &scheduleRouter{cells: r.cells, logger: logger}
	}
	mux.Handle(mcpserver.Path, mcpserver.Handler(api, auth, logger.With("component", "mcp"), opts))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, TLSConfig: tlsCfg}
	scheme := "http"
	if tlsCfg != nil {
		scheme = "https"
		lis = tls.NewListener(lis, tlsCfg)
	}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("mcp endpoint", "err", err)
		}
	}()
	url := fmt.Sprintf("%s://%s%s", scheme, lis.Addr(), mcpserver.Path)
	logger.Info("mcp listening", "mcp_url", url, "tls", tlsCfg != nil, "auth", !cfg.Common.Auth.Disabled)
	if cfg.OnMCPReady != nil {
		cfg.OnMCPReady(url)
	}
	return func(ctx context.Context) error {
		if err := srv.Shutdown(ctx); err != nil {
			return errors.Join(fmt.Errorf("shut down the mcp endpoint: %w", err), srv.Close())
		}
		return nil
	}, nil
}
