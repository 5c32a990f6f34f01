package sqlpool

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/planex-dev/planex/services/executor/runner/runnertest"
)

// warnings records the WARN (and higher) records a pool logs.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, r.Message)
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

func (w *warnings) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

// TestPostgresReadOnlyRoleReusesConnections runs steps as the role `planex
// sql grant-readonly` creates, which may not execute
// pg_advisory_unlock_all(): every step reuses the one connection and
// nothing is logged at WARN (issue 27: the reset used to fail and close
// every connection).
func TestPostgresReadOnlyRoleReusesConnections(t *testing.T) {
	s := newSecDB(t)
	ctx := runnertest.Context(t)
	var w warnings
	p, err := Open(ctx, Config{DSN: s.roleDSN, Logger: slog.New(&w)})
	if err != nil {
		t.Fatalf("Open as the granted read-only role: %v", err)
	}
	defer p.Close()
	db := p.db.(*postgresDB)
	if db.resetRead.closeAlways || strings.Contains(db.resetRead.sql, "pg_advisory_unlock_all") {
		t.Errorf("reset chosen for the read-only role: %+v, want one without pg_advisory_unlock_all that keeps connections", db.resetRead)
	}
	created := db.read.Stat().NewConnsCount()
	const steps = 8
	for i := range steps {
		out, terr := call(t, p, "sql.query", map[string]any{"sql": "SELECT count(*) FROM t"})
		if terr != nil || out.(*QueryOutput).Rows[0][0] != int64(3) {
			t.Fatalf("step %d: %v %v", i, out, terr)
		}
	}
	if _, terr := call(t, p, "sql.schema", map[string]any{}); terr != nil {
		t.Fatalf("sql.schema: %v", terr)
	}
	if n := db.read.Stat().NewConnsCount() - created; n != 0 {
		t.Errorf("%d steps opened %d new connections, want 0 (the connection is reset and reused)", steps+1, n)
	}
	if total := db.read.Stat().TotalConns(); total != 1 {
		t.Errorf("pool holds %d connections after sequential steps, want 1", total)
	}
	if got := w.all(); len(got) > 0 {
		t.Errorf("WARN logged during steps: %q", got)
	}
}

// TestPostgresResetClosesSessionHoldingLock gives the read-only role a
// lock function but not pg_advisory_unlock_all(): a step that takes a
// session advisory lock leaves no lock behind (its connection is closed,
// with a WARN), and the next steps work.
func TestPostgresResetClosesSessionHoldingLock(t *testing.T) {
	s := newSecDB(t)
	ctx := runnertest.Context(t)
	mustExec(t, s.admin, "GRANT EXECUTE ON FUNCTION pg_catalog.pg_advisory_lock(bigint) TO "+s.role)
	var w warnings
	p, err := Open(ctx, Config{DSN: s.roleDSN, Logger: slog.New(&w)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	db := p.db.(*postgresDB)
	if !db.resetRead.checkLocks {
		t.Fatalf("reset chosen: %+v, want the advisory lock check", db.resetRead)
	}
	before := s.state(t)
	// Straight on the read path: the statement checks would refuse it.
	if _, err := db.query(ctx, "SELECT pg_advisory_lock(4247)", nil, 1); err != nil {
		t.Fatalf("take a lock as the role: %v", err)
	}
	// The server releases the lock when the closed connection's backend
	// exits, a moment after the step ended.
	deadline := time.Now().Add(10 * time.Second)
	for after := s.state(t); after != before; after = s.state(t) {
		if time.Now().After(deadline) {
			t.Fatalf("after the step: %s, want %s (the lock outlived the step)", after, before)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := w.all(); len(got) != 1 || !strings.Contains(got[0], "could not be reset") {
		t.Errorf("warnings %q, want one naming the connection that could not be reset", got)
	}
	if out, terr := call(t, p, "sql.query", map[string]any{"sql": "SELECT count(*) FROM t"}); terr != nil || out.(*QueryOutput).Rows[0][0] != int64(3) {
		t.Fatalf("query after the closed connection: %v %v", out, terr)
	}
}
