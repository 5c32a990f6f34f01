package policy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Watcher holds the policies loaded from files and reloads them when the
// files change (polling: it works the same on ConfigMap volumes, whose
// files are swapped through symlinks). A reload that does not compile
// keeps the policies in force, logs the error and counts it in
// planex.policy.reloads{result="error"}.
type Watcher struct {
	paths  []string
	logger *slog.Logger
	cur    atomic.Pointer[Set]
	sum    []byte
	reload metric.Int64Counter
}

// NewWatcher loads paths; an error (unreadable file, parse or CEL error
// with file and line) means the supervisor must not start.
func NewWatcher(logger *slog.Logger, paths ...string) (*Watcher, error) {
	w := &Watcher{paths: paths, logger: logger}
	set, sum, err := w.load()
	if err != nil {
		return nil, err
	}
	w.cur.Store(set)
	w.sum = sum
	w.reload, _ = otel.Meter("github.com/planex-dev/planex/internal/policy").Int64Counter("planex.policy.reloads",
		metric.WithDescription("Policy reloads by result (ok, error)."))
	return w, nil
}

// Current is the set in force.
func (w *Watcher) Current() *Set {
	if w == nil {
		return nil
	}
	return w.cur.Load()
}

func (w *Watcher) load() (*Set, []byte, error) {
	h := sha256.New()
	for _, p := range w.paths {
		if p == Builtin {
			h.Write(DefaultYAML)
			continue
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, nil, err
		}
		h.Write(data)
	}
	set, err := Load(w.paths...)
	return set, h.Sum(nil), err
}

// Check reloads the files if their contents changed; it reports whether
// a new set is in force.
func (w *Watcher) Check(ctx context.Context) bool {
	set, sum, err := w.load()
	if err == nil && bytes.Equal(sum, w.sum) {
		return false
	}
	if err != nil {
		if sum != nil && bytes.Equal(sum, w.sum) {
			return false
		}
		w.sum = sum // do not log the same broken contents at every poll
		w.logger.ErrorContext(ctx, "policy reload refused; the previous policies stay in force", "error", err)
		w.reload.Add(ctx, 1, metric.WithAttributes(attribute.String("result", "error")))
		return false
	}
	w.sum = sum
	w.cur.Store(set)
	w.logger.InfoContext(ctx, "policies reloaded", "files", w.paths)
	w.reload.Add(ctx, 1, metric.WithAttributes(attribute.String("result", "ok")))
	return true
}

// Run polls the files every interval until ctx ends.
func (w *Watcher) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.Check(ctx)
		}
	}
}
