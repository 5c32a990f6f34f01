package sqlpool

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/big"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/executor/runner"
)

// postgresDB runs statements through pgx pools: read for sql.schema and
// sql.query, write for sql.exec (the same pool unless Config.WriteDSN is
// set).
type postgresDB struct {
	read    *pgxpool.Pool
	write   *pgxpool.Pool
	timeout time.Duration
	logger  *slog.Logger
	// resetRead and resetWrite are how the connections of read and write
	// are reset after a step, chosen once from their role's privileges
	// (chooseReset).
	resetRead, resetWrite sessionReset
}

func openPostgres(ctx context.Context, cfg Config) (_ *postgresDB, err error) {
	read, err := connectPostgres(ctx, cfg.DSN, "DSN")
	if err != nil {
		return nil, err
	}
	db := &postgresDB{read: read, write: read, timeout: cfg.StatementTimeout, logger: cfg.Logger}
	defer func() {
		if err != nil {
			_ = db.close()
		}
	}()
	if db.resetRead, err = chooseReset(ctx, read, "DSN", cfg.Logger); err != nil {
		return nil, err
	}
	db.resetWrite = db.resetRead
	problems, err := roleProblems(ctx, read)
	if err != nil {
		return nil, fmt.Errorf("check the privileges of the PostgreSQL role: %w", err)
	}
	if len(problems) > 0 {
		if !cfg.AllowPrivilegedRole {
			return nil, fmt.Errorf("%w: %s; connect as a read-only role (see `planex sql grant-readonly`), or for development only allow it with --sql-allow-privileged-role",
				ErrPrivilegedRole, strings.Join(problems, "; "))
		}
		cfg.Logger.Warn("SECURITY: the sql pool's PostgreSQL role can change data or act on the server; sql.query is protected by the statement checks only. "+
			"Never run like this in production: use a read-only role (planex sql grant-readonly).",
			"problems", strings.Join(problems, "; "))
	}
	if cfg.WriteDSN != "" {
		if db.write, err = connectPostgres(ctx, cfg.WriteDSN, "write DSN"); err != nil {
			db.write = db.read
			return nil, err
		}
		if db.resetWrite, err = chooseReset(ctx, db.write, "write DSN", cfg.Logger); err != nil {
			return nil, err
		}
	}
	return db, nil
}

// ErrPrivilegedRole is returned by Open when the PostgreSQL role of the
// read DSN could write or act on the server and Config.AllowPrivilegedRole
// is not set.
var ErrPrivilegedRole = errors.New("the PostgreSQL role is not read-only")

// connectPostgres opens and pings a pool; what names the DSN in errors.
func connectPostgres(ctx context.Context, dsn, what string) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse PostgreSQL %s %q: %w", what, redactDSN(dsn), err)
	}
	where := fmt.Sprintf("%s:%d/%s", pc.ConnConfig.Host, pc.ConnConfig.Port, pc.ConnConfig.Database)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL at %s: %w", where, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to PostgreSQL at %s: %w", where, err)
	}
	return pool, nil
}

// serverRoles are the predefined roles that reach beyond the database:
// files, programs, signals to other sessions, writes to every table.
var serverRoles = []string{"pg_write_server_files", "pg_read_server_files", "pg_execute_server_program", "pg_signal_backend", "pg_write_all_data"}

// roleProblems lists what the connected role may do beyond reading:
// superuser, role or database creation, membership in serverRoles, and
// INSERT, UPDATE, DELETE or TRUNCATE on a table or CREATE on the database
// or a schema (outside the system schemas). Empty means read-only.
func roleProblems(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var (
		user                string
		super, crole, cdb   bool
		dbCreate            bool
		members, writes, cs []string
	)
	err := pool.QueryRow(ctx, `
SELECT r.rolname, r.rolsuper, r.rolcreaterole, r.rolcreatedb,
  has_database_privilege(current_database(), 'CREATE'),
  ARRAY(SELECT s FROM unnest($1::text[]) s
    WHERE CASE WHEN EXISTS (SELECT 1 FROM pg_roles WHERE rolname = s) THEN pg_has_role(current_user, s, 'USAGE') ELSE false END),
  ARRAY(SELECT format('%s on %I.%I', p, n.nspname, c.relname)
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace,
      unnest(ARRAY['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE']) p
    WHERE c.relkind IN ('r', 'p', 'v', 'f', 'm')
      AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_toast%'
      AND has_table_privilege(c.oid, p)
    ORDER BY 1 LIMIT 5),
  ARRAY(SELECT format('CREATE on schema %I', n.nspname) FROM pg_namespace n
    WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_%'
      AND has_schema_privilege(n.oid, 'CREATE')
    ORDER BY 1 LIMIT 5)
FROM pg_roles r WHERE r.rolname = current_user`, serverRoles).Scan(&user, &super, &crole, &cdb, &dbCreate, &members, &writes, &cs)
	if err != nil {
		return nil, err
	}
	var out []string
	if super {
		out = append(out, fmt.Sprintf("role %s is a superuser", user))
	}
	if crole {
		out = append(out, fmt.Sprintf("role %s may create roles", user))
	}
	if cdb {
		out = append(out, fmt.Sprintf("role %s may create databases", user))
	}
	if len(members) > 0 {
		out = append(out, fmt.Sprintf("role %s is a member of %s", user, strings.Join(members, ", ")))
	}
	if dbCreate {
		out = append(out, fmt.Sprintf("role %s has CREATE on the database", user))
	}
	if len(writes) > 0 {
		out = append(out, fmt.Sprintf("role %s has %s", user, strings.Join(writes, ", ")))
	}
	if len(cs) > 0 {
		out = append(out, fmt.Sprintf("role %s has %s", user, strings.Join(cs, ", ")))
	}
	return out, nil
}

func (p *postgresDB) system() string   { return "postgresql" }
func (p *postgresDB) dialect() dialect { return dialectPostgres }

func (p *postgresDB) ping(ctx context.Context) error {
	if err := p.read.Ping(ctx); err != nil {
		return err
	}
	if p.write != nil && p.write != p.read {
		return p.write.Ping(ctx)
	}
	return nil
}

func (p *postgresDB) close() error {
	if p.write != p.read {
		p.write.Close()
	}
	p.read.Close()
	return nil
}

// session is one step's connection: a transaction on a connection of the
// pool that is reset (sessionReset) before it goes back, so that nothing a
// statement did to the session — an advisory lock taken through a
// function, a setting, a prepared statement, a temporary table, LISTEN —
// outlives the step.
type session struct {
	conn   *pgxpool.Conn
	tx     pgx.Tx
	reset  sessionReset
	logger *slog.Logger
}

// begin acquires a connection and starts a transaction with the statement
// timeout set locally. The caller must call end.
func (p *postgresDB) begin(ctx context.Context, pool *pgxpool.Pool, mode pgx.TxAccessMode) (*session, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	reset := p.resetRead
	if pool == p.write && p.write != p.read {
		reset = p.resetWrite
	}
	s := &session{conn: conn, reset: reset, logger: p.logger}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: mode})
	if err != nil {
		return nil, errors.Join(err, s.end(ctx))
	}
	s.tx = tx
	ms := p.timeout.Milliseconds()
	if dl, ok := ctx.Deadline(); ok {
		ms = min(ms, time.Until(dl).Milliseconds())
	}
	// standard_conforming_strings=on makes '\' an ordinary character, as
	// the statement checker's lexer reads it.
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d; SET LOCAL standard_conforming_strings = on", max(ms, 1))); err != nil {
		return nil, errors.Join(err, s.end(ctx))
	}
	return s, nil
}

// resetSQL is DISCARD ALL without DEALLOCATE ALL, DISCARD PLANS and the
// release of advisory locks: it closes cursors, resets settings and the
// session role, UNLISTENs, drops temporary tables and resets sequences'
// session state in one round trip, and keeps the pool's own prepared
// statements (statements cannot PREPARE: the checks refuse it), so queries
// are not re-prepared after every step. Every role may run it. Session
// advisory locks are released by unlockSQL, or found by heldLocksSQL, as
// the role allows (chooseReset).
const resetSQL = "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; UNLISTEN *; DISCARD TEMP; DISCARD SEQUENCES"

// unlockSQL releases the session's advisory locks. The role `planex sql
// grant-readonly` creates may not execute it (RevokedFunctions), nor take
// an advisory lock in the first place.
const unlockSQL = "SELECT pg_catalog.pg_advisory_unlock_all()"

// heldLocksSQL answers whether the session still holds an advisory lock;
// pg_locks is readable by every role.
const heldLocksSQL = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid())"

// sessionReset is how the connections of one pgx pool are reset after a
// step, decided once from the privileges of the pool's role.
type sessionReset struct {
	// sql is the reset, one round trip.
	sql string
	// checkLocks: sql ends with heldLocksSQL, and a connection that still
	// holds an advisory lock is closed instead of reused.
	checkLocks bool
	// closeAlways: the role can neither release nor see advisory locks it
	// might hold, so every connection is closed after its step.
	closeAlways bool
}

// chooseReset decides how the connections of pool are reset: with
// pg_advisory_unlock_all when the role may execute it; else, when it may
// read pg_locks, with a check that closes the rare connection still
// holding an advisory lock (the read-only role cannot take one: every
// connection is reused); else by closing every connection after its step,
// which is logged once as a WARN naming what to grant. what names the DSN
// in errors.
func chooseReset(ctx context.Context, pool *pgxpool.Pool, what string, logger *slog.Logger) (sessionReset, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var unlock, locks bool
	err := pool.QueryRow(ctx, `SELECT has_function_privilege('pg_catalog.pg_advisory_unlock_all()', 'EXECUTE'),
  has_function_privilege('pg_catalog.pg_lock_status()', 'EXECUTE') AND has_table_privilege('pg_catalog.pg_locks', 'SELECT')`).Scan(&unlock, &locks)
	if err != nil {
		return sessionReset{}, fmt.Errorf("check how the PostgreSQL role of the %s can reset a session: %w", what, err)
	}
	switch {
	case unlock:
		return sessionReset{sql: resetSQL + "; " + unlockSQL}, nil
	case locks:
		return sessionReset{sql: resetSQL + "; " + heldLocksSQL, checkLocks: true}, nil
	}
	logger.Warn("the PostgreSQL role of the "+what+" may neither execute pg_advisory_unlock_all() nor read pg_locks: "+
		"every connection is closed after its step (no pooling); grant SELECT on pg_catalog.pg_locks to the role", "dsn", what)
	return sessionReset{sql: resetSQL, closeAlways: true}, nil
}

// resetTimeout bounds the reset of a connection after a step.
const resetTimeout = 5 * time.Second

// errLockHeld: the session still holds an advisory lock after the reset.
var errLockHeld = errors.New("the session still holds an advisory lock its role may not release")

// end rolls back what is still open, resets the session and releases the
// connection; a connection that cannot be reset is closed, never reused.
// It works also when ctx already ended.
func (s *session) end(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resetTimeout)
	defer cancel()
	var err error
	if s.tx != nil {
		if rerr := s.tx.Rollback(ctx); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) {
			err = rerr
		}
	}
	conn := s.conn.Conn()
	if err == nil {
		err = s.resetConn(ctx, conn)
	}
	switch {
	case err != nil:
		s.logger.Warn("closing a PostgreSQL connection that could not be reset", "err", err)
		_ = conn.Close(ctx) // a closed connection is destroyed on Release
	case s.reset.closeAlways:
		_ = conn.Close(ctx) // chooseReset warned once
	}
	s.conn.Release()
	return nil
}

// resetConn runs the session reset on conn in one round trip.
func (s *session) resetConn(ctx context.Context, conn *pgx.Conn) error {
	results, err := conn.PgConn().Exec(ctx, s.reset.sql).ReadAll()
	if err != nil {
		return fmt.Errorf("reset PostgreSQL session: %w", err)
	}
	if !s.reset.checkLocks {
		return nil
	}
	last := results[len(results)-1]
	if last.Err != nil {
		return fmt.Errorf("reset PostgreSQL session: %w", last.Err)
	}
	if len(last.Rows) != 1 || len(last.Rows[0]) != 1 {
		return fmt.Errorf("reset PostgreSQL session: the advisory lock check answered %d rows", len(last.Rows))
	}
	if string(last.Rows[0][0]) != "f" {
		return errLockHeld
	}
	return nil
}

func (p *postgresDB) schema(ctx context.Context) (_ []Table, err error) {
	s, err := p.begin(ctx, p.read, pgx.ReadOnly)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, s.end(ctx)) }()
	rows, err := s.tx.Query(ctx, `
SELECT c.table_name, c.column_name, c.data_type, c.is_nullable = 'YES',
  EXISTS (
    SELECT 1 FROM information_schema.table_constraints tc
    JOIN information_schema.key_column_usage k
      ON k.constraint_schema = tc.constraint_schema AND k.constraint_name = tc.constraint_name
    WHERE tc.constraint_type = 'PRIMARY KEY' AND tc.table_schema = c.table_schema
      AND tc.table_name = c.table_name AND k.column_name = c.column_name)
FROM information_schema.columns c
WHERE c.table_schema = current_schema()
ORDER BY c.table_name, c.ordinal_position`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return scanTables(rows)
}

func (p *postgresDB) query(ctx context.Context, text string, params []any, maxRows int) (_ *QueryOutput, err error) {
	s, err := p.begin(ctx, p.read, pgx.ReadOnly)
	if err != nil {
		return nil, err
	}
	// Always roll back and reset: even a setting or a session lock taken by
	// the statement is undone.
	defer func() { err = errors.Join(err, s.end(ctx)) }()
	rows, err := s.tx.Query(ctx, text, params...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	fields := rows.FieldDescriptions()
	out := &QueryOutput{Columns: make([]Column, len(fields)), Rows: [][]any{}}
	for i, f := range fields {
		typ := fmt.Sprintf("oid:%d", f.DataTypeOID)
		if t, ok := rows.Conn().TypeMap().TypeForOID(f.DataTypeOID); ok {
			typ = t.Name
		}
		out.Columns[i] = Column{Name: f.Name, Type: typ}
	}
	for rows.Next() {
		if len(out.Rows) == maxRows {
			out.Truncated = true
			break
		}
		vals, err := rows.Values()
		if err != nil {
			return nil, err
		}
		row := make([]any, len(vals))
		for i, v := range vals {
			row[i] = pgValue(v, fields[i].DataTypeOID)
		}
		out.Rows = append(out.Rows, row)
	}
	if !out.Truncated {
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	out.RowCount = len(out.Rows)
	return out, nil
}

func (p *postgresDB) exec(ctx context.Context, text string, params []any) (_ int64, err error) {
	s, err := p.begin(ctx, p.write, pgx.ReadWrite)
	if err != nil {
		return 0, err
	}
	defer func() {
		if eerr := s.end(ctx); eerr != nil && err == nil {
			// Committed: the reset failing closed the connection, the
			// statement's outcome stands.
			p.logger.Warn("reset after sql.exec", "err", eerr)
		}
	}()
	tag, err := s.tx.Exec(ctx, text, params...)
	if err != nil {
		return 0, err
	}
	if err := s.tx.Commit(ctx); err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// pgValue converts a decoded PostgreSQL value to its JSON form.
func pgValue(v any, oid uint32) any {
	switch x := v.(type) {
	case nil, bool, string, int64, float64:
		return x
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case float32:
		return float64(x)
	case time.Time:
		if oid == pgtype.DateOID {
			return x.Format(time.DateOnly)
		}
		return x.UTC().Format(time.RFC3339Nano)
	case []byte:
		return base64.StdEncoding.EncodeToString(x)
	case [16]byte: // uuid
		return fmt.Sprintf("%x-%x-%x-%x-%x", x[0:4], x[4:6], x[6:8], x[8:10], x[10:16])
	case pgtype.Numeric:
		return numericValue(x)
	case netip.Prefix, netip.Addr, net.IPNet, *net.IPNet:
		return fmt.Sprint(x)
	case map[string]any:
		return x // json, jsonb
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = pgValue(e, 0)
		}
		return out
	case fmt.Stringer:
		return x.String()
	}
	if d, ok := v.(interface{ Value() (any, error) }); ok {
		if dv, err := d.Value(); err == nil {
			if s, ok := dv.(string); ok {
				return s
			}
		}
	}
	return fmt.Sprint(v)
}

// numericValue keeps integral numerics as integers when they fit.
func numericValue(n pgtype.Numeric) any {
	if !n.Valid {
		return nil
	}
	if n.NaN || n.InfinityModifier != pgtype.Finite {
		f, _ := n.Float64Value()
		return fmt.Sprint(f.Float64) // NaN and ±Inf are not JSON numbers
	}
	if n.Exp >= 0 {
		if i, err := n.Int64Value(); err == nil && i.Valid {
			return i.Int64
		}
	}
	f, err := n.Float64Value()
	if err != nil || math.IsInf(f.Float64, 0) {
		r := new(big.Rat).SetInt(n.Int)
		return r.FloatString(int(max(-n.Exp, 0)))
	}
	return f.Float64
}

// classify maps PostgreSQL errors to tool errors.
func (p *postgresDB) classify(err error, readOnly bool) *runner.Error {
	if errors.Is(err, context.DeadlineExceeded) {
		return &runner.Error{Code: planexv1.ErrorCode_ERROR_CODE_TIMEOUT, Message: "statement did not finish within the statement timeout", Err: err}
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		msg := pe.Message
		if pe.Detail != "" {
			msg += " (" + pe.Detail + ")"
		}
		switch {
		case pe.Code == "25006": // read_only_sql_transaction
			return runner.PermissionDenied("args.sql", "sql.query is read-only, the database refused: %s; use sql.exec to change data", msg)
		case pe.Code == "57014": // query_canceled: statement_timeout
			return &runner.Error{Code: planexv1.ErrorCode_ERROR_CODE_TIMEOUT, Message: "statement cancelled at the statement timeout", Err: err}
		case pe.Code == "42501": // insufficient_privilege
			return runner.PermissionDenied("args.sql", "PostgreSQL: %s", msg)
		case strings.HasPrefix(pe.Code, "08"), strings.HasPrefix(pe.Code, "53"), strings.HasPrefix(pe.Code, "57P"), pe.Code == "40001", pe.Code == "40P01":
			return runner.Unavailable(err, "PostgreSQL unavailable: %s", msg)
		}
		return runner.Failed(err, "PostgreSQL: %s (SQLSTATE %s)", msg, pe.Code)
	}
	switch {
	case pgconn.SafeToRetry(err), readOnly && isConnErr(err):
		return runner.Unavailable(err, "PostgreSQL unreachable")
	case isConnErr(err):
		// The connection broke while a write was in flight: it may have
		// been committed.
		return runner.OutcomeUnknown(err, "the connection to PostgreSQL broke during the statement; it may or may not have been applied")
	}
	return runner.Failed(err, "PostgreSQL: %v", err)
}

func isConnErr(err error) bool {
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne)
}
