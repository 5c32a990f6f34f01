package supervisor

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planex-dev/planex/internal/tenant"
	"github.com/planex-dev/planex/internal/trigger"
)

// WebhookPath is the path prefix of trigger webhooks:
// POST /v1/hooks/<tenant>/<trigger>.
const WebhookPath = "/v1/hooks/"

// webhookHandler serves trigger webhooks: a request is authenticated by
// its trigger's HMAC signature scheme (no planex credential), then its
// body is published into the trigger's subject, the same stream every
// other event goes through; 202 once JetStream acknowledged it.
type webhookHandler struct {
	cells      *cells
	secretsDir string
	logger     *slog.Logger
	now        func() time.Time
}

// passHeaders says which request headers an event keeps (for `headers`
// in the trigger's expressions): never credentials or the signature.
func passHeader(k string) bool {
	switch http.CanonicalHeaderKey(k) {
	case "Authorization", "Proxy-Authorization", "Cookie", trigger.HeaderGitHub, "X-Hub-Signature", trigger.HeaderStripe:
		return false
	case "Content-Type", "User-Agent":
		return true
	}
	return strings.HasPrefix(http.CanonicalHeaderKey(k), "X-")
}

func (h *webhookHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	tn, name, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, WebhookPath), "/")
	if !ok || trigger.ValidName(name) != nil || (tn != tenant.Default && tenant.ValidName(tn) != nil) {
		http.NotFound(w, r)
		return
	}
	log := h.logger.With("tenant", tn, "trigger", name)
	if tn != tenant.Default && h.cells.reg.Cached(tn) == nil {
		http.NotFound(w, r)
		return
	}
	c, err := h.cells.cell(tn)
	if err != nil || c.parts.triggers == nil {
		http.Error(w, "tenant not ready", http.StatusServiceUnavailable)
		return
	}
	trg := c.parts.triggers
	trg.mu.RLock()
	spec := trg.specs[name]
	trg.mu.RUnlock()
	if spec == nil || !spec.spec.GetWebhook().GetEnabled() {
		http.NotFound(w, r)
		return
	}
	hook := spec.spec.GetWebhook()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, trigger.MaxPayload))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	// Fail closed: no secret, no event.
	secret, err := h.secret(hook.GetSecretRef())
	if err != nil {
		log.Warn("webhook refused: its secret cannot be read", "secret_ref", hook.GetSecretRef(), "err", err)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	tol := time.Duration(hook.GetToleranceSeconds()) * time.Second
	if err := trigger.Verify(hook.GetScheme(), secret, r.Header, body, h.now(), tol); err != nil {
		log.Warn("webhook refused: bad signature", "scheme", hook.GetScheme(), "reason", err, "remote", r.RemoteAddr)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	msg := &nats.Msg{Subject: spec.spec.GetSubject(), Data: body, Header: nats.Header{}}
	n := 0
	for k, v := range r.Header {
		if passHeader(k) && len(v) > 0 && n < 32 {
			msg.Header.Set(k, v[0])
			n++
		}
	}
	msg.Header.Set(jetstream.MsgIDHeader, "hook:"+name+":"+trigger.ReplayID(hook.GetScheme(), r.Header))
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	ack, err := trg.js.PublishMsg(ctx, msg)
	if err != nil {
		log.Error("webhook event not published", "err", err)
		http.Error(w, "event not stored; retry", http.StatusServiceUnavailable)
		return
	}
	log.Info("webhook event accepted", "event_sequence", ack.Sequence, "duplicate", ack.Duplicate)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_ = json.NewEncoder(w).Encode(map[string]any{"event_sequence": ack.Sequence, "duplicate": ack.Duplicate})
}

// secret reads a webhook secret (again on every request: a mounted
// Secret changes in place), without its trailing newline.
func (h *webhookHandler) secret(ref string) ([]byte, error) {
	if h.secretsDir == "" {
		return nil, errors.New("the supervisor runs without --webhook-secrets-dir")
	}
	b, err := os.ReadFile(filepath.Join(h.secretsDir, filepath.Base(ref)))
	if err != nil {
		return nil, err
	}
	b = []byte(strings.TrimRight(string(b), "\r\n"))
	if len(b) == 0 {
		return nil, errors.New("the secret file is empty")
	}
	return b, nil
}

// serveWebhooks serves trigger webhooks at cfg.WebhookAddr (with the
// gRPC API's TLS settings) until the returned stop; off when the address
// is empty.
func serveWebhooks(cfg Config, cells *cells, logger *slog.Logger) (stop func(context.Context) error, err error) {
	if cfg.WebhookAddr == "" {
		return func(context.Context) error { return nil }, nil
	}
	tlsCfg, err := cfg.Common.TLS.HTTPServerConfig()
	if err != nil {
		return nil, fmt.Errorf("--webhook-addr: %w", err)
	}
	lis, err := net.Listen("tcp", cfg.WebhookAddr)
	if err != nil {
		return nil, fmt.Errorf("listen on --webhook-addr %s: %w", cfg.WebhookAddr, err)
	}
	logger = logger.With("component", "webhooks")
	mux := http.NewServeMux()
	mux.Handle(WebhookPath, &webhookHandler{cells: cells, secretsDir: cfg.WebhookSecretsDir, logger: logger, now: time.Now})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		MaxHeaderBytes: 64 << 10, TLSConfig: tlsCfg}
	scheme := "http"
	if tlsCfg != nil {
		scheme = "https"
		lis = tls.NewListener(lis, tlsCfg)
	}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("webhook endpoint", "err", err)
		}
	}()
	logger.Info("webhooks listening", "url", fmt.Sprintf("%s://%s%s<tenant>/<trigger>", scheme, lis.Addr(), WebhookPath), "tls", tlsCfg != nil)
	if cfg.OnWebhookReady != nil {
		cfg.OnWebhookReady(fmt.Sprintf("%s://%s", scheme, lis.Addr()))
	}
	return func(ctx context.Context) error {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			return errors.Join(fmt.Errorf("stop webhooks: %w", err), srv.Close())
		}
		return nil
	}, nil
}
