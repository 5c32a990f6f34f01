// Package sqlpool is the "sql" executor pool: sql.schema, sql.query and
// sql.exec over SQLite (modernc.org/sqlite, no cgo) or PostgreSQL (pgx),
// chosen by the DSN.
//
// # Read-only queries
//
// sql.query must never change data nor act outside its transaction. Four
// layers make sure of it:
//
//  1. The text is lexed (strings, quoted identifiers, comments and
//     PostgreSQL dollar quotes understood) and must hold exactly one
//     statement, so "SELECT 1; DELETE FROM t" and "SELECT ';' -- x" are told
//     apart correctly.
//  2. The statement must start with SELECT, WITH or VALUES (or TABLE on
//     PostgreSQL) and contain none of the keywords that write (INSERT,
//     UPDATE, DELETE, INTO, ...) nor a function that acts on the server
//     (set_config, pg_advisory_lock, lo_export, load_extension, ...). On
//     PostgreSQL functions are checked against an allowlist instead (see
//     funcs.go), U&"..." identifiers are decoded first, and the SQL text
//     handed to query_to_xml and its family must be a literal that passes
//     the same checks.
//  3. The database enforces it. PostgreSQL runs the statement in a READ
//     ONLY transaction with SET LOCAL statement_timeout, always rolled back,
//     and resets the connection after every step (DISCARD ALL, keeping the
//     pool's prepared statements), so that no session-level advisory lock
//     or setting outlives it. Open refuses a PostgreSQL role that is a
//     superuser or holds INSERT, UPDATE, DELETE, TRUNCATE or CREATE
//     privileges (Config.AllowPrivilegedRole overrides, for development);
//     GrantReadOnlySQL writes the SQL of a proper role, which also revokes
//     EXECUTE on the functions that act outside a read-only transaction.
//     sql.exec uses Config.WriteDSN when set.
//     SQLite runs it on a separate connection pool opened with mode=ro and
//     PRAGMA query_only=1, whose connections carry an authorizer that denies
//     everything but reading (no INSERT, CREATE, ATTACH, PRAGMA writes ...).
//  4. Errors the database raises for writes map to
//     ERROR_CODE_PERMISSION_DENIED naming args.sql.
//
// sql.exec is the write tool: side_effect WRITE, approval required by
// default, one statement, no ATTACH/PRAGMA/COPY (which reach the server's
// file system).
//
// # Values
//
// Result columns carry the database type name; values keep their JSON
// type: integers stay integers, floats floats, booleans booleans (SQLite
// columns declared BOOLEAN included), NULL is null, timestamps are RFC 3339
// strings, dates "YYYY-MM-DD", and bytes are base64.
package sqlpool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/planex-dev/planex/services/executor/runner"
)

const instrumentation = "github.com/planex-dev/planex/services/executor/sqlpool"

// Defaults of Config fields left zero.
const (
	DefaultMaxRows          = 1000
	DefaultStatementTimeout = 30 * time.Second
)

// Config configures the pool.
type Config struct {
	// DSN selects the database: "postgres://..." (or "postgresql://"),
	// "sqlite:///abs/path.db", "sqlite://rel/path.db" or a plain file path
	// for SQLite. A SQLite file must exist.
	DSN string
	// WriteDSN, on PostgreSQL, is the connection of sql.exec: a role that
	// may write, kept apart from the read-only role of DSN. Empty: sql.exec
	// uses DSN (and then can write only with AllowPrivilegedRole).
	WriteDSN string
	// AllowPrivilegedRole lets the pool start although the PostgreSQL role
	// of DSN is a superuser or may write (development only; a warning is
	// logged). Without it Open refuses such a role with ErrPrivilegedRole.
	AllowPrivilegedRole bool
	// MaxRows caps the rows sql.query returns; per-call max_rows may only
	// lower it.
	MaxRows int
	// StatementTimeout bounds one statement.
	StatementTimeout time.Duration
	// Logger receives the pool's logs.
	Logger *slog.Logger
}

// Pool is an open SQL pool.
type Pool struct {
	cfg    Config
	db     backend
	tracer trace.Tracer
	tools  []runner.Tool
}

// backend is what the tools need from a database.
type backend interface {
	system() string
	dialect() dialect
	schema(ctx context.Context) ([]Table, error)
	query(ctx context.Context, sql string, params []any, maxRows int) (*QueryOutput, error)
	exec(ctx context.Context, sql string, params []any) (int64, error)
	// classify maps a database error to a tool error.
	classify(err error, readOnly bool) *runner.Error
	// ping checks that the database answers.
	ping(ctx context.Context) error
	close() error
}

// Kind reports the backend a DSN selects: "postgresql" or "sqlite", or an
// error naming the DSN (with any password hidden).
func Kind(dsn string) (string, error) {
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		return "postgresql", nil
	case dsn == "":
		return "", errors.New("empty DSN")
	case strings.Contains(dsn, "://") && !strings.HasPrefix(dsn, "sqlite://"):
		return "", fmt.Errorf("DSN %q: want postgres://..., sqlite:///path or a file path", redactDSN(dsn))
	}
	return "sqlite", nil
}

// Open connects to the database the DSN names and checks it is reachable.
func Open(ctx context.Context, cfg Config) (*Pool, error) {
	cfg.MaxRows = cmp.Or(max(cfg.MaxRows, 0), DefaultMaxRows)
	cfg.StatementTimeout = cmp.Or(max(cfg.StatementTimeout, 0), DefaultStatementTimeout)
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	kind, err := Kind(cfg.DSN)
	if err != nil {
		return nil, err
	}
	var db backend
	if kind == "postgresql" {
		db, err = openPostgres(ctx, cfg)
	} else {
		db, err = openSQLite(ctx, cfg, strings.TrimPrefix(cfg.DSN, "sqlite://"))
	}
	if err != nil {
		return nil, err
	}
	p := &Pool{cfg: cfg, db: db, tracer: otel.Tracer(instrumentation)}
	if p.tools, err = p.buildTools(); err != nil {
		return nil, errors.Join(err, db.close())
	}
	return p, nil
}

// Probe checks that the database answers (a round trip on each of the
// pool's connection pools; for SQLite also that the database file is still
// there), within ctx. The executor calls it periodically, so the pool's
// health follows the database: NOT_SERVING while it is down, SERVING again
// once it answers.
func (p *Pool) Probe(ctx context.Context) error {
	if err := p.db.ping(ctx); err != nil {
		return fmt.Errorf("%s database: %w", p.db.system(), err)
	}
	return nil
}

// Close closes the database connections.
func (p *Pool) Close() error { return p.db.close() }

// Tools returns sql.schema, sql.query and sql.exec.
func (p *Pool) Tools() []runner.Tool { return p.tools }

// redactDSN hides the password of a URL-shaped DSN.
func redactDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.User == nil {
		return dsn
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "REDACTED")
	}
	return u.String()
}

// span starts the client span of one database call. The statement text is
// recorded with its literals replaced by '?'.
func (p *Pool) span(ctx context.Context, op string, st *statement) (context.Context, trace.Span) {
	attrs := []attribute.KeyValue{
		attribute.String("db.system", p.db.system()),
		attribute.String("db.operation", op),
	}
	if st != nil {
		attrs = append(attrs, attribute.String("db.query.text", st.sanitized()))
	}
	return p.tracer.Start(ctx, op, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// fail ends a span with err.
func fail(span trace.Span, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

// withTimeout applies the statement timeout unless the step's own deadline
// is sooner.
func (p *Pool) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, p.cfg.StatementTimeout)
}
