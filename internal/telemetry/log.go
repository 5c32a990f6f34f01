package telemetry

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel/trace"

	"github.com/planex-dev/planex/internal/redact"
)

// NewLogger returns a slog logger writing to w in format "json" or "text"
// at level "debug", "info", "warn" or "error". Every record logged with a
// context carries that context's trace_id and span_id, and the attributes
// added with WithLogAttrs (run_id, step_id). Every attribute passes through
// r (redact.New() when nil).
func NewLogger(w io.Writer, level, format string, r *redact.Redactor) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	// Every log line goes through the redaction layer: no e-mail address,
	// token or card number reaches the logs.
	if r == nil {
		r = redact.New()
	}
	opts := &slog.HandlerOptions{Level: lvl, ReplaceAttr: r.ReplaceAttr}
	var h slog.Handler
	switch strings.ToLower(format) {
	case "json":
		h = slog.NewJSONHandler(w, opts)
	case "text":
		h = slog.NewTextHandler(w, opts)
	default:
		return nil, fmt.Errorf("--log-format %q: want json or text", format)
	}
	return slog.New(contextHandler{h}), nil
}

type logAttrsKey struct{}

// WithLogAttrs returns a context whose log records carry attrs (for
// example run_id and step_id) in addition to any already there.
func WithLogAttrs(ctx context.Context, attrs ...slog.Attr) context.Context {
	prev, _ := ctx.Value(logAttrsKey{}).([]slog.Attr)
	all := make([]slog.Attr, 0, len(prev)+len(attrs))
	all = append(all, prev...)
	all = append(all, attrs...)
	return context.WithValue(ctx, logAttrsKey{}, all)
}

// contextHandler adds trace and run correlation attributes from the
// record's context.
type contextHandler struct{ slog.Handler }

func (h contextHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	if attrs, ok := ctx.Value(logAttrsKey{}).([]slog.Attr); ok {
		r.AddAttrs(attrs...)
	}
	return h.Handler.Handle(ctx, r)
}

func (h contextHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return contextHandler{h.Handler.WithAttrs(attrs)}
}

func (h contextHandler) WithGroup(name string) slog.Handler {
	return contextHandler{h.Handler.WithGroup(name)}
}
