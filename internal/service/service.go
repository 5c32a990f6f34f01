// Package service is the lifecycle every planex service shares: connect to
// NATS, create the JetStream resources, serve gRPC with health and
// reflection, report SERVING only while NATS is connected and the streams
// exist, and shut down in order (health first, then in-flight RPCs, then
// the service's own consumers, then the NATS connection).
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"
	"google.golang.org/grpc/credentials"

	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/grpcserver"
	"github.com/planex-dev/planex/internal/natsauth"
	"github.com/planex-dev/planex/internal/redact"
	"github.com/planex-dev/planex/internal/tlsconfig"
)

// Common is the configuration every service shares.
type Common struct {
	// GRPCAddr is the gRPC listen address.
	GRPCAddr string
	// NATSURL is the NATS server URL.
	NATSURL string
	// MetricsAddr serves /metrics when set.
	MetricsAddr string
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// LogFormat is json or text.
	LogFormat string
	// ShutdownGrace bounds graceful shutdown of in-flight work.
	ShutdownGrace time.Duration
	// Replicas of the JetStream streams and buckets this service creates.
	StreamReplicas int
	// JetStreamMaxBytes is the size budget of all planex streams and
	// buckets (e.g. "8GiB"); empty means bus.DefaultMaxBytes.
	JetStreamMaxBytes string
	// RedactPatterns are name=regexp pairs masked in logs and exported
	// spans, in addition to redact.DefaultPatterns.
	RedactPatterns []string

	// TLS is the gRPC transport security (--tls-*, --plaintext): served,
	// and used when this service calls another.
	TLS tlsconfig.Flags
	// Auth authenticates gRPC callers (--auth-*).
	Auth authn.Config
	// Reflection serves gRPC server reflection (--grpc-reflection).
	Reflection bool
	// HealthRequiresAuth makes the health service need the viewer role;
	// by default it is public so probes and load balancers can use it.
	HealthRequiresAuth bool
	// NATS are the NATS credentials and TLS settings (--nats-*).
	NATS natsauth.Options
	// HealthAddr serves the gRPC health service alone, in plaintext, for
	// probes that cannot speak TLS (--health-addr; empty: off).
	HealthAddr string
}

// ClientCredentials are the transport credentials this service uses to
// call another planex service: TLS with its own certificate as client
// certificate (mTLS), or plaintext when --plaintext.
func (c Common) ClientCredentials() (credentials.TransportCredentials, error) {
	return c.TLS.ClientCredentials("")
}

// Redactor is the redaction layer for this service's logs and spans: the
// default patterns plus --redact-pattern.
func (c Common) Redactor() (*redact.Redactor, error) {
	patterns, err := redact.Compile(c.RedactPatterns)
	if err != nil {
		return nil, fmt.Errorf("--redact-pattern: %w", err)
	}
	return redact.New(patterns...), nil
}

// RegisterFlags adds the common flags with the service's default gRPC
// address.
func (c *Common) RegisterFlags(fs *pflag.FlagSet, defaultGRPCAddr string) {
	fs.StringVar(&c.GRPCAddr, "grpc-addr", defaultGRPCAddr, "gRPC listen address")
	fs.StringVar(&c.NATSURL, "nats-url", "nats://127.0.0.1:4222", "NATS server URL")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", "", "serve Prometheus metrics on this address at /metrics (empty: off)")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&c.LogFormat, "log-format", "json", "log format: json or text")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", 10*time.Second, "time allowed for in-flight work at shutdown")
	fs.IntVar(&c.StreamReplicas, "stream-replicas", 1, "replicas of the JetStream streams and buckets (3 in a NATS cluster)")
	fs.StringVar(&c.JetStreamMaxBytes, "jetstream-max-bytes", "1GiB", "size budget of all planex streams and buckets together, split between them; each refuses writes when full (set below the JetStream store, e.g. 8GiB of 9Gi)")
	fs.StringArrayVar(&c.RedactPatterns, "redact-pattern", nil, "name=regexp masked in logs and exported spans, in addition to e-mail addresses, credentials, bearer tokens, API keys and card numbers (repeatable)")
	c.TLS.RegisterFlags(fs)
	c.Auth.RegisterFlags(fs)
	fs.BoolVar(&c.Reflection, "grpc-reflection", false, "serve gRPC server reflection (to authenticated viewers)")
	fs.StringVar(&c.HealthAddr, "health-addr", "", "also serve the gRPC health service alone, in plaintext, on this address (for Kubernetes gRPC probes; empty: off)")
	fs.BoolVar(&c.HealthRequiresAuth, "health-requires-auth", false, "require the viewer role for the gRPC health service (public by default, for probes)")
	c.NATS.RegisterFlags(fs)
}

// Validate checks the common flags, naming the flag and value at fault.
func (c Common) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.GRPCAddr); err != nil {
		errs = append(errs, fmt.Errorf("--grpc-addr %q: want host:port", c.GRPCAddr))
	}
	if c.HealthAddr != "" {
		if _, _, err := net.SplitHostPort(c.HealthAddr); err != nil {
			errs = append(errs, fmt.Errorf("--health-addr %q: want host:port", c.HealthAddr))
		}
	}
	if c.JetStreamMaxBytes != "" {
		if n, err := bus.ParseBytes(c.JetStreamMaxBytes); err != nil || n < 64<<20 {
			errs = append(errs, fmt.Errorf("--jetstream-max-bytes %q: want a size of at least 64MiB, e.g. 1GiB", c.JetStreamMaxBytes))
		}
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			errs = append(errs, fmt.Errorf("--metrics-addr %q: want host:port", c.MetricsAddr))
		}
	}
	if u, err := url.Parse(c.NATSURL); err != nil || u.Host == "" || (u.Scheme != "nats" && u.Scheme != "tls" && u.Scheme != "ws" && u.Scheme != "wss") {
		errs = append(errs, fmt.Errorf("--nats-url %q: want nats://host:port", redactURL(c.NATSURL)))
	}
	if c.ShutdownGrace <= 0 {
		errs = append(errs, fmt.Errorf("--shutdown-grace %s: must be positive", c.ShutdownGrace))
	}
	if _, err := c.Redactor(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.TLS.Validate(), c.Auth.Validate(), c.NATS.Validate(c.NATSURL))
	if !c.Auth.Disabled && c.Auth.APIKeysFile == "" && c.Auth.JWT.JWKSFile == "" && c.Auth.JWT.JWKSURL == "" &&
		(c.TLS.Plaintext || c.TLS.ClientAuth == tlsconfig.ClientAuthNone) {
		errs = append(errs, errors.New("--auth-*: no way to authenticate callers: set --auth-api-keys-file, --auth-jwks-file/--auth-jwks-url, or client certificates (--tls-ca-file), or --auth-disabled"))
	}
	if c.StreamReplicas < 1 || c.StreamReplicas > 5 {
		errs = append(errs, fmt.Errorf("--stream-replicas %d: want 1 to 5", c.StreamReplicas))
	}
	return errors.Join(errs...)
}

// MetricsHandler serves the process's metrics (telemetry.Telemetry.Metrics).
type MetricsHandler = http.Handler

// Deps is what a service gets to start its components.
type Deps struct {
	// Logger for the service.
	Logger *slog.Logger
	// NC is the NATS connection.
	NC *nats.Conn
	// Bus holds the JetStream streams, buckets and object store.
	Bus *bus.Resources
	// Server is the gRPC server; register implementations on Server.GRPC.
	Server *grpcserver.Server
	// Addr is the address the gRPC server listens on (useful with port 0).
	Addr net.Addr
}

// StartFunc registers gRPC services and starts background work (consumers,
// heartbeats). The returned stop function drains that work; it is called
// after the gRPC server stopped and before the NATS connection closes.
type StartFunc func(ctx context.Context, d Deps) (stop func(context.Context) error, err error)

// Params describe one service to serve.
type Params struct {
	// Name is the service name (NATS connection name, logs).
	Name string
	// Common configuration.
	Common Common
	// Logger for the service.
	Logger *slog.Logger
	// Bus tunes the JetStream resources.
	Bus bus.Options
	// Metrics is served on Common.MetricsAddr when both are set.
	Metrics MetricsHandler
	// Start starts the service's components.
	Start StartFunc
	// Ready, when set, is called with the listen address once the service
	// is SERVING (used by `planex dev` and tests).
	Ready func(net.Addr)
	// ReadyCheck, when set, is a further condition of SERVING beside NATS
	// and the streams (the supervisor: its expected executor pools have
	// registered); its error, safe to log, says what is awaited.
	ReadyCheck func(context.Context) error
	// DisabledMethods are gRPC methods (full names) refused to every
	// caller with PermissionDenied.
	DisabledMethods []string
}

// Serve runs a service until ctx ends, then shuts it down gracefully. It
// returns an error only when the service could not start or failed.
func Serve(ctx context.Context, p Params) (err error) {
	logger := p.Logger.With("service", p.Name)
	lis, err := grpcserver.Listen(p.Common.GRPCAddr)
	if err != nil {
		return err
	}
	defer lis.Close()

	creds, err := p.Common.TLS.ServerCredentials()
	if err != nil {
		return err
	}
	auth, err := authn.New(ctx, p.Common.Auth, logger)
	if err != nil {
		return err
	}
	natsOpts, err := p.Common.NATS.NATSOptions()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	nc, err := bus.Connect(cctx, p.Common.NATSURL, "planex-"+p.Name, logger, natsOpts...)
	cancel()
	if err != nil {
		return err
	}
	closed := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	defer func() {
		// Drain delivers what is buffered and flushes pending publishes.
		if derr := nc.Drain(); derr != nil && !errors.Is(derr, nats.ErrConnectionClosed) {
			err = errors.Join(err, fmt.Errorf("drain NATS: %w", derr))
		}
		select {
		case <-closed:
		case <-time.After(p.Common.ShutdownGrace):
			nc.Close()
		}
	}()

	bo := p.Bus
	if bo.Replicas == 0 {
		bo.Replicas = p.Common.StreamReplicas
	}
	if bo.MaxBytes == 0 && p.Common.JetStreamMaxBytes != "" {
		// Validated by Common.Validate.
		bo.MaxBytes, _ = bus.ParseBytes(p.Common.JetStreamMaxBytes)
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	res, err := setupBus(sctx, nc, bo, logger)
	cancel()
	if err != nil {
		return fmt.Errorf("set up JetStream on %s: %w", p.Common.NATSURL, err)
	}

	policy := authn.ServicePolicy(!p.Common.HealthRequiresAuth, false)
	for _, m := range p.DisabledMethods {
		policy[m] = authn.RoleDisabled
	}
	srv, err := grpcserver.New(logger, grpcserver.Security{Creds: creds, Auth: auth, Reflection: p.Common.Reflection, Policy: policy})
	if err != nil {
		return err
	}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	stop, err := p.Start(runCtx, Deps{Logger: logger, NC: nc, Bus: res, Server: srv, Addr: lis.Addr()})
	if err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}

	var metricsSrv *http.Server
	if p.Common.MetricsAddr != "" && p.Metrics != nil {
		mlis, err := net.Listen("tcp", p.Common.MetricsAddr)
		if err != nil {
			return errors.Join(fmt.Errorf("listen on --metrics-addr %s: %w", p.Common.MetricsAddr, err), stop(context.Background()))
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", p.Metrics)
		metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = metricsSrv.Serve(mlis) }()
		logger.Info("metrics listening", "addr", mlis.Addr().String())
	}

	if p.Common.HealthAddr != "" {
		hlis, err := net.Listen("tcp", p.Common.HealthAddr)
		if err != nil {
			return errors.Join(fmt.Errorf("listen on --health-addr %s: %w", p.Common.HealthAddr, err), stop(context.Background()))
		}
		go func() {
			if err := srv.ServeHealth(runCtx, hlis); err != nil {
				logger.Error("health listener", "err", err)
			}
		}()
		logger.Info("plaintext health listening", "addr", hlis.Addr().String())
	}

	health := &healthWatch{srv: srv, nc: nc, res: res, logger: logger, extra: p.ReadyCheck}
	if p.Ready != nil {
		// Once SERVING: at once, or when a later check gets there.
		health.onServing = func() { p.Ready(lis.Addr()) }
	}
	logger.Info("serving", "grpc_addr", lis.Addr().String(), "tls", !p.Common.TLS.Plaintext, "auth", !p.Common.Auth.Disabled, "nats_url", nc.ConnectedUrlRedacted())
	health.check(runCtx)
	go health.loop(runCtx)

	serveErr := srv.Serve(ctx, lis, p.Common.ShutdownGrace)
	logger.Info("shutting down")
	stopRun()
	sdCtx, cancel := context.WithTimeout(context.Background(), p.Common.ShutdownGrace)
	defer cancel()
	err = errors.Join(serveErr, stop(sdCtx))
	if metricsSrv != nil {
		err = errors.Join(err, metricsSrv.Shutdown(sdCtx))
	}
	return err
}

// redactURL hides a password in a URL (which Validate refuses anyway).
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}

// healthWatch keeps the health status in line with NATS: SERVING while
// the connection is up and the streams exist.
type healthWatch struct {
	srv     *grpcserver.Server
	nc      *nats.Conn
	res     *bus.Resources
	logger  *slog.Logger
	extra   func(context.Context) error // Params.ReadyCheck
	serving bool
	// onServing is called once, the first time the status is SERVING.
	onServing func()
}

func (h *healthWatch) check(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	err := bus.Check(cctx, h.nc, h.res.JS)
	if err == nil && h.extra != nil {
		err = h.extra(cctx)
	}
	cancel()
	if ctx.Err() != nil {
		return
	}
	if ok := err == nil; ok != h.serving {
		h.serving = ok
		h.srv.SetServing(ok)
		if ok {
			h.logger.Info("health: SERVING")
			if h.onServing != nil {
				h.onServing()
				h.onServing = nil
			}
		} else {
			h.logger.Warn("health: NOT_SERVING", "err", err)
		}
	}
}

func (h *healthWatch) loop(ctx context.Context) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			h.check(ctx)
		}
	}
}

// setupBus is bus.Setup, tried again while the JetStream cluster is still
// forming (a peer not yet online: "no suitable peers for placement", or
// JetStream temporarily unavailable), as happens when every process of a
// deployment starts at once; other errors, and ctx's end, are final.
func setupBus(ctx context.Context, nc *nats.Conn, bo bus.Options, logger *slog.Logger) (*bus.Resources, error) {
	delay := 250 * time.Millisecond
	for {
		res, err := bus.Setup(ctx, nc, bo)
		if err == nil || !clusterForming(err) {
			return res, err
		}
		logger.WarnContext(ctx, "JetStream cluster not ready, setting up again", "err", err, "in", delay)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
}

// clusterForming reports JetStream errors that a cluster still forming
// answers: no peer for a replica's placement (10005), JetStream
// temporarily unavailable (10008).
func clusterForming(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == 10005 || apiErr.ErrorCode == 10008
	}
	return errors.Is(err, jetstream.ErrJetStreamNotEnabled)
}
