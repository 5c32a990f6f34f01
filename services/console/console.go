// Package console is planex's web console: a small HTTP server that serves
// an embedded single-page UI (runs, run detail with the plan DAG of every
// revision, open gates, the tool catalog) and the supervisor API to it over
// the Connect protocol.
//
// The API the browser calls is SupervisorService itself, served by handlers
// generated from proto/planex/v1 (gen/planex/v1/planexv1connect); each call
// is forwarded to the supervisor's gRPC API with the browser's own bearer
// token. The console holds no credential of its own: the supervisor
// authenticates and authorises every call exactly as it does the CLI's, and
// a browser without a token is answered Unauthenticated (the UI then asks
// for one).
//
// With OIDCConfig set the console also signs browsers in through an OpenID
// Connect provider (authorization code flow with PKCE, sso.go): the tokens
// stay in a server-side session, the browser holds only a session cookie
// and a CSRF token, and each API call is forwarded with the session's
// token, which the supervisor verifies against the provider's JWKS.
package console

import (
	"context"
	"crypto/tls"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/pflag"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/gen/planex/v1/planexv1connect"
	"github.com/planex-dev/planex/internal/tlsconfig"
)

//go:embed web
var webFS embed.FS

// maxRequestBytes bounds one API request from a browser.
const maxRequestBytes = 1 << 20

// Config configures the console server.
type Config struct {
	// HTTPAddr is where the console listens ("127.0.0.1:0" picks a port).
	HTTPAddr string
	// Schedules, when set, is the supervisor's ScheduleService, served to
	// the page over Connect like SupervisorService (the Schedules page).
	Schedules planexv1.ScheduleServiceClient
	// JaegerURL is the base URL of a Jaeger UI; run pages link to
	// <JaegerURL>/trace/<trace id>. Empty: no trace link.
	JaegerURL string
	// TLSCertFile and TLSKeyFile serve the console over HTTPS. Without them
	// the console listens on loopback only, so bearer tokens never cross a
	// network in clear text.
	TLSCertFile, TLSKeyFile string
	// AllowedHosts are the names (or name:port) browsers may reach the
	// console by, besides the defaults: the --http-addr host, localhost,
	// 127.0.0.1 and ::1, and with HTTPS the names in the certificate. A
	// request whose Host is none of them is refused (403), so a web page
	// cannot drive the console through DNS rebinding.
	AllowedHosts []string
	// ForwardTokens says whether browsers' bearer tokens are forwarded to
	// the supervisor. It must be false when the supervisor connection is
	// plaintext (a token is never sent without TLS); such a supervisor runs
	// with --auth-disabled and needs none.
	ForwardTokens bool
	// OIDC configures single sign-on; empty Issuer: bearer tokens only.
	OIDC OIDCConfig
	// OnReady, when set, is called with the listening address once the
	// console accepts connections.
	OnReady func(net.Addr)
}

// RegisterFlags adds the console's flags.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.HTTPAddr, "http-addr", "127.0.0.1:7480", "address the web console listens on (loopback unless --http-tls-cert-file is set)")
	fs.StringVar(&c.JaegerURL, "jaeger-url", "", "base URL of a Jaeger UI; run pages link to <url>/trace/<trace id>")
	fs.StringVar(&c.TLSCertFile, "http-tls-cert-file", "", "PEM certificate to serve the console over HTTPS")
	fs.StringVar(&c.TLSKeyFile, "http-tls-key-file", "", "PEM key of --http-tls-cert-file")
	fs.StringSliceVar(&c.AllowedHosts, "allowed-hosts", nil, "names (or name:port) browsers reach the console by, besides the --http-addr host, localhost, 127.0.0.1, ::1 and the HTTPS certificate's names; other Host headers are refused (comma separated)")
	c.OIDC.registerFlags(fs)
}

// Validate checks the configuration; errors name the flag.
func (c Config) Validate() error {
	host, _, err := net.SplitHostPort(c.HTTPAddr)
	if err != nil {
		return fmt.Errorf("--http-addr %q: %w", c.HTTPAddr, err)
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return errors.New("--http-tls-cert-file and --http-tls-key-file: set both")
	}
	if c.TLSCertFile == "" && !loopback(host) {
		return fmt.Errorf("--http-addr %q: not a loopback address; serve HTTPS (--http-tls-cert-file) so bearer tokens are not sent in clear text", c.HTTPAddr)
	}
	for _, h := range c.AllowedHosts {
		if _, err := parseAllowedHost(h); err != nil {
			return fmt.Errorf("--allowed-hosts %q: %w", h, err)
		}
	}
	if c.JaegerURL != "" {
		u, err := url.Parse(c.JaegerURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("--jaeger-url %q: want an http(s) URL", c.JaegerURL)
		}
	}
	return c.OIDC.validate(c.ForwardTokens)
}

// loopback reports whether host names only the loopback interface.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Handler returns the console's HTTP handler: the Connect API at
// /planex.v1.SupervisorService/, single sign-on at /auth/ and the UI
// everywhere else.
func Handler(cfg Config, client planexv1.SupervisorServiceClient, logger *slog.Logger) (http.Handler, error) {
	h, _, err := handler(cfg, client, logger)
	return h, err
}

// handler is Handler, also returning the single sign-on state (nil when
// it is off).
func handler(cfg Config, client planexv1.SupervisorServiceClient, logger *slog.Logger) (http.Handler, *sso, error) {
	static, err := fs.Sub(webFS, "web")
	if err != nil {
		return nil, nil, err
	}
	index, err := template.ParseFS(static, "index.html")
	if err != nil {
		return nil, nil, fmt.Errorf("console index page: %w", err)
	}
	guard, err := newHostGuard(cfg, logger)
	if err != nil {
		return nil, nil, err
	}
	mux := http.NewServeMux()
	// Requests are small (a goal is at most 4 KiB, inputs 64 KiB); the
	// bound keeps a client from making the console buffer more.
	path, api := planexv1connect.NewSupervisorServiceHandler(&proxy{client: client, forwardTokens: cfg.ForwardTokens, logger: logger},
		connect.WithReadMaxBytes(maxRequestBytes))
	var auth *sso
	if cfg.OIDC.Enabled() {
		if auth, err = newSSO(cfg, logger); err != nil {
			return nil, nil, err
		}
		auth.routes(mux)
		api = auth.wrapAPI(api)
	} else {
		// The page asks whether single sign-on is configured.
		mux.HandleFunc("GET /auth/me", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusOK, meResponse{})
		})
	}
	mux.Handle(path, api)
	if cfg.Schedules != nil {
		spath, sapi := planexv1connect.NewScheduleServiceHandler(&scheduleProxy{
			p: &proxy{forwardTokens: cfg.ForwardTokens, logger: logger}, client: cfg.Schedules,
		}, connect.WithReadMaxBytes(maxRequestBytes))
		if auth != nil {
			sapi = auth.wrapAPI(sapi)
		}
		mux.Handle(spath, sapi)
	}
	files := http.FileServerFS(static)
	mux.Handle("GET /assets/", files)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := index.Execute(w, struct{ JaegerURL string }{cfg.JaegerURL}); err != nil {
			logger.Warn("console: render index", "err", err)
		}
	})
	return securityHeaders(guard.wrap(mux)), auth, nil
}

// securityHeaders confines the page to its own origin: scripts, styles and
// API calls come only from the console, and no other site may frame it.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		next.ServeHTTP(w, r)
	})
}

// Run serves the console until ctx ends, then shuts down within 5s.
func Run(ctx context.Context, cfg Config, client planexv1.SupervisorServiceClient, logger *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	h, err := Handler(cfg, client, logger)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("--http-addr %s: %w", cfg.HTTPAddr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	if cfg.TLSCertFile != "" {
		// The certificate follows its files (rotation without restart);
		// HTTP/2 lifts browsers' limit of six HTTP/1.1 connections per
		// origin, which open run pages (one event stream each) would hit.
		r, err := tlsconfig.NewReloader(tlsconfig.Files{CertFile: cfg.TLSCertFile, KeyFile: cfg.TLSKeyFile})
		if err == nil {
			srv.TLSConfig, err = tlsconfig.ServerConfig(r, tlsconfig.ClientAuthNone)
		}
		if err != nil {
			ln.Close()
			return fmt.Errorf("--http-tls-cert-file: %w", err)
		}
		srv.TLSConfig.NextProtos = []string{"h2", "http/1.1"}
		ln = tls.NewListener(ln, srv.TLSConfig)
	}
	if cfg.OnReady != nil {
		cfg.OnReady(ln.Addr())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("console: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	// Open WatchRun streams end with ctx (BaseContext); Shutdown waits for
	// them to return.
	if err := srv.Shutdown(sctx); err != nil {
		return errors.Join(fmt.Errorf("console shutdown: %w", err), srv.Close())
	}
	return nil
}
